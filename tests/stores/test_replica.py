"""The replica: a warm request reads nothing from the database, and still sees every commit.

Statements are counted by the drivers themselves: SQLite's trace callback on the pool's
connection, and a psycopg connection class for PostgreSQL. Writes come from other
processes, other connections and plain SQL, as they do in production.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from keyturn import Authenticator, AuthRequest, KeyManager, Principal, Reason, Refusal, Scope
from keyturn._core.model import Found
from keyturn.stores.sqlite import SQLiteDatabase

TENANT = Scope.tenant("acme")


def request(secret: str, organization: str = "default") -> AuthRequest:
    return AuthRequest(authorization=(f"Bearer {secret}",), organization=(organization,))


def seed(db: Any) -> str:
    """acme with its default organization, alice in it, and a key of hers; its secret."""
    db.membership.add_organization("org_default", tenant_id="acme", default=True)
    db.membership.add_organization("org_research", tenant_id="acme")
    db.membership.add_member("alice", "org_default", role="admin")
    db.membership.add_member("alice", "org_research", role="member")
    return KeyManager(db.keys, db.membership).create("alice", name="CI", scope=TENANT).secret


def eventually(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Poll *condition* until true, at most *seconds* (a bound on the loop, not an assertion
    on time: the test then asserts what the condition saw)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def refused(
    auth: Authenticator, secret: str, reason: Reason, organization: str = "default"
) -> bool:
    outcome = auth.authenticate(request(secret, organization))
    return isinstance(outcome, Refusal) and outcome.reason is reason


# --- SQLite -------------------------------------------------------------------------------


@pytest.fixture
def sqlite_db(sqlite_path: Path) -> Iterator[SQLiteDatabase]:
    with SQLiteDatabase(sqlite_path) as db:
        yield db


def traced(db: SQLiteDatabase) -> list[str]:
    """Every statement the pool's connection runs from now on (one thread: one connection)."""
    statements: list[str] = []
    with db.connection() as connection:
        connection.set_trace_callback(statements.append)
    return statements


@pytest.mark.parametrize("replica", [True, False])
def test_sqlite_warm_requests_read_nothing(sqlite_path: Path, replica: bool) -> None:
    """With the replica, only the first request reads (one statement); without it, every
    request reads exactly one statement."""
    with SQLiteDatabase(sqlite_path, replica=replica) as db:
        secret = seed(db)
        auth = Authenticator(db.keys, db.membership, usage_interval=None)
        statements = traced(db)
        for _ in range(20):
            assert isinstance(auth.authenticate(request(secret)), Principal)
            assert isinstance(auth.authenticate(request(secret, "org_research")), Principal)
        reads = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
        assert len(reads) == (2 if replica else 40), statements
        assert len(statements) == len(reads)  # and nothing else: no write on the way


REVOKE = """
import sys
from datetime import UTC, datetime
from keyturn.stores.sqlite import SQLiteDatabase
with SQLiteDatabase(sys.argv[1]) as db:
    assert db.keys.revoke_key(sys.argv[2], datetime.now(UTC))
"""


def test_sqlite_a_revoke_by_another_process_is_refused_by_the_next_request(
    sqlite_db: SQLiteDatabase,
) -> None:
    """No lag: the request after another process's revoke returned is refused."""
    secret = seed(sqlite_db)
    auth = Authenticator(sqlite_db.keys, sqlite_db.membership, usage_interval=None)
    assert isinstance(auth.authenticate(request(secret)), Principal)  # now in the replica
    key_id = auth.authenticate(request(secret)).key_id  # type: ignore[union-attr]
    subprocess.run(  # noqa: S603 -- our own interpreter and code
        [sys.executable, "-c", REVOKE, sqlite_db.path, key_id], check=True, timeout=60
    )
    assert refused(auth, secret, Reason.REVOKED)


def test_sqlite_plain_sql_changes_are_seen(sqlite_db: SQLiteDatabase) -> None:
    """Changes made with plain SQL on another connection reach the replica through the
    triggers: a membership deleted, an organization deleted, a key revoked."""
    import sqlite3

    secret = seed(sqlite_db)
    auth = Authenticator(sqlite_db.keys, sqlite_db.membership, usage_interval=None)
    assert isinstance(auth.authenticate(request(secret, "org_research")), Principal)
    raw = sqlite3.connect(sqlite_db.path, isolation_level=None)
    try:
        raw.execute("DELETE FROM keyturn_memberships WHERE organization_id = 'org_research'")
        assert refused(auth, secret, Reason.ORG_NOT_REACHABLE, "org_research")
        raw.execute("PRAGMA foreign_keys = ON")
        raw.execute("DELETE FROM keyturn_organizations WHERE id = 'org_research'")
        assert refused(auth, secret, Reason.ORG_NOT_FOUND, "org_research")
        assert isinstance(auth.authenticate(request(secret)), Principal)
        raw.execute("UPDATE keyturn_keys SET revoked_at = '2000-01-01T00:00:00.000000+00:00'")
        assert refused(auth, secret, Reason.REVOKED)
    finally:
        raw.close()


