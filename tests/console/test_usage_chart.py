"""The usage chart of each key and "unused for 30 days: revoke it?", on every edge.

The chart is an inline SVG drawn on the server: no script, no inline style, so the
console's CSP (no 'unsafe-inline') stays as it is; its name says in words what it shows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from keyturn import AsyncKeyManager, KeyManager, Lifetime, Scope
from keyturn.console import Console
from keyturn.console._chart import CHART_DAYS, chart, window
from keyturn.console._visit import CSP
from keyturn.usage import ACCEPTED, KeyUsage
from tests.console.support import (
    ACCOUNT_COOKIE,
    BROWSER_EDGES,
    NOW,
    SIGN_IN,
    Client,
    World,
    expect,
    make_world,
    serving,
    sign_in,
    signed_in,
)
from tests.console.test_library import Awaited

TENANT = Scope.tenant("acme")
TODAY = NOW.date()


def busy_world(world: World) -> dict[str, str]:
    """alice's keys: "busy" (used today, counts over the month), "idle" (created 40 days
    ago, never used), "quiet" (created 40 days ago, used 2 days ago), "new" (created 5 days
    ago, never used), "gone" (revoked, unused 40 days). Their ids by name."""
    manager = world.manager
    world.clock.now = NOW - timedelta(days=40)
    idle = manager.create("alice", name="idle", scope=TENANT, expiry=Lifetime.DAYS_90)
    quiet = manager.create("alice", name="quiet", scope=TENANT, expiry=Lifetime.DAYS_90)
    gone = manager.create("alice", name="gone", scope=TENANT, expiry=Lifetime.DAYS_90)
    manager.revoke("alice", gone.info.key_id)
    world.clock.now = NOW - timedelta(days=5)
    new = manager.create("alice", name="new", scope=TENANT)
    busy = manager.create("alice", name="busy", scope=TENANT)
    world.clock.now = NOW
    world.store.mark_used(busy.info.key_id, NOW - timedelta(hours=1))
    world.store.mark_used(quiet.info.key_id, NOW - timedelta(days=2))
    busy_id = busy.info.key_id
    for days_ago, accepted, refused in ((0, 120, 3), (1, 80, 0), (4, 200, 1), (40, 999, 9)):
        counts = {(busy_id, ACCEPTED): accepted}
        if refused:
            counts[busy_id, "org_not_found"] = refused
        world.store.count_usage(TODAY - timedelta(days=days_ago), counts)
    return {
        "busy": busy_id,
        "idle": idle.info.key_id,
        "quiet": quiet.info.key_id,
        "new": new.info.key_id,
        "gone": gone.info.key_id,
    }


def row_of(html: str, key_id: str) -> str:
    """The key's row and, if it has one, its note row."""
    start = html.index(f'<tr data-key="{key_id}"')
    end = html.find("<tr data-key=", start + 1)
    return html[start : end if end != -1 else len(html)]


@pytest.fixture(params=BROWSER_EDGES)
def edge(request: pytest.FixtureRequest) -> Iterator[tuple[Client, World]]:
    """A signed-in client of the console with alice's keys, on each edge."""
    from tests.console.support import django_settings

    world = make_world()  # the client signs in with the test cookie on every edge
    client = Client(request.param, world.console)
    client.account = "alice"
    if request.param == "django":
        with django_settings(world.console):
            yield client, world
    else:
        yield client, world


