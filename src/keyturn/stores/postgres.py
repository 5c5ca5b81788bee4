"""The PostgreSQL key store and membership: one database shared by many app instances.

Install the extra (``pip install 'keyturn[postgres]'``). A :class:`PostgresDatabase` owns a
connection pool and gives the key store (``.keys``) and the membership provider
(``.membership``); :class:`AsyncPostgresDatabase` is its twin for the ASGI middleware.

Importing this module touches no database; a :class:`PostgresDatabase` connects when
constructed, an :class:`AsyncPostgresDatabase` on ``open()``, each pool in the background
(retrying a server that refuses); ``reach()`` connects once, on its own, for a caller
that wants a refusal said at once (``open_database(url, connect_first=True)``). Only
``create_schema()`` creates or upgrades the tables, under an advisory lock so that
instances deploying at once do not race, in the first schema of the ``search_path`` (for a
schema of their own, add ``?options=-csearch_path%3Dkeyturn`` to the URL).

Every call borrows a pooled connection in autocommit mode and runs one or two statements,
so a revoke is committed when ``revoke_key`` returns. What a request reads comes from the
process's replica (``_replica.py``), fed by the database itself: triggers send
``NOTIFY keyturn_changes`` in every writing transaction (``TRUNCATE`` and writes under
``session_replication_role = replica`` included), and a listener thread with a connection
of its own drops what each change touches. The replica is the one of the database the
pool's connections reach (server, database, schema of the tables: asked, never read from
the URL), and it answers only while the listener proves itself: same server and database
as the pool, a heartbeat answered within the last ``PROVEN_FOR`` seconds (2), no notice
unread (it is emptied at each connect, so nothing missed while it was away is ever
served); otherwise a request reads through, in one statement. A revoke committed
anywhere is refused by every instance within the listener's lag (milliseconds on a local
network: see ``docs/performance.md``); ``replica=False`` reads through on every request.
Instants are ``timestamptz`` and come back as UTC datetimes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import select
import termios
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final, Generic, TypeVar

try:
    from psycopg import AsyncConnection, Connection, OperationalError, ProgrammingError, pq
    from psycopg.conninfo import conninfo_to_dict
    from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout
except ImportError as exc:
    raise ImportError(
        "the PostgreSQL store needs psycopg: pip install 'keyturn[postgres]'"
    ) from exc

from keyturn._core.events import EventHook
from keyturn._core.fork import renew_in_child
from keyturn._core.model import Found
from keyturn.errors import StoreTimeout, StoreUnreachable
from keyturn.stores import _replica, _schema, _sql
from keyturn.stores._async import AsyncSQLKeyStore, AsyncSQLMembership
from keyturn.stores._sync import SQLKeyStore, SQLMembership
from keyturn.stores._versions import Versions

__all__ = ["AsyncPostgresDatabase", "PostgresDatabase"]

log: Final = logging.getLogger("keyturn")

_DIALECT: Final = _schema.Dialect(
    timestamp="timestamptz",
    has_version_table="SELECT to_regclass('keyturn_schema_version') IS NOT NULL",
    has_foreign_tables=None,
    change_feed=_schema.POSTGRES_CHANGE_FEED,
    every_write_heard=_schema.POSTGRES_EVERY_WRITE_HEARD,
    organizations_placed=_schema.POSTGRES_ORGANIZATIONS_PLACED,
    placeholder="%s",
)
_STATEMENTS: Final = _sql.Statements()
# Serializes create_schema() across instances: one fixed key every instance takes.
_MIGRATION_LOCK: Final = "SELECT pg_advisory_xact_lock(7017280452245743993)"
# Serializes the writes that keep a tenant's default organization (its first, removed last).
_TENANT_LOCK: Final = "SELECT pg_advisory_xact_lock(hashtextextended('keyturn tenant ' || %s, 0))"


AnyPool = ConnectionPool[Any] | AsyncConnectionPool[Any]
P = TypeVar("P", bound=AnyPool)

# Which database a connection reaches, by what it is: the database's name, the schema
# keyturn's tables resolve to on this connection (NULL before create_schema), the server's
# address, and whether the server's own identity (pg_control_system) may be read.
_IDENTIFY: Final = """
    SELECT current_database(),
        (SELECT n.nspname FROM pg_catalog.pg_class c
            JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
            WHERE c.oid = pg_catalog.to_regclass('keyturn_keys')),
        coalesce(host(inet_server_addr()), 'local'), coalesce(inet_server_port(), 0),
        pg_catalog.has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE')
