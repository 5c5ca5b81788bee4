"""An Authenticator built before a fork serves in the child (gunicorn ``--preload``).

The parent builds the Authenticator and uses it: a store call on its call threads (the
async driver), a ``last_used_at`` write on the usage recorder's thread. Then it forks, as a
preloading server forks its workers, and each child decides keys the parent never saw,
with both drivers, and closes the Authenticator, writing its usage. The parent counts the
keys accepted, waiting a bounded time for each child (killed by its pid if it never
answers), and the uses each child wrote. And a lock another thread of the parent held at
the fork is free in the child, for each owner of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from keyturn import Authenticator, AuthRequest, KeyManager, Principal, Scope
from keyturn._core import events
from keyturn._core import hashing as _hashing
from keyturn._core.hashing import check_secret
from keyturn._run.usage import UsageRecorder
from keyturn.client import ApiKeyAuth
from keyturn.console._guard import FormTokens as _FormTokens
from keyturn.errors import Reason
from keyturn.stores import open_database
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from tests.legacy import legacy_hash

CHILDREN = 2
CHILD_WAIT = 30.0  # seconds a child may take to answer at all: far past one decision
LOCK_WAIT = 10.0  # ... and to take a free lock


def forked(work: Callable[[], list[str]], wait: float = CHILD_WAIT, gate: Any = None) -> list[str]:
    """The lines *work* wrote in a forked child, as many as came with no *wait* seconds
    between them; the child is killed by its pid if it had not finished by then. With
    *gate* (a lock), the fork happens while holding it."""
    read, write = os.pipe()
    with gate or contextlib.nullcontext(), warnings.catch_warnings():
        # Python 3.12 warns of a fork while threads run: a preloading server forks so.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: answer, then leave without the parent's cleanup
        code = 1
        try:
            for line in work():
                os.write(write, f"{line}\n".encode())
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write)
    received = b""
    try:
        while select.select([read], [], [], wait)[0]:
            chunk = os.read(read, 4096)
            if not chunk:
                break
            received += chunk
        else:
            os.kill(pid, signal.SIGKILL)  # it hangs: its answers so far are all it gives
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    return received.decode().splitlines()


def _request(secret: str) -> AuthRequest:
    return AuthRequest((f"Bearer {secret}",))


def _counted(db: Any, key_ids: list[str]) -> set[str]:
    """Those of *key_ids* whose use was counted in the store today (UTC)."""
    today = datetime.now(UTC).date()
    return {usage.key_id for usage in db.keys.usage_of("alice", today)} & set(key_ids)


def _quiet(db: Any, key_ids: list[str]) -> None:
    """Wait (bounded) for the parent's usage writes of *key_ids* to land: a preloading
    server's parent serves nothing once it forked, and a write of its own racing the
    child's on a pooled connection both inherited would test the store, not the threads."""
    for _ in range(1000):
        if _counted(db, key_ids) == set(key_ids):
            return
        time.sleep(0.01)
    pytest.fail("the parent's usage writes did not land within 10 s")


def test_a_child_verifies_keys_its_parent_never_saw(store_url: str) -> None:
    with open_database(store_url) as db:
        db.membership.add_organization("org_main", tenant_id="acme", default=True)
        db.membership.add_member("alice", "org_main", role="admin")
        manager = KeyManager(db.keys, db.membership)
        scope = Scope.organization("org_main", tenant_id="acme")
        created = [manager.create("alice", name=f"k{n}", scope=scope) for n in range(6)]
        secrets = [key.secret for key in created]
        key_ids = [key.info.key_id for key in created]

        auth = Authenticator(db.keys, db.membership, usage_interval=0.0)
        try:
            # The parent's threads: a usage write (sync), a store call (async).
            assert isinstance(auth.authenticate(_request(secrets[0])), Principal)
            outcome = asyncio.run(auth.authenticate_async(_request(secrets[1])))
            assert isinstance(outcome, Principal)
            _quiet(db, key_ids[:2])

            def child(sync_secret: str, async_secret: str) -> Callable[[], list[str]]:
                def work() -> list[str]:
                    outcome: Any = asyncio.run(auth.authenticate_async(_request(async_secret)))
                    answers = [type(outcome).__name__]
                    answers.append(type(auth.authenticate(_request(sync_secret))).__name__)
                    auth.close()  # writes its usage out
                    return answers

                return work

            answers = [
                forked(child(secrets[2 + 2 * n], secrets[3 + 2 * n])) for n in range(CHILDREN)
            ]
        finally:
            auth.close()
        written = _counted(db, key_ids[2:])

    accepted = sum(answer.count("Principal") for answer in answers)
    assert accepted == 2 * CHILDREN, f"accepted {accepted}/{2 * CHILDREN}: {answers}"
    assert len(written) == 2 * CHILDREN, f"{len(written)}/{2 * CHILDREN} uses written"


