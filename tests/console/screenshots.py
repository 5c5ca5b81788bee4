"""Regenerate the console screenshots of docs/console.md: ``make screenshots``.

Serves the console in this process (ASGI edge, in-memory store, a fixed clock), drives
Debian's Chromium through Playwright, and writes ``docs/img/console-*.png``. The secret on
the "created" screenshot is replaced by a plainly fake one before the picture is taken.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from keyturn import Lifetime, Scope
from keyturn.activity import By
from keyturn.console import Console
from keyturn.usage import ACCEPTED, RATE_LIMITED
from tests.console.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.console.support import (
    ACCOUNT_COOKIE,
    REAUTHENTICATE,
    SIGN_IN,
    SIGNED_IN_AT_COOKIE,
    make_world,
    recently_authenticated,
    serving,
    sign_in,
    signed_in,
    signed_in_at,
)

OUT = Path(__file__).resolve().parents[2] / "docs" / "img"
DAYS_90 = Lifetime.DAYS_90
FAKE_SECRET = "rma_DOCS-EXAMPLE-NOT-A-REAL-KEY"


def main() -> None:
    from playwright.sync_api import expect, sync_playwright

    world = make_world()
    manager = world.manager
    world.clock.now = datetime(2026, 4, 15, 9, 0, tzinfo=UTC)  # nobody has used it since
    manager.create("alice", name="staging dashboard", scope=Scope.tenant("acme"), expiry=DAYS_90)
    world.clock.now = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
    research = Scope.organization("acme-research", tenant_id="acme")
    manager.create("alice", name="old laptop", scope=Scope.tenant("acme"), expiry=Lifetime.HOURS_3)
    browser = By.console(
        "alice", client_address="203.0.113.7", user_agent="Mozilla/5.0 (X11; Linux) Firefox/133.0"
    )
    manager.create("alice", name="research notebooks", scope=research, by=browser)
    backups = manager.create(
        "alice", name="nightly backups", scope=Scope.tenant("acme"), by=browser
    )
    world.clock.now += timedelta(days=2)
    ci = manager.create("alice", name="CI deploys", scope=Scope.tenant("acme"))
    gone = manager.create(
        "alice", name="staging", scope=Scope.organization("acme-main", tenant_id="acme")
    )
    manager.revoke("alice", gone.info.key_id, by=By.operator("ops", reason="seen in a CI log"))
    main = Scope.organization("acme-main", tenant_id="acme")
    agent = manager.create("alice", name="agent on build box", scope=main, expiry=Lifetime.DAYS_7)
    # Two rotations: one whose new key was first used, one whose new key was not seen yet.
    new_backups = manager.rotate("alice", backups.info.key_id, by=browser)
    world.store.mark_used(new_backups.info.key_id, world.clock.now + timedelta(minutes=50))
    world.clock.now += timedelta(minutes=30)
    manager.rotate("alice", agent.info.key_id, revoke_old_on_first_use=True)
    world.membership.remove_member("alice", "acme-research")  # its key turns Inactive
    world.store.mark_used(gone.info.key_id, world.clock.now - timedelta(hours=1))
    leak_url = "https://github.com/acme/deploy-scripts/blob/main/.env"  # a plainly made-up one
    world.store.report_leak(ci.info.key_id, leak_url, world.clock.now - timedelta(minutes=40))
    world.clock.now += timedelta(hours=2)  # the 7-day key has 6 days and 22 hours left
    world.store.mark_used(ci.info.key_id, world.clock.now - timedelta(minutes=5))
    usage(world, ci.info.key_id, weekday=120, weekend=6, refused_every=4)
    usage(world, new_backups.info.key_id, weekday=24, weekend=24, refused_every=0)
    OUT.mkdir(parents=True, exist_ok=True)
    with serving("asgi", world.console) as origin, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        url = f"{origin}/console/"

        def page_at(width: int) -> object:
            context = browser.new_context(
                timezone_id="Europe/Berlin", viewport={"width": width, "height": 800}
            )
            context.add_cookies([{"name": ACCOUNT_COOKIE, "value": "alice", "url": url}])
            page = context.new_page()
            page.goto(url)
            expect(page.locator("#tz")).to_have_value("Europe/Berlin")
            return page

        page = page_at(1100)
        page.screenshot(path=OUT / "console-keys.png", full_page=True)
        page.fill("#name", "nightly export")
        page.check("input[name=lifetime][value=custom]")
        page.fill("#date", "2026-12-31")
        expect(page.locator("#expires")).to_have_text("2026-12-31, end of day CET")
        page.locator("section.panel").first.screenshot(path=OUT / "console-create-custom-date.png")
        page.click("#create-button")
        page.locator("#secret").evaluate("(el, fake) => { el.value = fake; }", FAKE_SECRET)
        page.locator("#curl").evaluate(
            "(el, fake) => { el.textContent = el.textContent.replace(/rma_\\w+/, fake)"
            ".replace(/127\\.0\\.0\\.1:\\d+/, '127.0.0.1:8000'); }",
            FAKE_SECRET,
        )
        page.screenshot(path=OUT / "console-created.png")
        page.reload()  # sends the create form again: the console refuses a second key
        expect(page.locator("h1")).to_have_text("This form was already sent")
        page.screenshot(path=OUT / "console-already-sent.png")
        page.goto(url)
        page.locator("tr", has_text="CI deploys").locator("a.revoke").click()
        page.screenshot(path=OUT / "console-revoke.png")
        page.goto(url)
        page.locator(f"tr[data-key='{ci.info.key_id}'] a.rotate").click()
        page.check("#revoke-old")
        page.screenshot(path=OUT / "console-rotate.png")
        page.goto(url + "activity")
        page.screenshot(path=OUT / "console-activity.png", full_page=True)
        page.goto(url)
        page.locator("section.panel").nth(1).screenshot(path=OUT / "console-usage.png")
        narrow = page_at(375)
        narrow.set_viewport_size({"width": 375, "height": 1400})
        narrow.screenshot(path=OUT / "console-375px.png")
        django_screenshot(browser, world)
        step_up_screenshot(browser, world)
        rate_limits_screenshot(browser, world, ci.info.key_id)
        browser.close()
    print(f"wrote {len(list(OUT.glob('console-*.png')))} screenshots to {OUT}")


def usage(world: Any, key_id: str, *, weekday: int, weekend: int, refused_every: int) -> None:
    """Thirty days of requests for the key, up to today: a working week's rhythm, and a
    refusal (an organization the key cannot reach) every *refused_every* days."""
    today = world.clock.now.date()
    for days_ago in range(30):
        day = today - timedelta(days=days_ago)
        busy = weekday + (days_ago * 7) % 40 if day.weekday() < 5 else weekend
        counts = {(key_id, ACCEPTED): busy}
        if refused_every and days_ago % refused_every == 1:
            counts[key_id, "org_not_reachable"] = 1 + days_ago % 3
        world.store.count_usage(day, counts)


def django_screenshot(browser: Any, world: Any) -> None:
    """The same keys in a Django project: request.user signed in through Django's session."""
    from keyturn.console.django import username

    console = Console(world.manager, signed_in=username, sign_in_url=SIGN_IN)
    with serving("django", console) as origin:
        url = f"{origin}/console/"
        context = browser.new_context(
            timezone_id="Europe/Berlin", viewport={"width": 1100, "height": 800}
        )
        sign_in(context, "django", "alice", url)
        page = context.new_page()
        page.goto(url)
        page.screenshot(path=OUT / "console-django.png", full_page=True)
        context.close()


