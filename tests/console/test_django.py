"""The console's Django edge in Django's own test client: request.user, Django's CSRF, and
``manage.py keyturn``. The browser suite (test_browser.py) runs against this edge too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings

from keyturn import Scope
from keyturn.console import ConsoleSetupError
from keyturn.console.django import console_urls, username
from keyturn.stores import open_database
from tests.console.support import SIGN_IN, World, django_settings, hidden_fields, make_world
from tests.django_project import database


@pytest.fixture
def world() -> Iterator[World]:
    """The console tests' world, its console included in the tests' Django project."""
    database()
    world = make_world(edge="django")
    with django_settings(world.console):
        yield world


def users() -> Any:
    from django.contrib.auth.models import User  # once tests.django_project configured Django

    return User.objects


def signed_in(account: str, **options: Any) -> Client:
    client = Client(**options)
    client.force_login(users().get(username=account))
    return client


def create(client: Client, fields: dict[str, str], **headers: str) -> Any:
    form = {**fields, "name": "from django", "lifetime": "1d", "tz": "UTC"}
    form["scope"] = "tenant:acme"
    return client.post(
        "/console/",
        urlencode(form),
        content_type="application/x-www-form-urlencoded",  # as a browser sends the form
        headers={"Origin": "http://testserver", **headers},
    )


def test_request_user_is_the_account(world: World) -> None:
    """An anonymous visitor goes to the sign-in URL; a signed-in Django user sees their keys."""
    world.manager.create("alice", name="alice's", scope=Scope.tenant("acme"))

    anonymous = Client().get("/console/")
    page = signed_in("alice").get("/console/")

    assert anonymous.status_code == 303
    assert anonymous["Location"] == SIGN_IN + "?next=%2Fconsole%2F"
    assert page.status_code == 200
    assert "Signed in as <strong>alice</strong>" in page.text
    assert "alice&#39;s" in page.text
    assert "Signed in as <strong>bob</strong>" in signed_in("bob").get("/console/").text


def test_an_inactive_user_is_not_signed_in(world: World) -> None:
    """A deactivated Django user is sent to sign in, though its session still exists."""
    client = signed_in("bob")
    users().filter(username="bob").update(is_active=False)
    try:
        reply = client.get("/console/")
    finally:
        users().filter(username="bob").update(is_active=True)

    assert reply.status_code == 303


def test_djangos_csrf_guards_every_post(world: World) -> None:
    """With Django's CSRF checks on, a form without Django's token is refused with the
    console's own page and creates nothing; the form as the page renders it creates."""
    client = signed_in("alice", enforce_csrf_checks=True)
    fields = hidden_fields(client.get("/console/").text)
    assert set(fields) == {"token", "csrfmiddlewaretoken"}

    forged = create(client, {"token": fields["token"]})
    assert forged.status_code == 403
    assert "<h1" in forged.text and "This form has expired" in forged.text
    assert world.store.keys_of("alice") == []

    made = create(client, fields)
    assert made.status_code == 201
    assert len(world.store.keys_of("alice")) == 1


def test_one_csrf_secret_across_pages_without_csrf_middleware(world: World) -> None:
    """Without CsrfViewMiddleware in MIDDLEWARE the console still runs Django's check, and
    keeps the browser's CSRF secret: a form loaded before another console page still
    creates (a revoke form left open in another tab works); a forged one is still refused."""
    from django.conf import settings

    without = [name for name in settings.MIDDLEWARE if "CsrfViewMiddleware" not in name]
    with override_settings(MIDDLEWARE=without):
        client = signed_in("alice", enforce_csrf_checks=True)
        first = client.get("/console/")
        fields = hidden_fields(first.text)
        cookie = client.cookies["csrftoken"].value
        assert client.get("/console/").status_code == 200  # another page, in another tab
        assert client.cookies["csrftoken"].value == cookie

        assert create(client, {"token": fields["token"]}).status_code == 403
        made = create(client, fields)
        assert made.status_code == 201
        assert len(world.store.keys_of("alice")) == 1