"""
_SYSTEM: Final = "SELECT system_identifier::text FROM pg_catalog.pg_control_system()"
# The server, the database, the schema of keyturn's tables.
Identity = tuple[str, str, str]


def _server(row: Any, system: Any) -> str:
    # The system identifier tells servers apart wherever they are; without the right to
    # read it, the address the server answers on stands in.
    return f"system {system[0]}" if system else f"address {row[2]}:{row[3]}"


def _identity(row: Any, system: Any) -> Identity | None:
    """The identity of an ``_IDENTIFY`` row (and its ``_SYSTEM`` row, where readable);
    ``None`` while keyturn's tables are not there."""
    if row is None or row[1] is None:
        return None
    return (_server(row, system), str(row[0]), str(row[1]))


def _identified(row: Any, connection: Connection[Any]) -> Identity | None:
    system = connection.execute(_SYSTEM).fetchone() if row is not None and row[4] else None
    return _identity(row, system)


def _describe(conninfo: object) -> str:
    # Enough to recognise the database; never the password.
    try:
        params = conninfo_to_dict(conninfo) if isinstance(conninfo, str) else {}
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


_ORPHANS: Final[list[object]] = []  # a forked child's inherited pools, never closed


class _Replicated(Generic[P]):
    """What both databases are made of: a pool (opened here, or passed in), the stores over
    it, the process's replica of this database, its listener, and the stores'
    ``lookup_cached``. The twins differ only in their pool's class, when it opens, and
    their stores' (the class attributes).

    Which replica is this database's is asked of the database itself, on the first pooled
    connection lent (:meth:`PostgresDatabase.attach`): the server, the database, and the
    schema keyturn's tables resolve to on the pool's connections. Until then, and whenever
    the listener cannot prove itself current, requests read through.
    """

    sql = _STATEMENTS
    instant = staticmethod(_sql.utc)
    enforces_timeout = False  # the sync middleware bounds the calls itself
    _pool_class: type[P]
    _opens_at_once: bool  # the pool opens when built (an async one only in a running loop)
    _stores: tuple[Callable[[Any], Any], Callable[[Any], Any]]  # keys, membership
    replica: _replica.Replica
    _listener: _Listener | None

    def __init__(
        self,
        conninfo: str = "",
        *,
        pool: P | None = None,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 5.0,
        replica: bool = True,
        listener_conninfo: str | None = None,
        on_event: EventHook | None = None,
    ) -> None:
        self.on_event = on_event
        self._closed = False
        self._owns_pool = pool is None
        options = _pool_options(min_size, max_size, timeout)
        if pool is None:
            pool = self._pool_class(conninfo, open=self._opens_at_once, **options)
        self.pool: P = pool
        # A pool like the one we opened, not opened yet (a forked child's).
        self._renew_pool: Callable[[], P] = lambda: self._pool_class(
            conninfo, open=False, **options
        )
        keys, membership = self._stores
        self.keys = keys(self)
        self.membership = membership(self)
        self.replica, self._listener = _replica.Replica(), None  # never current: reads through
        self._wants_replica = replica
        # The listener connects as the pool does (its conninfo and kwargs), or as told; a
        # pool whose kwargs come from a callable needs listener_conninfo.
        kwargs = pool.kwargs if isinstance(pool.kwargs, dict) else {}
        self._listen_with = (
            (listener_conninfo, {})
            if listener_conninfo is not None
            else (str(pool.conninfo), kwargs)
        )
        self._attach_lock = threading.Lock()
        self._shared: tuple[str, ...] = ()
        self._reopen = False  # a forked child's new pool, opened on first use
        renew_in_child(self)

    def _after_fork(self) -> None:
        # The parent's connections are the parent's: a child querying one would read the
        # parent's answers. A pool of ours is made anew, opened on first use; the old one
        # is kept, never closed (closing would end the parent's sessions). A pool passed
        # in is its owner's to make in the child (gunicorn's post_fork).
        self._attach_lock = threading.Lock()
        if self._owns_pool and not self._closed:
            _ORPHANS.append(self.pool)
            self.pool = self._renew_pool()
            self._reopen = True

    def _attach(self, identity: Identity | None) -> None:
        if identity is None:  # keyturn's tables are not there yet: try again later
            return
        with self._attach_lock:
            if self._listener is not None or self._closed:
                return
            self._shared = ("postgresql", *identity)
            conninfo, kwargs = self._listen_with
            self.replica, listener = _replica.shared(
                self._shared, lambda shared: _Listener(conninfo, kwargs, identity, shared)
            )
            listener.ensure_running()
            self._listener = listener

    def _unshare(self) -> None:
        with self._attach_lock:
            self._closed = True
            listener, self._listener = self._listener, None
        if listener is not None:
            _replica.release(self._shared, _Listener.stop)

    def lookup_cached(self, key_id: str, organization: str | None) -> Found | None:
        listener = self._listener
        if listener is None or not listener.settled():
            return None
        return self.replica.found(key_id, organization)

    def changes(self) -> Versions | None:
        """When each thing the decision reads last changed, as the listener hears of it;
        ``None`` while the replica is off or cannot answer."""
        listener = self._listener
        if listener is None or not listener.answers():
            return None
        return self.replica.changes()


