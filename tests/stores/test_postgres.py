"""What the PostgreSQL stores add to the contract: explicit schema, pools, failures as 503."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from keyturn import (
    Authenticator,
    AuthRequest,
    Reason,
    SchemaTooNew,
    ServiceUnavailable,
    StoreTimeout,
    StoreUnreachable,
)
from keyturn._core import token as _token
from keyturn.stores import open_database
from keyturn.stores._schema import SCHEMA_VERSION
from keyturn.stores.memory import MemoryMembership
from keyturn.stores.postgres import AsyncPostgresDatabase, PostgresDatabase

pytestmark = pytest.mark.postgres


def test_nothing_is_created_until_create_schema(make_postgres_schema: Callable[[], str]) -> None:
    """Construction and use create no table; create_schema() does, idempotently."""
    url = make_postgres_schema()
    with PostgresDatabase(url) as db:
        assert db.schema_version() == 0
        with pytest.raises(psycopg.errors.UndefinedTable):
            db.keys.get_key("NoSuchKey123")
        assert db.create_schema() == SCHEMA_VERSION
        assert db.create_schema() == SCHEMA_VERSION
        assert db.schema_version() == SCHEMA_VERSION
        assert db.keys.get_key("NoSuchKey123") is None


def test_instances_deploying_at_once_create_the_schema_once(
    make_postgres_schema: Callable[[], str],
) -> None:
    """Four instances running create_schema() together all succeed, one version row results."""
    url = make_postgres_schema()
    databases = [PostgresDatabase(url) for _ in range(4)]
    start = threading.Barrier(4)
    results: list[object] = []

    def create(db: PostgresDatabase) -> None:
        start.wait(5)
        try:
            results.append(db.create_schema())
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=create, args=(db,)) for db in databases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for db in databases:
        db.close()
    assert results == [SCHEMA_VERSION] * 4
    with psycopg.connect(url) as connection:
        rows = connection.execute("SELECT version FROM keyturn_schema_version").fetchall()
    assert rows == [(v,) for v in range(1, SCHEMA_VERSION + 1)]


def test_async_database_creates_the_schema(make_postgres_schema: Callable[[], str]) -> None:
    """The async twin creates the schema explicitly and then serves reads."""
    url = make_postgres_schema()

    async def scenario() -> tuple[int, int, object]:
        async with AsyncPostgresDatabase(url) as adb:
            before = await adb.schema_version()
            after = await adb.create_schema()
            return before, after, await adb.keys.get_key("NoSuchKey123")

    assert asyncio.run(scenario()) == (0, SCHEMA_VERSION, None)


def test_instants_are_timestamptz(postgres_url: str) -> None:
    """The six instant columns are timestamptz: the database itself knows they are instants."""
    with psycopg.connect(postgres_url) as connection:
        rows = connection.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = 'keyturn_keys' "
            "AND column_name LIKE '%%_at' ORDER BY column_name"
        ).fetchall()
    assert rows == [
        (name, "timestamp with time zone")
        for name in (
            "created_at",
            "expires_at",
            "first_used_at",
            "last_used_at",
            "leaked_at",
            "revoked_at",
        )
    ]


def test_the_table_itself_allows_one_default_per_tenant(postgres_url: str) -> None:
    """A partial unique index refuses a second default, whoever writes the row."""
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute(
            "INSERT INTO keyturn_organizations (id, tenant_id, is_default) "
            "VALUES ('a', 't', true), ('b', 't', false), ('c', 't', false)"
        )
        with pytest.raises(psycopg.errors.UniqueViolation):
            connection.execute("UPDATE keyturn_organizations SET is_default = true WHERE id = 'b'")


def test_a_newer_schema_is_refused(make_postgres_schema: Callable[[], str]) -> None:
    """A database upgraded by a newer keyturn is refused with a clear message."""
    url = make_postgres_schema()
    with PostgresDatabase(url) as db:
        db.create_schema()
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("INSERT INTO keyturn_schema_version (version) VALUES (99)")
        with pytest.raises(SchemaTooNew, match="upgrade keyturn"):
            db.create_schema()
        with pytest.raises(SchemaTooNew, match="upgrade keyturn"):
            db.schema_version()


def test_a_pool_passed_in_is_used_and_left_open(postgres_url: str) -> None:
    """A database over the application's own pool uses it and does not close it."""
    with ConnectionPool(postgres_url, min_size=1, max_size=2, open=True) as pool:
        db = PostgresDatabase(pool=pool)
        assert db.keys.revoke_key("NoSuchKey123", datetime.now(UTC)) is False
        db.close()
        assert not pool.closed
        with pool.connection() as connection:
            assert connection.execute("SELECT 1").fetchone() == (1,)


