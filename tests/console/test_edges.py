"""The console's last edges through the ASGI and WSGI edges: the host's current
organization, the icon, the time zone list, the name's limit and the 409 page."""

from __future__ import annotations

import re
from typing import Any

import pytest

from keyturn.console import ConsoleSetupError
from keyturn.console._forms import KNOWN_ZONES, ZONES
from tests.console.support import EDGES, Client, World, form_token, make_world

ORGANIZATION_HEADER = "x-test-organization"  # where the tests' host keeps its current org


def from_header(request: Any) -> str | None:
    """The tests' host: the organization the user is in, from a request header."""
    value = request.headers.get(ORGANIZATION_HEADER)
    return value if isinstance(value, str) else None


def selected_scope(html: str) -> str:
    select = html[html.index('<select id="scope"') :]
    found = re.search(r'<option value="([^"]+)" selected>', select[: select.index("</select>")])
    assert found is not None, "no scope is selected"
    return found.group(1)


@pytest.mark.parametrize("edge", EDGES)
def test_the_host_says_which_organization_the_form_starts_on(edge: str) -> None:
    """current_organization picks the starting scope among the user's organizations; one the
    user does not reach, or none, falls back to the tenant's default organization."""
    world = make_world(start_on="organization", current_organization=from_header)
    client = Client(edge, world.console)
    client.account = "alice"

    def starts(organization: str | None) -> str:
        headers = {} if organization is None else {ORGANIZATION_HEADER: organization}
        return selected_scope(client.get("/console/", headers=headers).text)

    assert starts("acme-research") == "organization:acme-research"
    assert starts("globex-hq") == "organization:acme-main"  # alice is not a member there
    assert starts(None) == "organization:acme-main"


def test_an_async_host_hook_is_awaited_under_asgi() -> None:
    """Under ASGI a coroutine function's answer is awaited, as signed_in's is."""

    async def current(request: Any) -> str | None:
        return from_header(request)

    world = make_world(start_on="organization", current_organization=current)
    client = Client("asgi", world.console)
    client.account = "alice"

    page = client.get("/console/", headers={ORGANIZATION_HEADER: "acme-research"})

    assert selected_scope(page.text) == "organization:acme-research"


def test_the_hook_belongs_to_the_organization_start() -> None:
    """A current_organization given with start_on='tenant' would never be used: refused."""
    with pytest.raises(ConsoleSetupError, match="start_on='organization'"):
        make_world(current_organization=from_header)


def test_every_page_names_its_icon(client: Client) -> None:
    """Each page links the console's own icon, served below the mount point: the browser
    asks for no /favicon.ico."""
    page = client.get("/console/")
    icon = re.search(r'<link rel="icon" href="([^"]+)"', page.text)
    assert icon is not None and icon.group(1) == "/console/static/favicon.svg"

    served = client.get(icon.group(1))

    assert served.status == 200
    assert served.headers["content-type"] == "image/svg+xml"
    assert served.text.startswith("<svg")


def test_the_time_zone_list_offers_canonical_zones(client: Client, world: World) -> None:
    """The list holds canonical zones (no alias, no Etc/GMT+5); an alias a browser names
    is still accepted."""
    page = client.get("/console/").text
    select = page[page.index('<select id="tz"') :]
    select = select[: select.index("</select>")]
    offered = re.findall(r"<option(?: selected)?>([^<]+)</option>", select)

    assert offered == list(ZONES)
    for canonical in ("UTC", "Asia/Kolkata", "America/Los_Angeles", "Europe/Kyiv"):
        assert canonical in offered
    for alias in ("Asia/Calcutta", "US/Pacific", "Europe/Kiev", "Etc/GMT+5", "GMT"):
        assert alias not in offered
    assert len(offered) < 450 < len(KNOWN_ZONES)

    preview = client.get("/console/preview?lifetime=custom&date=2026-06-20&tz=Asia/Calcutta")
    assert preview.status == 200 and "IST" in preview.text
    token = form_token(page)
    created = client.post(
        "/console/",
        {
            "token": token,
            "name": "alias zone",
            "lifetime": "custom",
            "date": "2026-06-20",
            "tz": "Asia/Calcutta",
            "scope": "tenant:acme",
        },
    )
    assert created.status == 201


def test_the_name_field_leaves_the_count_to_the_script_and_the_server(client: Client) -> None:
    """No maxlength (a browser counts UTF-16 units there); 100 emoji are a name, 101 not."""
    page = client.get("/console/").text
    field = re.search(r'<input id="name"[^>]*>', page)
    assert field is not None
    assert "maxlength" not in field.group(0) and 'data-max="100"' in field.group(0)

    def create(name: str) -> int:
        form = {"name": name, "lifetime": "1d", "tz": "UTC", "scope": "tenant:acme"}
        form["token"] = form_token(client.get("/console/").text)
        return client.post("/console/", form).status

    assert create("🔑" * 100) == 201
    assert create("🔑" * 101) == 400


def test_the_already_sent_page_looks_like_the_others(client: Client) -> None:
    """The 409 of a form sent twice is a panel with a heading and a way back, like every page."""
    token = form_token(client.get("/console/").text)
    form = {"token": token, "name": "once", "lifetime": "1d", "tz": "UTC", "scope": "tenant:acme"}
    assert client.post("/console/", form).status == 201

    replay = client.post("/console/", form)

    assert replay.status == 409
    assert re.search(
        r'<section class="panel"[^>]*>\s*<h1 id="message-title">This form was already sent</h1>',
        replay.text,
    )
    assert '<a class="button" href="/console/">Back to your keys</a>' in replay.text
