"""The console's pages through every edge (Starlette's, Werkzeug's and Django's test clients).

Every test runs against the ASGI, the WSGI and the Django console and must pass identically
(but for the two differences that Django itself makes, named where they are tested).
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyturn import KeyManager, Lifetime, Scope, Status
from keyturn.console import Console, ConsoleSetupError, preview
from keyturn.console._visit import CSP, MAX_FORM_BYTES
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from tests.console.support import SIGN_IN, Client, World, form_token, make_world, signed_in

SECURITY_HEADERS = {
    "cache-control": "no-store",
    "content-security-policy": CSP,
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
}


def create_form(client: Client, **fields: str) -> dict[str, str]:
    """A create form as the page serves it, with *fields* changed."""
    token = form_token(client.get("/console/").text)
    return {
        "token": token,
        "name": "CI deploys",
        "lifetime": "30d",
        "date": "",
        "tz": "",
        "scope": "tenant:acme",
        **fields,
    }


def test_visitor_not_signed_in_is_sent_to_sign_in_with_next(client: Client) -> None:
    """Without an account the console answers every page with a redirect to the sign-in URL,
    whose ``next`` is the page to come back to (the key list, after a form)."""
    client.account = None
    for path in ("/console/", "/console/revoke?key=x", "/console/preview", "/console/activity"):
        reply = client.get(path)
        assert reply.status == 303
        assert reply.headers["location"] == SIGN_IN + "?" + urlencode({"next": path})
    posted = client.post("/console/revoke", {"key": "x"})
    assert posted.headers["location"] == SIGN_IN + "?next=%2Fconsole%2F"


def test_a_sign_in_url_with_its_own_query_keeps_it() -> None:
    """``next`` joins a query the sign-in URL has; one that names its own ``next`` is kept."""
    for url, expected in (
        ("/login?via=console", "/login?via=console&next=%2Fconsole%2F"),
        ("/login?next=/home", "/login?next=/home"),
    ):
        console = Console(make_world().manager, signed_in=signed_in, sign_in_url=url)
        assert Client("asgi", console).get("/console/").headers["location"] == expected


@pytest.mark.parametrize(
    "path", ["/console/", "/console/preview?lifetime=1d", "/console/revoke?key=no", "/console/x"]
)
def test_every_page_carries_the_security_headers(client: Client, path: str) -> None:
    """no-store, a CSP without inline script or framing, no referrer, nosniff: on every page."""
    reply = client.get(path)
    expected = dict(SECURITY_HEADERS)
    if client.edge == "django":  # under no-referrer a form's Origin is "null": Django refuses it
        expected["referrer-policy"] = "same-origin"
    for name, value in expected.items():
        assert reply.headers[name] == value
    assert "'unsafe-inline'" not in CSP
    assert "frame-ancestors 'none'" in CSP
    assert "<script>" not in reply.text  # scripts only from the console's own file


def test_static_assets_are_served_by_the_console(client: Client) -> None:
    """The script and the stylesheet come from the console itself, under its CSP."""
    script = client.get("/console/static/console.js")
    assert script.status == 200
    assert script.headers["content-type"].startswith("text/javascript")
    assert "Intl.DateTimeFormat" in script.text
    assert client.get("/console/static/console.css").status == 200


def test_create_shows_the_secret_once_with_no_store(client: Client, world: World) -> None:
    """A create answers 201 with the full secret in the body only, never in a header."""
    reply = client.post("/console/", create_form(client))
    assert reply.status == 201
    [key] = world.store.keys_of("alice")
    secret = reply.text.split('id="secret" type="text" readonly value="')[1].split('"')[0]
    assert secret.startswith("rma_")
    assert secret.endswith(key.hint[-4:])
    assert "will not be shown again" in reply.text
    assert reply.headers["cache-control"] == "no-store"
    assert not any(secret in value for value in reply.headers.values())
    assert secret not in client.get("/console/").text


def test_resubmitting_a_create_form_makes_no_second_key(client: Client, world: World) -> None:
    """The create form's token works once: the replay gets 409, no secret, no new key."""
    form = create_form(client)
    assert client.post("/console/", form).status == 201
    replay = client.post("/console/", form)
    assert replay.status == 409
    assert "rma_" not in replay.text.replace("rma_…", "")
    assert len(world.store.keys_of("alice")) == 1


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ],
)
def test_cross_origin_post_is_refused(
    client: Client, world: World, headers: dict[str, str]
) -> None:
    """A form sent from another origin is refused with 403, even with a valid token."""
    reply = client.post("/console/", create_form(client), headers=headers)
    assert reply.status == 403
    assert world.store.keys_of("alice") == []


