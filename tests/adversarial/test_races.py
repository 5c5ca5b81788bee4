"""Revocation races: a revoke acts on every request that starts after it, also one that lands
between a legacy hash's verification and its upgrade, and a success never carries over to
another state or organization.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from keyturn._core import hashing as _hashing
from keyturn._core import token as _token
from tests.adversarial.support import WORKERS, SpyStore, Target, assert_refused, bearer
from tests.legacy import legacy_hash
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


class HeldUpgrades(SpyStore):
    """The world's store, whose hash upgrades wait at a gate (on a thread of their own:
    ``nonblocking=False``) once they have said so."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner, nonblocking=False)
        self.entered = threading.Event()

    def upgrade_hash(self, key_id: str, old_hash: str, new_hash: str) -> bool:
        self.entered.set()
        self.gate.wait()
        return bool(self.inner.upgrade_hash(key_id, old_hash, new_hash))


def test_a_revoke_between_a_legacy_verification_and_its_upgrade_wins(
    attack: Callable[..., Target], world: World
) -> None:
    """A key with an argon2id hash is verified, and revoked before its upgrade is written:
    the upgrade replaces the hash and nothing else, so the key stays revoked, for this
    process and a restarted one.
    """
    key_id, secret = _token.split(world.keys["research"])
    stored = world.store.get_key(key_id)
    assert stored is not None
    assert world.store.upgrade_hash(key_id, stored.secret_hash, legacy_hash(secret))
    store = HeldUpgrades(world.store)
    target = attack(authenticator=world.authenticator(store=store))
    lines = bearer(world.keys["research"])

    def revoke_then_release() -> None:
        world.manager.revoke("alice", key_id)
        store.gate.open()

    first = target.meanwhile(lines, store.entered, revoke_then_release)
    world.calls.clear()
    later = target.send(lines)
    restarted = attack(authenticator=world.authenticator()).send(lines)

    assert first.status in (200, 401)  # it read the key before the revoke: either is fair
    assert_refused(later, 401, world)
    assert_refused(restarted, 401, world)
    upgraded = world.store.get_key(key_id)
    assert upgraded is not None and upgraded.revoked_at is not None
    assert upgraded.secret_hash == _hashing.hash_secret(secret)


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
