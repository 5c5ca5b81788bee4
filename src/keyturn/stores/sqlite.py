"""The SQLite key store and membership: one file, nothing to start, the embedded default.

One :class:`SQLiteDatabase` is one file holding the key store (``.keys``) and the
membership provider (``.membership``). The schema is versioned (``keyturn_schema_version``)
and created or upgraded on first use. Several processes may share the file: SQLite's
write-ahead log lets readers run while one process writes, and a revoke committed by any of
them is seen by the next request of every other.

Thread safety: the database keeps a small stack of connections and lends one to each call,
so threads read in parallel (SQLite runs without the GIL). The stores are synchronous; the
async middleware calls them in a worker thread, off the event loop.

Instants are stored as ISO 8601 text in UTC with microseconds: exact, readable in the
``sqlite3`` shell, and ordered like the instants.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final, TypeVar

from keyturn.errors import NotAKeyDatabase
from keyturn.stores import _sql

__all__ = ["SQLiteDatabase"]

T = TypeVar("T")

_DIALECT: Final = _sql.Dialect(
    timestamp="TEXT",
    has_version_table=(
        "SELECT count(*) FROM sqlite_master "
        "WHERE type = 'table' AND name = 'keyturn_schema_version'"
    ),
    has_foreign_tables=(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' "
        "AND name NOT LIKE 'keyturn\\_%' ESCAPE '\\' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
    ),
)


class SQLiteDatabase(_sql.ClosedOnExit):
    """One SQLite file holding keyturn's tables: ``.keys`` and ``.membership`` share it.

    :param path: the database file; created, with its tables, on first use.
    :param timeout: seconds a write waits for another writer (SQLite's ``busy_timeout``).
    :raises NotAKeyDatabase: on first use, when the file is not a SQLite database, or holds
        other tables and no keyturn schema (keyturn never adds its tables to another file).
    """

    # Reads never wait under WAL and writes wait at most the busy timeout: the sync
    # middleware needs no watchdog thread around these calls.
    enforces_timeout = True

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 5.0) -> None:
        self.path = os.fspath(path)
        if self.path in ("", ":memory:") or self.path.startswith("file:"):
            # Every connection would see a different empty database.
            raise ValueError(
                f"SQLiteDatabase needs a file path, got {self.path!r}; "
                "for a database in memory use keyturn.stores.memory"
            )
        self.timeout = timeout
        self.keys = _sql.SQLKeyStore(self)
        self.membership = _sql.SQLMembership(self)
        self._idle: list[sqlite3.Connection] = []
        self.connections = 0  # opened so far: at most one per thread using it at once
        self._lock = threading.Lock()  # guards opening connections and the schema check
        self._schema_ready = False
        self._closed = False

    def __repr__(self) -> str:
        return f"SQLiteDatabase({self.path!r})"

    def create_schema(self) -> int:
        """Create or upgrade the tables now (idempotent); returns the schema version."""
        return self._lent(_migrate)

    def schema_version(self) -> int:
        """The schema version in the file (created on first use, so never 0 here)."""
        return self.run(_sql.schema_version(_DIALECT))

    def close(self) -> None:
        """Close every connection; the database cannot be used afterwards.

        A connection still in use by another thread is closed when that call ends.
        """
        self._closed = True
        self._close_idle()

    def run(self, op: _sql.Op[T]) -> T:
        """Run one operation of :mod:`keyturn.stores._sql` on a lent connection."""
        return self._lent(functools.partial(_drive, op=op))

    def _lent(self, use: Callable[[sqlite3.Connection], T]) -> T:
        """*use* called with a connection lent for the call (LIFO; list ops are atomic)."""
        try:
            connection = self._idle.pop()
        except IndexError:
            connection = self._connect()
        try:
            return use(connection)
        finally:
            self._idle.append(connection)
            if self._closed:  # close() ran during this call: it could not close this one
                self._close_idle()

    def _close_idle(self) -> None:
        with contextlib.suppress(IndexError):
            while True:
                self._idle.pop().close()

    def _connect(self) -> sqlite3.Connection:
        with self._lock:
            if self._closed:
                raise sqlite3.ProgrammingError(f"{self!r} is closed")
            # isolation_level=None: each statement commits on its own; migrations BEGIN
            # explicitly. A connection moves between threads, but only one uses it at a time.
            new_file = not os.path.exists(self.path)
            connection = sqlite3.connect(
                self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
            )
            try:
                if new_file:
                    # The file holds key hashes and who may do what: readable by its owner
                    # only (SQLite gives its -wal and -shm files the same mode). chmod, never
                    # an open() and close() of our own: closing any descriptor of the file
                    # drops every POSIX lock this process holds on it, and another process
                    # would then delete the -wal and -shm files under our connections.
                    os.chmod(self.path, 0o600)
                _use_wal(connection, self.timeout)
                connection.execute("PRAGMA foreign_keys = ON")
                if not self._schema_ready:
                    _migrate(connection)
                    self._schema_ready = True
            except BaseException as exc:
                connection.close()
                if getattr(exc, "sqlite_errorname", "") == "SQLITE_NOTADB":
                    raise NotAKeyDatabase(f"{self.path!r} is not a SQLite database") from None
                raise
            self.connections += 1
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
    return _sql.drive(
        lambda query: connection.execute(_qmark(query.sql), [_param(p) for p in query.params]), op
    )


def _migrate(connection: sqlite3.Connection) -> int:
    # BEGIN IMMEDIATE takes the write lock first, so two processes never migrate at once.
    connection.execute("BEGIN IMMEDIATE")
    try:
        version = _drive(connection, _sql.migrate(_DIALECT))
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")
    return version