def test_post_without_a_valid_token_is_refused(client: Client, world: World) -> None:
    """No token, a forged one (non-ASCII too), or one issued to another account: 403 and
    nothing created.
    """
    form = create_form(client)
    bob = Client(client.edge, world.console)
    bob.account = "bob"
    for token in ("", "x.1.y", "x.1.\u00e9", "x.\u00b2.y", form_token(bob.get("/console/").text)):
        assert client.post("/console/", {**form, "token": token}).status == 403
    assert world.store.keys_of("alice") == []


def test_an_api_key_cannot_use_the_console(client: Client, world: World) -> None:
    """A request carrying Authorization: Bearer rma_... is refused, signed in or not."""
    created = world.manager.create("alice", name="k", scope=Scope.tenant("acme"))
    bearer = {"Authorization": f"Bearer {created.secret}"}
    assert client.get("/console/", headers=bearer).status == 403
    assert client.post("/console/", create_form(client), headers=bearer).status == 403
    client.account = None
    refused = client.get("/console/", headers={"Authorization": "bearer RMA_x"})
    assert refused.status == 403
    assert "API keys cannot manage keys" in refused.text
    assert len(world.store.keys_of("alice")) == 1


def test_user_strings_are_escaped(client: Client, world: World) -> None:
    """A key named <script> is shown as text on the created page and in the list."""
    name = '<script>alert("x")</script>'
    created = client.post("/console/", create_form(client, name=name))
    listed = client.get("/console/")
    for page in (created.text, listed.text):
        assert name not in page
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "  "}, "The key name is required"),
        ({"name": "x" * 101}, "the maximum is 100"),
        ({"lifetime": "forever"}, "Choose a lifetime"),
        ({"lifetime": "custom", "tz": "Europe/Paris"}, "Choose the custom expiry date"),
        ({"lifetime": "custom", "date": "2026-06-20"}, "Choose your time zone"),
        (
            {"lifetime": "custom", "date": "2026-06-15", "tz": "Europe/Paris"},
            "Choose a date from 2026-06-16 to 2027-06-15",
        ),
        ({"lifetime": "custom", "date": "15/06/2026", "tz": "UTC"}, "YYYY-MM-DD"),
        ({"scope": "tenant:globex"}, "Choose a scope"),
        ({"scope": "organization:globex-hq"}, "Choose a scope"),
    ],
)
def test_the_server_refuses_what_the_form_disables(
    client: Client, world: World, fields: dict[str, str], message: str
) -> None:
    """Bad input gets 400 with a clear message next to the field, and the values kept."""
    reply = client.post("/console/", create_form(client, **fields))
    assert reply.status == 400
    assert message in reply.text
    assert "The key was not created" in reply.text
    assert world.store.keys_of("alice") == []


def test_a_custom_date_expires_at_the_end_of_that_day(client: Client, world: World) -> None:
    """A custom date in Auckland expires at midnight after it, Auckland time."""
    reply = client.post(
        "/console/",
        create_form(client, lifetime="custom", date="2026-07-01", tz="Pacific/Auckland"),
    )
    assert reply.status == 201
    [key] = world.store.keys_of("alice")
    assert key.expires_at == datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
    assert "2026-07-01, end of day NZST" in reply.text
    assert "2026-07-02" not in reply.text


