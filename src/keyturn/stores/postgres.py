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
so a revoke is committed when ``revoke_key`` returns. What a request reads comes from the
process's replica (``_replica.py``), fed by the database itself: triggers send
``NOTIFY keyturn_changes`` in every writing transaction, and a listener thread with a
connection of its own drops what each change touches. The replica answers only while the
listener is connected (it is emptied at each connect, so nothing missed while it was away
is ever served); otherwise a request reads through, in one statement. A revoke committed
anywhere is refused by every instance within the listener's lag (milliseconds on a local
network: see ``docs/performance.md``); ``replica=False`` reads through on every request.
Instants are ``timestamptz`` and come back as UTC datetimes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

try:
    from psycopg import AsyncConnection, Connection, OperationalError
    from psycopg.conninfo import conninfo_to_dict
    from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout
except ImportError as exc:
    raise ImportError(
        "the PostgreSQL store needs psycopg: pip install 'keyturn[postgres]'"
    ) from exc

from keyturn._model import Found
from keyturn.activity import EventHook
from keyturn.errors import StoreTimeout, StoreUnreachable
from keyturn.stores import _replica, _sql
from keyturn.stores._async import AsyncSQLKeyStore, AsyncSQLMembership
from keyturn.stores._sync import SQLKeyStore, SQLMembership

__all__ = ["AsyncPostgresDatabase", "PostgresDatabase"]

log: Final = logging.getLogger("keyturn")

_DIALECT: Final = _sql.Dialect(
    timestamp="timestamptz",
    has_version_table="SELECT to_regclass('keyturn_schema_version') IS NOT NULL",
    has_foreign_tables=None,
    change_feed=_sql.POSTGRES_CHANGE_FEED,
    placeholder="%s",
)
_STATEMENTS: Final = _sql.Statements()
# Serializes create_schema() across instances: one fixed key every instance takes.
_MIGRATION_LOCK: Final = "SELECT pg_advisory_xact_lock(7017280452245743993)"
# Serializes the writes that keep a tenant's default organization (its first, removed last).
_TENANT_LOCK: Final = "SELECT pg_advisory_xact_lock(hashtextextended('keyturn tenant ' || %s, 0))"


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


class _Replicated:
    """The replica side of both databases: the process's replica of this database, its
    listener, and the stores' ``lookup_cached``."""

    sql = _STATEMENTS
    instant = staticmethod(_sql.utc)
    enforces_timeout = False  # the sync middleware bounds the calls itself
    replica: _replica.Replica
    _listener: _Listener | None

    def _share(self, conninfo: str, replica: bool) -> None:
        self._shared = ("postgresql", conninfo)
        self.replica, self._listener = _replica.Replica(), None  # never current: reads through
        if replica:
            self.replica, listener = _replica.shared(
                self._shared, lambda shared: _Listener(conninfo, shared)
            )
            self._listener = listener

    def _unshare(self) -> None:
        if self._listener is not None:
            self._listener = None
            _replica.release(self._shared, _Listener.stop)

    def lookup_cached(self, key_id: str, organization: str | None) -> Found | None:
        if self._listener is None:
            return None
        self._listener.ensure_running()
        return self.replica.found(key_id, organization)

    def changes(self) -> int | None:
        """A number that moves with every change the decision could read, as the listener
        hears of it; ``None`` while the replica is off or not current."""
        if self._listener is None:
            return None
        self._listener.ensure_running()
        return self.replica.changes()


