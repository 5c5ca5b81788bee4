"""SQLite's warm path asks the file nothing, and still sees every commit.

The feed (``keyturn/stores/sqlite.py``) learns of another connection's commit from the
WAL-index header in the ``-shm`` file, mapped into the process: a warm request issues no
statement (counted by SQLite's trace callback on every connection the database holds). A
real process of its own commits here -- revokes through keyturn, plain SQL, checkpoints
that reset the log, a backup restored in place -- and after each commit returns, this
process's next request sees it. Where the header cannot be mapped, the feed asks
``PRAGMA data_version`` at most every ``CHECK_EVERY`` seconds: there a commit elsewhere is
polled for with a bounded count of requests, and a write of this process is seen at once.
A forked child maps the header anew, once a connection of its own holds the file.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keyturn import Authenticator, KeyManager, Principal, Reason
from keyturn.stores import sqlite as sqlite_store
from keyturn.stores.sqlite import SQLiteDatabase
from tests.multiprocess.test_fork import forked
from tests.stores.test_replica import TENANT, refused, request, seed

WARM = 1000  # warm requests counted
POLLS = 2000  # requests at most until a commit elsewhere is seen without the header

# Another process: opens the file and, for each line on stdin, commits one change and
# says "ok" once it returned. Lines: "revoke KEY_ID" (through keyturn), "sql KEY_ID" (plain
# SQL), "checkpoint MODE", "restore BACKUP" (SQLite's online backup, in place),
# "autocheckpoint KEY_ID" (a revoke whose commit checkpoints and lets the next write
# restart the log, so the header's frame count comes round again with new salts).
WRITER = """
import sqlite3, sys
from datetime import UTC, datetime
from keyturn.stores.sqlite import SQLiteDatabase

path = sys.argv[1]
db = SQLiteDatabase(path, replica=False)
raw = sqlite3.connect(path, isolation_level=None)
raw.execute("PRAGMA busy_timeout = 5000")
for line in sys.stdin:
    command, _, argument = line.strip().partition(" ")
    if command == "revoke":
        assert db.keys.revoke_key(argument, datetime.now(UTC))
    elif command in ("sql", "autocheckpoint"):
        if command == "autocheckpoint":
            raw.execute("PRAGMA wal_autocheckpoint = 1")
        raw.execute(
            "UPDATE keyturn_keys SET revoked_at = '2000-01-01T00:00:00.000000+00:00' "
            "WHERE key_id = ?",
            (argument,),
        )
    elif command == "checkpoint":
        raw.execute(f"PRAGMA wal_checkpoint({argument})").fetchall()
    elif command == "restore":
        backup = sqlite3.connect(argument)
        backup.backup(raw)
        backup.close()
    print("ok", flush=True)