def test_list_shows_only_own_keys_and_filters_from_the_url(client: Client, world: World) -> None:
    """Filters by status and scope are query parameters; bob's keys never show."""
    manager = world.manager
    manager.create("alice", name="tenant key", scope=Scope.tenant("acme"))
    research = Scope.organization("acme-research", tenant_id="acme")
    revoked = manager.create("alice", name="research key", scope=research)
    manager.revoke("alice", revoked.info.key_id)
    manager.create("bob", name="bob key", scope=Scope.tenant("acme"))

    def names(query: dict[str, str]) -> list[str]:
        text = client.get("/console/?" + urlencode(query)).text
        return [n for n in ("tenant key", "research key", "bob key") if f">{n}<" in text]

    assert names({}) == ["tenant key", "research key"]
    assert names({"status": "Revoked"}) == ["research key"]
    assert names({"status": "Active"}) == ["tenant key"]
    assert names({"scope": "organization:acme-research"}) == ["research key"]
    assert names({"scope": "tenant:acme", "status": "Revoked"}) == []
    page = client.get("/console/?status=Revoked").text
    assert "<option selected>Revoked</option>" in page


def test_revoke_asks_first_then_revokes_for_good(client: Client, world: World) -> None:
    """The confirmation names the key; the POST revokes and redirects to the list."""
    created = world.manager.create("alice", name="old deploy", scope=Scope.tenant("acme"))
    key_id = created.info.key_id
    confirm = client.get(f"/console/revoke?key={key_id}")
    assert confirm.status == 200
    assert "Revoke the key “old deploy”?" in confirm.text
    assert world.manager.list("alice")[0].status is Status.ACTIVE
    form = {"token": form_token(confirm.text), "key": key_id}
    done = client.post("/console/revoke", form)
    assert done.status == 303
    assert done.headers["location"] == f"/console/?revoked={key_id}"
    assert world.manager.list("alice")[0].status is Status.REVOKED
    assert "is revoked: it no longer works" in client.get(done.headers["location"]).text
    again = client.post("/console/revoke", form)
    assert again.status == 409
    assert "Revoke the key" not in client.get(f"/console/revoke?key={key_id}").text


def test_another_users_key_cannot_be_revoked(client: Client, world: World) -> None:
    """Bob's key is not found for alice, on the confirmation and on the POST."""
    bobs = world.manager.create("bob", name="bob key", scope=Scope.tenant("acme"))
    mine = world.manager.create("alice", name="mine", scope=Scope.tenant("acme"))
    key_id = bobs.info.key_id
    assert client.get(f"/console/revoke?key={key_id}").status == 404
    token = form_token(client.get(f"/console/revoke?key={mine.info.key_id}").text)
    assert client.post("/console/revoke", {"token": token, "key": key_id}).status == 404
    create_token = form_token(client.get("/console/").text)  # a token of another form
    assert client.post("/console/revoke", {"token": create_token, "key": key_id}).status == 403
    assert world.manager.list("bob")[0].status is Status.ACTIVE


def test_starting_scope_is_configurable(world: World) -> None:
    """start_on='organization' preselects the account's default organization."""
    for start_on, selected in (
        ("tenant", "tenant:acme"),
        ("organization", "organization:acme-main"),
    ):
        other = make_world(start_on=start_on)  # type: ignore[arg-type]
        client = Client("asgi", other.console)
        client.account = "alice"
        assert f'<option value="{selected}" selected>' in client.get("/console/").text


def test_mount_point_without_slash_redirects(client: Client) -> None:
    """/console redirects to /console/, so relative links resolve under the mount."""
    reply = client.get("/console")
    # Django's own APPEND_SLASH (CommonMiddleware) answers there, with a 301.
    assert reply.status in ((301,) if client.edge == "django" else (307, 308))
    assert reply.headers["location"].endswith("/console/")


def test_head_has_no_body_and_wrong_method_is_405(client: Client) -> None:
    """HEAD answers as GET without a body; PUT gets 405 with Allow."""
    assert client.request("HEAD", "/console/").text == ""
    reply = client.request("PUT", "/console/revoke")
    assert reply.status == 405
    assert reply.headers["allow"] == "GET, HEAD, POST"