def test_the_pages_headers(world: World) -> None:
    """The console's headers, with Referrer-Policy same-origin (Django's CSRF refuses
    "Origin: null"), and Django's CSRF cookie for the forms."""
    page = signed_in("alice").get("/console/")

    assert page["Cache-Control"] == "no-store"
    assert "frame-ancestors 'none'" in page["Content-Security-Policy"]
    assert page["Referrer-Policy"] == "same-origin"
    assert "csrftoken" in page.cookies


def test_an_api_key_is_refused(world: World) -> None:
    """A request carrying an API key gets 403 here too, whoever is signed in."""
    created = world.manager.create("alice", name="k", scope=Scope.tenant("acme"))

    reply = signed_in("alice").get(
        "/console/", headers={"Authorization": f"Bearer {created.secret}"}
    )

    assert reply.status_code == 403
    assert "API keys cannot manage keys" in reply.text
    assert created.secret not in reply.text


def test_static_files_head_and_unknown_pages(world: World) -> None:
    """The script, the style and the icon are served below the mount point; HEAD has no body;
    an unknown page is the console's 404."""
    client = signed_in("alice")

    script = client.get("/console/static/console.js")
    icon = client.head("/console/static/favicon.svg")
    missing = client.get("/console/nowhere")

    assert script.status_code == 200 and script["Content-Type"].startswith("text/javascript")
    assert icon.status_code == 200 and icon.content == b""
    assert missing.status_code == 404 and "There is no such console page" in missing.text


def test_username_and_console_urls_refuse_what_they_cannot_use() -> None:
    """username() is None without a signed-in user; console_urls() wants a Console."""

    class Anonymous:
        is_authenticated = False

    class Request:
        user = Anonymous()

    assert username(Request()) is None  # type: ignore[arg-type]
    with pytest.raises(ConsoleSetupError, match="Console"):
        console_urls(object())  # type: ignore[arg-type]

    async def coroutine(request: Any) -> str:
        return "alice"

    with pytest.raises(ConsoleSetupError, match="plain functions"):
        console_urls(make_world(signed_in=coroutine).console)


def test_manage_py_keyturn_runs_the_command_on_the_projects_store(tmp_path: Path) -> None:
    """``manage.py keyturn db init`` creates the tables of settings.KEYTURN's store; other
    commands run there too; a failing one is a CommandError with its exit status."""
    url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    with override_settings(KEYTURN={"STORE_URL": url}):
        call_command("keyturn", "db", "init")
        call_command("keyturn", "org", "add", "org_main", "--tenant", "acme", "--default")
        with pytest.raises(CommandError) as failed:
            call_command("keyturn", "org", "add", "org_main", "--tenant", "acme")

    assert failed.value.returncode == 1
    with open_database(url) as db:
        organization = db.membership.get_organization("org_main")
    assert organization is not None and organization.tenant_id == "acme"


def test_manage_py_keyturn_from_the_command_line(tmp_path: Path) -> None:
    """As ``python manage.py keyturn ...`` runs it: every word is keyturn's; its exit status."""
    from django.core.management import ManagementUtility

    url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    with override_settings(KEYTURN={"STORE_URL": url}):
        for argv, status in (
            (["manage.py", "keyturn", "db", "init"], 0),
            (["manage.py", "keyturn", "org", "list"], 0),
            (["manage.py", "keyturn", "no-such-command"], 2),
        ):
            with pytest.raises(SystemExit) as exited:
                ManagementUtility(argv).execute()
            assert exited.value.code == status, argv


def test_manage_py_keyturn_speaks_as_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its usage, its errors and the commands its messages name are ``manage.py keyturn``."""
    from django.core.management import ManagementUtility

    url = f"sqlite:///{tmp_path / 'missing.sqlite3'}"
    with override_settings(KEYTURN={"STORE_URL": url}):
        for argv in (["manage.py", "keyturn", "--help"], ["manage.py", "keyturn", "org", "list"]):
            with pytest.raises(SystemExit):
                ManagementUtility(argv).execute()
    shown = capsys.readouterr()
    assert shown.out.startswith("usage: manage.py keyturn [-h]")
    assert "\n  manage.py keyturn db init\n" in shown.out  # the examples
    assert shown.err.startswith("manage.py keyturn: error: there is no store at ")
    assert "create it with 'manage.py keyturn db init'" in shown.err
    assert "'keyturn " not in shown.err
