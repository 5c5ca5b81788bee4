"""Rate limits in the console: each Active key's limits and their use now, and the usage
chart's series of requests a rate limit refused (``rate_limited``).

The requests are real: the Authenticator decides them and the limiter admits them, as the
API's middleware does; the console reads the same counts without taking from them.
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

from keyturn import AsyncKeyManager, Authenticator, AuthRequest, Principal, Scope
from keyturn.console import Console, ConsoleSetupError
from keyturn.console._chart import CHART_DAYS, chart, window
from keyturn.console._limits import per_window
from keyturn.ratelimits import Rate, RateLimiter, RateLimits
from keyturn.usage import ACCEPTED, RATE_LIMITED, KeyUsage
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
from tests.console.test_usage_chart import row_of
from tests.ratelimits.conftest import redis_prefix, redis_server  # noqa: F401 -- fixtures

TENANT = Scope.tenant("acme")
RESEARCH = Scope.organization("acme-research", tenant_id="acme")
PLANS = {
    "acme-main": RateLimits(key=Rate(100, 60), account=Rate(1000, 3600)),
    "acme-research": RateLimits(
        key=Rate(10, 60), account=Rate(1000, 3600), organization=Rate(5000, 86400)
    ),
}


def limits(principal: Principal) -> RateLimits | None:
    """The tests' plans, by the organization a request is in."""
    return PLANS.get(principal.organization_id)


def limited_world(edge: str = "asgi", **options: Any) -> tuple[World, RateLimiter]:
    """The console world with a limiter on the world's clock, given to its console."""
    holder: list[World] = []
    limiter = options.pop("limiter", None) or RateLimiter(
        limits, clock=lambda: holder[0].clock().timestamp()
    )
    world = make_world(edge=edge, rate_limiter=limiter, **options)
    holder.append(world)
    return world, limiter


def requests(world: World, limiter: RateLimiter, key: tuple[str, str], count: int) -> int:
    """*count* requests with *key* (its id and secret, from :func:`keys`), decided and
    admitted as the API does; how many the limiter let through. A tenant key's requests
    name the ``default`` organization, an organization key's none."""
    (scope,) = [info.scope for info in world.manager.list("alice") if info.key_id == key[0]]
    organization = () if scope.organization_id else ("default",)
    gate = Authenticator(world.store, world.membership, clock=world.clock)
    admitted = 0
    try:
        for _ in range(count):
            request = AuthRequest(authorization=(f"Bearer {key[1]}",), organization=organization)
            principal = gate.authenticate(request)
            assert isinstance(principal, Principal)
            admitted += limiter.admit(principal).allowed
    finally:
        gate.close()
    return admitted


def keys(world: World) -> dict[str, tuple[str, str]]:
    """alice's keys: "ci" (tenant), "notebooks" (acme-research), "gone" (revoked); each
    name's (key id, secret)."""
    manager = world.manager
    made = {
        "ci": manager.create("alice", name="ci", scope=TENANT),
        "notebooks": manager.create("alice", name="notebooks", scope=RESEARCH),
        "gone": manager.create("alice", name="gone", scope=TENANT),
    }
    manager.revoke("alice", made["gone"].info.key_id)
    return {name: (key.info.key_id, key.secret) for name, key in made.items()}


def limit_lines(row: str) -> list[str]:
    """The texts of a row's limits as a browser shows them: no tags, spaces collapsed."""
    items = re.findall(r"<li>(.*?)</li>", row, flags=re.S)
    return [" ".join(re.sub(r"<[^>]+>", "", item).split()) for item in items]


@pytest.fixture(params=BROWSER_EDGES)
def limited(request: pytest.FixtureRequest) -> Iterator[tuple[Client, World, RateLimiter]]:
    """A signed-in client of a console given a limiter, on each edge."""
    from tests.console.support import django_settings

    world, limiter = limited_world()
    client = Client(request.param, world.console)
    client.account = "alice"
    if request.param == "django":
        with django_settings(world.console):
            yield client, world, limiter
    else:
        yield client, world, limiter