class PostgresDatabase(_Replicated[ConnectionPool[Any]], _sql.ClosedOnExit):
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
    :param listener_conninfo: how the listener connects, when it cannot connect as the
        pool does (the pool's conninfo and ``kwargs``; a ``configure`` callback is not
        run for it); it must reach the same database, or the replica never answers.
    :param on_event: called with each :class:`~keyturn.activity.KeyEvent` once it is
        recorded (see :mod:`keyturn.activity`); its failures are logged.
    """

    _pool_class = ConnectionPool
    _opens_at_once = True
    _stores = (SQLKeyStore, SQLMembership)
    keys: SQLKeyStore
    membership: SQLMembership

    def __repr__(self) -> str:
        return f"PostgresDatabase({_describe(self.pool.conninfo)!r})"

    def create_schema(self) -> int:
        """Create or upgrade the tables (idempotent, safe to run concurrently); the version."""
        return _create_schema(self.pool, self._owns_pool)

    def _reopened(self) -> None:
        with self._attach_lock:
            if self._reopen:
                self.pool.open()
                self._reopen = False

    def attach(self, connection: Connection[Any]) -> None:
        """On the first pooled connection lent: find which database this is, and share
        the process's replica of it (docs/stores.md, "Identity, not spelling")."""
        self._attach(_identified(connection.execute(_IDENTIFY).fetchone(), connection))

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
        if self._reopen:
            self._reopened()
        with _waited(self.pool), self.pool.connection() as connection:
            if self._listener is None and self._wants_replica:
                self.attach(connection)
            if lock is None:
                yield connection
            else:
                with connection.transaction():
                    connection.execute(_TENANT_LOCK, (lock,))
                    yield connection


