"""Step-up before minting: creating or rotating a key needs a recent sign-in, when the host
asks for one (``recently_authenticated``, ``reauthenticate_url``).

Through every edge (ASGI, WSGI, Django) with the frameworks' test clients; an async hook
and an async manager under ASGI; the ``next`` the console sends and the host's check of it
(``safe_next``); and the whole walk in Debian's Chromium, on real servers on 127.0.0.1.
"""

from __future__ import annotations

import html
import itertools
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, quote, urljoin, urlsplit

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from keyturn import AsyncKeyManager, Scope
from keyturn.console import Console, ConsoleSetupError, Visit, safe_next
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from tests.console.support import (
    ACCOUNT_COOKIE,
    BROWSER_EDGES,
    NOW,
    REAUTHENTICATE,
    RECENT,
    SIGN_IN,
    SIGNED_IN_AT_COOKIE,
    Client,
    World,
    django_settings,
    expect,
    form_token,
    make_world,
    serving,
    sign_in,
    signed_in,
    signed_in_at,
)
from tests.console.test_library import Awaited, seed

LONG_AGO = signed_in_at(NOW - timedelta(hours=1))  # signed in, but not recently
JUST_NOW = signed_in_at(NOW)
OFF_SITE = [  # each a way to leave the site that some reader of a URL accepts
    "https://evil.example/",
    "//evil.example/",
    "/\\evil.example/",
    "\\\\evil.example/",
    "/\t/evil.example/",
    "/\n/evil.example/",
    " //evil.example/",
    "javascript:alert(1)",
    "http:evil.example",
    "evil.example",
    "",
]


