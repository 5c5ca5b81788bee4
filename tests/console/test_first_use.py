"""What a newcomer meets first, through every edge: a ready ``curl`` line beside a new
secret, expiry dates that read as the day picked, the usage chart's lag said, a
``User-Agent`` a person can read, and a setup error that says what to pass."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from typing import Any

import pytest
from starlette.testclient import TestClient

from keyturn import Authenticator, Scope
from keyturn.console import Console, ConsoleSetupError, short_agent
from keyturn.demo import create_app
from keyturn.usage import ACCEPTED
from tests.console.support import NOW, Client, World, form_token, make_world
from tests.console.test_pages import create_form


def curl_line(html: str) -> list[str]:
    [line] = re.findall(r'<code id="curl">([^<]*)</code>', html)
    return shlex.split(line.replace("&#39;", "'").replace("&amp;", "&"))


def call(world: World, argv: list[str]) -> int:
    """Run a curl line's request against the list-models API over the world's store."""
    assert argv[0] == "curl"
    headers = dict(h.split(": ", 1) for flag, h in zip(argv[1:-1:2], argv[2:-1:2], strict=True))
    authenticator = Authenticator(world.store, world.membership, clock=world.clock)
    with TestClient(create_app(authenticator)) as api:
        status: int = api.get(argv[-1], headers=headers).status_code
    return status


@pytest.mark.parametrize(
    ("scope", "organization"), [("tenant:acme", "default"), ("organization:acme-research", None)]
)
def test_a_new_key_s_page_shows_a_curl_line_that_works(
    client: Client, world: World, scope: str, organization: str | None
) -> None:
    """The secret comes with a ready curl line; a tenant key's names an organization (the
    user reaches ``default``); run as it is, the API answers 200."""
    reply = client.post("/console/", create_form(client, scope=scope))
    assert reply.status == 201
    argv = curl_line(reply.text)
    headers = argv[2:-1:2]
    assert headers[0].startswith("Authorization: Bearer rma_")
    assert headers[1:] == ([f"x-organization-id: {organization}"] if organization else [])
    assert argv[-1] == f"{client.origin}/managed-agents/v1/models"
    assert call(world, argv) == 200


def test_a_tenant_key_s_curl_line_names_an_organization_the_user_reaches(
    client: Client, world: World
) -> None:
    """carol reaches only acme-research, not the tenant's default organization: her line
    names acme-research."""
    world.membership.add_member("carol", "acme-research", role="member")
    client.account = "carol"
    reply = client.post("/console/", create_form(client, scope="tenant:acme"))
    argv = curl_line(reply.text)
    assert "x-organization-id: acme-research" in argv
    assert call(world, argv) == 200


def test_the_curl_line_calls_the_api_url_given() -> None:
    world = make_world(api_url="https://api.example/managed-agents/v1/models")
    client = Client("asgi", world.console)
    client.account = "alice"
    reply = client.post("/console/", create_form(client))
    assert curl_line(reply.text)[-1] == "https://api.example/managed-agents/v1/models"


def test_the_rotated_key_s_page_shows_times_in_the_user_s_zone(
    client: Client, world: World
) -> None:
    """The rotate form carries the zone: the new key's page shows its expiry there, and its
    curl line, as the create page does."""
    old = world.manager.create("alice", name="deploys", scope=Scope.tenant("acme"))
    page = client.get(f"/console/rotate?key={old.info.key_id}&tz=Pacific/Auckland").text
    assert '<input type="hidden" name="tz" value="Pacific/Auckland">' in page
    form = {"token": form_token(page), "key": old.info.key_id, "tz": "Pacific/Auckland"}
    reply = client.post("/console/rotate", form)
    assert reply.status == 201
    assert "NZST" in reply.text and " UTC" not in reply.text
    assert "x-organization-id: default" in curl_line(reply.text)


def test_a_custom_date_reads_as_that_day_on_every_page(client: Client, world: World) -> None:
    """Picked 2027-01-15 in Paris: the preview, the new key's page, the list and the revoke
    page all say "2027-01-15, end of day", never the next day's midnight."""
    preview = client.get("/console/preview?lifetime=custom&date=2027-01-15&tz=Europe/Paris")
    assert '"expires": "2027-01-15, end of day CET"' in preview.text
    form = create_form(client, lifetime="custom", date="2027-01-15", tz="Europe/Paris")
    created = client.post("/console/", form)
    [key] = world.manager.list("alice")
    pages = {
        "created": created.text,
        "list": client.get("/console/?tz=Europe/Paris").text,
        "revoke": client.get(f"/console/revoke?key={key.key_id}&tz=Europe/Paris").text,
    }
    for name, html in pages.items():
        assert "2027-01-15, end of day CET" in html, name
        assert "2027-01-16" not in html, name