def test_oversized_or_foreign_forms_are_refused(client: Client, world: World) -> None:
    """A body over the limit gets 413, a non-form body 415; nothing is created."""
    form = create_form(client)
    big = urlencode({**form, "name": "x" * MAX_FORM_BYTES}).encode()
    assert client.post("/console/", big).status == 413
    as_json = client.post("/console/", b"{}", headers={"Content-Type": "application/json"})
    assert as_json.status == 415
    assert world.store.keys_of("alice") == []


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fields=st.dictionaries(
        st.sampled_from(["name", "lifetime", "date", "tz", "scope", "token", "extra"]),
        st.text(max_size=40),
    )
)
def test_any_form_gets_a_page_never_a_crash(client: Client, fields: dict[str, str]) -> None:
    """Whatever a form holds, the console answers with a page: never a 500."""
    form = {**create_form(client), **fields}
    assert client.post("/console/", form).status in (201, 400, 403, 409)


def test_preview_gives_bounds_and_expiry_in_the_users_zone(client: Client, world: World) -> None:
    """The JSON preview's bounds follow the zone: Auckland is a day ahead of Los Angeles."""
    world.clock.now = datetime(2026, 6, 30, 12, 0, tzinfo=UTC)  # Auckland: 1 July, 00:00
    auckland = client.get("/console/preview?lifetime=1d&tz=Pacific/Auckland")
    assert auckland.headers["content-type"] == "application/json"
    assert '"min": "2026-07-02", "max": "2027-07-01"' in auckland.text
    angeles = client.get("/console/preview?lifetime=1d&tz=America/Los_Angeles")
    assert '"min": "2026-07-01", "max": "2027-06-30"' in angeles.text


def test_preview_on_a_dst_change_day() -> None:
    """In Los Angeles, 8 March 2026 has 23 hours; its end is 00:00 PDT, 07:00 UTC."""
    now = datetime(2026, 3, 7, 20, 0, tzinfo=UTC)  # 12:00 PST on 7 March
    shown = preview("custom", "2026-03-08", "America/Los_Angeles", now)
    assert shown.expires == "2026-03-08, end of day PDT"
    assert (shown.first_day, shown.last_day) == (date(2026, 3, 8), date(2027, 3, 7))
    last = preview("custom", "2027-03-07", "America/Los_Angeles", now)
    assert last.expires == "2027-03-07 12:00 PST"  # one year from now comes first


def test_console_needs_a_membership_that_lists_organizations() -> None:
    """A provider without organizations_of is refused when the console is built."""

    class Minimal:
        def get_organization(self, organization_id: str) -> None:
            return None

        def get_default_organization(self, tenant_id: str) -> None:
            return None

        def get_role(self, account_id: str, organization_id: str) -> None:
            return None

        def reaches_tenant(self, account_id: str, tenant_id: str) -> bool:
            return False

    manager = KeyManager(MemoryKeyStore(), Minimal())
    with pytest.raises(ConsoleSetupError, match="organizations_of"):
        Console(manager, signed_in=lambda r: None, sign_in_url="/login")
    good = KeyManager(MemoryKeyStore(), MemoryMembership())
    with pytest.raises(ConsoleSetupError, match="start_on"):
        Console(good, signed_in=lambda r: None, sign_in_url="/login", start_on="org")  # type: ignore[arg-type]
    with pytest.raises(ConsoleSetupError, match="sign_in_url"):
        Console(good, signed_in=lambda r: None, sign_in_url="")


def test_asgi_console_awaits_an_async_sign_in(world: World) -> None:
    """An async signed_in is awaited by the ASGI edge."""

    async def signed_in(request: object) -> str:
        return "bob"

    console = Console(world.manager, signed_in=signed_in, sign_in_url=SIGN_IN)
    page = Client("asgi", console).get("/console/")
    assert page.status == 200
    assert "Signed in as <strong>bob</strong>" in page.text


def test_repeated_query_fields_read_the_same_on_both_edges(client: Client, world: World) -> None:
    """?status=Revoked&status=Active filters on the first value, on either edge."""
    world.manager.create("alice", name="live", scope=Scope.tenant("acme"))
    page = client.get("/console/?status=Revoked&status=Active")
    assert ">live<" not in page.text
    assert "<option selected>Revoked</option>" in page.text