def test_each_active_key_shows_its_limits_and_their_use(
    limited: tuple[Client, World, RateLimiter],
) -> None:
    """After some admitted requests, each Active key's row names its limits (key, account,
    organization, as the limits function gives them for the key's principal) and their
    use now; the account's pool counts both keys; a revoked key shows none. Reading them
    takes nothing from the counts."""
    client, world, limiter = limited
    made = keys(world)
    assert requests(world, limiter, made["ci"], 3) == 3
    assert requests(world, limiter, made["notebooks"], 12) == 10  # its key limit is 10

    html = client.get("/console/").text

    assert limit_lines(row_of(html, made["ci"][0])) == [
        "Key: 3 of 100 a minute",
        "Account: 13 of 1,000 an hour",
    ]
    assert limit_lines(row_of(html, made["notebooks"][0])) == [
        "Key: 10 of 10 a minute",
        "Account: 13 of 1,000 an hour",
        "Organization acme-research: 10 of 5,000 a day",
    ]
    assert "Rate limits" not in row_of(html, made["gone"][0])  # it can make no request
    assert '<meter min="0" max="100" value="3" low="80" high="80" optimum="0"' in html
    assert "what this server process counted" in html
    again = limit_lines(row_of(client.get("/console/").text, made["ci"][0]))
    assert again[0] == "Key: 3 of 100 a minute"  # showing the page took nothing
    assert limiter.stats.allowed == 13 and limiter.stats.refused == 2


def test_use_follows_the_sliding_window(limited: tuple[Client, World, RateLimiter]) -> None:
    """Half a minute into the next minute, the last minute's requests count half."""
    client, world, limiter = limited
    made = keys(world)
    requests(world, limiter, made["notebooks"], 10)
    start = world.clock().timestamp()
    world.clock.now += timedelta(seconds=60 - start % 60 + 30)

    row = row_of(client.get("/console/").text, made["notebooks"][0])

    assert limit_lines(row)[0] == "Key: 5 of 10 a minute"
    assert requests(world, limiter, made["notebooks"], 10) == 5


def test_without_a_limiter_the_list_says_nothing_of_limits(client: Client, world: World) -> None:
    """No limiter, no column, no note: the list is as it was."""
    keys(world)
    html = client.get("/console/").text
    assert "Rate limits" not in html and "<meter" not in html and "limits-note" not in html
    assert 'colspan="8"' in html or "has-note" not in html


def test_a_key_without_a_limit_says_so() -> None:
    """The limits function answers None for a principal: "Rate limits: none", no meter."""
    world, _ = limited_world(limiter=RateLimiter(lambda p: None))
    made = keys(world)
    client = Client("asgi", world.console)
    client.account = "alice"
    html = client.get("/console/").text
    assert re.search(r"Rate limits:</span>\s+none", row_of(html, made["ci"][0]))
    assert "<meter" not in html
    assert "limits-note" not in html  # no use shown: nothing to explain


def test_the_limiter_must_be_one() -> None:
    """Anything but a RateLimiter is refused when the console is built."""
    with pytest.raises(ConsoleSetupError, match="rate_limiter must be"):
        make_world(rate_limiter=RateLimits(key=Rate(1, 60)))


def test_a_console_in_another_process_reads_the_shared_counts(
    redis_server: str,  # noqa: F811
    redis_prefix: str,  # noqa: F811
) -> None:
    """The API's limiter and the console's own (another process's, here another object) on
    one Redis: the console shows what the API admitted, and says whose requests it counts."""
    from keyturn.ratelimits.redis import RedisEngine

    holder: list[World] = []

    def clock() -> float:
        return holder[0].clock().timestamp()

    api = RateLimiter(limits, engine=RedisEngine(redis_server, prefix=redis_prefix), clock=clock)
    console_side = RateLimiter(
        limits, engine=RedisEngine(redis_server, prefix=redis_prefix), clock=clock
    )
    world, _ = limited_world(limiter=console_side)
    holder.append(world)
    made = keys(world)
    assert requests(world, api, made["ci"], 7) == 7
    client = Client("wsgi", world.console)
    client.account = "alice"

    html = client.get("/console/").text

    key, account = limit_lines(row_of(html, made["ci"][0]))
    slack = api.slice_of(Rate(100, 60)) - 1  # the API's unspent slice, counted as taken
    assert key.startswith("Key: ") and 7 <= int(key.split()[1]) <= 7 + slack
    assert account.startswith("Account: ")
    assert "every server sharing the limits" in html and "up to 5% of a limit" in html
    assert console_side.stats.leases == 0
    api.engine.close()
    console_side.engine.close()