def test_each_key_has_a_chart_of_its_last_30_days(edge: tuple[Client, World]) -> None:
    """One bar per day; accepted and refused requests as two stacked rectangles; the chart's
    name and the text beside it give the totals of the 30 days (day 40 is left out). A key
    without a request in those days has no chart."""
    client, world = edge
    ids = busy_world(world)
    reply = client.get("/console/")
    assert reply.status == 200
    row = row_of(reply.text, ids["busy"])
    svg = row[row.index("<svg") : row.index("</svg>")]
    assert 'role="img"' in svg and f'aria-labelledby="usage-{ids["busy"]}"' in svg
    title = re.search(r'<title id="usage-\w+">([^<]*)</title>', svg)
    assert title is not None
    assert title.group(1) == (
        "Requests with “busy” in the last 30 days: 400 accepted, 4 refused; "
        f"busiest day {(TODAY - timedelta(days=4)).isoformat()} with 201."
    )
    assert svg.count("<g>") == 30
    assert svg.count('class="accepted"') == 3 and svg.count('class="refused"') == 2
    assert f"<title>{TODAY.isoformat()}: 120 accepted, 3 refused</title>" in svg
    assert "400 accepted" in row and "4 refused" in row and 'title="org_not_found 4"' in row
    idle = row_of(reply.text, ids["idle"])
    assert "<svg" not in idle  # no request in 30 days: nothing to draw


def test_the_page_keeps_its_csp_and_holds_no_inline_style_or_script(
    edge: tuple[Client, World],
) -> None:
    """The charts add no inline style or script: the CSP is the console's own, which
    allows neither, and the page has no style attribute, <style> or inline <script>."""
    client, world = edge
    busy_world(world)
    reply = client.get("/console/")
    assert reply.headers["content-security-policy"] == CSP
    assert "'unsafe-inline'" not in CSP
    assert "<svg" in reply.text
    assert not re.search(r"<style|\sstyle=|<script(?![^>]*\ssrc=)|\son\w+=", reply.text)


def test_unused_keys_ask_to_be_revoked(edge: tuple[Client, World]) -> None:
    """A key that still works, is older than 30 days and nobody used for 30 days asks
    "revoke it?" with a link to its revoke page; a key used lately, a younger one, and a
    revoked one do not."""
    client, world = edge
    ids = busy_world(world)
    html = client.get("/console/").text
    idle = row_of(html, ids["idle"])
    assert "Unused for 30 days: revoke it?" in idle
    assert "since it was created" in idle
    assert f'href="/console/revoke?key={ids["idle"]}"' in idle
    for name in ("busy", "quiet", "new", "gone"):
        assert "Unused for 30 days" not in row_of(html, ids[name]), name


def test_a_key_used_long_ago_says_when(edge: tuple[Client, World]) -> None:
    """A key last used 31 days ago asks to be revoked and names the time of its last use."""
    client, world = edge
    ids = busy_world(world)
    world.store.mark_used(ids["idle"], NOW - timedelta(days=31))
    idle = row_of(client.get("/console/").text, ids["idle"])
    assert "Unused for 30 days: revoke it?" in idle
    assert "since <time" in idle


class Uncounted:
    """A host's store with no usage_of: the console has no chart column."""

    def __init__(self, world: World) -> None:
        self._store = world.store

    def __getattr__(self, name: str) -> Any:
        if name in ("usage_of", "count_usage"):
            raise AttributeError(name)
        return getattr(self._store, name)


def test_a_store_without_counts_shows_no_chart_column() -> None:
    """Over a store that keeps no counts the list draws no chart, and still asks about
    unused keys."""
    world = make_world()
    busy_world(world)
    manager = KeyManager(Uncounted(world), world.membership, clock=world.clock)  # type: ignore[arg-type]
    console = Console(manager, signed_in=signed_in, sign_in_url=SIGN_IN)
    client = Client("asgi", console)
    client.account = "alice"
    html = client.get("/console/").text
    assert "<svg" not in html and 'class="usage' not in html
    assert "Unused for 30 days: revoke it?" in html  # told by last_used_at, not the counts


def test_an_async_manager_s_console_draws_the_charts() -> None:
    """Over an AsyncKeyManager the counts are awaited on the loop, like every other call."""
    world = make_world()
    ids = busy_world(world)
    manager = AsyncKeyManager(Awaited(world.store), Awaited(world.membership), clock=world.clock)
    console = Console(manager, signed_in=signed_in, sign_in_url=SIGN_IN)
    app = Starlette(routes=[Mount("/console", app=console.asgi())])
    with TestClient(app, cookies={ACCOUNT_COOKIE: "alice"}) as client:
        html = client.get("/console/").text
    assert "400" in row_of(html, ids["busy"])
    assert row_of(html, ids["busy"]).count("<g>") == 30


