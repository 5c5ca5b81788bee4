"""The SQLite key store and membership: one file, nothing to start, the embedded default.

One :class:`SQLiteDatabase` is one file; it gives the key store (``.keys``) and the
membership membership (``.membership``)::

    from keyturn import Authenticator, KeyManager
    from keyturn.stores.sqlite import SQLiteDatabase

    db = SQLiteDatabase("keyturn.sqlite3")  # the file and its tables appear on first use
    db.membership.add_organization("org_acme", tenant_id="acme", default=True)
    db.membership.add_member("alice", "org_acme", role="admin")
    manager = KeyManager(db.keys, db.membership)
    auth = Authenticator(db.keys, db.membership)
    ...
    db.close()

The schema is versioned (table ``keyturn_schema_version``) and created or upgraded on
first use; :meth:`SQLiteDatabase.create_schema` does it up front. Several processes may
share the file: SQLite's write-ahead log lets readers run while one process writes, and a
revoke committed by any of them is seen by the next request of every other.

Thread safety: the database keeps a small stack of connections and lends one to each call,
so threads read in parallel (SQLite runs without the GIL). The stores are synchronous; the
async middleware calls them in a worker thread, off the event loop.

Instants are stored as ISO 8601 text in UTC with microseconds (``2026-01-31T09:30:00.
000001+00:00``): exact, readable in the ``sqlite3`` shell, and ordered like the instants.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
import time
from datetime import datetime
from types import TracebackType
from typing import Any, Final, TypeVar

from keyturn.stores import _sql

__all__ = ["SQLiteDatabase", "SQLiteKeyStore", "SQLiteMembership"]

T = TypeVar("T")

_DIALECT: Final = _sql.Dialect(
    timestamp="TEXT",
    has_version_table=(
        "SELECT count(*) FROM sqlite_master "
        "WHERE type = 'table' AND name = 'keyturn_schema_version'"
    ),
)


class SQLiteKeyStore(_sql.SQLKeyStore):
    """A :class:`~keyturn.protocols.KeyStore` in a SQLite file; get it as ``db.keys``."""

    # Reads never wait under WAL and writes wait at most the busy timeout: the sync
    # middleware needs no watchdog thread around these calls.
    enforces_timeout = True


class SQLiteMembership(_sql.SQLMembership):
    """A :class:`~keyturn.protocols.MembershipProvider` in a SQLite file: ``db.membership``.

    Tables ``keyturn_organizations`` (``id``, ``tenant_id``, ``is_default``; at most one
    default per tenant) and ``keyturn_memberships`` (``account_id``, ``organization_id``,
    ``role``). A reference implementation: replace it with a provider over your own tables.
    """

    enforces_timeout = True


class SQLiteDatabase:
    """One SQLite file holding keyturn's tables: ``.keys`` and ``.membership`` share it.

    :param path: the database file; created, with its tables, on first use.
    :param timeout: seconds a write waits for another writer (SQLite's ``busy_timeout``).
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 5.0) -> None:
        self.path = os.fspath(path)
        if self.path in ("", ":memory:") or self.path.startswith("file:"):
            # Every connection would see a different empty database.
            raise ValueError(
                f"SQLiteDatabase needs a file path, got {self.path!r}; "
                "for a database in memory use keyturn.stores.memory"
            )
        self.timeout = timeout
        self.keys = SQLiteKeyStore(self)
        self.membership = SQLiteMembership(self)
        self._idle: list[sqlite3.Connection] = []  # lent out LIFO; list ops are atomic
        self._opened: list[sqlite3.Connection] = []
        self._lock = threading.Lock()  # guards opening connections and the schema check
        self._schema_ready = False
        self._closed = False

    def __repr__(self) -> str:
        return f"SQLiteDatabase({self.path!r})"

    def __enter__(self) -> SQLiteDatabase:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def create_schema(self) -> int:
        """Create or upgrade the tables now (idempotent); returns the schema version."""
        return self.run(_sql.schema_version(_DIALECT))  # the first connection migrates

    def schema_version(self) -> int:
        """The schema version in the file (created on first use, so never 0 here)."""
        return self.run(_sql.schema_version(_DIALECT))

    def close(self) -> None:
        """Close every connection; the database cannot be used afterwards."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            for connection in idle:
                self._opened.remove(connection)
        # A connection lent out is closed when it comes back: closing it under a running
        # statement crashes the interpreter (sqlite3 is not safe against that).
        for connection in idle:
            connection.close()

    def run(self, op: _sql.Op[T]) -> T:
        """Run one operation of :mod:`keyturn.stores._sql` on a lent connection."""
        with self._lock:  # close() must never take a connection that is being lent
            connection = self._idle.pop() if self._idle else None
        if connection is None:
            connection = self._connect()
        try:
            return _drive(connection, op)
        finally:
            with self._lock:
                if self._closed:
                    self._opened.remove(connection)
                    connection.close()
                else:
                    self._idle.append(connection)

    def _connect(self) -> sqlite3.Connection:
        with self._lock:
            if self._closed:
                raise sqlite3.ProgrammingError(f"{self!r} is closed")
            # isolation_level=None: each statement commits on its own; migrations BEGIN
            # explicitly. timeout= is SQLite's busy_timeout. The connection moves between
            # threads, but only one uses it at a time.
            # The file holds key hashes and who may do what: create it readable by its owner
            # only (SQLite gives its -wal and -shm files the same mode).
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            connection = sqlite3.connect(
                self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
            )
            try:
                _use_wal(connection, self.timeout)
                connection.execute("PRAGMA foreign_keys = ON")
                if not self._schema_ready:
                    _migrate(connection)
                    self._schema_ready = True
            except BaseException:
                connection.close()
                raise
            self._opened.append(connection)
            return connection


def _use_wal(connection: sqlite3.Connection, timeout: float) -> None:
    # In WAL mode readers never wait for the writer. The mode is stored in the file, so this
    # is a no-op once set; but switching a new file needs a moment alone with it, and SQLite
    # reports "locked" at once instead of waiting, so retry until the busy timeout.
    deadline = time.monotonic() + timeout
    while True:
        try:
            connection.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.005)


@functools.cache
def _qmark(sql: str) -> str:
    return sql.replace("%s", "?")


def _param(value: Any) -> Any:
    if isinstance(value, datetime):  # always UTC from _sql; fixed width sorts like instants
        return value.isoformat(timespec="microseconds")
    return value


def _drive(connection: sqlite3.Connection, op: _sql.Op[T]) -> T:
    answer: Any = None
    try:
        while True:
            query = op.send(answer)
            cursor = connection.execute(_qmark(query.sql), [_param(p) for p in query.params])
            if query.fetch == _sql.ONE:
                answer = cursor.fetchone()
            elif query.fetch == _sql.ALL:
                answer = cursor.fetchall()
            else:
                answer = cursor.rowcount
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _migrate(connection: sqlite3.Connection) -> None:
    # BEGIN IMMEDIATE takes the write lock first, so two processes never migrate at once.
    connection.execute("BEGIN IMMEDIATE")
    try:
        _drive(connection, _sql.migrate(_DIALECT))
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")
