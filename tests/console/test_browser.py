"""The console in a real browser: Debian's Chromium driven by Playwright, on both edges.

Each test gets a fresh console with no keys, served by each edge (ASGI under uvicorn, WSGI
under Werkzeug's server, and the Django URLconf in a Django project under Werkzeug's server,
signed in through Django's sessions and guarded by its CSRF check) on a free 127.0.0.1
port, in a thread of this process, and stopped at its end. The server's clock is the
test's; the browser's time zone is emulated per test. Without Chromium or
Playwright these tests skip, saying why -- except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest

from keyturn import Lifetime, Scope, Status
from keyturn.console import local_time
from tests.console.support import (
    BROWSER_EDGES,
    NOW,
    World,
    expect,
    make_world,
    serving,
    sign_in,
)


@attrs.frozen
class Site:
    world: World
    url: str  # the console's base URL, with its trailing slash
    edge: str


@pytest.fixture(params=BROWSER_EDGES)
def site(request: pytest.FixtureRequest, browser: Any) -> Iterator[Site]:
    """A console of one edge with no keys and the clock at NOW, served for one test."""
    world = make_world(edge=request.param)
    with serving(request.param, world.console) as origin:
        yield Site(world, f"{origin}/console/", request.param)


def open_console(browser: Any, site: Site, *, zone: str = "Europe/Paris", width: int = 1000) -> Any:
    """A page signed in as alice, in a browser that lives in *zone*."""
    context = browser.new_context(timezone_id=zone, viewport={"width": width, "height": 900})
    sign_in(context, site.edge, "alice", site.url)
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.goto(site.url)
    return page


def test_defaults(browser: Any, site: Site) -> None:
    """30 days, the tenant scope and the browser's zone are chosen; Create waits for a name."""
    page = open_console(browser, site, zone="America/Los_Angeles")
    expect()(page.locator("input[name=lifetime][value='30d']")).to_be_checked()
    expect()(page.locator("#scope")).to_have_value("tenant:acme")
    expect()(page.locator("#tz")).to_have_value("America/Los_Angeles")
    expect()(page.locator("#date")).to_be_disabled()
    expect()(page.locator("#create-button")).to_be_disabled()
    expires = local_time(NOW + timedelta(days=30), _zone("America/Los_Angeles"))
    expect()(page.locator("#expires")).to_have_text(expires)
    labels = [page.locator(f"label[for={id_}]").count() for id_ in ("name", "date", "tz", "scope")]
    assert labels == [1, 1, 1, 1]
    page.context.close()


def test_every_disabled_state(browser: Any, site: Site) -> None:
    """Create is disabled for an empty name, and for a custom date empty, past or too far."""
    page = open_console(browser, site, zone="Europe/Paris")
    button, why = page.locator("#create-button"), page.locator("#create-why")
    expect()(button).to_be_disabled()
    expect()(why).to_have_text("Name the key to create it.")
    page.fill("#name", "   ")
    expect()(button).to_be_disabled()
    page.fill("#name", "CI deploys")
    expect()(button).to_be_enabled()
    page.check("input[name=lifetime][value=custom]")
    expect()(page.locator("#date")).to_be_enabled()
    expect()(button).to_be_disabled()
    expect()(why).to_have_text("Choose the custom expiry date.")
    expect()(page.locator("#date")).to_have_attribute("min", "2026-06-16")
    page.fill("#date", "2026-06-15")  # today: in the past for a key's end
    expect()(button).to_be_disabled()
    expect()(why).to_have_text("The date must be tomorrow or later.")
    page.fill("#date", "2027-06-16")
    expect()(button).to_be_disabled()
    page.fill("#date", "2026-06-16")
    expect()(button).to_be_enabled()
    expect()(page.locator("#expires")).to_have_text("2026-06-16, end of day CEST")
    page.fill("#name", "")
    expect()(button).to_be_disabled()
    page.context.close()


def _zone(name: str) -> Any:
    from zoneinfo import ZoneInfo

    return ZoneInfo(name)