class PostgresDatabase(_Replicated, _sql.ClosedOnExit):
    """A PostgreSQL database holding keyturn's tables, through a connection pool.

    :param conninfo: a ``postgresql://`` URL or libpq connection string.
    :param pool: use this :class:`psycopg_pool.ConnectionPool` instead of opening one (it is
        then yours to close); *conninfo* and the sizes are ignored.
    :param min_size: connections kept open.
    :param max_size: connections at most; each app instance holds up to this many.
    :param timeout: seconds to wait for a free connection before the call fails.
    :param replica: keep what requests read in the process, fed by the database's change
        feed (the default; one more connection per process, for the listener); ``False``
        reads through on every request.
    :param on_event: called with each :class:`~keyturn.activity.KeyEvent` once it is
        recorded (see :mod:`keyturn.activity`); its failures are logged.
    """

    def __init__(
        self,
        conninfo: str = "",
        *,
        pool: ConnectionPool[Any] | None = None,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 5.0,
        replica: bool = True,
        on_event: EventHook | None = None,
    ) -> None:
        self.on_event = on_event
        self._owns_pool = pool is None
        if pool is None:
            pool = ConnectionPool(conninfo, open=True, **_pool_options(min_size, max_size, timeout))
        self.pool: ConnectionPool[Any] = pool
        self.keys = SQLKeyStore(self)
        self.membership = SQLMembership(self)
        self._share(str(pool.conninfo), replica)

    def __repr__(self) -> str:
        return f"PostgresDatabase({_describe(self.pool)!r})"

    def create_schema(self) -> int:
        """Create or upgrade the tables (idempotent, safe to run concurrently); the version."""
        return _create_schema(self.pool, self._owns_pool)

    def schema_version(self) -> int:
        """The schema version in the database; 0 when ``create_schema()`` never ran."""
        return _schema_version(self.pool, self._owns_pool)

    def close(self) -> None:
        """Stop the listener and close the pool, unless it was passed in."""
        self._unshare()
        if self._owns_pool:
            self.pool.close()

    @contextlib.contextmanager
    def connection(self, lock: str | None = None) -> Iterator[Connection[Any]]:
        """A pooled connection for a ``with`` block, each statement committed on its own;
        with *lock*, one transaction serialized with every other taking that lock."""
        with _waited(self.pool), self.pool.connection() as connection:
            if lock is None:
                yield connection
            else:
                with connection.transaction():
                    connection.execute(_TENANT_LOCK, (lock,))
                    yield connection


class AsyncPostgresDatabase(_Replicated):
    """The async twin of :class:`PostgresDatabase`, over an ``AsyncConnectionPool``.

    Open it inside the event loop: ``async with AsyncPostgresDatabase(url) as adb:``, or
    ``await adb.open()`` and later ``await adb.close()``. It shares the process's replica
    with any :class:`PostgresDatabase` on the same connection string.
    """

    def __init__(
        self,
        conninfo: str = "",
        *,
        pool: AsyncConnectionPool[Any] | None = None,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 5.0,
        replica: bool = True,
        on_event: EventHook | None = None,
    ) -> None:
        self.on_event = on_event
        self._owns_pool = pool is None
        if pool is None:
            # An async pool may only start inside a running loop: open() does it.
            pool = AsyncConnectionPool(
                conninfo, open=False, **_pool_options(min_size, max_size, timeout)
            )
        self.pool: AsyncConnectionPool[Any] = pool
        self.keys = AsyncSQLKeyStore(self)
        self.membership = AsyncSQLMembership(self)
        self._share(str(pool.conninfo), replica)

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
        # Deploy-time work, on a connection of its own in a worker thread.
        return await asyncio.to_thread(_create_schema, self.pool, True)

    async def schema_version(self) -> int:
        """The schema version in the database; 0 when ``create_schema()`` never ran."""
        return await asyncio.to_thread(_schema_version, self.pool, True)

    async def close(self) -> None:
        """Stop the listener and close the pool, unless it was passed in."""
        self._unshare()
        if self._owns_pool:
            await self.pool.close()

    @contextlib.asynccontextmanager
    async def connection(self, lock: str | None = None) -> AsyncIterator[AsyncConnection[Any]]:
        """The awaited twin of :meth:`PostgresDatabase.connection`."""
        with _waited(self.pool):
            async with self.pool.connection() as connection:
                if lock is None:
                    yield connection
                else:
                    async with connection.transaction():
                        await connection.execute(_TENANT_LOCK, (lock,))
                        yield connection


def _create_schema(pool: ConnectionPool[Any] | AsyncConnectionPool[Any], owns_pool: bool) -> int:
    with _admin(pool, owns_pool) as connection, connection.transaction():
        connection.execute(_MIGRATION_LOCK)
        return _sql.migrate(connection, _DIALECT)


