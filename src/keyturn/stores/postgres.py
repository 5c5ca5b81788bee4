"""The PostgreSQL key store and membership: one database shared by many app instances.

Install the extra (``pip install 'keyturn[postgres]'``). A :class:`PostgresDatabase` owns a
connection pool and gives the key store (``.keys``) and the membership provider
(``.membership``); :class:`AsyncPostgresDatabase` is its twin for the ASGI middleware.

Importing this module touches no database; a :class:`PostgresDatabase` connects when
constructed, an :class:`AsyncPostgresDatabase` on ``open()``. Only ``create_schema()``
creates or upgrades the tables, under an advisory lock so that instances deploying at once
do not race, in the first schema of the ``search_path`` (for a schema of their own, add
``?options=-csearch_path%3Dkeyturn`` to the URL).

Every call borrows a pooled connection in autocommit mode and runs one or two statements,
so a revoke is committed when ``revoke_key`` returns and every instance refuses the key
on its next request. Instants are ``timestamptz`` and come back as UTC datetimes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Final, TypeVar

try:
    from psycopg import AsyncConnection, Connection, OperationalError
    from psycopg.conninfo import conninfo_to_dict
    from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout
except ImportError as exc:
    raise ImportError(
        "the PostgreSQL store needs psycopg: pip install 'keyturn[postgres]'"
    ) from exc

from keyturn.errors import StoreTimeout, StoreUnreachable
from keyturn.stores import _sql

__all__ = ["AsyncPostgresDatabase", "PostgresDatabase"]

T = TypeVar("T")

_DIALECT: Final = _sql.Dialect(
    timestamp="timestamptz",
    has_version_table="SELECT to_regclass('keyturn_schema_version') IS NOT NULL",
)
# Serializes create_schema() across instances: one fixed key every instance takes.
_MIGRATION_LOCK: Final = "SELECT pg_advisory_xact_lock(7017280452245743993)"


def _describe(pool: ConnectionPool[Any] | AsyncConnectionPool[Any]) -> str:
    # Enough to recognise the database; never the password.
    try:
        params = conninfo_to_dict(pool.conninfo) if isinstance(pool.conninfo, str) else {}
    except Exception:
        params = {}
    shown = ("host", "port", "dbname", "user")
    return " ".join(f"{name}={params[name]}" for name in shown if params.get(name))


def _pool_options(min_size: int, max_size: int, timeout: float) -> dict[str, Any]:
    return {
        "min_size": min_size,
        "max_size": max_size,
        "timeout": timeout,  # waiting for a free connection longer than this raises: 503
        "kwargs": {"autocommit": True},  # one statement, one round trip; no idle transactions
        "name": "keyturn",
    }


class PostgresDatabase(_sql.ClosedOnExit):
    """A PostgreSQL database holding keyturn's tables, through a connection pool.

    :param conninfo: a ``postgresql://`` URL or libpq connection string.
    :param pool: use this :class:`psycopg_pool.ConnectionPool` instead of opening one (it is
        then yours to close); *conninfo* and the sizes are ignored.
    :param min_size: connections kept open.
    :param max_size: connections at most; each app instance holds up to this many.
    :param timeout: seconds to wait for a free connection before the call fails.
    """

    def __init__(
        self,
        conninfo: str = "",
        *,
        pool: ConnectionPool[Any] | None = None,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 5.0,
    ) -> None:
        self._owns_pool = pool is None
        if pool is None:
            pool = ConnectionPool(conninfo, open=True, **_pool_options(min_size, max_size, timeout))
        self.pool: ConnectionPool[Any] = pool
        self.keys = _sql.SQLKeyStore(self)
        self.membership = _sql.SQLMembership(self)

    def __repr__(self) -> str:
        return f"PostgresDatabase({_describe(self.pool)!r})"

    def create_schema(self) -> int:
        """Create or upgrade the tables (idempotent, safe to run concurrently); the version."""
        with self._admin() as connection, connection.transaction():
            connection.execute(_MIGRATION_LOCK)
            return _drive(connection, _sql.migrate(_DIALECT))

    def schema_version(self) -> int:
        """The schema version in the database; 0 when ``create_schema()`` never ran."""
        with self._admin() as connection:
            return _drive(connection, _sql.schema_version(_DIALECT))

    def _admin(self) -> contextlib.AbstractContextManager[Connection[Any]]:
        # The administrative calls (deploy time, the keyturn command) connect on their own:
        # a server that refuses answers at once, not after the pool's wait for a connection.
        if not self._owns_pool:
            return self.pool.connection()
        try:
            return Connection.connect(str(self.pool.conninfo), autocommit=True)
        except OperationalError as exc:
            reason = (str(exc).splitlines() or [""])[0]
            raise StoreUnreachable(
                f"cannot connect to PostgreSQL ({_describe(self.pool)}): {reason}", reason=reason
            ) from None

    def close(self) -> None:
        """Close the pool, unless it was passed in."""
        if self._owns_pool:
            self.pool.close()

    def run(self, op: _sql.Op[T]) -> T:
        """Run one operation of :mod:`keyturn.stores._sql` on a pooled connection."""
        with _waited(self.pool), self.pool.connection() as connection:
            return _drive(connection, op)


class AsyncPostgresDatabase:
    """The async twin of :class:`PostgresDatabase`, over an ``AsyncConnectionPool``.

    Open it inside the event loop: ``async with AsyncPostgresDatabase(url) as adb:``, or
    ``await adb.open()`` and later ``await adb.close()``.
    """

    def __init__(
        self,
        conninfo: str = "",
        *,
        pool: AsyncConnectionPool[Any] | None = None,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 5.0,
    ) -> None:
        self._owns_pool = pool is None
        if pool is None:
            # An async pool may only start inside a running loop: open() does it.
            pool = AsyncConnectionPool(
                conninfo, open=False, **_pool_options(min_size, max_size, timeout)
            )
        self.pool: AsyncConnectionPool[Any] = pool
        self.keys = _sql.AsyncSQLKeyStore(self)
        self.membership = _sql.AsyncSQLMembership(self)

    def __repr__(self) -> str:
        return f"AsyncPostgresDatabase({_describe(self.pool)!r})"

    async def __aenter__(self) -> AsyncPostgresDatabase:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Start the pool (it connects in the background)."""
        if self._owns_pool:
            await self.pool.open()

    async def create_schema(self) -> int:
        """Create or upgrade the tables (idempotent, safe to run concurrently); the version."""
        async with self.pool.connection() as connection, connection.transaction():
            await connection.execute(_MIGRATION_LOCK)
            return await _drive_async(connection, _sql.migrate(_DIALECT))

    async def schema_version(self) -> int:
        """The schema version in the database; 0 when ``create_schema()`` never ran."""
        return await self.run(_sql.schema_version(_DIALECT))

    async def close(self) -> None:
        """Close the pool, unless it was passed in."""
        if self._owns_pool:
            await self.pool.close()

    async def run(self, op: _sql.Op[T]) -> T:
        """Run one operation of :mod:`keyturn.stores._sql` on a pooled connection."""
        with _waited(self.pool):
            async with self.pool.connection() as connection:
                return await _drive_async(connection, op)


@contextlib.contextmanager
def _waited(pool: ConnectionPool[Any] | AsyncConnectionPool[Any]) -> Iterator[None]:
    # The pool's wait for a connection ran out: whether the server is down or every
    # connection is busy, the store did not answer in time (503, reason backend_timeout).
    try:
        yield
    except PoolTimeout:
        raise StoreTimeout(
            f"no PostgreSQL connection within {pool.timeout:g} s ({_describe(pool)}, "
            f"max_size={pool.max_size}): the server is down, or the pool too small for the load"
        ) from None


def _drive(connection: Connection[Any], op: _sql.Op[T]) -> T:
    return _sql.drive(lambda query: connection.execute(query.sql, query.params), op)


# The async twin of _sql.drive: the same loop, with `await`.


async def _drive_async(connection: AsyncConnection[Any], op: _sql.Op[T]) -> T:
    answer: Any = None
    try:
        while True:
            query = op.send(answer)
            cursor = await connection.execute(query.sql, query.params)
            if query.fetch == _sql.ONE:
                answer = await cursor.fetchone()
            elif query.fetch == _sql.ALL:
                answer = await cursor.fetchall()
            else:
                answer = cursor.rowcount
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