def test_custom_date_bounds_follow_the_browsers_zone(browser: Any, site: Site) -> None:
    """At 12:00 UTC on 30 June it is already 1 July in Auckland: the bounds say so."""
    site.world.clock.now = datetime(2026, 6, 30, 12, 0, tzinfo=UTC)
    expected = {
        "Pacific/Auckland": ("2026-07-02", "2027-07-01", "2026-07-02, end of day NZST"),
        "America/Los_Angeles": ("2026-07-01", "2027-06-30", "2026-07-02, end of day PDT"),
    }
    for zone, (first, last, expires) in expected.items():
        page = open_console(browser, site, zone=zone)
        page.check("input[name=lifetime][value=custom]")
        date = page.locator("#date")
        expect()(date).to_have_attribute("min", first)
        expect()(date).to_have_attribute("max", last)
        page.fill("#date", "2026-07-02")
        expect()(page.locator("#expires")).to_have_text(expires)
        page.context.close()


def test_a_custom_date_on_a_dst_change_day(browser: Any, site: Site) -> None:
    """In Los Angeles on 7 March 2026, 8 March (23 hours) ends at 00:00 PDT, 07:00 UTC."""
    site.world.clock.now = datetime(2026, 3, 7, 20, 0, tzinfo=UTC)  # 12:00 PST
    page = open_console(browser, site, zone="America/Los_Angeles")
    page.fill("#name", "spring forward")
    page.check("input[name=lifetime][value=custom]")
    expect()(page.locator("#date")).to_have_attribute("min", "2026-03-08")
    page.fill("#date", "2026-03-08")
    expect()(page.locator("#expires")).to_have_text("2026-03-08, end of day PDT")
    page.fill("#date", "2027-03-07")  # the last day: one year from now comes first
    expect()(page.locator("#expires")).to_have_text("2027-03-07 12:00 PST")
    page.fill("#date", "2026-03-08")
    expect()(page.locator("#expires")).to_have_text("2026-03-08, end of day PDT")
    page.click("#create-button")
    expect()(page.locator("h1")).to_have_text("Key “spring forward” created")
    [key] = site.world.store.keys_of("alice")
    assert key.expires_at == datetime(2026, 3, 9, 7, 0, tzinfo=UTC)
    page.context.close()


def test_the_secret_is_shown_once(browser: Any, site: Site) -> None:
    """After create: reload, back and re-submit never show the secret again nor add a key."""
    page = open_console(browser, site)
    page.fill("#name", "shown once")
    page.click("#create-button")
    secret = page.locator("#secret").input_value()
    assert re.fullmatch(r"rma_\w+", secret)
    expect()(page.locator("#copy")).to_be_visible()
    page.click("#copy")
    expect()(page.locator("#copy-status")).not_to_be_empty()
    page.reload()  # re-sends the POST: the form's token was used
    expect()(page.locator("h1")).to_have_text("This form was already sent")
    assert secret not in page.content()
    page.click("text=Back to your keys")
    expect()(page.locator("tbody tr")).to_have_count(1)
    assert secret not in page.content()
    page.go_back()
    assert secret not in page.content()
    page.go_back()
    assert secret not in page.content()
    page.goto(site.url)
    expect()(page.locator("tbody tr code")).to_have_text(f"rma_…{secret[-4:]}")
    assert len(site.world.store.keys_of("alice")) == 1
    page.context.close()


def test_double_submit_makes_one_key(browser: Any, site: Site) -> None:
    """Sending the same form twice (a double click, a replay) creates one key."""
    page = open_console(browser, site)
    page.fill("#name", "double")
    hidden = page.locator("#create input[type=hidden]")  # the form token, Django's CSRF token
    fields = {
        **{field.get_attribute("name") or "": field.input_value() for field in hidden.all()},
        "name": "double",
        "lifetime": "1d",
        "tz": "UTC",
        "scope": "tenant:acme",
    }
    headers = {"Origin": site.url.split("/console/")[0]}
    first = page.request.post(site.url, form=fields, headers=headers)
    second = page.request.post(site.url, form=fields, headers=headers)
    assert (first.status, second.status) == (201, 409)
    assert len(site.world.store.keys_of("alice")) == 1
    page.context.close()


