"""A flood of wrong secrets cannot be turned against other users: each guess costs one
SHA-256, like a good key (D2, D22), so there is nothing to shed (counted outcomes, no clock).

The scene of the report that once needed argon2's fairness scheduling: 400 well-formed keys
with wrong secrets for one known key id (or spread over one account's keys), interleaved
with 20 other users' first requests and 20 requests with keys used before. Every other
user's request passes, every guess is refused as a wrong secret (never a 503), and no
argon2 runs, in every store mode: a store called on the event loop, a blocking store under
the async driver (SQLite), and the sync driver from many threads (WSGI).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from keyturn import Authenticator, AuthRequest, KeyManager, Principal, Scope
from keyturn.errors import Reason, Refusal
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from keyturn.stores.sqlite import SQLiteDatabase
from tests.adversarial.support import key_of, random_secret, split
from tests.legacy import legacy_runs

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


@pytest.mark.parametrize("aim", ["one key", "one account"])
def test_a_flood_of_wrong_secrets_costs_no_one_else_anything(
    mode: tuple[str, Any, Any], aim: str
) -> None:
    """400 wrong secrets for one key (or spread over one account's keys) amid 20 other
    users' first requests and 20 warm ones: every other user passes, every guess is a 401
    wrong secret, and no argon2 runs.
    """
    name, store, membership = mode
    scene = Scene(store, membership)
    authenticator = Authenticator(store, membership, timeout=60, usage_interval=None)
    targets = scene.mallory[:1] if aim == "one key" else scene.mallory
    runs = legacy_runs()
    with authenticator:
        assert set(run(name, authenticator, scene.warm)) == {"pass"}
        sequence = scene.sequence(scene.flood(*targets))
        results = run(name, authenticator, [key for _, key in sequence])

    seen: dict[str, Counter[str]] = {"flood": Counter(), "first": Counter(), "warm": Counter()}
    for (kind, _), result in zip(sequence, results, strict=True):
        seen[kind][result] += 1
    assert seen["first"] == Counter({"pass": USERS})
    assert seen["warm"] == Counter({"pass": USERS})
    assert seen["flood"] == Counter({f"401 {Reason.WRONG_SECRET.value}": FLOOD})
    assert legacy_runs() == runs