def test_sqlite_a_reader_pruned_past_starts_afresh(sqlite_db: SQLiteDatabase) -> None:
    """A process that missed more changes than the log keeps empties its replica and reads
    through, never serving what changed."""
    import sqlite3

    secret = seed(sqlite_db)
    auth = Authenticator(sqlite_db.keys, sqlite_db.membership, usage_interval=None)
    assert isinstance(auth.authenticate(request(secret)), Principal)
    raw = sqlite3.connect(sqlite_db.path, isolation_level=None)
    try:
        raw.execute("BEGIN")
        for index in range(10_050):  # past the log's 10,000 entries, in one commit
            raw.execute(
                "INSERT INTO keyturn_changes (kind, id) VALUES ('m', ?)", (f"nobody{index}",)
            )
        raw.execute("UPDATE keyturn_keys SET revoked_at = '2000-01-01T00:00:00.000000+00:00'")
        raw.execute("COMMIT")
        (oldest,) = raw.execute("SELECT min(seq) FROM keyturn_changes").fetchone()
        assert oldest > 2  # the entries this reader had not read are gone
    finally:
        raw.close()
    assert refused(auth, secret, Reason.REVOKED)


# --- PostgreSQL ---------------------------------------------------------------------------


@pytest.fixture
def counted_postgres(postgres_url: str) -> Iterator[tuple[Any, list[str]]]:
    """A PostgresDatabase whose pool counts every statement its connections execute."""
    import psycopg
    from psycopg_pool import ConnectionPool

    from keyturn.stores.postgres import PostgresDatabase

    executed: list[str] = []

    class Counting(psycopg.Connection[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            executed.append(str(query))
            return super().execute(query, params, **kwargs)

    pool = ConnectionPool(
        postgres_url, connection_class=Counting, kwargs={"autocommit": True}, open=True
    )
    db = PostgresDatabase(pool=pool)
    try:
        yield db, executed
    finally:
        db.close()
        pool.close()


@pytest.mark.postgres
def test_postgres_warm_requests_read_nothing(counted_postgres: tuple[Any, list[str]]) -> None:
    """Once the listener is in place, only the first request of each kind reads (one
    statement), and then none does."""
    db, executed = counted_postgres
    secret = seed(db)  # its first connection finds the database and starts the listener
    auth = Authenticator(db.keys, db.membership, usage_interval=None)
    assert eventually(lambda: db.replica.current)
    executed.clear()
    for _ in range(20):
        assert isinstance(auth.authenticate(request(secret)), Principal)
        assert isinstance(auth.authenticate(request(secret, "org_research")), Principal)
    assert len(executed) == 2, executed
    executed.clear()
    for _ in range(20):
        assert isinstance(auth.authenticate(request(secret)), Principal)
        assert isinstance(auth.authenticate(request(secret, "org_research")), Principal)
    assert executed == []


@pytest.mark.postgres
def test_postgres_without_a_replica_each_request_reads_one_statement(postgres_url: str) -> None:
    """replica=False: every request is one statement, never two or three."""
    import psycopg
    from psycopg_pool import ConnectionPool

    from keyturn.stores.postgres import PostgresDatabase

    executed: list[str] = []

    class Counting(psycopg.Connection[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            executed.append(str(query))
            return super().execute(query, params, **kwargs)

    with ConnectionPool(
        postgres_url, connection_class=Counting, kwargs={"autocommit": True}, open=True
    ) as pool:
        db = PostgresDatabase(pool=pool, replica=False)
        secret = seed(db)
        auth = Authenticator(db.keys, db.membership, usage_interval=None)
        executed.clear()
        for _ in range(10):
            assert isinstance(auth.authenticate(request(secret, "org_research")), Principal)
        assert len(executed) == 10
        db.close()


@pytest.mark.postgres
def test_postgres_plain_sql_revoke_reaches_the_replica(
    counted_postgres: tuple[Any, list[str]], postgres_url: str
) -> None:
    """A revoke written with plain SQL on another connection is refused once its
    notification arrives, and the warm path stays at zero reads until then."""
    import psycopg

    db, _ = counted_postgres
    secret = seed(db)
    auth = Authenticator(db.keys, db.membership, usage_interval=None)
    auth.authenticate(request(secret))
    assert eventually(lambda: db.replica.current)
    assert isinstance(auth.authenticate(request(secret)), Principal)
    with psycopg.connect(postgres_url, autocommit=True) as raw:
        raw.execute("UPDATE keyturn_keys SET revoked_at = now()")
    assert eventually(lambda: refused(auth, secret, Reason.REVOKED))


@pytest.mark.postgres
def test_postgres_the_listener_killed_reads_through_then_recovers(
    counted_postgres: tuple[Any, list[str]], postgres_url: str
) -> None:
    """The listener's session terminated by the server: no revoked key is accepted past
    the feed's lag meanwhile, and the warm path returns to zero reads without a restart."""
    import psycopg

    db, executed = counted_postgres
    secret = seed(db)
    other = KeyManager(db.keys, db.membership).create("alice", name="other", scope=TENANT)
    auth = Authenticator(db.keys, db.membership, usage_interval=None)
    auth.authenticate(request(secret))
    assert eventually(lambda: db.replica.current and db._listener.backend_pid is not None)
    killed = db._listener.backend_pid
    with psycopg.connect(postgres_url, autocommit=True) as raw:
        raw.execute("SELECT pg_terminate_backend(%s)", (killed,))
        raw.execute(
            "UPDATE keyturn_keys SET revoked_at = now() WHERE key_id = %s",
            (other.info.key_id,),
        )
    assert eventually(lambda: refused(auth, other.secret, Reason.REVOKED))
    assert eventually(lambda: db._listener.backend_pid not in (None, killed) and db.replica.current)
    assert isinstance(auth.authenticate(request(secret)), Principal)  # refills
    executed.clear()
    for _ in range(10):
        assert isinstance(auth.authenticate(request(secret)), Principal)
    assert executed == []


@pytest.mark.postgres
def test_postgres_a_sync_console_and_an_async_api_share_one_replica(postgres_url: str) -> None:
    """A revoke through the sync database (a console) is refused by the async one (the API)
    of the same process at once: one replica, dropped before the revoke returns."""
    import asyncio

    from keyturn.stores.postgres import AsyncPostgresDatabase, PostgresDatabase

    with PostgresDatabase(postgres_url) as console, asyncio.Runner() as loop:
        api = AsyncPostgresDatabase(postgres_url)
        loop.run(api.open())
        try:
            secret = seed(console)
            auth = Authenticator(api.keys, api.membership, usage_interval=None)
            first = loop.run(auth.authenticate_async(request(secret)))
            assert isinstance(first, Principal)
            assert api.replica is console.replica  # known once each has asked the database
            assert eventually(lambda: api.replica.current)
            assert isinstance(loop.run(auth.authenticate_async(request(secret))), Principal)
            KeyManager(console.keys, console.membership).revoke("alice", first.key_id)
            refusal = loop.run(auth.authenticate_async(request(secret)))
            assert isinstance(refusal, Refusal) and refusal.reason is Reason.REVOKED
        finally:
            loop.run(api.close())


# --- bounded per entry --------------------------------------------------------------------


def test_the_replica_keeps_the_keys_in_use_and_never_empties_whole(sqlite_path: Path) -> None:
    """Past its size, the least recently used key goes; the ones in use stay, and a flood of
    ids that name no key evicts none of them."""
    from keyturn.stores import _replica

    with SQLiteDatabase(sqlite_path, replica=False) as source:
        seed(source)
        manager = KeyManager(source.keys, source.membership)
        secrets = [manager.create("alice", name=f"k{i}", scope=TENANT).secret for i in range(6)]
        ids = [source.keys.keys_of("alice")[i].key_id for i in range(7)]
        found = {key_id: source.keys.lookup(key_id, "default") for key_id in ids}
    assert secrets
    replica = _replica.Replica(max_entries=4)
    replica.reset(current=True)
    for key_id in ids[:4]:
        replica.keep(key_id, found[key_id], replica.epoch)
    assert replica.found(ids[0], "default") is not None  # in use: the most recent now
    for n in range(100):  # ids that name no key, all kept apart
        missing = f"NoSuchKey{n:03d}"
        replica.keep(missing, Found(key=None, asked="default"), replica.epoch)
    for key_id in ids[4:6]:
        replica.keep(key_id, found[key_id], replica.epoch)
    kept = [key_id for key_id in ids[:6] if replica.found(key_id, "default") is not None]
    assert kept == [ids[0], ids[3], ids[4], ids[5]]


def test_an_organization_change_leaves_other_tenants_warm(sqlite_path: Path) -> None:
    """A write to one tenant's organization drops that organization and its tenant's
    default, not every account's roles and reach: another tenant's request still reads
    nothing."""
    with SQLiteDatabase(sqlite_path) as db:
        secret = seed(db)
        db.membership.add_organization("org_other", tenant_id="initech", default=True)
        db.membership.add_member("bob", "org_other", role="admin")
        bob = KeyManager(db.keys, db.membership).create(
            "bob", name="CI", scope=Scope.tenant("initech")
        )
        auth = Authenticator(db.keys, db.membership, usage_interval=None)
        for token in (secret, bob.secret):
            assert isinstance(auth.authenticate(request(token)), Principal)
        db.membership.add_organization("org_new", tenant_id="initech")
        statements = traced(db)
        assert isinstance(auth.authenticate(request(secret)), Principal)
        assert statements == []  # acme's entries were left alone
        assert isinstance(auth.authenticate(request(bob.secret)), Principal)
        assert len(statements) <= 1  # at most initech's default, read again