def test_filters_live_in_the_url(browser: Any, site: Site) -> None:
    """Filtering by status and scope puts both in the URL; the URL alone restores the view."""
    manager = site.world.manager
    manager.create("alice", name="tenant key", scope=Scope.tenant("acme"))
    research = Scope.organization("acme-research", tenant_id="acme")
    manager.revoke("alice", manager.create("alice", name="old", scope=research).info.key_id)
    manager.create("alice", name="research key", scope=research)
    page = open_console(browser, site)
    expect()(page.locator("tbody tr")).to_have_count(3)
    page.select_option("#filter-status", "Active")
    page.select_option("#filter-scope", "organization:acme-research")
    page.click("button:text('Filter')")
    expect()(page.locator("tbody tr")).to_have_count(1)
    expect()(page.locator("tbody th")).to_have_text("research key")
    assert "status=Active" in page.url
    assert "scope=organization%3Aacme-research" in page.url
    bookmarked = page.url
    other = open_console(browser, site)
    other.goto(bookmarked)
    expect()(other.locator("tbody th")).to_have_text("research key")
    expect()(other.locator("#filter-status")).to_have_value("Active")
    other.goto(site.url + "?status=Revoked")
    expect()(other.locator("tbody th")).to_have_text("old")
    page.context.close()
    other.context.close()


def test_revoke_with_confirmation(browser: Any, site: Site) -> None:
    """Revoke asks first, naming the key; then the key is Revoked and cannot be revoked again."""
    site.world.manager.create("alice", name="old deploy", scope=Scope.tenant("acme"))
    page = open_console(browser, site)
    page.click("a.revoke")
    expect()(page.locator("h1")).to_have_text("Revoke the key “old deploy”?")
    assert site.world.manager.list("alice")[0].status is Status.ACTIVE
    page.click("text=Cancel")
    expect()(page.locator("tbody .status")).to_have_text("✓ Active")
    page.click("a.revoke")
    page.click("button:text('Revoke “old deploy”')")
    expect()(page.locator(".notice")).to_contain_text("“old deploy”")
    expect()(page.locator("tbody .status")).to_have_text("✕ Revoked")
    expect()(page.locator("a.revoke")).to_have_count(0)
    assert site.world.manager.list("alice")[0].status is Status.REVOKED
    page.context.close()


def test_a_whole_create_with_the_keyboard(browser: Any, site: Site) -> None:
    """Tab, type, arrow keys and Enter alone create a 90-day organization key."""
    page = open_console(browser, site)
    for _ in range(5):  # bounded: the name field is the second stop
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "name":
            break
    page.keyboard.type("typed by keyboard")
    page.keyboard.press("Tab")  # to the lifetime radios, on 30 days
    page.keyboard.press("ArrowRight")  # 90 days
    expect()(page.locator("input[name=lifetime][value='90d']")).to_be_checked()
    stops = []
    for _ in range(10):
        page.keyboard.press("Tab")
        focused = page.evaluate("document.activeElement.id")
        stops.append(focused)
        if focused == "scope":
            page.keyboard.press("ArrowDown")  # tenant acme -> organization acme-main
        if focused == "create-button":
            break
    assert stops[-1] == "create-button", stops
    page.keyboard.press("Enter")
    expect()(page.locator("h1")).to_have_text("Key “typed by keyboard” created")
    [key] = site.world.store.keys_of("alice")
    assert key.scope == Scope.organization("acme-main", tenant_id="acme")
    assert key.expires_at == NOW + timedelta(days=90)
    page.context.close()


def test_a_cross_origin_post_is_refused(browser: Any, site: Site) -> None:
    """A page of another origin auto-posting to the console gets 403; nothing is created."""
    page = open_console(browser, site)
    token = page.locator("#create input[name=token]").input_value()  # even a stolen token
    attack = (
        f'<form id="f" method="post" action="{site.url}">'
        f'<input name="token" value="{token}"><input name="name" value="evil">'
        '<input name="lifetime" value="1d"><input name="tz" value="UTC">'
        '<input name="scope" value="tenant:acme"></form>'
    )
    page.route(
        "http://attacker.invalid/",
        lambda route: route.fulfill(status=200, content_type="text/html", body=attack),
    )
    page.goto("http://attacker.invalid/")
    with page.expect_navigation():
        page.evaluate("document.getElementById('f').submit()")
    expect()(page.locator("h1")).to_have_text("Refused: another site sent this form")
    assert site.world.store.keys_of("alice") == []
    page.context.close()