def test_repr_never_shows_the_password() -> None:
    """The database's repr names host and database, never the password."""
    pool = ConnectionPool("postgresql://app:hunter2@127.0.0.1:5432/keys", open=False)
    db = PostgresDatabase(pool=pool)
    assert "hunter2" not in repr(db) and "hunter2" not in repr(db.keys)
    assert "127.0.0.1" in repr(db)


def test_open_store_reads_postgresql_urls(postgres_url: str) -> None:
    """postgresql:// opens a PostgresDatabase on that URL."""
    db = open_database(postgres_url)
    try:
        assert isinstance(db, PostgresDatabase)
        assert db.schema_version() == SCHEMA_VERSION
    finally:
        db.close()


def test_a_database_that_is_down_gives_503_not_401() -> None:
    """When PostgreSQL cannot be reached, requests get 503 and a client keeps its key."""
    db = PostgresDatabase("postgresql://postgres@127.0.0.1:1/nothing", timeout=0.3)
    auth = Authenticator(db.keys, MemoryMembership(), timeout=2)
    try:
        token = _token.generate().token  # well formed, so it reaches the store
        outcome = auth.authenticate(AuthRequest(authorization=(f"Bearer {token}",)))
        assert isinstance(outcome, ServiceUnavailable)
        assert outcome.reason is Reason.BACKEND_TIMEOUT  # the pool got no connection in time
    finally:
        auth.close()
        db.close()


def test_a_pool_with_no_free_connection_is_a_store_timeout(postgres_url: str) -> None:
    """Every connection busy: the call raises StoreTimeout and the request gets a 503."""
    with PostgresDatabase(postgres_url, min_size=1, max_size=1, timeout=0.2) as db:
        auth = Authenticator(db.keys, MemoryMembership(), timeout=30)
        try:
            with db.pool.connection():  # the only connection, held
                with pytest.raises(StoreTimeout, match="max_size=1") as caught:
                    db.keys.get_key("kt_missing")
                assert isinstance(caught.value, TimeoutError)
                token = _token.generate().token
                outcome = auth.authenticate(AuthRequest(authorization=(f"Bearer {token}",)))
            assert isinstance(outcome, ServiceUnavailable)
            assert outcome.reason is Reason.BACKEND_TIMEOUT
            assert db.keys.get_key("kt_missing") is None  # the connection is back: answered
        finally:
            auth.close()


def test_an_async_pool_with_no_free_connection_is_a_store_timeout(postgres_url: str) -> None:
    async def scenario() -> None:
        async with AsyncPostgresDatabase(postgres_url, min_size=1, max_size=1, timeout=0.2) as db:
            async with db.pool.connection():
                with pytest.raises(StoreTimeout, match="max_size=1"):
                    await db.keys.get_key("kt_missing")
            assert await db.keys.get_key("kt_missing") is None

    asyncio.run(scenario())


def test_a_server_that_refuses_fails_the_schema_calls_at_once() -> None:
    """create_schema() and schema_version() report a refused connection, not a pool timeout."""
    with PostgresDatabase("postgresql://postgres:hunter2@127.0.0.1:1/nothing", timeout=60) as db:
        with pytest.raises(StoreUnreachable, match="refused") as caught:
            db.schema_version()
        with pytest.raises(StoreUnreachable, match="refused"):
            db.create_schema()
    assert isinstance(caught.value, ConnectionError) and "hunter2" not in str(caught.value)