class AsyncPostgresDatabase(_Replicated[AsyncConnectionPool[Any]]):
    """The async twin of :class:`PostgresDatabase`, over an ``AsyncConnectionPool``.

    Open it inside the event loop: ``async with AsyncPostgresDatabase(url) as adb:``, or
    ``await adb.open()`` and later ``await adb.close()``. It shares the process's replica
    with any :class:`PostgresDatabase` on the same connection string.
    """

    _pool_class = AsyncConnectionPool
    _opens_at_once = False  # an async pool may only start inside a running loop: open() does it
    _stores = (AsyncSQLKeyStore, AsyncSQLMembership)
    keys: AsyncSQLKeyStore
    membership: AsyncSQLMembership

    def __repr__(self) -> str:
        return f"AsyncPostgresDatabase({_describe(self.pool.conninfo)!r})"

    async def __aenter__(self) -> AsyncPostgresDatabase:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Start the pool (it connects in the background)."""
        if self._owns_pool:
            await self.pool.open()

    async def attach(self, connection: AsyncConnection[Any]) -> None:
        """The awaited twin of :meth:`PostgresDatabase.attach`."""
        row = await (await connection.execute(_IDENTIFY)).fetchone()
        system = None
        if row is not None and row[4]:
            system = await (await connection.execute(_SYSTEM)).fetchone()
        self._attach(_identity(row, system))

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
        if self._reopen:
            self._reopen = False
            await self.pool.open()
        with _waited(self.pool):
            async with self.pool.connection() as connection:
                if self._listener is None and self._wants_replica:
                    await self.attach(connection)
                if lock is None:
                    yield connection
                else:
                    async with connection.transaction():
                        await connection.execute(_TENANT_LOCK, (lock,))
                        yield connection


def _create_schema(pool: AnyPool, owns_pool: bool) -> int:
    with _admin(pool, owns_pool) as connection, connection.transaction():
        connection.execute(_MIGRATION_LOCK)
        return _schema.migrate(connection, _DIALECT)


def _schema_version(pool: AnyPool, owns_pool: bool) -> int:
    with _admin(pool, owns_pool) as connection:
        return _schema.schema_version(connection, _DIALECT)


def _admin(pool: AnyPool, owns_pool: bool) -> contextlib.AbstractContextManager[Connection[Any]]:
    # The administrative calls (deploy time, the keyturn command) connect on their own:
    # a server that refuses answers at once, not after the pool's wait for a connection.
    if not owns_pool and isinstance(pool, ConnectionPool):
        return pool.connection()
    return _connect(str(pool.conninfo), autocommit=True)


def reach(conninfo: str) -> None:
    """Connect once, on a connection of its own, and close it: a server that refuses or is
    not reached within the connect timeout (the URL's ``connect_timeout``, else
    ``CONNECT_TIMEOUT``), or a URL libpq cannot read, raises
    :class:`~keyturn.errors.StoreUnreachable` here, before a pool would retry it in the
    background and log each failure."""
    timeout = {} if "connect_timeout" in conninfo else {"connect_timeout": CONNECT_TIMEOUT}
    _connect(conninfo, **timeout).close()


CONNECT_TIMEOUT: Final = 5  # seconds: reach()'s, unless the URL says


def _connect(conninfo: str, **options: Any) -> Connection[Any]:
    """A plain connection; what keeps it from connecting is ``StoreUnreachable``, its
    reason one line without the password."""
    try:
        return Connection.connect(conninfo, **options)
    except (OperationalError, ProgrammingError) as exc:
        reason = " ".join(str(exc).split())
        if isinstance(exc, ProgrammingError):
            # libpq could not parse the URL, and quotes the part it stopped at, which may be
            # the password: only the kind of error is said.
            reason = reason.partition(":")[0] + " (check the URL's %-escapes and quoting)"
        raise StoreUnreachable(
            f"cannot connect to PostgreSQL ({_describe(conninfo)}): {reason}", reason=reason
        ) from None


@contextlib.contextmanager
def _waited(pool: AnyPool) -> Iterator[None]:
    # The pool's wait for a connection ran out: whether the server is down or every
    # connection is busy, the store did not answer in time (503, reason backend_timeout).
    try:
        yield
    except PoolTimeout:
        raise StoreTimeout(
            f"no PostgreSQL connection within {pool.timeout:g} s ({_describe(pool.conninfo)}, "
            f"max_size={pool.max_size}): the server is down, or the pool too small for the load"
        ) from None


# The listener's liveness (docs/stores.md): a heartbeat every HEARTBEAT seconds, answered
# within BEAT_DEADLINE or the connection is dropped; the replica answers only within
# PROVEN_FOR seconds of the last heartbeat sent and answered, so a listener that stalls
# (a hung proxy, a paused process) stops it answering within that bound, whatever the
# kernel's timeouts say.
HEARTBEAT: Final = 0.5
BEAT_DEADLINE: Final = 1.0
PROVEN_FOR: Final = 2.0
_LISTENER_OPTIONS: Final[dict[str, Any]] = {
    "autocommit": True,
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,  # milliseconds
}


_NOTHING: Final = bytes(4)  # FIONREAD's answer for an empty socket
_SETTLING: Final = 200  # waits of 0.5 ms (100 ms in all) for notices to be applied, at most


class _Elsewhere(Exception):
    """The listener reached another database than the pool's."""