def test_readable_at_375_pixels(browser: Any, site: Site) -> None:
    """At 375 px nothing scrolls sideways; each key is a card with labelled fields."""
    site.world.manager.create("alice", name="narrow", scope=Scope.tenant("acme"))
    page = open_console(browser, site, width=375)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 375
    expect()(page.locator("thead")).to_be_hidden()
    expect()(page.locator("tbody .status")).to_have_text("✓ Active")
    page.context.close()


def test_without_script_the_server_decides(browser: Any, site: Site) -> None:
    """With JavaScript off, nothing is disabled, the server refuses bad input with a message,
    and the user picks the time zone."""
    context = browser.new_context(java_script_enabled=False, timezone_id="Pacific/Auckland")
    sign_in(context, site.edge, "alice", site.url)
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.goto(site.url)
    expect()(page.locator("#tz")).to_have_value("")  # never guessed by the server
    expect()(page.locator("#create-button")).to_be_enabled()
    page.click("#create-button")
    expect()(page.locator("#name-error")).to_contain_text("The key name is required")
    page.fill("#name", "no script")
    page.check("input[name=lifetime][value=custom]")
    page.fill("#date", "2026-06-17")
    page.click("#create-button")
    expect()(page.locator("#tz-error")).to_contain_text("Choose your time zone")
    expect()(page.locator("#expires")).to_have_text("—")
    expect()(page.locator("#name")).to_have_value("no script")  # the values are kept
    page.select_option("#tz", "Pacific/Auckland")
    page.click("#create-button")
    expect()(page.locator("h1")).to_have_text("Key “no script” created")
    [key] = site.world.store.keys_of("alice")
    assert key.expires_at == datetime(2026, 6, 17, 12, 0, tzinfo=UTC)  # 18 June 00:00 NZST
    context.close()


def test_keys_expiring_soon_carry_a_badge_with_the_time_left(browser: Any, site: Site) -> None:
    """A key expiring within 7 days shows "expires in …" as text in its row; a later one not."""
    tenant = Scope.tenant("acme")
    soon = site.world.manager.create("alice", name="soon", scope=tenant, expiry=Lifetime.DAYS_1)
    later = site.world.manager.create("alice", name="later", scope=tenant)
    site.world.clock.now = NOW + timedelta(hours=5)
    page = open_console(browser, site, width=375)
    badge = page.locator(f"tr[data-key='{soon.info.key_id}'] .badge-expiring")
    expect()(badge).to_have_text("◔ expires in 19 hours")
    expect()(badge).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    expect()(page.locator(f"tr[data-key='{later.info.key_id}'] .badge-expiring")).to_have_count(0)
    page.context.close()


def test_a_leaked_key_is_shown_and_revoked_from_its_confirmation(browser: Any, site: Site) -> None:
    """The leak report reads as text in the list and on the confirmation; no link; one revoke."""
    created = site.world.manager.create("alice", name="deploy", scope=Scope.tenant("acme"))
    url = "https://code.example/acme/app/blob/main/.env"
    site.world.store.report_leak(created.info.key_id, url, NOW - timedelta(hours=2))
    page = open_console(browser, site, zone="UTC")
    row = page.locator(f"tr[data-key='{created.info.key_id}']")
    expect()(row.locator(".badge-leaked")).to_have_text("⚠ Leaked")
    note = page.locator(f"tr[data-note-for='{created.info.key_id}'] .leak")
    expect()(note).to_contain_text(f"“deploy” was reported leaked at {url}, 2026-06-15 10:00")
    expect()(note).to_be_visible()
    expect()(page.locator("a[href*='code.example']")).to_have_count(0)
    row.locator("a.revoke").click()
    expect()(page.locator(".leak")).to_contain_text(f"Reported leaked at {url}")
    expect()(page.locator(".leak")).to_be_visible()
    expect()(page.locator(".leak")).to_contain_text("revoke it now")
    page.click("button:text('Revoke “deploy”')")
    expect()(row.locator(".status")).to_have_text("✕ Revoked")
    expect()(row.locator(".badge-leaked")).to_have_text("⚠ Leaked")
    assert site.world.manager.list("alice")[0].status is Status.REVOKED
    page.context.close()


