"""Each answer the memo keeps holds while what it read is unchanged, and only that.

A write to one key leaves another key's answer a hit; an organization's change re-decides
the requests that reached it, and no other; a membership change, those of that account.
Counted with the memo's own counters (``hits``, ``redecided``), on every store with a
feed. Then the other side: writes of plain SQL by another process (a revoke, a role
changed, a tenant's default replaced, an organization deleted without its memberships, an
organization moved to another tenant) are never answered stale: every answer is the one
the decision gives alone over a database opened without a replica.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from keyturn import Authenticator, AuthRequest, KeyManager, Principal, Scope
from keyturn._core.decision import Rules
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from keyturn.stores.sqlite import SQLiteDatabase
from tests.stores.test_memo import decide_alone, same

ACME = Scope.tenant("acme")
BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def populate(store: Any, membership: Any) -> tuple[dict[str, str], dict[str, str]]:
    """Three tenants, three accounts, a key each way; the secrets and ids by name."""
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_organization("org_research", tenant_id="acme")
    membership.add_organization("org_secret", tenant_id="acme")
    membership.add_organization("org_globex", tenant_id="globex", default=True)
    membership.add_organization("org_i1", tenant_id="initech", default=True)
    membership.add_member("alice", "org_main", role="admin")
    membership.add_member("alice", "org_research", role="member")
    membership.add_member("bob", "org_main", role="member")
    membership.add_member("bob", "org_globex", role="admin")
    membership.add_member("bob", "org_secret", role="viewer")
    membership.add_member("carol", "org_i1", role="admin")
    manager = KeyManager(store, membership)
    made = {
        "alice_tenant": manager.create("alice", name="a", scope=ACME),
        "alice_main": manager.create("alice", name="b", organization="org_main"),
        "alice_research": manager.create("alice", name="c", organization="org_research"),
        "bob_tenant": manager.create("bob", name="d", scope=ACME),
        "bob_globex": manager.create("bob", name="e", scope=Scope.tenant("globex")),
        "carol_tenant": manager.create("carol", name="f", scope=Scope.tenant("initech")),
    }
    secrets = {name: created.secret for name, created in made.items()}
    return secrets, {name: created.info.key_id for name, created in made.items()}


# The requests judged: (key, organization header).
REQUESTS = (
    ("alice_tenant", "default"),
    ("alice_tenant", "org_research"),
    ("alice_tenant", "org_secret"),
    ("alice_main", None),
    ("alice_main", "default"),
    ("alice_research", None),
    ("bob_tenant", "org_main"),
    ("bob_tenant", "org_secret"),
    ("bob_globex", "default"),
    ("bob_globex", "org_secret"),
    ("carol_tenant", "default"),
    ("carol_tenant", "org_i2"),
)


def asked(secret: str, organization: str | None) -> AuthRequest:
    return AuthRequest((f"Bearer {secret}",), () if organization is None else (organization,))


@contextmanager
def opened(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """(store, membership, truth store, truth membership, plain-SQL writer or None)."""
    if backend == "memory":
        store, membership = MemoryKeyStore(), MemoryMembership()
        yield store, membership, store, membership, None
        return
    if backend == "sqlite":
        path = tmp_path / "keys.sqlite3"
        with SQLiteDatabase(path) as db, SQLiteDatabase(path, replica=False) as truth:
            yield db.keys, db.membership, truth.keys, truth.membership, ("sqlite", str(path))
        return
    from keyturn.stores.postgres import PostgresDatabase

    url = request.getfixturevalue("make_postgres_schema")()
    with PostgresDatabase(url) as db, PostgresDatabase(url, replica=False) as truth:
        db.create_schema()
        db.keys.lookup("NoSuchKey000", None)  # finds the database: the listener starts
        assert eventually(lambda: db.changes() is not None), "the listener did not connect"
        yield db.keys, db.membership, truth.keys, truth.membership, ("postgres", url)


def eventually(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Poll *condition* until true, at most *seconds* (a bound, not a timing assertion)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


class Judge:
    """Sends the judged requests through an Authenticator and counts what its memo did."""

    def __init__(self, store: Any, membership: Any, secrets: dict[str, str]) -> None:
        self.auth = Authenticator(store, membership, usage_interval=None)
        self.secrets = secrets

    def send(self, name: str, organization: str | None) -> Any:
        return self.auth.authenticate(asked(self.secrets[name], organization))

    def warm(self) -> None:
        for _ in range(2):
            for name, organization in REQUESTS:
                self.send(name, organization)

    def quiet(self) -> None:
        """Wait until the feed has applied what it will hear of the last write (PostgreSQL's
        notices come after the write's own drop): its change number stops moving."""
        feed = self.auth.memo._store
        seen = -1
        for _ in range(200):  # bounded
            versions = feed()
            if versions is not None and versions.seq == seen:
                return
            seen = -1 if versions is None else versions.seq
            time.sleep(0.05)

    def redecided_by(self, write: Callable[[], object]) -> set[tuple[str, str | None]]:
        """The judged requests whose kept answers a *write* made void."""
        self.warm()
        write()
        self.quiet()
        redecided = set()
        for name, organization in REQUESTS:
            before = self.auth.memo.redecided
            self.send(name, organization)
            if self.auth.memo.redecided > before:
                redecided.add((name, organization))
        return redecided


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_write_re_decides_only_the_requests_that_read_what_it_touched(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A key's revoke, a role changed, an organization added: each re-decides exactly the
    kept answers that read it; every other request stays the memo's."""
    with opened(backend, tmp_path, request) as (store, membership, _, _, _):
        secrets, ids = populate(store, membership)
        judge = Judge(store, membership, secrets)
        with judge.auth:
            hits = judge.auth.memo.hits
            # A write to one key: that key's requests only.
            assert judge.redecided_by(
                lambda: store.revoke_key(ids["alice_research"], judge.auth.clock())
            ) == {("alice_research", None)}
            # A key created: no request read it.
            manager = KeyManager(store, membership)
            assert judge.redecided_by(lambda: manager.create("bob", name="g", scope=ACME)) == set()
            # A membership change: that account's requests only (alice's answers).
            assert judge.redecided_by(
                lambda: membership.add_member("alice", "org_secret", role="viewer")
            ) == {
                ("alice_tenant", "default"),
                ("alice_tenant", "org_research"),
                ("alice_main", None),
                ("alice_main", "default"),
            }
            # Another account: nothing kept read it.
            assert (
                judge.redecided_by(lambda: membership.add_member("dave", "org_i1", role="admin"))
                == set()
            )
            # An organization of initech: initech's default requests only, none of acme's.
            assert judge.redecided_by(
                lambda: membership.add_organization("org_i2", tenant_id="initech")
            ) == {("carol_tenant", "default")}
            # An organization of acme: the requests that read acme's default, no other.
            assert judge.redecided_by(
                lambda: membership.add_organization("org_new", tenant_id="acme")
            ) == {("alice_tenant", "default"), ("alice_main", "default")}
            # Every request sent and not named above was the memo's.
            assert judge.auth.memo.hits - hits >= 6 * len(REQUESTS)


WRITER = """
import sys
url, statements = sys.argv[1], sys.argv[2:]
if url.startswith("postgresql"):
    import psycopg
    with psycopg.connect(url) as connection:  # one transaction, committed at the end
        for statement in statements:
            connection.execute(statement)
else:
    import sqlite3
    connection = sqlite3.connect(url, isolation_level=None)  # no foreign keys: no cascade
    connection.execute("BEGIN IMMEDIATE")
    for statement in statements:
        connection.execute(statement)
    connection.execute("COMMIT")
    connection.close()
"""

# Plain SQL, committed by another process: each a change the memo must never answer stale.
CHANGES = {
    "revoke": (
        "UPDATE keyturn_keys SET revoked_at = created_at WHERE name = 'b'",  # alice_main
    ),
    "role changed": (
        "UPDATE keyturn_memberships SET role = 'viewer' "
        "WHERE account_id = 'alice' AND organization_id = 'org_main'",
    ),
    "default replaced": (
        "DELETE FROM keyturn_organizations WHERE id = 'org_i1'",
        "INSERT INTO keyturn_organizations (id, tenant_id, is_default) "
        "VALUES ('org_i2', 'initech', TRUE)",
        "INSERT INTO keyturn_memberships (account_id, organization_id, role) "
        "VALUES ('carol', 'org_i2', 'member')",
    ),
    "organization deleted": ("DELETE FROM keyturn_organizations WHERE id = 'org_research'",),
    "tenant moved": (
        "UPDATE keyturn_organizations SET tenant_id = 'globex' WHERE id = 'org_secret'",
    ),
}


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_plain_sql_from_another_process_is_never_answered_stale(
    backend: str, change: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """After the commit (SQLite: at once; PostgreSQL: once its listener heard it), every
    answer is the decision's alone, request after request; before it, none differs from
    the decision's over the state before."""
    with opened(backend, tmp_path, request) as (store, membership, truth_store, truth, where):
        secrets, _ = populate(store, membership)
        judge = Judge(store, membership, secrets)
        rules = Rules()

        def agrees() -> bool:
            for name, organization in REQUESTS:
                kept = judge.send(name, organization)
                alone = decide_alone(
                    asked(secrets[name], organization),
                    judge.auth.clock(),
                    rules,
                    truth_store,
                    truth,
                )
                if not same(kept, alone):
                    return False
            return True

        with judge.auth:
            judge.warm()
            assert agrees()
            before = [judge.send(name, organization) for name, organization in REQUESTS]
            kind, url = where
            writer = [sys.executable, "-c", WRITER, url, *CHANGES[change]]
            subprocess.run(writer, check=True)  # noqa: S603 -- our own interpreter and code
            if kind == "sqlite":
                assert agrees()  # the next request of every other process sees a commit
            else:
                assert eventually(agrees), "the change was never heard"
            for _ in range(3):  # and it stays heard: no answer kept before comes back
                assert agrees()
            after = [judge.send(name, organization) for name, organization in REQUESTS]
            assert any(not same(old, new) for old, new in zip(before, after, strict=True))
            assert any(isinstance(outcome, Principal) for outcome in after)


# --- bounded, and never emptied whole -------------------------------------------------------


def test_a_forgotten_name_counts_as_changed_at_the_floor() -> None:
    """Past its bound the oldest name goes, the floor rising to its change first; a reset
    raises the floor past every number given before."""
    from keyturn.stores._versions import Versions

    versions = Versions(size=2)
    for name in ("a", "b", "c"):
        versions.moved((("k", name),))
    assert versions.seq == 3 and versions.floor == 1 and ("k", "a") not in versions.last
    assert not versions.unchanged([("k", "a")], 0)
    assert versions.unchanged([("k", "a"), ("k", "nobody")], 1)
    assert not versions.unchanged([("k", "b")], 1) and versions.unchanged([("k", "b")], 2)
    versions.reset()
    assert versions.resets == 1 and not versions.unchanged([("k", "nobody")], 3)
    assert versions.unchanged([("k", "nobody")], versions.seq)


def test_the_memo_keeps_the_answers_in_use() -> None:
    """Past its size the least recently used answer goes, not the first kept."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    secrets, _ = populate(store, membership)
    with Authenticator(store, membership, usage_interval=None) as auth:
        auth.memo.max_size = 2
        one, two = asked(secrets["alice_main"], None), asked(secrets["alice_research"], None)
        three = asked(secrets["carol_tenant"], "default")
        for sent in (one, two, one, three):  # two is the least recently used when three comes
            auth.authenticate(sent)
        hits = auth.memo.hits
        auth.authenticate(one)
        assert auth.memo.hits == hits + 1
        auth.authenticate(two)
        assert auth.memo.hits == hits + 1  # forgotten: decided again
        assert len(auth.memo) == 2


def test_an_organization_change_keeps_other_tenants_defaults_even_none() -> None:
    """A tenant with no organization (its default ``None``) stays known through another
    tenant's organization changes; its own tenant's change drops it, and nothing else."""
    from keyturn._core.model import Found
    from keyturn.stores._replica import Replica
    from keyturn.stores._sql import MEMBERSHIP, ORGANIZATION, TENANT

    store, membership = MemoryKeyStore(), MemoryMembership()
    _, ids = populate(store, membership)
    key = store.get_key(ids["carol_tenant"])
    assert key is not None
    replica = Replica()
    replica.reset(current=True)
    resets = replica.resets
    lonely = Found(key=key, asked=None, named=None, default=None, roles={}, reaches=False)
    replica.keep(key.key_id, lonely, replica.epoch)
    assert replica.found(key.key_id, None) == lonely
    for kind, changed in ((ORGANIZATION, "org_x"), (TENANT, "acme"), (MEMBERSHIP, "alice")):
        replica.changed(kind, changed)
        assert replica.found(key.key_id, None) == lonely
    replica.changed(TENANT, "initech")
    assert replica.found(key.key_id, None) is None
    assert replica.resets == resets  # nothing emptied whole