db.close()
raw.close()
"""


class Writer:
    """A process of its own committing to the file, one change per call."""

    def __init__(self, path: Path) -> None:
        self.process = subprocess.Popen(  # noqa: S603 -- our own interpreter and script
            [sys.executable, "-c", WRITER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def __call__(self, command: str) -> None:
        """Commit *command* there; returns once the commit returned."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == "ok", "the writer failed"

    def close(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        try:
            assert self.process.wait(60) == 0
        finally:
            self.process.stdout.close()


@pytest.fixture
def writer(sqlite_path: Path) -> Iterator[Writer]:
    SQLiteDatabase(sqlite_path).close()  # the file and its tables first
    made = Writer(sqlite_path)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def unmapped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The -shm header cannot be mapped: the feed asks the file in time instead."""
    monkeypatch.setattr(sqlite_store, "_map_header", lambda connection, path: None)


def key_id(secret: str) -> str:
    from keyturn._core.token import split

    return split(secret)[0]


def traced(db: SQLiteDatabase) -> list[str]:
    """Every statement any connection of *db* runs from now on (its pool and its feed's)."""
    statements: list[str] = []
    feed = db._feed
    assert feed is not None and feed._connection is not None
    for connection in [*db._idle, feed._connection]:
        connection.set_trace_callback(statements.append)
    return statements


def warm(db: SQLiteDatabase, secrets: list[str]) -> Authenticator:
    auth = Authenticator(db.keys, db.membership, usage_interval=None)
    for secret in secrets:
        assert isinstance(auth.authenticate(request(secret)), Principal)
        assert isinstance(auth.authenticate(request(secret)), Principal)  # from the replica
    return auth


def keys(db: SQLiteDatabase, n: int) -> list[str]:
    """The secrets of *n* new keys of alice's (after seed)."""
    manager = KeyManager(db.keys, db.membership)
    return [manager.create("alice", name=f"k{i}", scope=TENANT).secret for i in range(n)]


def requests_until_refused(auth: Authenticator, secret: str, limit: int) -> int | None:
    """How many requests it took until *secret* was refused as revoked (1: the first)."""
    for sent in range(1, limit + 1):
        if refused(auth, secret, Reason.REVOKED):
            return sent
        time.sleep(sqlite_store.CHECK_EVERY / 4)
    return None


# --- the header mapped ------------------------------------------------------------------


def test_a_warm_request_issues_no_statement(sqlite_path: Path) -> None:
    with SQLiteDatabase(sqlite_path) as db:
        secret = seed(db)
        auth = warm(db, [secret])
        assert db._feed is not None and db._feed._header is not None
        statements = traced(db)
        for _ in range(WARM):
            assert isinstance(auth.authenticate(request(secret)), Principal)
        assert statements == []
        auth.close()


@pytest.mark.parametrize("how", ["revoke", "sql", "autocheckpoint"])
def test_a_commit_elsewhere_is_refused_by_the_next_request(
    sqlite_path: Path, writer: Writer, how: str
) -> None:
    """Through keyturn or plain SQL, and with the log restarted under the header by every
    write (its frame count comes round again; the salts tell it apart)."""
    with SQLiteDatabase(sqlite_path) as db:
        secrets = [seed(db), *keys(db, 9)]
        auth = warm(db, secrets)
        late = []
        for n, secret in enumerate(secrets):
            writer(f"{how} {key_id(secret)}")
            if not refused(auth, secret, Reason.REVOKED):
                late.append(n)
            statements = traced(db)  # caught up: the keys still live answer from memory
            for other in secrets[n + 1 :]:
                assert isinstance(auth.authenticate(request(other)), Principal)
            assert statements == []
        assert late == []
        auth.close()


@pytest.mark.parametrize("mode", ["PASSIVE", "FULL", "RESTART", "TRUNCATE"])
def test_checkpoints_leave_the_warm_path_right(
    sqlite_path: Path, writer: Writer, mode: str
) -> None:
    """A checkpoint elsewhere (TRUNCATE empties the log, RESTART rewinds it), then a revoke:
    refused by the next request; a checkpoint alone changes nothing the replica holds."""
    with SQLiteDatabase(sqlite_path) as db:
        secrets = [seed(db), *keys(db, 2)]
        auth = warm(db, secrets)
        epoch = db.replica.epoch
        writer(f"checkpoint {mode}")
        assert all(isinstance(auth.authenticate(request(s)), Principal) for s in secrets)
        assert db.replica.epoch == epoch  # no change read, no reset
        writer(f"revoke {key_id(secrets[0])}")
        assert refused(auth, secrets[0], Reason.REVOKED)
        writer(f"checkpoint {mode}")
        writer(f"sql {key_id(secrets[1])}")
        assert refused(auth, secrets[1], Reason.REVOKED)
        assert isinstance(auth.authenticate(request(secrets[2])), Principal)
        auth.close()


def test_a_backup_restored_in_place_elsewhere_is_seen_by_the_next_request(
    sqlite_path: Path, writer: Writer, tmp_path: Path
) -> None:
    with SQLiteDatabase(sqlite_path) as db:
        kept = seed(db)
        backup = tmp_path / "backup.sqlite3"
        source, target = sqlite3.connect(sqlite_path), sqlite3.connect(backup)
        source.backup(target)
        source.close()
        target.close()
        newer = keys(db, 1)[0]
        auth = warm(db, [kept, newer])
        writer(f"restore {backup}")
        assert not isinstance(auth.authenticate(request(newer)), Principal)
        assert isinstance(auth.authenticate(request(kept)), Principal)
        writer(f"revoke {key_id(kept)}")
        assert refused(auth, kept, Reason.REVOKED)
        auth.close()


def test_a_write_of_this_process_is_seen_at_once(sqlite_path: Path) -> None:
    """Through another database object on the file (its own replica, off), and through a
    connection that is not keyturn's."""
    with SQLiteDatabase(sqlite_path) as db:
        secrets = [seed(db), *keys(db, 1)]
        auth = warm(db, secrets)
        with SQLiteDatabase(sqlite_path, replica=False) as other:
            assert other.keys.revoke_key(key_id(secrets[0]), _now())
        assert refused(auth, secrets[0], Reason.REVOKED)
        raw = sqlite3.connect(sqlite_path, isolation_level=None)
        try:
            raw.execute(
                "UPDATE keyturn_keys SET revoked_at = '2000-01-01T00:00:00.000000+00:00' "
                "WHERE key_id = ?",
                (key_id(secrets[1]),),
            )
        finally:
            raw.close()
        assert refused(auth, secrets[1], Reason.REVOKED)
        auth.close()


def test_one_mapping_per_file_and_process(sqlite_path: Path) -> None:
    """Reopening the file maps nothing new while the -shm file lives (a connection that is
    not keyturn's keeps it): the descriptor kept is the one reused."""
    with SQLiteDatabase(sqlite_path) as db:
        seed(db)
        raw = sqlite3.connect(sqlite_path)
        raw.execute("SELECT count(*) FROM keyturn_keys").fetchone()
        assert db.changes() is not None
        first = db._feed._header if db._feed is not None else None
        mapped = len(sqlite_store._MAPPED)
    try:
        with SQLiteDatabase(sqlite_path) as again:
            assert again.changes() is not None
            assert again._feed is not None and again._feed._header is first is not None
            assert len(sqlite_store._MAPPED) == mapped
    finally:
        raw.close()


def test_a_database_not_in_wal_mode_has_no_header(sqlite_path: Path) -> None:
    raw = sqlite3.connect(sqlite_path, isolation_level=None)
    try:
        assert raw.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)
        raw.execute("CREATE TABLE t (x)")
        assert sqlite_store._map_header(raw, str(sqlite_path)) is None
    finally:
        raw.close()


# --- without the header: PRAGMA data_version in time ---------------------------------------


@pytest.mark.usefixtures("unmapped")
def test_without_the_header_a_commit_elsewhere_is_seen_within_a_few_requests(
    sqlite_path: Path, writer: Writer
) -> None:
    with SQLiteDatabase(sqlite_path) as db:
        secrets = [seed(db), *keys(db, 4)]
        auth = warm(db, secrets)
        assert db._feed is not None and db._feed._header is None
        taken = []
        for secret in secrets:
            writer(f"revoke {key_id(secret)}")
            taken.append(requests_until_refused(auth, secret, POLLS))
        assert None not in taken
        auth.close()


@pytest.mark.usefixtures("unmapped")
def test_without_the_header_a_write_of_this_process_is_seen_at_once(sqlite_path: Path) -> None:
    with SQLiteDatabase(sqlite_path) as db:
        secrets = [seed(db), *keys(db, 1)]
        auth = warm(db, secrets)
        with SQLiteDatabase(sqlite_path, replica=False) as other:
            assert other.keys.revoke_key(key_id(secrets[0]), _now())
        assert refused(auth, secrets[0], Reason.REVOKED)
        KeyManager(db.keys, db.membership).revoke("alice", key_id(secrets[1]))
        assert refused(auth, secrets[1], Reason.REVOKED)
        auth.close()


@pytest.mark.usefixtures("unmapped")
def test_without_the_header_warm_requests_check_the_file_at_most_every_interval(
    sqlite_path: Path,
) -> None:
    """Counted: PRAGMA data_version statements against the intervals that went by."""
    with SQLiteDatabase(sqlite_path) as db:
        secret = seed(db)
        auth = warm(db, [secret])
        statements = traced(db)
        started = time.monotonic()
        for _ in range(WARM):
            assert isinstance(auth.authenticate(request(secret)), Principal)
        intervals = (time.monotonic() - started) / sqlite_store.CHECK_EVERY
        assert set(statements) <= {"PRAGMA data_version"}
        assert len(statements) <= intervals + 1
        auth.close()


# --- fork ----------------------------------------------------------------------------------


def test_a_forked_child_of_a_parent_using_the_file_asks_it_in_time(
    sqlite_path: Path, writer: Writer
) -> None:
    """A child forked while its parent had the file open holds none of its locks (SQLite
    in the child counts the parent's as held): it never maps the header, and sees a commit
    elsewhere within a bounded count of requests; the parent maps it still."""
    with SQLiteDatabase(sqlite_path) as db:
        secrets = [seed(db), *keys(db, 1)]
        auth = warm(db, secrets)
        feed = db._feed
        assert feed is not None and feed._header is not None

        def child() -> list[str]:
            said = [f"header after fork: {feed._header is not None}"]
            said.append(f"first: {isinstance(auth.authenticate(request(secrets[1])), Principal)}")
            said.append(f"mapped: {feed._header is not None}")
            writer(f"revoke {key_id(secrets[1])}")
            taken = requests_until_refused(auth, secrets[1], POLLS)
            said.append(f"revoked: {taken is not None}")
            return said

        writer(f"revoke {key_id(secrets[0])}")
        assert forked(child) == [
            "header after fork: False",
            "first: True",
            "mapped: False",
            "revoked: True",
        ]
        assert refused(auth, secrets[0], Reason.REVOKED)  # the parent, after the fork
        assert refused(auth, secrets[1], Reason.REVOKED)  # the child's writer's commit
        assert feed._header is not None
        auth.close()


def test_a_forked_child_that_opens_the_file_itself_maps_the_header(
    sqlite_path: Path, writer: Writer
) -> None:
    with SQLiteDatabase(sqlite_path) as db:
        secrets = [seed(db), *keys(db, 1)]

    def child() -> list[str]:
        with SQLiteDatabase(sqlite_path) as db:
            auth = warm(db, secrets)
            said = [f"mapped: {db._feed is not None and db._feed._header is not None}"]
            statements = traced(db)
            for _ in range(100):
                auth.authenticate(request(secrets[1]))
            said.append(f"statements: {len(statements)}")
            writer(f"revoke {key_id(secrets[1])}")
            said.append(f"revoked: {refused(auth, secrets[1], Reason.REVOKED)}")
            auth.close()
        return said

    assert forked(child) == ["mapped: True", "statements: 0", "revoked: True"]


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def test_the_descriptor_of_a_deleted_file_is_let_go(tmp_path: Path) -> None:
    """A -shm file deleted meanwhile frees its descriptor when another file is mapped."""
    first = tmp_path / "first.sqlite3"
    with SQLiteDatabase(first) as db:
        seed(db)
        assert db.changes() is not None
        inode = os.stat(f"{first}-shm").st_ino
    for name in ("first.sqlite3", "first.sqlite3-wal", "first.sqlite3-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    with SQLiteDatabase(tmp_path / "second.sqlite3") as db:
        seed(db)
        assert db.changes() is not None
    assert all(ino != inode for _, ino in sqlite_store._MAPPED)


def test_a_database_reached_through_a_link_maps_the_file_sqlite_uses(tmp_path: Path) -> None:
    """SQLite names the -shm file after the real path: a stale file beside the link is
    never the one mapped, and commits elsewhere are still seen by the next request."""
    real = tmp_path / "real.sqlite3"
    link = tmp_path / "link.sqlite3"
    link.symlink_to(real)
    Path(f"{link}-shm").write_bytes(bytes(32768))  # never written by anyone
    with SQLiteDatabase(link) as db:
        secrets = [seed(db), *keys(db, 1)]
        auth = warm(db, secrets)
        assert db._feed is not None and db._feed._header is not None
        writer = Writer(real)
        try:
            writer(f"revoke {key_id(secrets[0])}")
            assert refused(auth, secrets[0], Reason.REVOKED)
        finally:
            writer.close()
        assert isinstance(auth.authenticate(request(secrets[1])), Principal)
        auth.close()


def test_a_file_this_process_holds_no_lock_on_is_not_mapped(sqlite_path: Path) -> None:
    with SQLiteDatabase(sqlite_path) as db:
        seed(db)
        assert db.changes() is not None
        assert sqlite_store._locked_here(os.stat(f"{sqlite_path}-shm")) is not False
    stranger = sqlite_path.with_name("stranger-shm")
    stranger.write_bytes(bytes(32768))
    assert sqlite_store._locked_here(os.stat(stranger)) is not True