def _use(site: Site, secret: str) -> None:
    """One accepted request with *secret*: the Authenticator records its use in the store."""
    from keyturn import Authenticator, AuthRequest, Principal

    world = site.world
    auth = Authenticator(world.store, world.membership, clock=world.clock, usage_interval=0)
    try:
        request = AuthRequest(authorization=(f"Bearer {secret}",), organization=("default",))
        assert isinstance(auth.authenticate(request), Principal)
    finally:
        auth.close()


def test_rotate_confirm_by_use_then_revoke_the_old_key_in_one_click(
    browser: Any, site: Site
) -> None:
    """Rotate from the list, copy the new secret once; the pair says the new key is not seen
    yet until a request uses it; then one click revokes the old key."""
    old = site.world.manager.create("alice", name="deploy", scope=Scope.tenant("acme"))
    site.world.clock.now = NOW + timedelta(days=2)
    page = open_console(browser, site, zone="UTC")
    page.locator(f"tr[data-key='{old.info.key_id}'] a.rotate").click()
    expect()(page.locator("h1")).to_have_text("Rotate the key “deploy”?")
    page.click("button:text('Rotate “deploy”')")
    expect()(page.locator("h1")).to_have_text("Key “deploy” created")
    secret = page.locator("#secret").input_value()
    assert re.fullmatch(r"rma_\w+", secret)
    expect()(page.locator(".rotation")).to_contain_text(f"It replaces the key {old.info.hint}")
    page.click("text=Done: back to your keys")
    new_id = site.world.manager.list("alice")[0].key_id
    rows = page.locator("tbody tr[data-key]")
    expect()(rows).to_have_count(2)
    assert [row.get_attribute("data-key") for row in rows.all()] == [new_id, old.info.key_id]
    note = page.locator(f"tr[data-note-for='{old.info.key_id}'] .rotation")
    expect()(note).to_contain_text("not seen yet")
    expect()(page.locator("button:text('Revoke old key')")).to_have_count(0)
    page.locator(f"tr[data-key='{old.info.key_id}'] a.revoke").click()  # early: still possible
    expect()(page.locator(".rotation-unconfirmed")).to_contain_text("unconfirmed")
    page.click("text=Cancel")
    assert secret not in page.content()

    site.world.clock.now += timedelta(hours=1)
    _use(site, secret)
    page.reload()
    expect()(note).to_contain_text("first used at 2026-06-17 13:00")
    site.world.clock.now += timedelta(hours=1)
    _use(site, secret)  # a later use: the note keeps the first
    page.reload()
    expect()(note).to_contain_text("first used at 2026-06-17 13:00")
    page.click("button:text('Revoke old key')")
    expect()(page.locator(".notice")).to_contain_text("is revoked")
    old_row = page.locator(f"tr[data-key='{old.info.key_id}']")
    expect()(old_row.locator(".status")).to_have_text("✕ Revoked")
    expect()(page.locator(".rotation")).to_have_count(0)
    statuses = {info.key_id: info.status for info in site.world.manager.list("alice")}
    assert statuses == {new_id: Status.ACTIVE, old.info.key_id: Status.REVOKED}
    page.context.close()