def _schema_version(pool: ConnectionPool[Any] | AsyncConnectionPool[Any], owns_pool: bool) -> int:
    with _admin(pool, owns_pool) as connection:
        return _sql.schema_version(connection, _DIALECT)


def _admin(
    pool: ConnectionPool[Any] | AsyncConnectionPool[Any], owns_pool: bool
) -> contextlib.AbstractContextManager[Connection[Any]]:
    # The administrative calls (deploy time, the keyturn command) connect on their own:
    # a server that refuses answers at once, not after the pool's wait for a connection.
    if not owns_pool and isinstance(pool, ConnectionPool):
        return pool.connection()
    try:
        return Connection.connect(str(pool.conninfo), autocommit=True)
    except OperationalError as exc:
        reason = (str(exc).splitlines() or [""])[0]
        raise StoreUnreachable(
            f"cannot connect to PostgreSQL ({_describe(pool)}): {reason}", reason=reason
        ) from None


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


# Seconds between the listener's heartbeats; with tcp_user_timeout, a connection dropped
# without a word is noticed (and the replica no longer answers) within about 15 s.
HEARTBEAT: Final = 5.0
_LISTENER_OPTIONS: Final[dict[str, Any]] = {
    "autocommit": True,
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,  # milliseconds
}


class _Listener:
    """The database's change feed for one replica: a thread that LISTENs on a connection
    of its own, reconnecting with a growing pause when the connection or the server goes.

    The replica is current from the moment LISTEN is in place (emptied then: whatever
    changed while no one listened is gone from it) until the connection fails.
    """

    def __init__(self, conninfo: str, replica: _replica.Replica) -> None:
        self.conninfo = conninfo
        self.replica = replica
        self.backend_pid: int | None = None  # the listening session, while connected
        self._lock = threading.Lock()
        self._pid = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def ensure_running(self) -> None:
        """Start the listener in this process, if it is not running here yet."""
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child
                self._stop = threading.Event()
                self._thread = threading.Thread(
                    target=self._listen, args=(self._stop,), name="keyturn-listener", daemon=True
                )
                self._thread.start()
                self._pid = os.getpid()

    def stop(self) -> None:
        """Stop listening; the replica is no longer current."""
        with self._lock:
            self._stop.set()
            thread, self._thread, self._pid = self._thread, None, 0
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self.replica.reset(current=False)

    def _listen(self, stop: threading.Event) -> None:
        pause = 0.05
        while not stop.is_set():
            try:
                self._connected(stop)
                pause = 0.05
            except Exception as exc:  # the server went away, or refused: read through
                log.warning(
                    "keyturn's change feed is down (%s); requests read the database until "
                    "it is back",
                    type(exc).__name__,
                )
            finally:
                self.replica.reset(current=False)
                self.backend_pid = None
            stop.wait(pause)
            pause = min(pause * 2, 2.0)

    def _connected(self, stop: threading.Event) -> None:
        # A connection dropped without a word (a firewall's idle timeout) must not leave the
        # replica current: the kernel gives up on unanswered data after tcp_user_timeout, and
        # a heartbeat query every few seconds gives it data to wait for.
        with Connection.connect(self.conninfo, **_LISTENER_OPTIONS) as connection:
            (schema,) = connection.execute("SELECT current_schema()").fetchone() or ("",)
            connection.execute(f"LISTEN {_sql.NOTIFY_CHANNEL}")
            self.backend_pid = connection.info.backend_pid
            self.replica.reset(current=True)
            beat = time.monotonic() + HEARTBEAT
            while not stop.is_set():
                if time.monotonic() >= beat:
                    connection.execute("SELECT 1")
                    beat = time.monotonic() + HEARTBEAT
                for notify in connection.notifies(timeout=0.5):
                    where, _, change = notify.payload.partition("\t")
                    kind, _, changed_id = change.partition("\t")
                    if where == schema:
                        self.replica.changed(kind, changed_id)
