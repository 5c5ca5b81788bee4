"""Deployed as operators deploy it, and badly: each test counts revoked or denied keys
accepted, on real PostgreSQL and real SQLite files, and expects none.

The replica (``docs/stores.md``) answers only for the database its pool reaches, hears
every write however it is made, and stops answering when its listener cannot prove
itself. Each test here is a deployment that once broke one of those promises: two
databases behind one base URL, a schema named like the user, ``search_path`` set on the
pool, a proxy that hangs, ``TRUNCATE``, writes under ``session_replication_role =
replica``, a restored SQLite file, one database spelled two ways, plain SQL against the
default organization's rule.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from keyturn import Authenticator, KeyManager, Principal, Scope
from keyturn.stores.sqlite import SQLiteDatabase
from tests.stores.test_replica import eventually, request

TENANT = Scope.tenant("acme")
TRIES = 10


def seed(db: Any, account: str = "alice") -> str:
    """acme with its default organization, *account* in it, and a key of theirs; its secret."""
    with contextlib.suppress(Exception):  # the organization may be there already
        db.membership.add_organization("org_default", tenant_id="acme", default=True)
    db.membership.add_member(account, "org_default", role="admin")
    return KeyManager(db.keys, db.membership).create(account, name="CI", scope=TENANT).secret


def accepted(auth: Authenticator, secret: str, tries: int = TRIES) -> int:
    """How many of *tries* requests with *secret* were let through."""
    return sum(isinstance(auth.authenticate(request(secret)), Principal) for _ in range(tries))


def warm(auth: Authenticator, db: Any, secret: str) -> None:
    """The key accepted, from the replica once it is current (the memo's warm path)."""
    assert isinstance(auth.authenticate(request(secret)), Principal)
    assert eventually(lambda: db.changes() is not None, seconds=15)
    assert accepted(auth, secret) == TRIES


def revoke(secret: str) -> str:
    """The plain SQL that revokes the key of *secret* (PostgreSQL)."""
    from keyturn._core.token import split

    return f"UPDATE keyturn_keys SET revoked_at = now() WHERE key_id = '{split(secret)[0]}'"  # noqa: S608


def key_id(secret: str) -> str:
    from keyturn._core.token import split

    return split(secret)[0]


def plain_sql(url: str, *statements: str, **kwargs: Any) -> None:
    """Run *statements* on a connection of their own, as another program would."""
    import psycopg

    with psycopg.connect(url, autocommit=True, **kwargs) as connection:
        for statement in statements:
            connection.execute(statement)  # type: ignore[arg-type]


def settled() -> None:
    """Long enough for any listener to have heard a committed change, and for a stalled one
    to have stopped answering (PROVEN_FOR): a bound, never asserted."""
    from keyturn.stores.postgres import PROVEN_FOR

    time.sleep(PROVEN_FOR + 0.5)


# --- PostgreSQL: identity, not spelling ------------------------------------------------------


@pytest.fixture
def two_databases(postgres_server: str) -> Iterator[tuple[str, str, str]]:
    """Two new databases on the test server: the server's base URL and their names."""
    import psycopg

    names = [f"keyturn_faults_{secrets.token_hex(4)}" for _ in range(2)]
    base = postgres_server.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(base, autocommit=True) as connection:
        for name in names:
            connection.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    try:
        yield base, names[0], names[1]
    finally:
        with psycopg.connect(base, autocommit=True) as connection:
            for name in names:
                connection.execute(f"DROP DATABASE {name} WITH (FORCE)")  # type: ignore[arg-type]


@pytest.mark.postgres
def test_two_databases_behind_one_base_url_keep_apart(two_databases: tuple[str, str, str]) -> None:
    """A database per tenant, named in the pool's kwargs: a key of one database is never
    accepted by the other, and a revoke in the first is heard there."""
    from psycopg_pool import ConnectionPool

    from keyturn.stores.postgres import PostgresDatabase

    base, first, second = two_databases
    pools = [
        ConnectionPool(base, kwargs={"dbname": name, "autocommit": True}, open=True)
        for name in (first, second)
    ]
    one, two = (PostgresDatabase(pool=pool) for pool in pools)
    try:
        for db in (one, two):
            db.create_schema()
        secret = seed(one)
        seed(two, account="bob")
        auth_one = Authenticator(one.keys, one.membership, usage_interval=None)
        auth_two = Authenticator(two.keys, two.membership, usage_interval=None)
        warm(auth_one, one, secret)
        assert eventually(lambda: two.changes() is not None or accepted(auth_two, secret, 1) > 0)
        assert accepted(auth_two, secret) == 0
        plain_sql(
            base,
            revoke(secret),
            dbname=first,
        )
        settled()
        assert accepted(auth_one, secret) == 0
        assert one.replica is not two.replica
    finally:
        for db, pool in zip((one, two), pools, strict=True):
            db.close()
            pool.close()


@pytest.mark.postgres
def test_one_database_spelled_two_ways_is_one_replica(postgres_url: str) -> None:
    """A URL and a keyword string for one database share one replica: a revoke through one
    is refused through the other at once."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from keyturn.stores.postgres import PostgresDatabase

    spelled = make_conninfo(**conninfo_to_dict(postgres_url))  # "host=... dbname=..."
    assert spelled != postgres_url
    with PostgresDatabase(postgres_url) as api, PostgresDatabase(spelled) as console:
        secret = seed(console)
        auth = Authenticator(api.keys, api.membership, usage_interval=None)
        warm(auth, api, secret)
        assert api.replica is console.replica
        revoked = 0
        for _ in range(TRIES):
            other = KeyManager(console.keys, console.membership).create(
                "alice", name="next", scope=TENANT
            )
            assert isinstance(auth.authenticate(request(other.secret)), Principal)
            assert isinstance(auth.authenticate(request(other.secret)), Principal)
            KeyManager(console.keys, console.membership).revoke("alice", other.info.key_id)
            revoked += isinstance(auth.authenticate(request(other.secret)), Principal)
        assert revoked == 0


@pytest.mark.postgres
@pytest.mark.parametrize("how", ["options", "configure"])
def test_search_path_set_on_the_pool_is_heard(
    postgres_server: str, make_postgres_schema: Callable[[], str], how: str
) -> None:
    """``search_path`` set the psycopg way (the pool's options, or a configure callback):
    the listener hears the tables the pool's connections use."""
    from psycopg_pool import ConnectionPool

    from keyturn.stores.postgres import PostgresDatabase

    schema = make_postgres_schema().rsplit("%3D", 1)[1]
    if how == "options":
        pool = ConnectionPool(
            postgres_server,
            kwargs={"autocommit": True, "options": f"-c search_path={schema}"},
            open=True,
        )
    else:
        pool = ConnectionPool(
            postgres_server,
            kwargs={"autocommit": True},
            configure=lambda c: c.execute(f"SET search_path TO {schema}"),  # type: ignore[arg-type]
            open=True,
        )
    db = PostgresDatabase(pool=pool)
    try:
        db.create_schema()
        secret = seed(db)
        auth = Authenticator(db.keys, db.membership, usage_interval=None)
        warm(auth, db, secret)
        plain_sql(
            postgres_server,
            f"UPDATE {schema}.keyturn_keys SET revoked_at = now() "  # noqa: S608
            f"WHERE key_id = '{key_id(secret)}'",
        )
        settled()
        assert accepted(auth, secret) == 0
    finally:
        db.close()
        pool.close()


@pytest.mark.postgres
def test_a_schema_named_like_the_user_does_not_silence_the_listener(
    two_databases: tuple[str, str, str],
) -> None:
    """Tables in ``public``, then a schema named like the user appears (first in the default
    ``search_path``): the listener still hears the tables the pool resolves."""
    from keyturn.stores.postgres import PostgresDatabase

    base, name, _ = two_databases
    url = f"{base.rsplit('/', 1)[0]}/{name}"
    with PostgresDatabase(url) as setup:
        setup.create_schema()
    plain_sql(url, "CREATE SCHEMA IF NOT EXISTS postgres", "CREATE SCHEMA IF NOT EXISTS root")
    with PostgresDatabase(url) as db:
        secret = seed(db)
        auth = Authenticator(db.keys, db.membership, usage_interval=None)
        warm(auth, db, secret)
        plain_sql(url, revoke(secret))
        settled()
        assert accepted(auth, secret) == 0


# --- PostgreSQL: every write heard ----------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize(
    "statement",
    [
        "TRUNCATE keyturn_keys",
        "TRUNCATE keyturn_memberships",
        "TRUNCATE keyturn_organizations CASCADE",
    ],
)
def test_truncate_is_heard(postgres_url: str, statement: str) -> None:
    """A table emptied with TRUNCATE (no row trigger fires) empties every replica."""
    from keyturn.stores.postgres import PostgresDatabase

    with PostgresDatabase(postgres_url) as db:
        secret = seed(db)
        auth = Authenticator(db.keys, db.membership, usage_interval=None)
        warm(auth, db, secret)
        plain_sql(postgres_url, statement)
        settled()
        assert accepted(auth, secret) == 0


@pytest.mark.postgres
def test_writes_under_replication_role_replica_are_heard(postgres_url: str) -> None:
    """A logical replication subscriber's apply worker, or a restore with triggers off,
    writes under ``session_replication_role = replica``: the revoke is heard all the same."""
    from keyturn.stores.postgres import PostgresDatabase

    with PostgresDatabase(postgres_url) as db:
        secret = seed(db)
        auth = Authenticator(db.keys, db.membership, usage_interval=None)
        warm(auth, db, secret)
        plain_sql(
            postgres_url,
            "SET session_replication_role = replica",
            revoke(secret),
        )
        settled()
        assert accepted(auth, secret) == 0


# --- PostgreSQL: liveness with a deadline ---------------------------------------------------


class FreezingProxy:
    """A TCP proxy on loopback to the test server; :meth:`freeze` stops relaying on every
    connection open then, keeping each TCP session alive, as a hung PgBouncer does."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.frozen: set[socket.socket] = set()
        self.sockets: list[socket.socket] = []
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._relay, args=(a, b), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while not self.stopped.is_set():
                data = source.recv(65536)
                if not data:
                    return
                while source in self.frozen and not self.stopped.is_set():
                    time.sleep(0.05)  # hold the bytes; the session stays open
                sink.sendall(data)

    def freeze(self) -> None:
        self.frozen.update(self.sockets)

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()
        for sock in self.sockets:
            sock.close()


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_a_hung_proxy_stops_the_replica_answering(postgres_url: str) -> None:
    """Every connection goes through a proxy that hangs but keeps its TCP sessions: within
    the liveness bound the replica stops answering (its listener connects anew: the
    replica starts afresh), and a revoke made meanwhile is never accepted."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    from psycopg_pool import ConnectionPool

    from keyturn.stores.postgres import PostgresDatabase

    params = conninfo_to_dict(postgres_url)
    proxy = FreezingProxy(str(params.get("host", "127.0.0.1")), int(params.get("port", 5432)))
    url = make_conninfo(**{**params, "host": "127.0.0.1", "port": proxy.port})
    pool = ConnectionPool(url, kwargs={"autocommit": True}, timeout=1.0, open=True)
    db = PostgresDatabase(pool=pool)
    try:
        secret = seed(db)
        auth = Authenticator(db.keys, db.membership, usage_interval=None, timeout=2.0)
        warm(auth, db, secret)
        proxy.freeze()
        plain_sql(
            postgres_url,
            revoke(secret),
        )
        settled()
        assert accepted(auth, secret, tries=3) == 0
    finally:
        proxy.close()
        db.close()
        pool.close(timeout=1.0)


# --- PostgreSQL and SQLite: the default organization's rule ---------------------------------


def _default_rule_broken(run: Callable[[str], None]) -> list[str]:
    """The plain-SQL writes that break the rule and were let through."""
    run("INSERT INTO keyturn_organizations (id, tenant_id, is_default) VALUES ('d', 't', TRUE)")
    run("INSERT INTO keyturn_organizations (id, tenant_id, is_default) VALUES ('o', 't', FALSE)")
    broken = []
    for statement in (
        "DELETE FROM keyturn_organizations WHERE id = 'd'",
        "UPDATE keyturn_organizations SET is_default = FALSE WHERE id = 'd'",
        "INSERT INTO keyturn_organizations (id, tenant_id, is_default) VALUES ('x', 'u', FALSE)",
        "UPDATE keyturn_organizations SET tenant_id = 'v' WHERE id = 'o'",
    ):
        with contextlib.suppress(Exception):
            run(statement)
            broken.append(statement)
    # What the rule allows still works: the others go first, then the default.
    run("DELETE FROM keyturn_organizations WHERE id = 'o'")
    run("DELETE FROM keyturn_organizations WHERE id = 'd'")
    return broken


def test_plain_sql_cannot_break_the_default_rule_on_sqlite(sqlite_path: Path) -> None:
    """SQLite: a tenant's first organization is its default, and the default goes last."""
    SQLiteDatabase(sqlite_path).create_schema()
    raw = sqlite3.connect(sqlite_path, isolation_level=None)
    try:
        assert _default_rule_broken(lambda sql: raw.execute(sql) and None) == []
    finally:
        raw.close()


@pytest.mark.postgres
def test_plain_sql_cannot_break_the_default_rule_on_postgres(postgres_url: str) -> None:
    """PostgreSQL: the same rule, kept by the database whoever writes."""
    assert _default_rule_broken(lambda sql: plain_sql(postgres_url, sql)) == []


# --- SQLite: a restored file ------------------------------------------------------------------


def _copy(source: Path, onto: Path) -> None:
    """SQLite's online backup of *source* over *onto*: a backup made, or one restored in
    place (``sqlite3 onto ".restore source"``)."""
    reading, writing = sqlite3.connect(source), sqlite3.connect(onto)
    try:
        reading.backup(writing)
    finally:
        reading.close()
        writing.close()


def test_a_restored_sqlite_file_resets_the_replica(sqlite_path: Path, tmp_path: Path) -> None:
    """Restore a backup over the file: a key the backup does not hold is refused, and a
    revoke made after the restore (its change numbered as the backup's log goes) is heard."""
    with SQLiteDatabase(sqlite_path) as db:
        kept = seed(db)
        backup = tmp_path / "backup.sqlite3"
        _copy(sqlite_path, backup)
        auth = Authenticator(db.keys, db.membership, usage_interval=None)
        newer = KeyManager(db.keys, db.membership).create("alice", name="new", scope=TENANT)
        for _ in range(20):  # the newer key's changes move the log past the backup's
            KeyManager(db.keys, db.membership).create("alice", name="x", scope=TENANT)
        warm(auth, db, newer.secret)
        warm(auth, db, kept)
        _copy(backup, sqlite_path)
        assert accepted(auth, newer.secret) == 0
        assert accepted(auth, kept) == TRIES
        raw = sqlite3.connect(sqlite_path, isolation_level=None)
        try:
            raw.execute(
                "UPDATE keyturn_keys SET revoked_at = ? WHERE key_id = ?",
                ("2000-01-01T00:00:00.000000+00:00", key_id(kept)),
            )
        finally:
            raw.close()
        assert accepted(auth, kept) == 0


def test_unrelated_requests_after_a_revoke_are_counted_once(sqlite_path: Path) -> None:
    """A tagged log (schema 7) still applies changes one by one: a revoke by another
    connection is refused by the next request, without a reset of the replica."""
    with SQLiteDatabase(sqlite_path) as db:
        secret = seed(db)
        auth = Authenticator(db.keys, db.membership, usage_interval=None)
        warm(auth, db, secret)
        epoch = db.replica.epoch
        raw = sqlite3.connect(sqlite_path, isolation_level=None)
        try:
            raw.execute(
                "UPDATE keyturn_keys SET revoked_at = ? WHERE key_id = ?",
                ("2000-01-01T00:00:00.000000+00:00", key_id(secret)),
            )
        finally:
            raw.close()
        assert accepted(auth, secret) == 0
        assert db.replica.current and db.replica.epoch == epoch + 1  # one change, no reset


# --- PostgreSQL: a paused process -----------------------------------------------------------

PAUSED_INSTANCE = """
import sys
from keyturn import Authenticator, AuthRequest, Principal
from keyturn.stores.postgres import PostgresDatabase

with PostgresDatabase(sys.argv[1]) as db:
    auth = Authenticator(db.keys, db.membership, usage_interval=None)
    for line in sys.stdin:
        request = AuthRequest(authorization=(f"Bearer {line.strip()}",), organization=("default",))
        outcome = auth.authenticate(request)
        print("accepted" if isinstance(outcome, Principal) else "refused", flush=True)
"""


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_a_paused_process_answers_nothing_stale_when_it_resumes(postgres_url: str) -> None:
    """An instance paused (SIGSTOP) while keys are revoked: its first request on resuming
    is refused, whatever its listener has or has not read yet."""
    import os
    import signal
    import subprocess
    import sys

    from keyturn.stores.postgres import PostgresDatabase

    with PostgresDatabase(postgres_url, replica=False) as db:
        secrets_ = [seed(db)] + [
            KeyManager(db.keys, db.membership).create("alice", name=f"k{i}", scope=TENANT).secret
            for i in range(4)
        ]
    instance = subprocess.Popen(  # noqa: S603 -- our own interpreter and code
        [sys.executable, "-c", PAUSED_INSTANCE, postgres_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert instance.stdin is not None and instance.stdout is not None

    def ask(secret: str) -> str:
        assert instance.stdin is not None and instance.stdout is not None
        instance.stdin.write(secret + "\n")
        instance.stdin.flush()
        return instance.stdout.readline().strip()

    late = 0
    try:
        for secret in secrets_:
            assert eventually(lambda secret=secret: ask(secret) == "accepted")
            time.sleep(1.0)  # warm: the replica and the memo answer
            assert ask(secret) == "accepted"
            os.kill(instance.pid, signal.SIGSTOP)
            plain_sql(postgres_url, revoke(secret))
            time.sleep(3.0)
            instance.stdin.write(secret + "\n")  # waiting for it the moment it resumes
            instance.stdin.flush()
            os.kill(instance.pid, signal.SIGCONT)
            late += instance.stdout.readline().strip() == "accepted"
    finally:
        instance.stdin.close()
        try:
            instance.wait(timeout=30)
        except subprocess.TimeoutExpired:
            instance.kill()  # stopped by its PID
            instance.wait()
        instance.stdout.close()
    assert late == 0