def test_last_used_never_beside_a_refusal_says_never_accepted(client: Client, world: World) -> None:
    """A key only ever refused has a chart (its refusals) and "Never accepted"; an unused
    one "Never"; the list says the counts lag."""
    refused = world.manager.create("alice", name="refused", scope=Scope.tenant("acme"))
    world.manager.create("alice", name="unused", scope=Scope.tenant("acme"))
    world.store.count_usage(NOW.date(), {(refused.info.key_id, "org_not_found"): 2})
    page = client.get("/console/").text
    cells = re.findall(r'<td data-label="Last used"><div>([^<]*)', page)
    assert sorted(cells) == ["Never", "Never accepted"]
    assert "about once a minute" in page
    world.store.count_usage(NOW.date(), {(refused.info.key_id, ACCEPTED): 1})
    world.store.mark_used(refused.info.key_id, NOW)
    assert "Never accepted" not in client.get("/console/").text


def test_without_usage_the_list_says_nothing_of_lag(client: Client, world: World) -> None:
    world.manager.create("alice", name="unused", scope=Scope.tenant("acme"))
    assert "about once a minute" not in client.get("/console/").text


def test_the_activity_page_shortens_user_agents(client: Client, world: World) -> None:
    """A browser's User-Agent reads as "Firefox 132 on Linux", the full string in a title."""
    agent = "Mozilla/5.0 (X11; Linux x86_64; rv:132.0) Gecko/20100101 Firefox/132.0"
    client.post("/console/", create_form(client), headers={"User-Agent": agent})
    page = client.get("/console/activity").text
    assert f'<span class="agent" title="{agent}">Firefox 132 on Linux</span>' in page


@pytest.mark.parametrize(
    ("agent", "shown"),
    [
        (
            "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
            "Chrome/131.0.0.0 Safari/537.36 Edg/131.0.2903.86",
            "Edge 131 on Windows",
        ),
        (
            "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like "
            "Gecko) Version/18.1 Safari/605.1.15",
            "Safari 18 on macOS",
        ),
        (
            "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 "
            "(KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
            "Safari 18 on iOS",
        ),
        ("curl/8.5.0", "curl/8.5.0"),
        ("python-httpx/0.28.1", "python-httpx/0.28.1"),
        ("Mozilla/5.0 (compatible; SomeBot/1.0)", "Mozilla/5.0"),
        ("x" * 80, "x" * 59 + "…"),
    ],
)
def test_short_agent(agent: str, shown: str) -> None:
    assert short_agent(agent) == shown


def test_a_text_secret_says_bytes_are_needed_and_how_to_make_them() -> None:
    """``secret="..."`` is the wrong type, whatever its length: the error says so and shows
    how to make and load the bytes."""
    world = make_world()
    options: dict[str, Any] = {"signed_in": lambda request: None, "sign_in_url": "/login"}
    with pytest.raises(ConsoleSetupError) as wrong:
        Console(world.manager, secret="x" * 41, **options)  # type: ignore[arg-type]
    message = str(wrong.value)
    assert "secret must be bytes, not str" in message
    assert "secrets.token_hex(32)" in message and "bytes.fromhex(os.environ[" in message
    with pytest.raises(ConsoleSetupError, match=r"at least 16 random bytes, got 8"):
        Console(world.manager, secret=b"12345678", **options)
    Console(world.manager, secret=bytes.fromhex("ab" * 32), **options)


# What a host without the console extra meets: each library of the extra blocked in a fresh
# interpreter (a None in sys.modules is how Python marks a module that cannot be imported).
_WITHOUT = """
import sys
sys.modules[{library!r}] = None
from keyturn import KeyManager
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from keyturn.console import Console
console = Console(
    KeyManager(MemoryKeyStore(), MemoryMembership()), signed_in=len, sign_in_url="/login"
)
console.asgi()
console.wsgi()
"""


@pytest.mark.parametrize("library", ["jinja2", "anyio", "starlette", "werkzeug"])
def test_a_missing_console_extra_names_itself(library: str) -> None:
    """Without a library of the console extra, the error names the extra and its install
    line, not a bare ``No module named``."""
    ran = subprocess.run(  # noqa: S603 -- our interpreter and our script
        [sys.executable, "-c", _WITHOUT.format(library=library)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    last = ran.stderr.strip().splitlines()[-1]
    assert last == (
        f"ImportError: the key console needs the console extra ({library} is not installed): "
        "pip install 'keyturn[console]'"
    )
