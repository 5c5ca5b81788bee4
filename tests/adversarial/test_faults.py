"""Faults fail closed (D15): a failing or hanging store or provider is a 503 with
``Retry-After``, never a 401 and never a pass. A forged secret costs one SHA-256 (no 503 to
shed it); a legacy argon2id hash runs argon2 within its parameter limits, once per process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
from argon2 import PasswordHasher, Type

from keyturn import AuditEvent, Reason
from keyturn._core.hashing import HASH_LIMITS
from tests.adversarial.support import (
    AsyncHangingStore,
    Canary,
    SpyMembership,
    SpyStore,
    Target,
    assert_refused,
    bearer,
    key_of,
    random_secret,
    split,
)
from tests.legacy import legacy_runs
from tests.web.web_support import MODELS, PUBLIC, Reply
from tests.world import World

ORG = "x-organization-id"
TIMEOUT = 0.3


def assert_unavailable(reply: Reply, world: World) -> None:
    """503 service_unavailable with Retry-After and no challenge; the app not called."""
    assert_refused(reply, 503, world)
    assert reply.values("retry-after") == ["1"]


# --- failing and hanging backends ----------------------------------------------------------

FAILING = {
    "key store read": ("get_key", "tenant", "default"),
    "organization lookup": ("get_organization", "tenant", "org_research"),
    "default organization lookup": ("get_default_organization", "tenant", "default"),
    "role lookup": ("get_role", "research", None),
    "tenant reach": ("reaches_tenant", "tenant", "org_secret"),
}


@pytest.mark.parametrize(("method", "key", "organization"), FAILING.values(), ids=FAILING.keys())
def test_raising_backend_is_503(
    attack: Callable[..., Target],
    world: World,
    method: str,
    key: str,
    organization: str | None,
) -> None:
    """Whichever store or provider call raises, the request gets 503, not 401 or a pass."""
    store, membership = SpyStore(world.store), SpyMembership(world.membership)
    store.failing = method == "get_key"
    membership.failing = {method}
    target = attack(authenticator=world.authenticator(store=store, membership=membership))
    more = [(ORG, organization)] if organization else []

    assert_unavailable(target.send(bearer(world.keys[key], *more)), world)
    assert world.audit[-1].error.reason is Reason.BACKEND_ERROR


HANGING = {
    "key store read": "get_key",
    "organization lookup": "get_organization",
}


@pytest.mark.parametrize("method", HANGING.values(), ids=HANGING.keys())
def test_hanging_backend_is_503_and_others_go_on(
    attack: Callable[..., Target], world: World, method: str
) -> None:
    """A call that hangs is cut at the timeout with 503; meanwhile another request completes."""
    store = SpyStore(world.store, nonblocking=False)
    membership = SpyMembership(world.membership, nonblocking=False)
    if method == "get_key":
        store.hanging = {split(world.keys["tenant"])[0]}
    else:
        membership.hanging = {method}
    target = attack(
        authenticator=world.authenticator(store=store, membership=membership, timeout=TIMEOUT)
    )
    slow = bearer(world.keys["tenant"], (ORG, "org_research"))

    with store.gate.released_at_end(), membership.gate.released_at_end():
        order, slow_reply, fast_reply = target.race(slow, bearer(world.keys["research"]))

    assert order == ["fast", "slow"]
    assert fast_reply.status == 200
    world.calls.clear()  # the fast request's call
    assert_unavailable(slow_reply, world)
    (refusal,) = [event for event in world.audit if not event.allowed]
    assert refusal.error.reason is Reason.BACKEND_TIMEOUT


def test_hanging_async_store_is_503_and_the_loop_goes_on(
    asgi_target: Callable[..., Target], world: World
) -> None:
    """An async store that never answers is cut at the timeout; the loop serves others."""
    store = AsyncHangingStore(world.store, split(world.keys["tenant"])[0])
    target = asgi_target(authenticator=world.authenticator(store=store, timeout=TIMEOUT))
    slow = bearer(world.keys["tenant"], (ORG, "default"))

    try:
        order, slow_reply, fast_reply = target.race(slow, bearer(world.keys["research"]))
    finally:
        store.gate.open()

    assert order == ["fast", "slow"]
    assert fast_reply.status == 200
    world.calls.clear()
    assert_unavailable(slow_reply, world)


STALE = 24  # requests at once: more than the Authenticator has threads for store calls


def test_calls_that_timed_out_are_not_replayed_on_recovery(
    attack: Callable[..., Target], world: World
) -> None:
    """Store calls still queued when their request gave up never run once the store is back:
    an outage must not end in a stampede of stale reads.
    """
    store = SpyStore(world.store, nonblocking=False)
    store.hanging = {split(world.keys["research"])[0]}
    target = attack(authenticator=world.authenticator(store=store, timeout=TIMEOUT))
    requests = [bearer(world.keys["research"])] * STALE

    with store.gate.released_at_end():
        replies = target.send_many(requests)

    assert {reply.status for reply in replies} == {503}
    time.sleep(0.5)  # time for any queued call to run against the recovered store
    assert store.reads < STALE


def test_hung_store_does_not_starve_the_loops_executor(
    asgi_target: Callable[..., Target], world: World
) -> None:
    """Threads stuck in a hung store are the Authenticator's own: the event loop's default
    executor, which the app and the loop itself use, stays free.
    """
    store = SpyStore(world.store, nonblocking=False)
    store.hanging = {split(world.keys["research"])[0]}
    target = asgi_target(authenticator=world.authenticator(store=store, timeout=TIMEOUT))

    async def scenario() -> tuple[list[Reply], int]:
        try:
            replies = await asyncio.gather(
                *(target.send_async(bearer(world.keys["research"])) for _ in range(40))
            )
            loop = asyncio.get_running_loop()
            return replies, await asyncio.wait_for(loop.run_in_executor(None, int), 2)
        finally:
            store.gate.open()

    replies, answer = asyncio.run(scenario())

    assert {reply.status for reply in replies} == {503}
    assert answer == 0


def test_failing_audit_hook_changes_no_outcome(
    attack: Callable[..., Target], world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """An audit hook that raises is logged; 200, 401 and 503 stay what they were."""

    def broken(event: AuditEvent) -> None:
        raise RuntimeError("audit sink down")

    store = SpyStore(world.store)
    target = attack(authenticator=world.authenticator(store=store, audit=broken))

    accepted = target.send(bearer(world.keys["research"]))
    refused = target.send(bearer(world.keys["tenant_typo"]))
    store.failing = True
    unavailable = target.send(bearer(world.keys["research"]))

    assert (accepted.status, refused.status, unavailable.status) == (200, 401, 503)
    assert caplog.text.count("the audit hook failed") == 3


def test_failing_policy_is_a_500_never_a_401(attack: Callable[..., Target], world: World) -> None:
    """A policy that raises is a bug: it propagates (the server's 500), never a refusal or pass."""

    def broken(principal: Any, request: Any) -> bool:
        raise RuntimeError("policy bug")

    target = attack(authenticator=world.authenticator(policy=broken))

    with pytest.raises(RuntimeError, match="policy bug"):
        target.send(bearer(world.keys["research"]))
    assert world.calls == []


# --- forged secrets and stored hashes -------------------------------------------------------


def test_burst_of_wrong_secrets_is_refused_and_costs_no_one_else(
    attack: Callable[..., Target], world: World
) -> None:
    """200 distinct wrong secrets for a known id at once: each is a 401 (one SHA-256, no
    argon2, nothing shed), and a good key in the thick of the burst passes every time.
    """
    target = attack()
    good = bearer(world.keys["main"])
    key_id, _ = split(world.keys["research"])
    guesses = [bearer(key_of(key_id, random_secret())) for _ in range(200)]
    requests = []
    for i, guess in enumerate(guesses):
        requests.append(guess)
        if i % 10 == 0:
            requests.append(good)
    runs = legacy_runs()

    replies = target.send_many(requests)

    on_guesses = [reply for lines, reply in zip(requests, replies, strict=True) if lines != good]
    on_good = [reply for lines, reply in zip(requests, replies, strict=True) if lines == good]
    assert {reply.status for reply in on_guesses} == {401}
    assert {reply.status for reply in on_good} == {200}
    assert legacy_runs() == runs


SLOW_SECRET = "S1ow" * 7  # a fixed secret, so its costly hash is made once per run


@cache
def slowest_allowed_hash() -> str:
    """A hash at the largest parameters a stored hash may ask for (about half a second)."""
    return PasswordHasher(
        time_cost=HASH_LIMITS.max_time_cost,
        memory_cost=HASH_LIMITS.max_memory_kib,
        parallelism=HASH_LIMITS.max_parallelism,
        type=Type.ID,
    ).hash(SLOW_SECRET)


def test_the_costliest_allowed_legacy_hash_runs_argon2_once(
    attack: Callable[..., Target], world: World, canary: Canary
) -> None:
    """A key whose stored argon2id hash asks for the most the limits allow passes, after one
    argon2 run; its next requests run none (the process remembers its secret's SHA-256),
    even from a store that cannot replace the hash.
    """
    key_id, _ = split(world.keys["research"])
    slow_key = key_of(key_id, SLOW_SECRET)
    canary.secret(slow_key)
    store = SpyStore(world.store)
    store.hashes[key_id] = slowest_allowed_hash()
    target = attack(authenticator=world.authenticator(store=store))
    runs = legacy_runs()

    replies = [target.send(bearer(slow_key)) for _ in range(3)]

    assert [reply.status for reply in replies] == [200, 200, 200]
    assert legacy_runs() - runs <= 1  # none if an earlier test of this process verified it


BAD_HASHES = {
    "4 TiB of memory": (
        "$argon2id$v=19$m=4294967295,t=1,p=1$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaA"
    ),
    "four billion passes": (
        "$argon2id$v=19$m=8192,t=4294967295,p=1$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaA"
    ),
    "255 lanes": "$argon2id$v=19$m=8192,t=1,p=255$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaA",
    "argon2i": "$argon2i$v=19$m=8192,t=1,p=1$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaA",
    "memory below argon2's minimum": (
        "$argon2id$v=19$m=1,t=1,p=1$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaA"
    ),
    "no salt and no hash": "$argon2id$v=19$m=8192,t=1,p=1$$",
    "not argon2": "pbkdf2_sha256$600000$salt$hash",
    "non-ASCII": "$argon2id$v=19$m=8192,t=1,p=1$c2FsdA$\u00e9\u00e9\u00e9",
}


@pytest.mark.parametrize("stored", BAD_HASHES.values(), ids=BAD_HASHES.keys())
def test_unusable_stored_hash_is_401_at_once(
    attack: Callable[..., Target], world: World, stored: str
) -> None:
    """A stored hash that is absurd, corrupt or of another kind is refused at once as 401,
    before argon2 allocates anything, and never as a 500.
    """
    key_id, _ = split(world.keys["research"])
    store = SpyStore(world.store)
    store.hashes[key_id] = stored
    target = attack(authenticator=world.authenticator(store=store))

    reply = target.send(bearer(world.keys["research"]))

    assert_refused(reply, 401, world)
    assert world.audit[-1].error.reason in (Reason.UNVERIFIABLE, Reason.WRONG_SECRET)


def test_public_paths_stay_open_while_the_store_is_down(
    attack: Callable[..., Target], world: World
) -> None:
    """A broken store closes the API, not the paths the middleware does not guard."""
    store = SpyStore(world.store)
    store.failing = True
    target = attack(authenticator=world.authenticator(store=store))

    assert target.send(path=PUBLIC).status == 200
    assert target.send(bearer(world.keys["research"]), path=MODELS).status == 503
    assert store.reads == 1