class _Outdated(Exception):
    """The schema's feed does not place every change (before version 8): a replica fed by
    it could keep a tenant's default or an account's reach after they changed."""


def _version_of(schema: str) -> str:
    quoted = schema.replace('"', '""')
    return f'SELECT coalesce(max(version), 0) FROM "{quoted}".keyturn_schema_version'  # noqa: S608


class _Listener:
    """The database's change feed for one replica: a thread that LISTENs on a connection
    of its own, reconnecting with a growing pause when the connection or the server goes.

    The replica answers (:meth:`answers`) only while all of this holds: the listener's
    connection reaches the server and database the pool's does (asked of each, never
    read from a URL); the schema's triggers name what each change touches (version 8:
    ``_schema.PLACED_FROM``); it has LISTENed since the replica was last emptied; a heartbeat sent
    less than ``PROVEN_FOR`` seconds ago was answered (every notice committed before
    it was sent has then been read); and nothing waits unread on its socket. Notices are
    those of the schema keyturn's tables resolve to on the pool's connections.
    """

    def __init__(
        self, conninfo: str, kwargs: dict[str, Any], identity: Identity, replica: _replica.Replica
    ) -> None:
        self.conninfo = conninfo
        self.kwargs = {**kwargs, **_LISTENER_OPTIONS}
        self.identity = identity
        self.replica = replica
        self.backend_pid: int | None = None  # the listening session, while connected
        self.proven_until = 0.0  # on the monotonic clock
        self.busy = False  # reading notices off the socket, not all applied yet
        self._socket: int | None = None  # the listening socket, while proven
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def answers(self) -> bool:
        """Whether the replica may answer now (see the class)."""
        socket = self._socket
        if socket is None:
            if self._thread is None:
                self.ensure_running()
            return False
        # The socket first, then busy: notices read off it are applied before busy clears.
        # FIONREAD (bytes waiting to be read) answers every thread at once, unlike a poll.
        return (
            time.monotonic() < self.proven_until
            and fcntl.ioctl(socket, termios.FIONREAD, _NOTHING) == _NOTHING
            and not self.busy
        )

    def settled(self) -> bool:
        """:meth:`answers`, once notices that wait are applied (a short, bounded wait).

        When it cannot say (the listener is behind by more than the wait: a stall), every
        answer kept before is made void before the caller reads through
        (``Replica.moved``, counted as a reset): what the
        database shows may be newer than what the feed has told, and no answer kept before
        (the memo's) may outlive it.
        """
        if self.answers():
            return True
        if self._socket is None:
            return False
        for _ in range(_SETTLING):  # the listener thread applies what waits, or stalls
            time.sleep(0.0005)
            if self.answers():
                return True
        self.replica.moved()
        return False

    def ensure_running(self) -> None:
        """Start the listener in this process, if it is not running here yet."""
        with self._lock:
            if self._thread is None:  # first use, or a forked child
                self._stop = threading.Event()
                self._thread = threading.Thread(
                    target=self._listen, args=(self._stop,), name="keyturn-listener", daemon=True
                )
                self._thread.start()

    def after_fork(self) -> None:
        # The parent's thread is gone and its connection is not ours: start afresh, on use.
        self._lock = threading.Lock()
        self._thread, self._socket, self.proven_until, self.busy = None, None, 0.0, False

    def stop(self) -> None:
        """Stop listening; the replica no longer answers."""
        with self._lock:
            self._stop.set()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self._socket = None
        self.replica.reset(current=False)

    def _listen(self, stop: threading.Event) -> None:
        pause = 0.05
        while not stop.is_set():
            try:
                self._connected(stop)
                pause = 0.05
            except _Elsewhere as exc:
                log.error("keyturn's change feed is off: %s", exc)
            except _Outdated as exc:
                log.warning("keyturn's change feed waits for create_schema(): %s", exc)
            except Exception as exc:  # the server went away, refused, or stalled: read through
                log.warning(
                    "keyturn's change feed is down (%s); requests read the database until "
                    "it is back",
                    type(exc).__name__,
                )
            finally:
                self._socket, self.proven_until = None, 0.0
                self.replica.reset(current=False)
                self.backend_pid, self.busy = None, False
            stop.wait(pause)
            pause = min(pause * 2, 2.0)

    def _connected(self, stop: threading.Event) -> None:
        connection = Connection.connect(self.conninfo, **self.kwargs)
        try:
            pgconn = connection.pgconn
            pgconn.nonblocking = 1
            poll = select.poll()
            poll.register(pgconn.socket, select.POLLIN)
            # Every exchange from here on has a deadline of our own: a hung proxy keeps
            # the TCP session alive, and the kernel's timeouts never fire.
            row = self._exchange(pgconn, poll, _IDENTIFY)
            system = self._exchange(pgconn, poll, _SYSTEM) if row[4] == "t" else None
            # The same server and database as the pool's connections: NOTIFY reaches
            # every session of one database, and notices name the schema they come from.
            where = (_server(row, system), row[0])
            if where != self.identity[:2]:
                raise _Elsewhere(
                    f"the listener reaches {where}, the pool {self.identity[:2]}: "
                    "pass listener_conninfo for the pool's database"
                )
            (version,) = self._exchange(pgconn, poll, _version_of(self.identity[2]))
            if int(version or 0) < _schema.PLACED_FROM:
                raise _Outdated(
                    f"schema version {version}, the replica needs {_schema.PLACED_FROM}: "
                    "requests read the database until then"
                )
            self._exchange(pgconn, poll, f"LISTEN {_schema.NOTIFY_CHANNEL}")
            self.backend_pid = pgconn.backend_pid
            self.replica.reset(current=True)
            while not stop.is_set():
                sent = time.monotonic()
                self._exchange(pgconn, poll, "SELECT 1")
                self.proven_until = sent + PROVEN_FOR
                self._socket = pgconn.socket
                beat = sent + HEARTBEAT
                while (left := beat - time.monotonic()) > 0 and not stop.is_set():
                    if poll.poll(left * 1000):
                        self._receive(pgconn)
        finally:
            connection.close()  # no rollback: an exchange may be in flight

    def _exchange(self, pgconn: Any, poll: select.poll, query: str) -> list[str | None]:
        """Send *query*, apply notices until its answer: the first row's values as text."""
        # ``busy`` is set only while bytes read off the socket may hold notices not yet
        # applied; while it waits for the answer, the socket itself tells (FIONREAD), so
        # requests go on answering from the replica through every heartbeat. On a failure
        # it stays set until the listener's connection is dropped.
        deadline = time.monotonic() + BEAT_DEADLINE
        pgconn.send_query(query.encode())
        while pgconn.flush():  # the rest waits for room in the socket: rare, and bounded
            if time.monotonic() >= deadline:
                raise TimeoutError("the database took no query")
            time.sleep(0.001)
        while pgconn.is_busy():
            self._apply(pgconn)  # what is_busy() parsed, with what consume_input() read
            self.busy = False
            left = deadline - time.monotonic()
            if left <= 0 or not poll.poll(left * 1000):
                raise TimeoutError("the database did not answer in time")
            self.busy = True
            pgconn.consume_input()
        values: list[str | None] = []
        while (result := pgconn.get_result()) is not None:
            if result.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
                raise OperationalError((result.error_message or b"").decode(errors="replace"))
            if result.status == pq.ExecStatus.TUPLES_OK and result.ntuples and not values:
                values = [
                    None if (value := result.get_value(0, i)) is None else value.decode()
                    for i in range(result.nfields)
                ]
        self._apply(pgconn)  # notices read off the socket behind the answer
        self.busy = False
        return values

    def _receive(self, pgconn: Any) -> None:
        self.busy = True  # cleared once what was read is applied (as in _exchange)
        pgconn.consume_input()
        self._apply(pgconn)
        self.busy = False

    def _apply(self, pgconn: Any) -> None:
        # Every notice libpq holds, read off the socket already or parsed just now.
        schema = self.identity[2]
        while (notify := pgconn.notifies()) is not None:
            where, _, change = notify.extra.decode().partition("\t")
            kind, _, changed_id = change.partition("\t")
            if where == schema:
                self.replica.changed(kind, changed_id)