def test_an_engine_that_does_not_answer_leaves_the_limits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis down: the page still answers, with each key's limits, no use, and a note;
    the log names the engine and the error's type only."""
    from keyturn.ratelimits.redis import RedisEngine

    down = RedisEngine("redis://:hunter2@127.0.0.1:1/0", deadline=0.2)
    world, _ = limited_world(limiter=RateLimiter(limits, engine=down))
    made = keys(world)
    client = Client("asgi", world.console)
    client.account = "alice"

    reply = client.get("/console/")

    assert reply.status == 200
    assert limit_lines(row_of(reply.text, made["ci"][0])) == [
        "Key: 100 a minute",
        "Account: 1,000 an hour",
    ]
    assert "could not be read just now" in reply.text and "<meter" not in reply.text
    assert "could not read rate limit use from RedisEngine (ConnectionError)" in caplog.text
    assert "hunter2" not in caplog.text
    down.close()


def test_an_async_manager_s_console_shows_the_limits() -> None:
    """Over an AsyncKeyManager the roles are awaited on the loop like every other call."""
    world, limiter = limited_world()
    made = keys(world)
    requests(world, limiter, made["ci"], 2)
    manager = AsyncKeyManager(Awaited(world.store), Awaited(world.membership), clock=world.clock)
    console = Console(manager, signed_in=signed_in, sign_in_url=SIGN_IN, rate_limiter=limiter)
    app = Starlette(routes=[Mount("/console", app=console.asgi())])
    with TestClient(app, cookies={ACCOUNT_COOKIE: "alice"}) as client:
        html = client.get("/console/").text
    assert limit_lines(row_of(html, made["ci"][0]))[0] == "Key: 2 of 100 a minute"


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (1, "a second"),
        (60, "a minute"),
        (3600, "an hour"),
        (86400, "a day"),
        (90, "per 90 seconds"),
        (300, "per 5 minutes"),
        (7200, "per 2 hours"),
        (604800, "per 7 days"),
    ],
)
def test_windows_read_as_words(seconds: int, words: str) -> None:
    assert per_window(seconds) == words


def limited_usage(world: World, key_id: str) -> None:
    """Three days of a key's requests: accepted, refused for a reason, and rate limited."""
    today = NOW.date()
    for days_ago, accepted, refused, rate_limited in ((0, 50, 2, 30), (1, 40, 0, 0), (3, 10, 0, 5)):
        counts = {(key_id, ACCEPTED): accepted}
        if refused:
            counts[key_id, "org_not_found"] = refused
        if rate_limited:
            counts[key_id, RATE_LIMITED] = rate_limited
        world.store.count_usage(today - timedelta(days=days_ago), counts)


def test_the_chart_counts_rate_limited_refusals_apart(client: Client, world: World) -> None:
    """Requests a rate limit refused are a series of their own: their own rectangles on
    top, their own count in the chart's name, in each day's tooltip and beside the chart;
    the other refusals keep theirs."""
    made = keys(world)
    key_id = made["ci"][0]
    limited_usage(world, key_id)

    row = row_of(client.get("/console/").text, key_id)

    svg = row[row.index("<svg") : row.index("</svg>")]
    title = re.search(r'<title id="usage-\w+">([^<]*)</title>', svg)
    assert title is not None
    assert title.group(1) == (
        "Requests with “ci” in the last 30 days: 100 accepted, 2 refused, 35 rate limited; "
        f"busiest day {NOW.date().isoformat()} with 82."
    )
    assert svg.count('class="limited"') == 2 and svg.count('class="refused"') == 1
    assert f"<title>{NOW.date().isoformat()}: 50 accepted, 2 refused, 30 rate limited" in svg
    today = svg[svg.index(f"<title>{NOW.date().isoformat()}") :]
    heights = {
        name: int(height)
        for name, height in re.findall(r'class="(\w+)"[^>]*height="(\d+)"', today[:400])
    }
    assert heights == {"accepted": 16, "refused": 1, "limited": 10}  # 27 pixels, stacked
    assert '<span class="usage-limited">35 rate limited</span>' in row
    assert 'title="org_not_found 2">2 refused' in row


