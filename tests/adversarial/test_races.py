"""Revocation races and the verified-token cache: a revoke acts on every request that starts
after it, and a cached success never carries over to another state or organization.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from keyturn import _hashing
from tests.adversarial.support import WORKERS, Gate, SpyStore, Target, assert_refused, bearer
from tests.web.web_support import Reply
from tests.world import World

ORG = "x-organization-id"
REQUESTS = 60
SPACING = 0.002  # seconds between two request starts


def traffic_around(
    target: Target, lines: Any, event: Callable[[], object], at: float
) -> list[tuple[bool, Reply]]:
    """Start REQUESTS requests SPACING apart, many in flight at once, and run *event* at
    *at* seconds; say for each request whether it started after *event* had returned.
    """
    done = threading.Event()

    def run_event() -> None:
        event()
        done.set()

    if target.adapter == "asgi":

        async def one(i: int) -> tuple[bool, Reply]:
            await asyncio.sleep(i * SPACING)
            after = done.is_set()
            return after, await target.send_async(lines)

        async def side() -> None:
            await asyncio.sleep(at)
            run_event()

        async def everything() -> list[tuple[bool, Reply]]:
            *results, _ = await asyncio.gather(*(one(i) for i in range(REQUESTS)), side())
            return results  # type: ignore[return-value]

        return asyncio.run(everything())

    def one_thread(i: int) -> tuple[bool, Reply]:
        time.sleep(i * SPACING)
        after = done.is_set()
        return after, target.send(lines)

    with ThreadPoolExecutor(WORKERS + 1) as pool:
        timer = threading.Timer(at, run_event)
        timer.start()
        try:
            return list(pool.map(one_thread, range(REQUESTS)))
        finally:
            timer.join(5)


def test_every_request_started_after_a_revoke_is_refused(
    attack: Callable[..., Target], world: World
) -> None:
    """Under concurrent traffic, each request that starts after the revoke committed is 401."""
    store = SpyStore(world.store, nonblocking=False)  # reads on threads: real interleaving
    target = attack(authenticator=world.authenticator(store=store))
    lines = bearer(world.keys["research"])
    assert target.send(lines).status == 200  # verified and cached before the race

    results = traffic_around(
        target,
        lines,
        lambda: world.manager.revoke("alice", world.key_ids["research"]),
        at=REQUESTS * SPACING / 2,
    )

    after = [reply.status for started_after, reply in results if started_after]
    before = [reply.status for started_after, reply in results if not started_after]
    assert after and set(after) == {401}
    assert 200 in before  # the race was real: the key worked until the revoke
    assert set(before) <= {200, 401}


def test_a_verification_landing_after_the_revoke_resurrects_nothing(
    attack: Callable[..., Target], world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An argon2 run that lands after the revoke fills the cache, yet the key stays refused,
    also after a restart: the cache skips argon2, never the key record.
    """
    entered, gate = threading.Event(), Gate()
    check = _hashing.check_secret

    def held_check(*args: Any) -> Any:
        entered.set()
        gate.wait()
        return check(*args)

    monkeypatch.setattr(_hashing, "check_secret", held_check)
    authenticator = world.authenticator()
    target = attack(authenticator=authenticator)
    lines = bearer(world.keys["research"])

    def revoke_then_release() -> None:
        world.manager.revoke("alice", world.key_ids["research"])
        gate.open()

    first = target.meanwhile(lines, entered, revoke_then_release)
    world.calls.clear()
    later = target.send(lines)
    restarted = attack(authenticator=world.authenticator()).send(lines)

    assert first.status in (200, 401)  # it read the key before the revoke: either is fair
    assert len(authenticator.cache) == 1  # the late verification did fill the cache
    assert authenticator.verifier.runs == 1  # and the later request used it
    assert_refused(later, 401, world)
    assert_refused(restarted, 401, world)


def test_cached_success_in_one_organization_opens_no_other(target: Target, world: World) -> None:
    """A tenant key cached in one organization still gets 404 for an organization its
    creator cannot reach; an organization key cached at home gets 404 elsewhere.
    """
    tenant, research = world.keys["tenant"], world.keys["research"]
    assert target.send(bearer(tenant, (ORG, "org_research"))).status == 200
    assert target.send(bearer(research)).status == 200
    world.calls.clear()

    for lines in [
        bearer(tenant, (ORG, "org_secret")),
        bearer(tenant, (ORG, "org_globex")),
        bearer(research, (ORG, "org_main")),
        bearer(research, (ORG, "default")),
    ]:
        assert_refused(target.send(lines), 404, world)


def test_cached_key_follows_membership_both_ways(target: Target, world: World) -> None:
    """A cached key turns Inactive (401) the moment its creator leaves, and Active again
    when access returns (D11): the cache never answers for the membership provider.
    """
    lines = bearer(world.keys["research"])
    assert target.send(lines).status == 200

    world.membership.remove_member("alice", "org_research")
    world.calls.clear()
    assert_refused(target.send(lines), 401, world)

    world.membership.add_member("alice", "org_research", role="member")
    assert target.send(lines).status == 200


def test_revoked_key_stays_revoked_across_restarts(
    attack: Callable[..., Target], world: World
) -> None:
    """Each new Authenticator (a restart, an empty cache) refuses a key revoked before it."""
    lines = bearer(world.keys["main"])
    assert attack().send(lines).status == 200
    world.manager.revoke("alice", world.key_ids["main"])
    world.calls.clear()

    for _ in range(3):
        assert_refused(attack(authenticator=world.authenticator()).send(lines), 401, world)