@pytest.mark.parametrize("edge_name", BROWSER_EDGES)
def test_the_chart_in_a_browser(browser: Any, edge_name: str) -> None:
    """In Chromium: the chart is an image named in words, drawn in the stylesheet's colours
    (so the CSS reaches inline SVG), no CSP violation is reported, and at 375 px nothing
    scrolls sideways."""
    world = make_world(edge=edge_name)
    ids = busy_world(world)
    with serving(edge_name, world.console) as origin:
        url = f"{origin}/console/"
        for width in (1100, 375):
            context = browser.new_context(viewport={"width": width, "height": 900})
            sign_in(context, edge_name, "alice", url)
            page = context.new_page()
            page.set_default_timeout(10_000)
            said: list[str] = []
            page.on("console", lambda message, said=said: said.append(message.text))
            page.goto(url)
            chart = page.get_by_role("img", name=re.compile("^Requests with “busy”"))
            expect()(chart).to_be_visible()
            box = chart.bounding_box()
            assert box is not None and (box["width"], box["height"]) == (120, 28)
            bar = page.locator(f"tr[data-key='{ids['busy']}'] rect.accepted").first
            assert bar.evaluate("e => getComputedStyle(e).fill") == "rgb(11, 92, 173)"
            refused = page.locator(f"tr[data-key='{ids['busy']}'] rect.refused").first
            assert refused.evaluate("e => getComputedStyle(e).fill") == "rgb(180, 35, 24)"
            note = page.locator(f"tr[data-note-for='{ids['idle']}'] .unused")
            expect()(note).to_contain_text("Unused for 30 days: revoke it?")
            assert page.evaluate("document.documentElement.scrollWidth") <= width
            assert not [text for text in said if "Content Security Policy" in text]
            context.close()


COUNTS = st.lists(
    st.integers(min_value=0, max_value=10**7), min_size=CHART_DAYS, max_size=CHART_DAYS
)


@given(accepted=COUNTS, refused=COUNTS)
def test_bars_fit_the_chart_and_follow_the_counts(accepted: list[int], refused: list[int]) -> None:
    """Every bar stays inside the chart on its baseline; a day with requests is at least a
    pixel high and a day without none; both parts show when the bar has room; a busier day
    is never drawn lower; the name adds up."""
    first, _ = window(TODAY)
    usage = KeyUsage(
        key_id="k1",
        days=tuple(first + timedelta(days=n) for n in range(CHART_DAYS)),
        accepted=tuple(accepted),
        refused=tuple(refused),
    )
    drawn = chart("CI", usage)
    assert (drawn.width, drawn.height, len(drawn.bars)) == (CHART_DAYS * 4, 28, CHART_DAYS)
    heights = []
    for bar, ok, no in zip(drawn.bars, accepted, refused, strict=True):
        assert 0 <= bar.refused_y <= bar.accepted_y <= 27
        assert bar.accepted_y + bar.accepted_height == 27  # on the baseline
        assert bar.refused_y + bar.refused_height == bar.accepted_y  # stacked on top
        height = bar.accepted_height + bar.refused_height
        assert (height > 0) == (ok + no > 0)
        assert bar.accepted_height == 0 or ok > 0
        assert bar.refused_height == 0 or no > 0
        if ok and no and height >= 2:
            assert bar.accepted_height >= 1 and bar.refused_height >= 1
        heights.append((ok + no, height))
    heights.sort()
    assert [height for _, height in heights] == sorted(height for _, height in heights)
    assert f"{sum(accepted):,} accepted, {sum(refused):,} refused" in drawn.title
