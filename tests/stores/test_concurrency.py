"""Concurrency: many requests at once while a key is revoked; races between revokes.

Every loop is bounded: workers stop after a few refusals following the revoke, or after a
fixed number of requests.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from keyturn import Authenticator, AuthRequest, KeyManager, Principal, Reason, Refusal, Scope
from keyturn.stores.sqlite import SQLiteDatabase
from tests.stores.conftest import Backend
from tests.stores.test_contract import make_key

WORKERS = 8
MAX_REQUESTS = 3000  # per worker: the bound on every loop
PASSES_BEFORE_REVOKE = 300  # in all, before the key is revoked
REFUSALS_TO_STOP = 5  # per worker, after the revoke


class Tally:
    """What the workers saw; every list must stay empty."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.passes = 0
        self.passed_after_revoke: list[int] = []
        self.unexpected: list[object] = []

    def record(self, outcome: Any, started_after_revoke: bool) -> bool:
        """Count one outcome; True when the worker has seen the revoke take effect."""
        with self.lock:
            if isinstance(outcome, Principal):
                self.passes += 1
                if started_after_revoke:
                    self.passed_after_revoke.append(1)
                return False
            if not (isinstance(outcome, Refusal) and outcome.reason is Reason.REVOKED):
                self.unexpected.append(outcome)
            return True


def wait_for(condition: Callable[[], bool], polls: int = 4000) -> None:
    """Poll *condition* a bounded number of times (a hang guard, not a speed check)."""
    for _ in range(polls):
        if condition():
            return
        time.sleep(0.005)
    pytest.fail(f"the condition did not hold after {polls} polls")


def setup(membership: Any) -> None:
    membership.add_organization("org_default", tenant_id="acme", default=True)
    membership.add_member("alice", "org_default", role="admin")


REQUEST_ORGANIZATION = ("default",)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A sync SQL database: SQLite in a temporary file, or PostgreSQL."""
    if request.param == "sqlite":
        with SQLiteDatabase(tmp_path / "keyturn.sqlite3") as db:
            yield db
    else:
        from keyturn.stores.postgres import PostgresDatabase

        with PostgresDatabase(request.getfixturevalue("postgres_url"), max_size=12) as db:
            yield db


def test_threads_see_a_revoke_on_their_next_request(database: Any) -> None:
    """Eight threads authenticate; once the revoke has committed, not one more request passes."""
    setup(database.membership)
    manager = KeyManager(database.keys, database.membership)
    created = manager.create("alice", name="busy", scope=Scope.tenant("acme"))
    request = AuthRequest(
        authorization=(f"Bearer {created.secret}",), organization=REQUEST_ORGANIZATION
    )
    auth = Authenticator(database.keys, database.membership, usage_interval=0)
    tally, revoked = Tally(), threading.Event()

    def worker() -> None:
        refusals = 0
        for _ in range(MAX_REQUESTS):
            after = revoked.is_set()
            if tally.record(auth.authenticate(request), after) and after:
                refusals += 1
                if refusals == REFUSALS_TO_STOP:
                    return

    threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
    try:
        for thread in threads:
            thread.start()
        wait_for(lambda: tally.passes >= PASSES_BEFORE_REVOKE)
        manager.revoke("alice", created.info.key_id)
        revoked.set()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
    finally:
        revoked.set()
        auth.close()  # flushes the last_used_at writes
    assert tally.passed_after_revoke == []
    assert tally.unexpected == []
    stored = database.keys.get_key(created.info.key_id)
    assert stored.revoked_at is not None  # the revoke was not lost among usage writes
    assert stored.last_used_at is not None


@pytest.mark.parametrize(
    "backend",
    [
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("postgres-async", marks=pytest.mark.postgres),
    ],
    indirect=True,
)
def test_tasks_see_a_revoke_on_their_next_request(backend: Backend) -> None:
    """Eight asyncio tasks authenticate; once the revoke has committed, none passes."""
    setup(backend.membership)
    created = KeyManager(backend.keys, backend.membership).create(
        "alice", name="busy", scope=Scope.tenant("acme")
    )
    request = AuthRequest(
        authorization=(f"Bearer {created.secret}",), organization=REQUEST_ORGANIZATION
    )
    auth = backend.authenticator(usage_interval=0)
    tally = Tally()

    async def scenario() -> None:
        revoked = asyncio.Event()

        async def worker() -> None:
            refusals = 0
            for _ in range(MAX_REQUESTS):
                after = revoked.is_set()
                if tally.record(await auth.authenticate_async(request), after) and after:
                    refusals += 1
                    if refusals == REFUSALS_TO_STOP:
                        return
                # A server reads the next request from its socket: the loop's turn. A warm
                # request never suspends, so without this one task ran all its requests at
                # once while the revoke and any task awaiting a store thread waited.
                await asyncio.sleep(0)

        tasks = [asyncio.create_task(worker()) for _ in range(WORKERS)]
        for _ in range(MAX_REQUESTS):
            if tally.passes >= PASSES_BEFORE_REVOKE:
                break
            await asyncio.sleep(0.005)
        # The async store revokes on the loop; a sync one in a thread, as a console would.
        keys = backend.native_keys
        if asyncio.iscoroutinefunction(keys.revoke_key):
            assert await keys.revoke_key(created.info.key_id, datetime.now(UTC))
        else:
            assert await asyncio.to_thread(keys.revoke_key, created.info.key_id, datetime.now(UTC))
        revoked.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)

    try:
        if backend.runner is not None:
            backend.runner.run(scenario())
        else:
            asyncio.run(scenario())
    finally:
        auth.close()
    assert tally.passes >= PASSES_BEFORE_REVOKE
    assert tally.passed_after_revoke == []
    assert tally.unexpected == []


@pytest.mark.parametrize(
    "backend",
    ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
    indirect=True,
)
def test_concurrent_revokes_have_one_winner(backend: Backend) -> None:
    """Of eight threads revoking the same key at once, exactly one is told it revoked it."""
    key = make_key()
    backend.keys.add_key(key)
    start = threading.Barrier(WORKERS)
    results: list[bool] = []

    def revoke() -> None:
        start.wait(10)
        results.append(backend.keys.revoke_key(key.key_id, datetime.now(UTC)))

    threads = [threading.Thread(target=revoke) for _ in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results) == [False] * (WORKERS - 1) + [True]