@pytest.mark.parametrize("edge_name", BROWSER_EDGES)
def test_limits_in_a_browser(browser: Any, edge_name: str) -> None:
    """In Chromium: after some admitted requests each Active key's limits and use read in
    words, its meters are hidden from the accessibility tree (the words say it), the
    rate-limited bars have the stylesheet's colour, no CSP violation is reported, and at
    375 px nothing scrolls sideways."""
    world, limiter = limited_world(edge=edge_name)
    made = keys(world)
    requests(world, limiter, made["ci"], 37)
    requests(world, limiter, made["notebooks"], 4)
    limited_usage(world, made["ci"][0])
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
            ci = page.locator(f"tr[data-key='{made['ci'][0]}']")
            expect()(ci.locator(".limits li")).to_have_text(
                ["Key: 37 of 100 a minute", "Account: 41 of 1,000 an hour"]
            )
            expect()(ci.locator("meter").first).to_be_visible()
            assert ci.locator("meter").first.evaluate("m => m.value") == 37
            notebooks = page.locator(f"tr[data-key='{made['notebooks'][0]}'] .limits li")
            expect()(notebooks).to_have_count(3)
            expect()(notebooks.nth(2)).to_have_text("Organization acme-research: 4 of 5,000 a day")
            expect()(page.locator(f"tr[data-key='{made['gone'][0]}'] .limits")).to_have_count(0)
            expect()(page.locator("#limits-note")).to_contain_text("this server process")
            limits = page.get_by_role("list", name="Rate limits").first
            expect()(limits).to_contain_text("Key: 37 of 100 a minute")
            assert "meter" not in page.locator("table.keys").aria_snapshot()
            bar = ci.locator("rect.limited").first
            assert bar.evaluate("e => getComputedStyle(e).fill") == "rgb(154, 103, 0)"
            expect()(page.get_by_role("img", name=re.compile("35 rate limited"))).to_be_visible()
            assert page.evaluate("document.documentElement.scrollWidth") <= width
            assert not [text for text in said if "Content Security Policy" in text]
            context.close()


COUNTS = st.lists(
    st.integers(min_value=0, max_value=10**7), min_size=CHART_DAYS, max_size=CHART_DAYS
)


@given(accepted=COUNTS, refused=COUNTS, rate_limited=COUNTS)
def test_three_series_fit_the_chart_and_follow_the_counts(
    accepted: list[int], refused: list[int], rate_limited: list[int]
) -> None:
    """With rate-limited refusals on top: every bar stays on its baseline, its three parts
    stacked; a part is drawn only for a count above zero, and each such part has a pixel
    whenever the bar has one for each; a busier day is never lower; the name adds up."""
    first, _ = window(NOW.date())
    usage = KeyUsage(
        key_id="k1",
        days=tuple(first + timedelta(days=n) for n in range(CHART_DAYS)),
        accepted=tuple(accepted),
        refused=tuple(r + n for r, n in zip(refused, rate_limited, strict=True)),
        rate_limited=tuple(rate_limited),
    )
    drawn = chart("CI", usage)
    heights = []
    every = zip(accepted, refused, rate_limited, strict=True)
    for bar, counts in zip(drawn.bars, every, strict=True):
        parts = (bar.accepted_height, bar.refused_height, bar.limited_height)
        assert bar.accepted_y + bar.accepted_height == 27  # on the baseline
        assert bar.refused_y + bar.refused_height == bar.accepted_y  # stacked
        assert bar.limited_y + bar.limited_height == bar.refused_y
        assert bar.limited_y >= 0  # inside the chart
        drawn_counts = list(zip(parts, counts, strict=True))
        assert all(height == 0 or count > 0 for height, count in drawn_counts)
        if sum(parts) >= sum(count > 0 for count in counts):
            assert all(height > 0 for height, count in drawn_counts if count)
        heights.append((sum(counts), sum(parts)))
    heights.sort()
    assert [height for _, height in heights] == sorted(height for _, height in heights)
    assert f"{sum(accepted):,} accepted, {sum(refused):,} refused" in drawn.title
    assert (f"{sum(rate_limited):,} rate limited" in drawn.title) == (sum(rate_limited) > 0)