def test_the_secret_never_reaches_a_log(
    client: Client, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """Creating a key logs nothing that holds its secret, at any level."""
    caplog.set_level("DEBUG")
    reply = client.post("/console/", create_form(client))
    secret = reply.text.split('readonly value="')[1].split('"')[0]
    assert secret.startswith("rma_")
    assert secret not in caplog.text


class Outage:
    """Makes *store*'s writes and lists fail while ``down`` is set, as a database that went
    away. It patches the instance the manager already holds: its caller was chosen at
    construction, so a store swapped in afterwards would never be asked."""

    def __init__(self, store: MemoryKeyStore) -> None:
        self.down = False
        for name in ("add_key", "keys_of"):
            setattr(store, name, self._failing(getattr(store, name)))

    def _failing(self, method: Any) -> Any:
        def call(*args: Any) -> Any:
            if self.down:
                raise ConnectionError("database unreachable")
            return method(*args)

        return call


def test_a_failing_store_gets_a_503_page_and_the_form_stays_usable(
    client: Client, world: World
) -> None:
    """Store down: 503 with Retry-After, no key; once it is back the same form creates one."""
    store = world.store
    outage = Outage(store)
    form = create_form(client)
    outage.down = True
    reply = client.post("/console/", form)
    assert reply.status == 503
    assert reply.headers["retry-after"] == "5"
    assert "Try again in a moment" in reply.text
    assert client.get("/console/").status == 503
    outage.down = False
    assert client.post("/console/", form).status == 201
    assert len(store.keys_of("alice")) == 1


def test_a_scope_lost_between_form_and_create_is_explained(client: Client, world: World) -> None:
    """A provider that lists an organization but denies the role: 400 on the scope field."""
    form = create_form(client, scope="organization:acme-research")
    world.membership.get_role = lambda account_id, organization_id: None  # type: ignore[method-assign]
    reply = client.post("/console/", form)
    assert reply.status == 400
    assert 'id="scope-error"' in reply.text
    assert "has no role in organization" in reply.text


def test_a_form_that_is_not_utf8_is_refused(client: Client, world: World) -> None:
    """Bytes that are not UTF-8 carry no token: 403, nothing created."""
    assert client.post("/console/", b"name=\xff\xfe&token=x").status == 403
    assert world.store.keys_of("alice") == []


def test_standalone_asgi_console_answers_lifespan_and_ignores_websockets(world: World) -> None:
    """Served on its own, the ASGI console completes the lifespan and accepts no WebSocket."""
    import asyncio

    app = world.console.asgi()
    assert repr(app).startswith("ConsoleASGI(Console(")
    sent: list[dict[str, Any]] = []
    events = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

    async def receive() -> dict[str, Any]:
        return next(events)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app({"type": "lifespan"}, receive, send))
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    sent.clear()
    asyncio.run(app({"type": "websocket", "path": "/"}, receive, send))
    assert sent == []


def test_without_script_times_follow_a_tz_parameter(client: Client, world: World) -> None:
    """?tz=Zone renders the list's times there, and the filter form keeps it."""
    world.manager.create("alice", name="zoned", scope=Scope.tenant("acme"))
    page = client.get("/console/?tz=Pacific/Auckland").text
    assert "2026-07-15, end of day NZST" in page  # 12:00 UTC on 15 June + 30 days
    assert '<input type="hidden" name="tz" value="Pacific/Auckland">' in page
    assert "2026-07-15 12:00 UTC" in client.get("/console/?tz=Not/AZone").text


def test_an_inactive_key_shows_as_such_and_can_be_revoked(client: Client, world: World) -> None:
    """A key whose creator left its organization is Inactive, offered for revoke, revocable."""
    research = Scope.organization("acme-research", tenant_id="acme")
    created = world.manager.create("alice", name="left behind", scope=research)
    world.membership.remove_member("alice", "acme-research")
    page = client.get("/console/?status=Inactive").text
    assert "‖</span> Inactive" in page
    assert f"revoke?key={created.info.key_id}" in page
    confirm = client.get(f"/console/revoke?key={created.info.key_id}")
    form = {"token": form_token(confirm.text), "key": created.info.key_id}
    assert client.post("/console/revoke", form).status == 303
    assert world.manager.list("alice")[0].status is Status.REVOKED