def test_rotate_by_keyboard_at_375_pixels_with_the_auto_revoke_choice(
    browser: Any, site: Site
) -> None:
    """At 375 px, keyboard only: the checkbox records the creator's choice, the pair fits
    the width, and the new key's first use revokes the old one."""
    old = site.world.manager.create("alice", name="agent", scope=Scope.tenant("acme"))
    site.world.clock.now = NOW + timedelta(minutes=5)
    page = open_console(browser, site, width=375)
    page.goto(f"{site.url}rotate?key={old.info.key_id}")
    stops = []
    for _ in range(10):  # bounded: the checkbox, then the button
        page.keyboard.press("Tab")
        focused = page.evaluate("document.activeElement.id || document.activeElement.tagName")
        stops.append(focused)
        if focused == "revoke-old":
            page.keyboard.press("Space")
            page.keyboard.press("Tab")
            break
    assert stops[-1] == "revoke-old", stops
    expect()(page.locator("#revoke-old")).to_be_checked()
    page.keyboard.press("Enter")
    expect()(page.locator("h1")).to_have_text("Key “agent” created")
    secret = page.locator("#secret").input_value()
    page.goto(site.url)
    note = page.locator(f"tr[data-note-for='{old.info.key_id}'] .rotation")
    expect()(note).to_contain_text("revoked automatically when the new key is first used")
    expect()(note).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    _use(site, secret)
    page.reload()
    expect()(page.locator(f"tr[data-key='{old.info.key_id}'] .status")).to_have_text("✕ Revoked")
    page.context.close()


def test_rotate_without_script(browser: Any, site: Site) -> None:
    """With JavaScript off the rotate form works the same: the server shows the secret."""
    old = site.world.manager.create("alice", name="no script", scope=Scope.tenant("acme"))
    site.world.clock.now = NOW + timedelta(minutes=5)
    context = browser.new_context(java_script_enabled=False)
    sign_in(context, site.edge, "alice", site.url)
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.goto(site.url)
    page.click("a.rotate")
    page.check("#revoke-old")
    page.click("button:text('Rotate “no script”')")
    expect()(page.locator("h1")).to_have_text("Key “no script” created")
    assert page.locator("#secret").input_value().startswith("rma_")
    new = site.world.manager.list("alice")[0]
    assert (new.replaces, new.revoke_old_on_first_use) == (old.info.key_id, True)
    context.close()


def test_a_name_is_counted_in_characters_as_the_server_counts(browser: Any, site: Site) -> None:
    """60 emoji (120 UTF-16 units) stay whole; 101 characters disable Create with the count;
    100 emoji make a key with that very name."""
    page = open_console(browser, site)
    button, why = page.locator("#create-button"), page.locator("#create-why")
    page.fill("#name", "🔑" * 60)
    assert page.locator("#name").input_value() == "🔑" * 60
    expect()(button).to_be_enabled()
    page.fill("#name", "🔑" * 101)
    expect()(button).to_be_disabled()
    expect()(why).to_have_text("The name has 101 characters; at most 100 are allowed.")
    page.fill("#name", "🔑" * 100)
    expect()(button).to_be_enabled()
    page.click("#create-button")
    expect()(page.locator("h1")).to_contain_text("created")
    [key] = site.world.store.keys_of("alice")
    assert key.name == "🔑" * 100
    page.context.close()


def test_the_browsers_zone_comes_first_and_is_used(browser: Any, site: Site) -> None:
    """The zone the browser names is the list's first and chosen, even an alias the list
    leaves out (Chromium names Kolkata "Asia/Calcutta"); a custom date ends at its midnight."""
    page = open_console(browser, site, zone="Asia/Kolkata")
    named = page.evaluate("Intl.DateTimeFormat().resolvedOptions().timeZone")
    expect()(page.locator("#tz option").nth(1)).to_have_attribute("value", named)
    expect()(page.locator("#tz")).to_have_value(named)
    page.fill("#name", "zoned")
    page.check("input[name=lifetime][value=custom]")
    page.fill("#date", "2026-06-20")
    expect()(page.locator("#expires")).to_have_text("2026-06-20, end of day IST")
    page.click("#create-button")
    expect()(page.locator("h1")).to_have_text("Key “zoned” created")
    [key] = site.world.store.keys_of("alice")
    assert key.expires_at == datetime(2026, 6, 20, 18, 30, tzinfo=UTC)
    page.context.close()