def rate_limits_screenshot(browser: Any, world: Any, key_id: str) -> None:
    """The same keys behind a console given the API's rate limiter, after some requests,
    some of them refused by the key's limit."""
    from keyturn import Principal
    from keyturn.ratelimits import Rate, RateLimiter, RateLimits

    def limits(principal: Principal) -> RateLimits:
        return RateLimits(key=Rate(60, 60), account=Rate(1000, 3600))

    limiter = RateLimiter(limits, clock=lambda: world.clock().timestamp())
    (info,) = [info for info in world.manager.list("alice") if info.key_id == key_id]
    principal = Principal(
        account_id="alice",
        key_id=key_id,
        key_name=info.name,
        scope=info.scope,
        organization_id="acme-main",
        tenant_id="acme",
        role="admin",
    )
    for _ in range(42):
        limiter.admit(principal)
    today = world.clock.now.date()
    world.store.count_usage(today, {(key_id, RATE_LIMITED): 35})
    console = Console(world.manager, signed_in=signed_in, sign_in_url=SIGN_IN, rate_limiter=limiter)
    with serving("asgi", console) as origin:
        url = f"{origin}/console/"
        context = browser.new_context(
            timezone_id="Europe/Berlin", viewport={"width": 1100, "height": 800}
        )
        context.add_cookies([{"name": ACCOUNT_COOKIE, "value": "alice", "url": url}])
        page = context.new_page()
        page.goto(url)
        page.locator("section.panel").nth(1).screenshot(path=OUT / "console-rate-limits.png")
        context.close()


def step_up_screenshot(browser: Any, world: Any) -> None:
    """The same keys behind a console that asks for a recent sign-in, signed in long ago."""
    console = Console(
        world.manager,
        signed_in=signed_in,
        sign_in_url=SIGN_IN,
        recently_authenticated=partial(recently_authenticated, world.clock),
        reauthenticate_url=REAUTHENTICATE,
    )
    with serving("asgi", console) as origin:
        url = f"{origin}/console/"
        context = browser.new_context(
            timezone_id="Europe/Berlin", viewport={"width": 1100, "height": 560}
        )
        long_ago = signed_in_at(world.clock.now - timedelta(hours=3))
        context.add_cookies(
            [
                {"name": ACCOUNT_COOKIE, "value": "alice", "url": url},
                {"name": SIGNED_IN_AT_COOKIE, "value": long_ago, "url": url},
            ]
        )
        page = context.new_page()
        page.goto(url)
        page.screenshot(path=OUT / "console-step-up.png")
        context.close()


if __name__ == "__main__":
    main()
