"""Two real processes on one SQLite file: what one commits, the other's next read sees.

This process plays the server: it keeps its database open, with two connections that two
threads opened by overlapping, and a warm verified-token cache. A second process plays the
command line: it opens the file, commits one change (a revoke, a new key, a member removed)
and closes it again, so each time it is, for a moment, the file's last user but one. That
is the shape that once lost revokes: a descriptor of the file opened and closed by the
store dropped this process's POSIX locks, and the other process's close then deleted the
``-wal`` and ``-shm`` files under this process's live connections, which kept reading them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from keyturn import Authenticator, AuthRequest, KeyManager, Principal, Refusal, Scope
from keyturn.stores.sqlite import SQLiteDatabase

ROUNDS = 4  # each round: a revoke, a new key, a member removed, each by the other process
OVERLAP_TRIES = 20_000  # reads per thread, at most, until the two threads overlap

# The other process: open the file, make one change through the public API, close it.
# argv: path, then "revoke KEY_ID" | "create NAME" (prints the secret) | "remove ACCOUNT".
CHANGE = """
import sys
from keyturn import KeyManager, Scope
from keyturn.stores.sqlite import SQLiteDatabase

path, command, argument = sys.argv[1:4]
with SQLiteDatabase(path) as db:
    manager = KeyManager(db.keys, db.membership)
    if command == "revoke":
        manager.revoke("alice", argument)
    elif command == "create":
        print(manager.create("alice", name=argument, scope=Scope.tenant("acme")).secret)
    else:
        db.membership.remove_member(argument, "org_default")
"""


def change(path: Path, command: str, argument: str) -> str:
    """Commit one change from a process of its own, which has closed the file on return."""
    done = subprocess.run(  # noqa: S603 -- our own interpreter and arguments
        [sys.executable, "-c", CHANGE, str(path), command, argument],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def request(secret: str) -> AuthRequest:
    return AuthRequest(authorization=(f"Bearer {secret}",), organization=("default",))


def overlap(db: SQLiteDatabase) -> None:
    """Read from two threads at once until the database has lent two connections together."""
    start = threading.Barrier(2)

    def read() -> None:
        start.wait(5)
        for _ in range(OVERLAP_TRIES):
            if db.connections >= 2:
                return
            db.keys.get_key("NoSuchKey123")

    threads = [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert db.connections >= 2, "two reads never overlapped"


def test_a_commit_by_a_process_that_closes_the_file_is_seen_by_the_next_read_here(
    sqlite_path: Path,
) -> None:
    """Revokes, new keys and removed members from another process act on the next request."""
    with SQLiteDatabase(sqlite_path) as db:
        db.membership.add_organization("org_default", tenant_id="acme", default=True)
        for account in ("alice", "bob"):
            db.membership.add_member(account, "org_default", role="admin")
        manager = KeyManager(db.keys, db.membership)
        alice = [
            manager.create("alice", name=f"key {n}", scope=Scope.tenant("acme"))
            for n in range(ROUNDS)
        ]
        bob = manager.create("bob", name="bob's", scope=Scope.tenant("acme"))
        overlap(db)
        with Authenticator(db.keys, db.membership, usage_interval=None) as auth:
            for created in [*alice, bob]:  # warm: every token verified, every key read
                assert isinstance(auth.authenticate(request(created.secret)), Principal)

            stale: list[str] = []
            for round_ in range(ROUNDS):
                change(sqlite_path, "revoke", alice[round_].info.key_id)
                if not isinstance(auth.authenticate(request(alice[round_].secret)), Refusal):
                    stale.append(f"round {round_}: a revoked key was accepted")

                secret = change(sqlite_path, "create", f"new {round_}")
                if not isinstance(auth.authenticate(request(secret)), Principal):
                    stale.append(f"round {round_}: a new key was refused")

                if round_ == 0:
                    change(sqlite_path, "remove", "bob")
                    if not isinstance(auth.authenticate(request(bob.secret)), Refusal):
                        stale.append("a removed member's key was accepted")
            assert stale == []


@pytest.mark.parametrize("command", ["revoke", "create"])
def test_the_other_process_reads_what_this_one_committed(sqlite_path: Path, command: str) -> None:
    """The converse: a commit here, under overlapping connections, is read by a new process."""
    with SQLiteDatabase(sqlite_path) as db:
        db.membership.add_organization("org_default", tenant_id="acme", default=True)
        db.membership.add_member("alice", "org_default", role="admin")
        manager = KeyManager(db.keys, db.membership)
        first = manager.create("alice", name="first", scope=Scope.tenant("acme"))
        overlap(db)
        change(sqlite_path, "create", "from there")  # the other process has come and gone
        if command == "revoke":
            manager.revoke("alice", first.info.key_id)
        else:
            manager.create("alice", name="from here", scope=Scope.tenant("acme"))
        seen = subprocess.run(  # noqa: S603 -- our own interpreter and arguments
            [
                sys.executable,
                "-m",
                "keyturn.cli",
                "--store",
                f"sqlite:///{sqlite_path}",
                "keys",
                "list",
                "--as",
                "alice",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert seen.returncode == 0, seen.stderr
    keys = {key["name"]: key["status"] for key in json.loads(seen.stdout)}
    expected = {"first": "Active", "from there": "Active"}
    if command == "revoke":
        expected["first"] = "Revoked"
    else:
        expected["from here"] = "Active"
    assert keys == expected
