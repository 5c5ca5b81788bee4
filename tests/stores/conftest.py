"""Fixtures for the store tests: one contract, run against every store keyturn ships.

PostgreSQL tests read ``KEYTURN_TEST_POSTGRES_DSN`` (a ``postgresql://`` URL). Unset, they
skip with the reason shown in the summary; with ``KEYTURN_REQUIRE_POSTGRES=1`` (as in CI) a
missing or unreachable server fails them instead. Each test session works in a schema of
its own, dropped at the end, so concurrent runs on one server do not collide.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from keyturn import Authenticator, AuthRequest, Principal, Refusal
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from keyturn.stores.sqlite import SQLiteDatabase

TABLES = (
    "keyturn_keys",
    "keyturn_memberships",
    "keyturn_organizations",
    "keyturn_events",
    "keyturn_notices",
    "keyturn_usage",
)

# --- PostgreSQL ---------------------------------------------------------------------------


def _postgres_unavailable(reason: str) -> None:
    if os.environ.get("KEYTURN_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"KEYTURN_REQUIRE_POSTGRES=1 but {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL tests skipped: {reason}")


def with_search_path(url: str, schema: str) -> str:
    """*url* with every connection's ``search_path`` set to *schema*."""
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """The test server's URL, or a skip (a failure when PostgreSQL is required)."""
    url = os.environ.get("KEYTURN_TEST_POSTGRES_DSN", "")
    if not url:
        _postgres_unavailable("KEYTURN_TEST_POSTGRES_DSN is not set")
    if not url.startswith(("postgresql://", "postgres://")):
        pytest.fail("KEYTURN_TEST_POSTGRES_DSN must be a postgresql:// URL", pytrace=False)
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=5) as connection:
            connection.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        _postgres_unavailable(f"cannot reach the PostgreSQL server: {exc}")
    return url


@pytest.fixture(scope="session")
def make_postgres_schema(postgres_server: str) -> Iterator[Callable[[], str]]:
    """Create empty schemas on the test server (dropped at the end); return URLs to them."""
    import psycopg

    created: list[str] = []

    def make() -> str:
        schema = f"keyturn_test_{os.getpid()}_{secrets.token_hex(4)}"
        with psycopg.connect(postgres_server, autocommit=True) as connection:
            connection.execute(f"CREATE SCHEMA {schema}")
        created.append(schema)
        return with_search_path(postgres_server, schema)

    yield make
    with psycopg.connect(postgres_server, autocommit=True) as connection:
        for schema in created:
            connection.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(scope="session")
def postgres_session_url(make_postgres_schema: Callable[[], str]) -> str:
    """A schema for this test session, with keyturn's tables in it."""
    from keyturn.stores.postgres import PostgresDatabase

    url = make_postgres_schema()
    with PostgresDatabase(url) as db:
        db.create_schema()
    return url


@pytest.fixture
def postgres_url(postgres_session_url: str) -> str:
    """The session's schema, emptied for this test."""
    import psycopg

    with psycopg.connect(postgres_session_url, autocommit=True) as connection:
        connection.execute(f"TRUNCATE {', '.join(TABLES)}")
    return postgres_session_url


def postgres_dump(url: str) -> str:
    """Every value in keyturn's PostgreSQL tables, as text."""
    import psycopg

    with psycopg.connect(url) as connection:
        return repr([connection.execute(f"SELECT * FROM {t}").fetchall() for t in TABLES])  # noqa: S608


# --- SQLite -------------------------------------------------------------------------------


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "keyturn.sqlite3"


def sqlite_dump(path: Path) -> str:
    """Every value in keyturn's SQLite tables, and the raw bytes of the file and its log."""
    connection = sqlite3.connect(path)
    try:
        rows = [connection.execute(f"SELECT * FROM {t}").fetchall() for t in TABLES]  # noqa: S608
    finally:
        connection.close()
    files = [p.read_bytes() for p in path.parent.glob(path.name + "*")]
    return repr(rows) + "".join(data.decode("latin-1") for data in files)


# --- one backend per store: the contract's fixture ------------------------------------------


class Synced:
    """Calls an async store or membership as if it were sync, on one event loop."""

    def __init__(self, target: Any, runner: asyncio.Runner) -> None:
        self._target = target
        self._runner = runner

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._runner.run(method(*args, **kwargs))

        return call


@attrs.define
class Backend:
    """One store under test: sync views of its key store and membership, and its raw data."""

    name: str
    keys: Any  # a sync KeyStore (a Synced view for the async store)
    membership: Any  # a sync membership with add_organization / add_member / remove_member
    dump: Callable[[], str]  # every stored value as text: what an attacker would read
    persistent: bool
    native_keys: Any = None  # what the Authenticator gets: the store itself
    native_membership: Any = None
    runner: asyncio.Runner | None = None

    def __attrs_post_init__(self) -> None:
        if self.native_keys is None:
            self.native_keys, self.native_membership = self.keys, self.membership

    def authenticator(self, **options: Any) -> Authenticator:
        return Authenticator(self.native_keys, self.native_membership, **options)

    def decide(self, auth: Authenticator, request: AuthRequest) -> Principal | Refusal:
        """Run one request through the driver that suits the store."""
        if self.runner is None:
            return auth.authenticate(request)
        return self.runner.run(auth.authenticate_async(request))


BACKENDS = [
    "memory",
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("postgres-async", marks=pytest.mark.postgres),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, sqlite_path: Path) -> Iterator[Backend]:
    """Every store keyturn ships, empty: memory, SQLite, PostgreSQL, async PostgreSQL."""
    name = request.param
    if name == "memory":
        store = MemoryKeyStore()
        yield Backend(
            name,
            store,
            MemoryMembership(),
            dump=lambda: repr(
                [
                    attrs.asdict(key)
                    for account in ("alice", "bob")
                    for key in store.keys_of(account)
                ]
            ),
            persistent=False,
        )
    elif name == "sqlite":
        with SQLiteDatabase(sqlite_path) as db:
            yield Backend(
                name, db.keys, db.membership, dump=lambda: sqlite_dump(sqlite_path), persistent=True
            )
    elif name == "postgres":
        from keyturn.stores.postgres import PostgresDatabase

        url = request.getfixturevalue("postgres_url")
        with PostgresDatabase(url) as db:
            # The pool opens its first connection on a thread of its own, drawing a jitter
            # from the random module; done before the test, that draw cannot land inside a
            # property test's generation (Hypothesis calls that a flaky strategy).
            db.keys.get_key("warm-up")
            yield Backend(
                name, db.keys, db.membership, dump=lambda: postgres_dump(url), persistent=True
            )
    else:
        from keyturn.stores.postgres import AsyncPostgresDatabase

        url = request.getfixturevalue("postgres_url")
        with asyncio.Runner() as runner:
            adb = AsyncPostgresDatabase(url)
            runner.run(adb.open())
            runner.run(adb.keys.get_key("warm-up"))  # as above: the pool's first connection
            try:
                yield Backend(
                    name,
                    Synced(adb.keys, runner),
                    Synced(adb.membership, runner),
                    dump=lambda: postgres_dump(url),
                    persistent=True,
                    native_keys=adb.keys,
                    native_membership=adb.membership,
                    runner=runner,
                )
            finally:
                runner.run(adb.close())