def row_of(html: str, key_id: str) -> str:
    """The list row of one key, as HTML."""
    match = re.search(rf'<tr data-key="{key_id}"[^>]*>(.*?)</tr>', html, re.DOTALL)
    assert match is not None, f"no row for {key_id}"
    return match.group(1)


def note_of(html: str, key_id: str) -> str:
    """The note row under one key's row (a leak report), as HTML."""
    match = re.search(rf'<tr class="note" data-note-for="{key_id}">(.*?)</tr>', html, re.DOTALL)
    assert match is not None, f"no note for {key_id}"
    return match.group(1)


def test_keys_expiring_within_7_days_are_marked_with_the_time_left(
    client: Client, world: World
) -> None:
    """Working keys expiring within 7 days carry a text badge with the time left; others none."""
    tenant = Scope.tenant("acme")
    day = world.manager.create("alice", name="day", scope=tenant, expiry=Lifetime.DAYS_1)
    week = world.manager.create("alice", name="week", scope=tenant, expiry=Lifetime.DAYS_7)
    month = world.manager.create("alice", name="month", scope=tenant, expiry=Lifetime.DAYS_30)
    gone = world.manager.create("alice", name="gone", scope=tenant, expiry=Lifetime.DAYS_1)
    short = world.manager.create("alice", name="short", scope=tenant, expiry=Lifetime.HOURS_3)
    world.manager.revoke("alice", gone.info.key_id)
    world.clock.now += timedelta(hours=2, minutes=59, seconds=30)
    page = client.get("/console/").text
    assert "◔</span> expires in 21 hours</span>" in row_of(page, day.info.key_id)
    assert "expires in 6 days" in row_of(page, week.info.key_id)
    assert "less than a minute" in row_of(page, short.info.key_id)
    for quiet in (month, gone):
        assert "badge-expiring" not in row_of(page, quiet.info.key_id)
    world.clock.now += timedelta(minutes=1)  # "short" is Expired: nothing left to warn about
    assert "badge-expiring" not in row_of(client.get("/console/").text, short.info.key_id)
    confirm = client.get(f"/console/revoke?key={week.info.key_id}").text
    assert "(expires in 6 days)" in confirm


def test_the_expiry_warning_window_is_configurable(world: World) -> None:
    """expiring_within widens or turns off the mark; a negative or non-timedelta one is refused."""
    world.manager.create("alice", name="month", scope=Scope.tenant("acme"))
    for within, marked in ((timedelta(days=30), True), (timedelta(0), False)):
        console = Console(
            world.manager,
            signed_in=world.console.signed_in,
            sign_in_url=SIGN_IN,
            expiring_within=within,
        )
        client = Client("asgi", console)
        client.account = "alice"
        assert ("expires in 30 days" in client.get("/console/").text) is marked
    for bad in (timedelta(days=-1), 7):
        with pytest.raises(ConsoleSetupError, match="expiring_within"):
            Console(
                world.manager,
                signed_in=world.console.signed_in,
                sign_in_url=SIGN_IN,
                expiring_within=bad,  # type: ignore[arg-type]
            )