@pytest.fixture(params=BROWSER_EDGES)
def edge(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def world() -> World:
    """The console tests' world, whose console asks for a recent sign-in."""
    return make_world(step_up=True)


@pytest.fixture
def client(edge: str, world: World) -> Iterator[Client]:
    """A client of each edge, signed in as alice an hour ago: not recently."""
    client = Client(edge, world.console)
    client.account = "alice"
    client.cookies[SIGNED_IN_AT_COOKIE] = LONG_AGO
    if edge == "django":
        with django_settings(world.console):
            yield client
    else:
        yield client


def link(page: str) -> str:
    """The href of the page's "Sign in again" link."""
    found = re.search(r'id="reauthenticate" href="([^"]+)"', page)
    assert found is not None, "the page has no re-sign-in link"
    return html.unescape(found.group(1))


def next_of(href: str) -> str:
    """The ``next`` of a re-sign-in link."""
    parts = urlsplit(href)
    assert parts.path == REAUTHENTICATE
    [back] = parse_qs(parts.query)["next"]
    return back


def create_form(token: str, name: str = "CI deploys") -> dict[str, str]:
    return {"token": token, "name": name, "lifetime": "30d", "tz": "UTC", "scope": "tenant:acme"}


def test_the_create_form_waits_for_a_recent_sign_in(client: Client, world: World) -> None:
    """Signed in an hour ago, the list shows the user's keys and, in place of the create
    form, a link to sign in again that comes back to the list; recent, the form is there."""
    world.manager.create("alice", name="old one", scope=Scope.tenant("acme"))

    page = client.get("/console/")
    assert page.status == 200
    assert "old one" in page.text
    assert '<form id="create"' not in page.text
    assert "Confirm it’s you to create a key." in page.text
    assert next_of(link(page.text)) == "/console/"

    client.cookies[SIGNED_IN_AT_COOKIE] = JUST_NOW
    page = client.get("/console/")
    assert '<form id="create"' in page.text
    assert 'id="reauthenticate"' not in page.text


def test_a_create_sent_after_the_sign_in_aged_is_refused_and_kept_for_later(
    client: Client, world: World
) -> None:
    """A form shown while the sign-in was recent, sent once it no longer is, creates
    nothing (403, a page that says so, with the link); after signing in again the same form
    works: its one-use token was not spent."""
    client.cookies[SIGNED_IN_AT_COOKIE] = JUST_NOW
    token = form_token(client.get("/console/").text)
    world.clock.now = NOW + RECENT  # filling in the form took too long

    refused = client.post("/console/", create_form(token))
    assert refused.status == 403
    assert "no key was created" in refused.text
    assert next_of(link(refused.text)) == "/console/"
    assert world.store.keys_of("alice") == []

    client.cookies[SIGNED_IN_AT_COOKIE] = signed_in_at(world.clock.now)
    created = client.post("/console/", create_form(token))
    assert created.status == 201
    assert [key.name for key in world.store.keys_of("alice")] == ["CI deploys"]


def test_a_stolen_cookie_cannot_mint_a_key(client: Client, world: World) -> None:
    """Whoever holds an old session gets a genuine form token from the page's other forms,
    yet neither a create nor a rotate goes through."""
    key = world.manager.create("alice", name="deploys", scope=Scope.tenant("acme"))
    revoke_page = client.get(f"/console/revoke?key={key.info.key_id}")
    assert revoke_page.status == 200  # revoking needs no recent sign-in

    assert client.post("/console/", create_form("x")).status == 403  # no genuine token
    rotate_page = client.get(f"/console/rotate?key={key.info.key_id}")
    assert rotate_page.status == 200
    assert 'action="/console/rotate"' not in rotate_page.text
    assert "Confirm it’s you to rotate a key." in rotate_page.text
    assert next_of(link(rotate_page.text)) == f"/console/rotate?key={key.info.key_id}"

    # A rotate token issued while recent, sent later: refused as well.
    client.cookies[SIGNED_IN_AT_COOKIE] = JUST_NOW
    token = form_token(client.get(f"/console/rotate?key={key.info.key_id}").text)
    client.cookies[SIGNED_IN_AT_COOKIE] = LONG_AGO
    refused = client.post("/console/rotate", {"token": token, "key": key.info.key_id})
    assert refused.status == 403
    assert next_of(link(refused.text)) == f"/console/rotate?key={key.info.key_id}"
    assert [k.name for k in world.store.keys_of("alice")] == ["deploys"]

    client.cookies[SIGNED_IN_AT_COOKIE] = JUST_NOW
    rotated = client.post("/console/rotate", {"token": token, "key": key.info.key_id})
    assert rotated.status == 201
    assert len(world.store.keys_of("alice")) == 2


def test_revoking_needs_no_recent_sign_in(client: Client, world: World) -> None:
    """Revoking only takes power away: an old sign-in revokes."""
    key = world.manager.create("alice", name="deploys", scope=Scope.tenant("acme"))
    token = form_token(client.get(f"/console/revoke?key={key.info.key_id}").text)

    reply = client.post("/console/revoke", {"token": token, "key": key.info.key_id})

    assert reply.status == 303
    [stored] = world.store.keys_of("alice")
    assert stored.revoked_at is not None


def test_the_hosts_re_sign_in_page_returns_only_to_this_site(client: Client) -> None:
    """The host's page, checking ``next`` with safe_next, sends a console path back and
    anything that leads elsewhere to its default: no open redirect."""
    for target in ("/console/", "/console/rotate?key=abc"):
        reply = client.get(f"{REAUTHENTICATE}?next={quote(target)}")
        assert reply.status in (302, 303)
        assert reply.headers["location"] == target
    for target in OFF_SITE:
        reply = client.get(f"{REAUTHENTICATE}?next={quote(target)}")
        assert reply.headers["location"] == "/console/", target


@pytest.mark.parametrize("answer", [1, "yes", "True", [True], None, object()])
def test_only_true_is_a_recent_sign_in(answer: object) -> None:
    """A hook that answers anything but True (a truthy string, 1, an object) fails closed."""
    world = make_world(recently_authenticated=lambda request: answer, reauthenticate_url="/re")
    client = Client("asgi", world.console)
    client.account = "alice"

    page = client.get("/console/")

    assert '<form id="create"' not in page.text
    assert link(page.text) == "/re?next=%2Fconsole%2F"


def test_the_hook_is_asked_only_of_a_signed_in_user() -> None:
    """A visitor who is not signed in goes to the sign-in page; the hook is not asked."""
    asked: list[object] = []

    def recent(request: Any) -> bool:
        asked.append(request)
        return True

    world = make_world(recently_authenticated=recent, reauthenticate_url="/re")
    for edge in ("asgi", "wsgi"):
        client = Client(edge, world.console)
        assert client.get("/console/").headers["location"] == SIGN_IN + "?next=%2Fconsole%2F"
        client.account = "alice"
        assert '<form id="create"' in client.get("/console/").text
    assert len(asked) == 2


def test_the_link_keeps_the_hosts_own_query() -> None:
    """A re-sign-in URL with a query of its own gets ``next`` appended to it."""
    world = make_world(
        recently_authenticated=lambda request: False,
        reauthenticate_url="https://id.example/login?prompt=login&max_age=0#top",
    )
    client = Client("wsgi", world.console)
    client.account = "alice"

    href = link(client.get("/console/").text)

    assert href == "https://id.example/login?prompt=login&max_age=0&next=%2Fconsole%2F#top"


@pytest.mark.parametrize("base", ["//evil.example/", "/\\evil.example/", "/\t/evil.example/"])
def test_a_mount_point_that_is_no_local_path_sends_no_next(base: str) -> None:
    """Should the mount point read as another site, the link carries no ``next`` at all."""
    world = make_world(step_up=True)
    visit = Visit(method="GET", path="/", base=base, origin="http://h", account_id="alice")

    page = world.console.handle(visit).body.decode()

    assert link(page) == REAUTHENTICATE


def test_setup_refuses_half_a_step_up() -> None:
    """Both hooks or neither; a hook that is no function; an empty URL: refused when built."""
    problems: list[dict[str, Any]] = [
        {"recently_authenticated": lambda request: True},
        {"reauthenticate_url": "/re"},
        {"recently_authenticated": True, "reauthenticate_url": "/re"},
        {"recently_authenticated": lambda request: True, "reauthenticate_url": ""},
    ]
    for options in problems:
        with pytest.raises(ConsoleSetupError, match=r"recently_authenticated|reauthenticate_url"):
            make_world(**options)


def test_wsgi_and_django_refuse_an_async_hook() -> None:
    """No event loop to await it: refused when the app is built, saying what to do."""
    from keyturn.console.django import console_urls

    async def recent(request: Any) -> bool:
        return True

    console = make_world(recently_authenticated=recent, reauthenticate_url="/re").console
    with pytest.raises(ConsoleSetupError, match=r"console\.asgi\(\)"):
        console.wsgi()
    with pytest.raises(ConsoleSetupError, match="plain functions"):
        console_urls(console)


def test_an_async_hook_over_an_async_manager_under_asgi() -> None:
    """Under ASGI a coroutine function is awaited, with an AsyncKeyManager behind the pages:
    refused while not recent, created once recent."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    seed(membership)
    recent = {"now": False}

    async def recently(request: Any) -> bool:
        return recent["now"] and request.cookies.get(ACCOUNT_COOKIE) == "alice"

    manager = AsyncKeyManager(Awaited(store), Awaited(membership))  # type: ignore[arg-type]
    console = Console(
        manager,
        signed_in=signed_in,
        sign_in_url=SIGN_IN,
        recently_authenticated=recently,
        reauthenticate_url="/re",
    )
    app = Starlette(routes=[Mount("/console", app=console.asgi())])
    origin = {"Origin": "http://testserver"}

    with TestClient(app, follow_redirects=False, cookies={ACCOUNT_COOKIE: "alice"}) as client:
        page = client.get("/console/")
        assert link(page.text) == "/re?next=%2Fconsole%2F"
        recent["now"] = True
        token = form_token(client.get("/console/").text)
        recent["now"] = False
        refused = client.post("/console/", data=create_form(token), headers=origin)
        assert refused.status_code == 403
        recent["now"] = True
        created = client.post("/console/", data=create_form(token), headers=origin)
        assert created.status_code == 201, created.text

    assert [key.name for key in store.keys_of("alice")] == ["CI deploys"]


SITE = "https://console.example"


def browsers_reading(target: str) -> str:
    """Where a browser goes for a Location of *target* on SITE: it drops tabs and line
    breaks, trims C0 controls and spaces at the ends, and reads a backslash as a slash."""
    cleaned = re.sub(r"[\t\n\r]", "", target).strip("".join(map(chr, range(0x21))))
    return urljoin(SITE + "/here/", cleaned.replace("\\", "/"))


def assert_stays_on_the_site(target: str) -> None:
    answer = safe_next(target, "/default")
    assert answer in (target, "/default")
    for reading in (urljoin(SITE + "/here/", answer), browsers_reading(answer)):
        assert urlsplit(reading).netloc == "console.example", (target, reading)


# What URL readers treat specially: every sequence of up to three of these is tried.
URL_PIECES = [
    "/",
    "//",
    "\\",
    "\t",
    "\n",
    "\r",
    " ",
    "\x00",
    "http:",
    "x.example",
    "/x.example",
    ":",
    "@",
    "?",
    "#",
    "%2F",
]


def test_safe_next_never_leaves_the_site_on_any_short_sequence() -> None:
    """Every sequence of up to three special pieces (4,369 targets) gives a path that stays
    on the site, read the way Python or a browser reads it, or the default."""
    tried = 0
    for length in range(4):
        for pieces in itertools.product(URL_PIECES, repeat=length):
            assert_stays_on_the_site("".join(pieces))
            tried += 1
    assert tried == 1 + 16 + 16**2 + 16**3


@given(st.text())
def test_safe_next_never_leaves_the_site(target: str) -> None:
    """Whatever text it gets, safe_next answers a path that stays on the site, or the
    default."""
    assert_stays_on_the_site(target)


@given(st.sampled_from(["/", "/console/", "/a/b?c=d&e=%2F%2F#f"]), st.text())
def test_safe_next_keeps_local_paths(path: str, tail: str) -> None:
    """A path on the site comes back as it is, whatever printable tail it has."""
    target = path + "".join(c for c in tail if c.isprintable() and c not in " \\")
    assume(not target.startswith("//"))
    assert safe_next(target) == target


def test_safe_next_refuses_every_way_off_the_site() -> None:
    """The known ways off a site each give the default."""
    for target in (*OFF_SITE, None, 7, b"/console/"):
        assert safe_next(target, "/d") == "/d", target


# -- in the browser --------------------------------------------------------------------------


@pytest.fixture
def served(edge: str, browser: Any) -> Iterator[tuple[World, str]]:
    """A step-up console of *edge* on a real server: its world and its base URL."""
    world = make_world(edge=edge, step_up=True)
    with serving(edge, world.console) as origin:
        yield world, f"{origin}/console/"


def test_in_the_browser_sign_in_again_then_create_and_rotate(
    browser: Any, edge: str, served: tuple[World, str]
) -> None:
    """Signed in an hour ago: the create form is replaced by the re-sign-in link; signing in
    again comes back to the list, where a key is created. Later, rotating asks again and
    comes back to that key's rotate page, where it rotates."""
    world, url = served
    context = browser.new_context(timezone_id="Europe/Paris")
    sign_in(context, edge, "alice", url)
    # Where the host's re-sign-in page sets it: on the whole site (path "/").
    old_sign_in = {"name": SIGNED_IN_AT_COOKIE, "value": LONG_AGO, "path": "/"}
    context.add_cookies([{**old_sign_in, "domain": urlsplit(url).hostname}])
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.goto(url)

    expect()(page.locator("#step-up")).to_contain_text("Confirm it’s you to create a key.")
    expect()(page.locator("#create")).to_have_count(0)
    page.click("#reauthenticate")
    expect()(page).to_have_url(url)
    page.fill("#name", "CI deploys")
    page.click("#create-button")
    expect()(page.locator("h1")).to_contain_text("CI deploys")
    expect()(page.locator("#secret")).to_have_value(re.compile(r"^rma_"))

    world.clock.now = NOW + RECENT  # the sign-in ages
    page.goto(url)
    expect()(page.locator("#step-up")).to_be_visible()
    [key] = world.store.keys_of("alice")
    page.locator(f"tr[data-key='{key.key_id}'] a.rotate").click()
    expect()(page.locator("#step-up")).to_contain_text("Confirm it’s you to rotate a key.")
    page.click("#reauthenticate")
    expect()(page).to_have_url(f"{url}rotate?key={key.key_id}")
    page.get_by_role("button", name=re.compile("^Rotate")).click()
    expect()(page.locator("#secret")).to_have_value(re.compile(r"^rma_"))
    assert len(world.store.keys_of("alice")) == 2
    context.close()


def test_in_the_browser_the_re_sign_in_page_stays_on_the_site(
    browser: Any, edge: str, served: tuple[World, str]
) -> None:
    """A crafted ``next`` aiming at another origin (a loopback port nobody serves) leaves the
    browser on the console, read as Chromium reads it."""
    _, url = served
    origin = url.removesuffix("/console/")
    context = browser.new_context()
    sign_in(context, edge, "alice", url)
    page = context.new_page()
    page.set_default_timeout(10_000)
    for target in (
        "http://127.0.0.1:9/",
        "//127.0.0.1:9/",
        "/\\127.0.0.1:9/",
        "/\t/127.0.0.1:9/",
        "\\/127.0.0.1:9/",
    ):
        page.goto(f"{origin}{REAUTHENTICATE}?next={quote(target)}")
        assert page.url == url, target
    context.close()
