"""Argon2 cannot be turned against other users: a flood of wrong secrets for one key, or for
one account's keys, sheds only its own excess (counted outcomes, no clock).

The scene of the report: 400 well-formed keys with wrong secrets for one known key id,
interleaved with 20 other users' first requests (each needs an argon2 run) and 20 requests
with keys already verified. Every other user's request must pass, in every store mode: a
store called on the event loop, a blocking store under the async driver (SQLite), and the
sync driver from many threads (WSGI).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from keyturn import Authenticator, AuthRequest, KeyManager, Principal, Scope, _hashing
from keyturn.errors import Reason, Refusal
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from keyturn.stores.sqlite import SQLiteDatabase
from tests.adversarial.support import key_of, random_secret, split

FLOOD = 400
USERS = 20


def request(key: str) -> AuthRequest:
    return AuthRequest(authorization=(f"Bearer {key}",), organization=("default",))


class Scene:
    """Mallory, with six keys, and twenty users with a fresh key and a warm one each."""

    def __init__(self, store: Any, membership: Any) -> None:
        membership.add_organization("org_acme", tenant_id="acme", default=True)
        manager = KeyManager(store, membership)
        accounts = ["mallory", *(f"user{n}" for n in range(USERS))]
        for account in accounts:
            membership.add_member(account, "org_acme", role="member")
        scope = Scope.tenant("acme")

        def create(account: str) -> str:
            return manager.create(account, name="k", scope=scope).secret

        self.mallory = [create("mallory") for _ in range(6)]
        self.first = [create(f"user{n}") for n in range(USERS)]
        self.warm = [create(f"user{n}") for n in range(USERS)]

    def flood(self, *targets: str) -> list[str]:
        """FLOOD well-formed keys with distinct wrong secrets, spread over *targets*' ids."""
        ids = [split(key)[0] for key in targets]
        return [key_of(ids[n % len(ids)], random_secret()) for n in range(FLOOD)]

    def sequence(self, flood: list[str]) -> list[tuple[str, str]]:
        """The flood with the other users' requests spread through its thick."""
        others = [("first", key) for key in self.first] + [("warm", key) for key in self.warm]
        others = [
            pair for pair in zip(others[:USERS], others[USERS:], strict=True) for pair in pair
        ]
        sequence: list[tuple[str, str]] = []
        for n, key in enumerate(flood):
            sequence.append(("flood", key))
            if n % 10 == 5 and others:
                sequence.append(others.pop(0))
        return sequence


def outcome(result: Principal | Refusal) -> str:
    if isinstance(result, Principal):
        return "pass"
    return f"{result.status} {result.reason.value}"


@pytest.fixture(params=["memory, async", "sqlite, async", "sqlite, sync threads"])
def mode(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Any, Any]]:
    if request.param.startswith("memory"):
        yield request.param, MemoryKeyStore(), MemoryMembership()
        return
    db = SQLiteDatabase(tmp_path / "keys.sqlite3")
    yield request.param, db.keys, db.membership
    db.close()


def run(mode: str, authenticator: Authenticator, keys: list[str]) -> list[str]:
    """Decide every request at once: concurrently on one loop, or from 32 threads."""
    if mode.endswith("async"):

        async def all_at_once() -> list[Principal | Refusal]:
            return await asyncio.gather(
                *(authenticator.authenticate_async(request(k)) for k in keys)
            )

        return [outcome(result) for result in asyncio.run(all_at_once())]
    with ThreadPoolExecutor(32) as pool:
        return [outcome(r) for r in pool.map(authenticator.authenticate, map(request, keys))]


def watch_share(
    monkeypatch: pytest.MonkeyPatch, authenticator: Authenticator, flooded: set[str]
) -> list[int]:
    """The most checks against the flooded keys' hashes ever in flight (queued or running),
    sampled each time an argon2 run starts.
    """
    verifier = authenticator.verifier
    check = _hashing.check_secret
    peak = [0]

    def counting_check(secret_hash: str, secret: str, limits: Any = _hashing.HASH_LIMITS) -> Any:
        share = sum(1 for stored in verifier.in_flight() if stored in flooded)
        peak[0] = max(peak[0], share)
        return check(secret_hash, secret, limits)

    monkeypatch.setattr(_hashing, "check_secret", counting_check)
    return peak


@pytest.mark.parametrize("aim", ["one key", "one account"])
def test_a_flood_sheds_only_its_own_excess(
    mode: tuple[str, Any, Any], aim: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """400 wrong secrets for one key (or spread over one account's keys) amid 20 other
    users' first requests and 20 warm ones: every other user passes; the flood gets only
    401 and 503, and never holds more checks in flight than its key's (or account's) share.
    """
    name, store, membership = mode
    scene = Scene(store, membership)
    authenticator = Authenticator(store, membership, timeout=60, usage_interval=None)
    targets = scene.mallory[:1] if aim == "one key" else scene.mallory
    flooded = {store.get_key(split(key)[0]).secret_hash for key in targets}
    peak = watch_share(monkeypatch, authenticator, flooded)
    with authenticator:
        assert set(run(name, authenticator, scene.warm)) == {"pass"}  # now verified
        warmed_runs = authenticator.verifier.runs
        flood = scene.flood(*targets)
        sequence = scene.sequence(flood)

        results = run(name, authenticator, [key for _, key in sequence])

        seen: dict[str, Counter[str]] = {"flood": Counter(), "first": Counter(), "warm": Counter()}
        for (kind, _), result in zip(sequence, results, strict=True):
            seen[kind][result] += 1
        flood_runs = authenticator.verifier.runs - warmed_runs - USERS

    print(f"{name}, aimed at {aim}: {seen}, peak in flight {peak[0]}")
    assert seen["first"] == Counter({"pass": USERS})
    assert seen["warm"] == Counter({"pass": USERS})
    assert 1 <= peak[0] <= (2 if aim == "one key" else 8)  # the documented default shares
    wrong, shed = f"401 {Reason.WRONG_SECRET.value}", f"503 {Reason.OVERLOADED.value}"
    assert set(seen["flood"]) <= {wrong, shed}
    assert seen["flood"][wrong] == flood_runs  # every admitted guess ran argon2 once, and failed
    assert seen["flood"][shed] == authenticator.verifier.shed


def test_shares_must_fit_the_pool() -> None:
    """A per-key share above the per-account one, or either above the pool, is refused at
    construction; the defaults shrink to fit a small pool.
    """
    with pytest.raises(ValueError, match="max_pending_per_key <= max_pending_per_account"):
        _hashing.SecretVerifier(max_pending_per_key=9, max_pending_per_account=8)
    with pytest.raises(ValueError, match="<= max_pending"):
        _hashing.SecretVerifier(max_workers=1, max_pending=4, max_pending_per_account=5)
    small = _hashing.SecretVerifier(max_workers=1, max_pending=1)
    assert (small.max_pending_per_key, small.max_pending_per_account) == (1, 1)
    small.close()
