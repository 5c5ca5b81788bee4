"""The SQLite key store and membership: one file, nothing to start, the embedded default.

One :class:`SQLiteDatabase` is one file holding the key store (``.keys``) and the
membership provider (``.membership``). The schema is versioned (``keyturn_schema_version``)
and created or upgraded on first use. Several processes may share the file: SQLite's
write-ahead log lets readers run while one process writes, and anything committed by any of
them is seen by the next request of every other.

What a request reads comes from the process's replica (``_replica.py``), checked against
the file on every request without asking SQLite anything: the WAL-index header at the
start of the ``-shm`` file, mapped read-only into the process, changes with every commit
before the commit returns, so comparing it with the header last seen (memory loads, no
statement, no system call) says whether any connection committed since. Only when it did
does the feed ask ``PRAGMA data_version`` and read the triggers' log ``keyturn_changes``
for what changed. So a warm request reads nothing from the file, and a commit by any
process (or any connection of this one) is seen by the next request of every other that
starts after the commit returned. Where the header cannot be mapped (a database not in WAL
mode, a system other than POSIX), the feed asks ``PRAGMA data_version`` at most every
``CHECK_EVERY`` seconds (0.5 ms) and after any call of this process on the file: a write
of this process is still seen at once, another process's commit within that bound.
``replica=False`` reads through on every request instead, in one statement.

Thread safety: the database keeps a small stack of connections and lends one to each call,
so threads read in parallel (SQLite runs without the GIL). The stores are synchronous; the
async middleware calls them in a worker thread, off the event loop, unless the replica can
answer at once.

Instants are stored as ISO 8601 text in UTC with microseconds: exact, readable in the
``sqlite3`` shell, and ordered like the instants.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sqlite3
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Final

from keyturn._core.events import EventHook
from keyturn._core.model import Found
from keyturn.errors import NotAKeyDatabase
from keyturn.stores import _replica, _schema, _sql
from keyturn.stores._sync import SQLKeyStore, SQLMembership
from keyturn.stores._versions import Versions

__all__ = ["SQLiteDatabase"]

_DIALECT: Final = _schema.Dialect(
    timestamp="TEXT",
    has_version_table=(
        "SELECT count(*) FROM sqlite_master "
        "WHERE type = 'table' AND name = 'keyturn_schema_version'"
    ),
    has_foreign_tables=(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' "
        "AND name NOT LIKE 'keyturn\\_%' ESCAPE '\\' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
    ),
    change_feed=_schema.SQLITE_CHANGE_FEED,
    every_write_heard=_schema.SQLITE_EVERY_WRITE_HEARD,
    organizations_placed=_schema.SQLITE_ORGANIZATIONS_PLACED,
    placeholder="?",
)
_STATEMENTS: Final = _sql.Statements.with_placeholder("?")


def _instant(at: datetime | None) -> str | None:
    # Fixed-width UTC text sorts and compares as the instants do.
    return None if at is None else at.astimezone(UTC).isoformat(timespec="microseconds")


class SQLiteDatabase(_sql.ClosedOnExit):
    """One SQLite file holding keyturn's tables: ``.keys`` and ``.membership`` share it.

    :param path: the database file; created, with its tables, on first use.
    :param timeout: seconds a write waits for another writer (SQLite's ``busy_timeout``).
    :param replica: keep what requests read in the process, checked against the file on
        every request (the default); ``False`` reads through on every request.
    :param on_event: called with each :class:`~keyturn.activity.KeyEvent` once it is
        recorded (see :mod:`keyturn.activity`); its failures are logged.
    :raises NotAKeyDatabase: on first use, when the file is not a SQLite database, or holds
        other tables and no keyturn schema (keyturn never adds its tables to another file).
    """

    # Reads never wait under WAL and writes wait at most the busy timeout: the sync
    # middleware needs no watchdog thread around these calls.
    enforces_timeout = True
    sql = _STATEMENTS
    instant = staticmethod(_instant)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        timeout: float = 5.0,
        replica: bool = True,
        on_event: EventHook | None = None,
    ) -> None:
        self.path = os.fspath(path)
        if self.path in ("", ":memory:") or self.path.startswith("file:"):
            # Every connection would see a different empty database.
            raise ValueError(
                f"SQLiteDatabase needs a file path, got {self.path!r}; "
                "for a database in memory use keyturn.stores.memory"
            )
        if sqlite3.sqlite_version_info < (3, 35):
            raise RuntimeError(
                f"keyturn needs SQLite 3.35 or newer; this Python has {sqlite3.sqlite_version}"
            )
        self.timeout = timeout
        self.on_event = on_event
        self.keys = SQLKeyStore(self)
        self.membership = SQLMembership(self)
        self._idle: list[sqlite3.Connection] = []
        self.connections = 0  # opened so far: at most one per thread using it at once
        self._lock = threading.Lock()  # guards opening connections and the schema check
        self._schema_ready = False
        self._closed = False
        _DATABASES.add(self)
        self._shared = ("sqlite", os.path.realpath(self.path))
        self.replica = _replica.Replica()  # never current unless fed: reads through
        self._feed: _Feed | None = None
        if replica:
            self.replica, feed = _replica.shared(
                self._shared, lambda shared: _Feed(self.path, timeout, shared)
            )
            self._feed = feed

    def __repr__(self) -> str:
        return f"SQLiteDatabase({self.path!r})"

    def create_schema(self) -> int:
        """Create or upgrade the tables now (idempotent); returns the schema version."""
        with self.connection() as connection:
            return _migrate(connection)

    def schema_version(self) -> int:
        """The schema version in the file (created on first use, so never 0 here)."""
        with self.connection() as connection:
            return _schema.schema_version(connection, _DIALECT)

    def close(self) -> None:
        """Close every connection; the database cannot be used afterwards.

        A connection still in use by another thread is closed when that call ends.
        """
        if not self._closed and self._feed is not None:
            _replica.release(self._shared, _Feed.close)
        self._closed = True
        self._close_idle()

    @contextlib.contextmanager
    def connection(self, lock: str | None = None) -> Iterator[sqlite3.Connection]:
        """A connection lent for a ``with`` block (LIFO; list operations are atomic).

        *lock* asks for writes serialized with others taking it: SQLite has one writer at a
        time, so every write statement is already.
        """
        with _GATE:
            try:
                connection = self._idle.pop()
            except IndexError:
                connection = self._connect()
            try:
                yield connection
            finally:
                self._idle.append(connection)
                feed = _FEEDS.get(self._shared[1])
                if feed is not None:  # what this call wrote is checked for by the next request
                    feed.stale = True
                if self._closed:  # close() ran during this call: it could not close this one
                    self._close_idle()

    def _after_fork(self) -> None:
        # SQLite connections must not cross a fork: the child opens its own.
        _ORPHANS.extend(self._idle)
        self._idle, self._lock = [], threading.Lock()

    # --- the replica, for the stores -------------------------------------------------------

    def lookup_cached(self, key_id: str, organization: str | None) -> Found | None:
        if not self._caught_up():
            return None
        return self.replica.found(key_id, organization)

    def changes(self) -> Versions | None:
        """When each thing the decision reads last changed, once caught up with every
        commit made before this call; ``None`` without a replica."""
        return self.replica.changes() if self._caught_up() else None

    def _caught_up(self) -> bool:
        if self._feed is None:
            return False
        if not self._schema_ready:  # the feed reads keyturn_changes: create it first
            with self.connection():
                pass
        self._feed.catch_up()
        return True

    # --- connections --------------------------------------------------------------------------

    def _close_idle(self) -> None:
        with contextlib.suppress(IndexError):
            while True:
                self._idle.pop().close()

    def _connect(self) -> sqlite3.Connection:
        with self._lock:
            if self._closed:
                raise sqlite3.ProgrammingError(f"{self!r} is closed")
            connection = _open(self.path, self.timeout)
            try:
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


def _open(path: str, timeout: float) -> sqlite3.Connection:
    # isolation_level=None: each statement commits on its own; migrations BEGIN explicitly.
    # A connection moves between threads, but only one uses it at a time.
    new_file = not os.path.exists(path)
    connection = sqlite3.connect(
        path, timeout=timeout, isolation_level=None, check_same_thread=False
    )
    if new_file:
        # The file holds key hashes and who may do what: readable by its owner only (SQLite
        # gives its -wal and -shm files the same mode). chmod, never an open() and close()
        # of our own: closing any descriptor of the file drops every POSIX lock this process
        # holds on it, and another process would then delete the -wal and -shm files under
        # our connections.
        try:
            os.chmod(path, 0o600)
        except BaseException:
            connection.close()
            raise
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


def _migrate(connection: sqlite3.Connection) -> int:
    # BEGIN IMMEDIATE takes the write lock first, so two processes never migrate at once.
    connection.execute("BEGIN IMMEDIATE")
    try:
        version = _schema.migrate(connection, _DIALECT)
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")
    return version


# The WAL-index header (https://www.sqlite.org/walformat.html): the first 96 bytes of the
# -shm file, two copies of one 48-byte header that every commit rewrites before it returns
# (its change counter, last frame, salts and checksums), copy two first, then copy one.
_HEADER: Final = 96
_COPY: Final = 48
_WAL_INDEX_VERSION: Final = 3007000  # the header's iVersion, in the machine's byte order
# Without the header (a database not in WAL mode, a -shm that cannot be mapped), the feed
# asks PRAGMA data_version at most once per this many seconds, and after any call of this
# process on the file: another process's commit is then seen within this bound.
CHECK_EVERY: Final = 0.0005


class _Feed:
    """The file's change feed, asked on every request, reading the file only when another
    connection committed: then ``keyturn_changes`` says what changed, and the replica drops it.

    Whether anyone committed is read, with no statement and no system call, from the
    WAL-index header in the ``-shm`` file, mapped read-only into the process: every commit
    rewrites it before it returns, so a header equal to the one last seen means no commit
    since (a header that differs, or was read half-written, sends the feed to the file:
    ``PRAGMA data_version`` on a connection of its own, then the log). The mapping is used
    only while that connection is open in WAL mode, having read: it then holds SQLite's
    locks, so no other process can delete or truncate the ``-shm`` file, take the database
    out of WAL mode, or write it without rewriting the header. Where the header cannot be
    mapped, the feed asks ``PRAGMA data_version`` at most every ``CHECK_EVERY`` seconds,
    and after any call of this process's databases on the file.

    The feed remembers the last change it read, by sequence number and random tag. When
    that change is no longer in the log as it was read (the file was restored from a
    backup, replaced, or the log pruned past it), the replica starts afresh.
    """

    def __init__(self, path: str, timeout: float, replica: _replica.Replica) -> None:
        self.path = path
        self.timeout = timeout
        self.replica = replica
        self.stale = False  # this process called the file since the last check
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None
        self._header: mmap.mmap | None = None  # the WAL-index header, while it may be read
        self._mapped = False  # whether this connection's header was looked for
        self._seen: bytes | None = None  # the header as it was before the last check
        self._next = 0.0  # without the header: when to check again (monotonic)
        self._version: int | None = None
        self._seq = 0
        self._tag: bytes | None = None
        _FEEDS[os.path.realpath(path)] = self

    def catch_up(self) -> None:
        """Bring the replica up to every commit made before this call."""
        header = self._header
        if header is not None:
            try:
                if header[:_HEADER] == self._seen:  # memory loads: no statement, no system call
                    return
            except ValueError:  # unmapped: its file was deleted under the process
                self._header = None
        elif not self.stale and time.monotonic() < self._next:
            return
        self._check()

    def _check(self) -> None:
        with _GATE, self._lock:
            if self._connection is None:  # first use, or a forked child: a connection of its own
                self._connection, self._version = _open(self.path, self.timeout), None
                self._header, self._mapped = None, False
            connection = self._connection
            header = self._header
            # Before the file is read: a commit after this look moves the header again,
            # and a call of this process after it marks the feed stale again.
            seen = header[:_HEADER] if header is not None else None
            checked = time.monotonic()
            self.stale = False
            try:
                (version,) = connection.execute("PRAGMA data_version").fetchone()
                if version != self._version:
                    if self._version is None or not self._read_since(connection):
                        last = connection.execute(
                            "SELECT seq, tag FROM keyturn_changes ORDER BY seq DESC LIMIT 1"
                        ).fetchone()
                        self._seq, self._tag = last or (0, None)
                        self.replica.reset(current=True)
                    self._version = version
            except BaseException:
                self.stale = True  # not caught up: the next request asks again
                raise
            if not self._mapped:  # this connection has read: it holds the -shm file, locked
                self._header, self._mapped = _map_header(connection, self.path), True
            self._seen = seen if seen is not None and _whole(seen) else None
            self._next = checked + CHECK_EVERY

    def _read_since(self, connection: sqlite3.Connection) -> bool:
        # The changes after the last one read, applied; False when that one is gone.
        changes = connection.execute(
            "SELECT seq, kind, id, tag FROM keyturn_changes WHERE seq >= ? ORDER BY seq",
            (self._seq,),
        ).fetchall()
        if not changes or changes[0][0] != self._seq or changes[0][3] != self._tag:
            return False
        for _, kind, changed_id, _ in changes[1:]:
            self.replica.changed(kind, changed_id)
        self._seq, self._tag = changes[-1][0], changes[-1][3]
        return True

    def close(self) -> None:
        with self._lock:
            self._header = None  # first: read only while the connection holds its locks
            if self._connection is not None:
                self._connection.close()
            self._connection = None

    def after_fork(self) -> None:
        # The parent's connection is never used, nor closed, here: closing any descriptor
        # of the file would drop this process's locks on it. Nor is the header read until
        # a connection of the child's own holds the -shm file: locks are not inherited.
        if self._connection is not None:
            _ORPHANS.append(self._connection)
        self._lock, self._connection, self._header, self._seen = threading.Lock(), None, None, None
        self._next, self.stale = 0.0, True


def _whole(header: bytes) -> bool:
    """Whether *header* is a WAL-index header read whole: both copies alike, initialized."""
    return (
        header[:_COPY] == header[_COPY:]
        and int.from_bytes(header[:4], sys.byteorder) == _WAL_INDEX_VERSION
        and header[12] == 1  # isInit
    )


def _map_header(connection: sqlite3.Connection, path: str) -> mmap.mmap | None:
    """The WAL-index header of *path*, mapped read-only; ``None`` when the database is not
    in WAL mode or the header cannot be mapped (the feed then asks the file in time).

    *connection* must have read the file in WAL mode: it then holds the ``-shm`` file open,
    with SQLite's locks, so the file mapped here is the one every writer updates; where
    the kernel lists locks (Linux), the file is mapped only if this process holds one.
    """
    if os.name != "posix":
        return None
    try:
        (mode,) = connection.execute("PRAGMA journal_mode").fetchone()
        if str(mode).lower() != "wal":
            return None
        # SQLite names the -shm file after the database's real path (links resolved).
        shm = os.path.realpath(path) + "-shm"
        # Only the file this process's connections hold locked. A forked child whose
        # parent had the file open holds no lock of its own (SQLite in the child counts
        # the parent's as held), so it asks the file in time instead.
        held = _locked_here(os.stat(shm))
        if held is False or (held is None and _ORPHANS):
            return None
        return _mapped(shm)
    except (OSError, ValueError, sqlite3.Error):
        return None


def _locked_here(shm: os.stat_result) -> bool | None:
    """Whether this process holds a POSIX lock on *shm* (SQLite's connections hold one on
    the -shm file they use); ``None`` where the kernel does not list locks."""
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as listed:
            locks = listed.read()
    except OSError:
        return None
    major, minor = os.major(shm.st_dev), os.minor(shm.st_dev)
    inode, pid = f"{major:02x}:{minor:02x}:{shm.st_ino}", str(os.getpid())
    return any(
        fields[4:6] == [pid, inode]
        for fields in (line.split() for line in locks.splitlines())
        if len(fields) > 5
    )


def _mapped(shm: str) -> mmap.mmap | None:
    # One mapping per -shm file per process, kept with its descriptor for the life of the
    # process: closing any descriptor of the file would drop the locks SQLite holds on it
    # for this process's connections, and another process could then reset the file under
    # them. Only a file deleted meanwhile lets its descriptor go.
    with _MAPPED_LOCK:
        named = os.stat(shm)
        known = _MAPPED.get((named.st_dev, named.st_ino))
        if known is not None:
            return known[1]
        for where, (descriptor, header) in list(_MAPPED.items()):
            if os.fstat(descriptor).st_nlink == 0:
                del _MAPPED[where]
                if header is not None:
                    header.close()
                os.close(descriptor)
        descriptor = os.open(shm, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        opened = os.fstat(descriptor)
        header = None
        if (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino) and (
            opened.st_size >= _HEADER
        ):
            header = mmap.mmap(descriptor, _HEADER, mmap.MAP_SHARED, mmap.PROT_READ)
        _MAPPED[(opened.st_dev, opened.st_ino)] = (descriptor, header)
        if header is None or int.from_bytes(header[:4], sys.byteorder) != _WAL_INDEX_VERSION:
            return None
        return header


class _ForkGate:
    """No thread of this process is inside SQLite when it forks: a child would inherit
    SQLite's own mutexes held by a thread it does not have, and hang on its first
    statement (a preloading server forks while the usage writer may be writing). Calls
    pass the gate together; a fork waits until none is inside (at most FORK_WAIT seconds)
    and holds new ones back until it is done."""

    def __init__(self) -> None:
        self._state = threading.Condition()
        self._inside = 0
        self._forking = False

    def __enter__(self) -> None:
        with self._state:
            while self._forking:
                self._state.wait()
            self._inside += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._state:
            self._inside -= 1
            if not self._inside:
                self._state.notify_all()

    def before_fork(self) -> None:
        self._state.acquire()  # held across the fork: released in the parent after it
        self._forking = True
        self._state.wait_for(lambda: not self._inside, timeout=FORK_WAIT)

    def after_fork_in_parent(self) -> None:
        self._forking = False
        self._state.notify_all()
        self._state.release()


FORK_WAIT: Final = 10.0
_GATE = _ForkGate()
_DATABASES: Final[weakref.WeakSet[SQLiteDatabase]] = weakref.WeakSet()
_ORPHANS: Final[list[object]] = []  # a forked child's inherited connections, kept unclosed
# The feed of each file (by real path) in this process, told of every call on the file.
_FEEDS: Final[weakref.WeakValueDictionary[str, _Feed]] = weakref.WeakValueDictionary()
# (device, inode) of each -shm file mapped -> its descriptor and header, never closed.
_MAPPED: Final[dict[tuple[int, int], tuple[int, mmap.mmap | None]]] = {}
_MAPPED_LOCK = threading.Lock()


def _renew_in_child() -> None:
    global _GATE, _MAPPED_LOCK
    _GATE = _ForkGate()  # the parent's threads, inside or waiting, are not in the child
    _MAPPED_LOCK = threading.Lock()
    for database in _DATABASES:
        database._after_fork()


os.register_at_fork(
    before=lambda: _GATE.before_fork(),
    after_in_parent=lambda: _GATE.after_fork_in_parent(),
    after_in_child=_renew_in_child,
)