def _held_at_the_fork(lock: Any, use: Callable[[], object]) -> list[str]:
    """What a child answers that runs *use* while another thread of the parent holds
    *lock* across the fork (as a request thread may, when a preloading server forks)."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            release.wait(CHILD_WAIT)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(CHILD_WAIT)
        return forked(lambda: [type(use()).__name__], LOCK_WAIT)
    finally:
        release.set()
        holder.join(CHILD_WAIT)


def _warned(auth: ApiKeyAuth) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        auth._check_expiry("2000-01-01T00:00:00Z")  # expired: it warns, under its lock


def test_a_lock_held_at_the_fork_is_free_in_the_child() -> None:
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    key = KeyManager(store, membership).create("alice", name="k", scope=Scope.tenant("acme"))
    old_secret = "S" * 28
    legacy = legacy_hash(old_secret)  # its check takes the legacy path's lock
    recorder = UsageRecorder(store, interval=0.0)
    tokens = _FormTokens(b"a secret of the console's")
    client = ApiKeyAuth(key.secret)
    uses: dict[str, tuple[Any, Callable[[], object]]] = {
        "event ids": (events._event_id._lock, events._event_id),
        "legacy hashes": (_hashing._LEGACY._lock, lambda: check_secret(legacy, old_secret)),
        "usage": (recorder._lock, lambda: recorder.refused(key.info.key_id, Reason.REVOKED)),
        "console form tokens": (tokens._lock, lambda: tokens.consume("nonce")),
        "client": (client._lock, lambda: _warned(client)),
    }
    try:
        answered = {name: _held_at_the_fork(*use) for name, use in uses.items()}
    finally:
        recorder.close()
    stuck = [name for name, answer in answered.items() if not answer]
    assert stuck == [], f"{len(stuck)}/{len(uses)} children stuck on a lock: {stuck}"


def test_a_child_reads_on_connections_of_its_own(store_url: str) -> None:
    """The parent goes on writing while each child reads: every answer a child gets is its
    own (an inherited connection shared with the parent would hand one the other's rows)."""
    with open_database(store_url) as db:
        db.membership.add_organization("org_main", tenant_id="acme", default=True)
        db.membership.add_member("alice", "org_main", role="admin")
        manager = KeyManager(db.keys, db.membership)
        scope = Scope.organization("org_main", tenant_id="acme")
        key_id = manager.create("alice", name="k", scope=scope).info.key_id
        assert db.keys.get_key(key_id) is not None  # the parent's pool is in use
        stop, gate = threading.Event(), threading.Lock()

        def write() -> None:  # the parent's own traffic, on its own connections
            n = 0
            while not stop.is_set() and n < 100_000:
                with gate:  # never in a write at the fork: only a connection is shared
                    db.membership.add_member(f"writer{n % 10}", "org_main", role="member")
                n += 1

        writer = threading.Thread(target=write)
        writer.start()
        try:

            def work() -> list[str]:
                answers = []
                for _ in range(50):
                    try:
                        key = db.keys.get_key(key_id)
                        answers.append("right" if key and key.key_id == key_id else "wrong")
                    except Exception as exc:
                        answers.append(type(exc).__name__)
                return answers

            answers = [answer for _ in range(CHILDREN) for answer in forked(work, gate=gate)]
        finally:
            stop.set()
            writer.join(CHILD_WAIT)
    assert answers == ["right"] * 50 * CHILDREN, sorted(set(answers))


def test_a_fork_while_another_thread_is_in_sqlite_leaves_the_child_working(
    tmp_path: Any,
) -> None:
    """A preloading parent may fork while its usage writer is inside SQLite: the child
    must not inherit SQLite's mutexes held, and hang on its first statement."""
    with open_database(f"sqlite:///{tmp_path / 'keyturn.sqlite3'}") as db:
        db.membership.add_organization("org_main", tenant_id="acme", default=True)
        db.membership.add_member("alice", "org_main", role="admin")
        scope = Scope.organization("org_main", tenant_id="acme")
        key_id = KeyManager(db.keys, db.membership).create("alice", name="k", scope=scope)
        stop = threading.Event()

        def write() -> None:  # no pause between writes: always inside SQLite, or nearly
            n = 0
            while not stop.is_set() and n < 1_000_000:
                db.membership.add_member(f"writer{n % 10}", "org_main", role="member")
                n += 1

        writer = threading.Thread(target=write)
        writer.start()
        try:

            def work() -> list[str]:
                key = db.keys.get_key(key_id.info.key_id)
                return ["right" if key is not None else "wrong"]

            answers = [answer for _ in range(6) for answer in forked(work, wait=LOCK_WAIT)]
        finally:
            stop.set()
            writer.join(CHILD_WAIT)
    assert answers == ["right"] * 6