def test_a_key_reported_leaked_shows_where_and_when_as_text(client: Client, world: World) -> None:
    """The list and the revoke confirmation say "reported leaked at <url>, <time>", escaped,
    with no link to the URL; once revoked, the report stays but the call to revoke goes."""
    created = world.manager.create("alice", name="deploy", scope=Scope.tenant("acme"))
    key_id = created.info.key_id
    url = 'https://code.example/acme/app/blob/main/.env?a=1&b="><script>x</script>'
    assert world.store.report_leak(key_id, url, datetime(2026, 6, 14, 9, 30, tzinfo=UTC))
    escaped = "https://code.example/acme/app/blob/main/.env?a=1&amp;b=&#34;&gt;&lt;script&gt;"
    page = client.get("/console/?tz=Europe/Paris").text
    assert '<span aria-hidden="true">⚠</span> Leaked</span>' in row_of(page, key_id)
    note = note_of(page, key_id)
    assert f'reported leaked</strong> at <span class="url">{escaped}x&lt;/script&gt;</span>' in note
    assert '<time datetime="2026-06-14T09:30:00+00:00">2026-06-14 11:30 CEST</time>' in note
    assert "revoke it, then create a new key" in note
    assert "<script>x" not in page and "code.example" not in " ".join(re.findall("<a [^>]*>", page))
    confirm = client.get(f"/console/revoke?key={key_id}").text
    assert f'Reported leaked</strong> at <span class="url">{escaped}' in confirm
    assert "revoke it now" in confirm
    client.post("/console/revoke", {"token": form_token(confirm), "key": key_id})
    after = client.get(f"/console/revoke?key={key_id}").text
    assert "Reported leaked</strong> at" in after and "revoke it now" not in after
    listed = client.get("/console/").text
    assert "Leaked</span>" in row_of(listed, key_id)
    assert "was reported leaked" in note_of(listed, key_id)
    assert "revoke it, then" not in note_of(listed, key_id)


def _rows(html: str) -> list[str]:
    """The key ids of the list's rows, in order."""
    return re.findall(r'<tr data-key="([^"]+)"', html)


def _secret(html: str) -> str:
    return html.split('id="secret" type="text" readonly value="')[1].split('"')[0]


def test_rotate_shows_the_new_secret_once_and_pairs_the_rows(client: Client, world: World) -> None:
    """Rotate asks first; the POST shows the new secret once; the list shows the pair, the
    new key's row above the old one, with the note that the new key was not seen yet."""
    old = world.manager.create("alice", name="deploys", scope=Scope.tenant("acme"))
    world.clock.now += timedelta(days=1)
    between = world.manager.create("alice", name="between", scope=Scope.tenant("acme"))
    world.clock.now += timedelta(days=1)
    page = client.get(f"/console/rotate?key={old.info.key_id}")
    assert page.status == 200 and "Rotate the key “deploys”?" in page.text
    form = {"token": form_token(page.text), "key": old.info.key_id}
    reply = client.post("/console/rotate", form)
    assert reply.status == 201
    secret = _secret(reply.text)
    new = world.manager.list("alice")[0]
    assert secret.startswith("rma_") and secret.endswith(new.hint[-4:])
    assert (new.name, new.replaces, new.revoke_old_on_first_use) == (
        "deploys",
        old.info.key_id,
        False,
    )
    assert f"It replaces the key <code>{old.info.hint}</code>" in reply.text
    assert not any(secret in value for value in reply.headers.values())
    listing = client.get("/console/").text
    assert secret not in listing
    assert _rows(listing) == [new.key_id, old.info.key_id, between.info.key_id]
    assert f"New key <code>{new.hint}</code> not seen yet." in listing
    assert f'New key<span class="sr">, replaces {old.info.hint}</span>' in listing
    assert "Keep this old key" in listing
    replay = client.post("/console/rotate", form)
    assert replay.status == 409 and "already sent" in replay.text
    assert len(world.store.keys_of("alice")) == 3


def test_the_auto_revoke_checkbox_is_the_creator_s_recorded_choice(
    client: Client, world: World
) -> None:
    """Checked, the choice is stored on the new key; the new key's first use revokes the old
    key, and the pair's note disappears with it."""
    old = world.manager.create("alice", name="deploys", scope=Scope.tenant("acme"))
    world.clock.now += timedelta(minutes=1)  # the new key lists first
    page = client.get(f"/console/rotate?key={old.info.key_id}")
    form = {"token": form_token(page.text), "key": old.info.key_id, "revoke_old": "1"}
    reply = client.post("/console/rotate", form)
    assert reply.status == 201 and "revoked automatically" in reply.text
    new = world.manager.list("alice")[0]
    assert new.revoke_old_on_first_use is True
    assert "is revoked automatically when the new key is first used" in client.get("/console/").text
    world.store.mark_used(new.key_id, world.clock.now)  # what a request with it records
    listing = client.get("/console/").text
    assert world.manager.list("alice")[1].status is Status.REVOKED
    assert "not seen yet" not in listing and "Revoke old key" not in listing
    assert _rows(listing) == [new.key_id, old.info.key_id]  # still a pair