def test_a_page_load_asks_for_nothing_that_is_missing(browser: Any, site: Site) -> None:
    """Loading the list requests nothing that answers 404 (no /favicon.ico), and the icon the
    page names is served."""
    context = browser.new_context()
    sign_in(context, site.edge, "alice", site.url)
    page = context.new_page()
    failed: list[str] = []
    page.on("response", lambda response: response.status >= 400 and failed.append(response.url))
    page.goto(site.url)
    expect()(page.locator("#expires")).not_to_have_text("…")
    page.reload()
    expect()(page.locator("#expires")).not_to_have_text("…")
    icon = page.locator("link[rel=icon]").get_attribute("href")
    assert icon is not None
    assert page.request.get(site.url.removesuffix("/console/") + icon).status == 200
    assert failed == []
    context.close()


def test_the_expiry_preview_never_shows_a_stale_answer(browser: Any, site: Site) -> None:
    """While the server is slow to answer, a new lifetime shows "…" rather than the last
    expiry; only the latest question is kept, whatever order the answers come back in."""
    page = open_console(browser, site, zone="UTC")
    expect()(page.locator("#expires")).to_have_text(local_time(NOW + timedelta(days=30), None))
    held: list[Any] = []
    page.route("**/console/preview?*", lambda route: held.append(route))  # a slow server
    page.check("input[name=lifetime][value='1d']")
    expect()(page.locator("#expires")).to_have_text("…")
    page.check("input[name=lifetime][value='7d']")
    expect()(page.locator("#expires")).to_have_text("…")
    for _ in range(100):  # bounded: both questions reach the route
        if len(held) == 2:
            break
        page.wait_for_timeout(50)
    assert [route.request.url.split("lifetime=")[1][:2] for route in held] == ["1d", "7d"]
    held[1].continue_()  # the latest answer first, then the stale one (its fetch was aborted)
    expect()(page.locator("#expires")).to_have_text(local_time(NOW + timedelta(days=7), None))
    with contextlib.suppress(Exception):  # the page may have given up on it already
        held[0].continue_()
    page.wait_for_timeout(200)
    expect()(page.locator("#expires")).to_have_text(local_time(NOW + timedelta(days=7), None))
    page.context.close()


def test_the_activity_page_shows_who_did_what_to_your_own_keys(browser: Any, site: Site) -> None:
    """Create and revoke in the browser, then Activity lists both, newest first, with the
    browser's address and user agent; bob's actions are not there; CSP holds (no violation)."""
    bobs = site.world.manager.create("bob", name="bob's secret project", scope=Scope.tenant("acme"))
    site.world.manager.revoke("bob", bobs.info.key_id)
    page = open_console(browser, site)
    violations: list[str] = []
    page.on("console", lambda message: message.type == "error" and violations.append(message.text))
    page.fill("#name", "audited")
    page.click("#create-button")
    page.click("text=Back to your keys")
    page.click("a.revoke")
    page.click("button:text('Revoke “audited”')")
    expect()(page.locator(".notice")).to_contain_text("“audited”")
    page.click("a.activity")
    expect()(page.locator("h1")).to_have_text("Activity")
    rows = page.locator("table.events tbody tr")
    expect()(rows).to_have_count(2)
    expect()(rows.nth(0).locator(".action")).to_have_text("Revoked")
    expect()(rows.nth(1).locator(".action")).to_have_text("Created")
    expect()(rows.nth(0)).to_contain_text("alice (console)")
    expect()(rows.nth(0).locator(".client")).to_contain_text("127.0.0.1")
    agent = rows.nth(0).locator(".client .agent")  # shortened; the whole string in its title
    expect()(agent).to_have_text(re.compile(r"^Chrome \d+ on Linux$"))
    expect()(agent).to_have_attribute("title", re.compile(r"^Mozilla/5\.0 .*HeadlessChrome/"))
    expect()(rows.nth(0).locator("time")).to_have_text(
        local_time(NOW, _zone("Europe/Paris")).rsplit(" ", 1)[0]
    )
    assert "bob" not in page.locator("main").inner_text()
    assert violations == []
    page.context.close()