def test_a_confirmed_rotation_revokes_the_old_key_in_one_click(
    client: Client, world: World
) -> None:
    """Once the new key was used, the note says when and holds the old key's revoke button;
    before, the revoke confirmation warns that the new key is unconfirmed."""
    old = world.manager.create("alice", name="deploys", scope=Scope.tenant("acme"))
    world.clock.now += timedelta(minutes=1)  # the new key lists first
    new = world.manager.rotate("alice", old.info.key_id)
    confirm = client.get(f"/console/revoke?key={old.info.key_id}").text
    assert "is unconfirmed:</strong> it has not been used yet" in confirm
    world.clock.now += timedelta(hours=2)
    world.store.mark_used(new.info.key_id, world.clock.now)
    world.store.mark_used(new.info.key_id, world.clock.now + timedelta(hours=1))  # not the first
    listing = client.get("/console/").text
    assert f"New key <code>{new.info.hint}</code> first used at <time" in listing
    assert 'datetime="2026-06-15T14:01:00+00:00"' in listing
    assert "revoke the old one, <code>" in listing
    match = re.search(r'class="rotation confirmed">\s*<input[^>]*value="([^"]+)"', listing)
    assert match is not None
    done = client.post("/console/revoke", {"token": match[1], "key": old.info.key_id})
    assert done.status == 303
    assert world.manager.list("alice")[1].status is Status.REVOKED
    assert "unconfirmed" not in client.get(f"/console/revoke?key={new.info.key_id}").text


def test_what_cannot_be_rotated_is_explained(client: Client, world: World) -> None:
    """Another user's key: 404. Revoked, or already replaced: the page says so, and a POST
    gets the library's reason. A forged checkbox value or another form's token: refused."""
    bobs = world.manager.create("bob", name="bob key", scope=Scope.tenant("acme"))
    mine = world.manager.create("alice", name="mine", scope=Scope.tenant("acme"))
    gone = world.manager.create("alice", name="gone", scope=Scope.tenant("acme"))
    world.manager.revoke("alice", gone.info.key_id)
    token = form_token(client.get(f"/console/rotate?key={mine.info.key_id}").text)
    assert client.get(f"/console/rotate?key={bobs.info.key_id}").status == 404
    assert client.post("/console/rotate", {"token": token, "key": bobs.info.key_id}).status == 404
    page = client.get(f"/console/rotate?key={gone.info.key_id}").text
    assert "cannot be rotated now" in page and 'action="/console/rotate"' not in page
    refused = client.post("/console/rotate", {"token": token, "key": gone.info.key_id})
    assert refused.status == 409 and "create a new key instead" in refused.text
    forged = client.post(
        "/console/rotate", {"token": token, "key": mine.info.key_id, "revoke_old": "yes"}
    )
    assert forged.status == 400
    revoke_token = form_token(client.get(f"/console/revoke?key={mine.info.key_id}").text)
    assert (
        client.post("/console/rotate", {"token": revoke_token, "key": mine.info.key_id}).status
        == 403
    )
    new = client.post("/console/rotate", {"token": token, "key": mine.info.key_id})
    assert new.status == 201  # the refusals above used nothing up
    assert "already has a new key" in client.get(f"/console/rotate?key={mine.info.key_id}").text
    new_id = next(i.key_id for i in world.manager.list("alice") if i.replaces == mine.info.key_id)
    again = form_token(client.get(f"/console/rotate?key={new_id}").text)  # not bound to a key
    twice = client.post("/console/rotate", {"token": again, "key": mine.info.key_id})
    assert twice.status == 409 and "already has a replacement" in twice.text
    assert len(world.store.keys_of("alice")) == 3 and len(world.store.keys_of("bob")) == 1
