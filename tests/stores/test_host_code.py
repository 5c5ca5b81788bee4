"""A host's own rules over keyturn's tables are asked on every request (D27, D14).

A host may keep keyturn's tables and add a rule of its own: a ``SQLMembership`` subclass
that suspends accounts, a provider of its own that delegates to keyturn's and keeps its
``.database``, a ``SQLKeyStore`` subclass that denies some keys. The store's combined read
and the memo's change numbers know nothing of such a rule, so they must never answer for
it: each case counts the keys the host denied that were accepted anyway, on a real SQLite
file and a real PostgreSQL database (sync and async), cold (a new Authenticator per
request) and warm (the host denies a key it accepted a moment ago, without a database
write: only asking the host can tell).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from keyturn import Authenticator, AuthRequest, KeyManager, Organization, Principal, Scope
from keyturn._core.model import ApiKey
from keyturn._run.capabilities import Shortcuts, shortcuts
from keyturn.stores._async import AsyncSQLKeyStore, AsyncSQLMembership
from keyturn.stores._sync import SQLKeyStore, SQLMembership
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from keyturn.stores.sqlite import SQLiteDatabase

REQUESTS = 10


@attrs.define
class Rule:
    """The host's own rule: accounts it suspended, keys it denied."""

    suspended: set[str] = attrs.Factory(set)
    denied: set[str] = attrs.Factory(set)


# --- the host's code, sync ----------------------------------------------------------------


class SuspendingMembership(SQLMembership):
    rule = Rule()

    def get_role(self, account_id: str, organization_id: str) -> str | None:
        if account_id in self.rule.suspended:
            return None
        return super().get_role(account_id, organization_id)

    def reaches_tenant(self, account_id: str, tenant_id: str) -> bool:
        return account_id not in self.rule.suspended and super().reaches_tenant(
            account_id, tenant_id
        )


class HostMembership:
    """The host's provider: keyturn's membership behind a rule, its database kept at hand."""

    def __init__(self, inner: Any, rule: Rule) -> None:
        self.inner, self.rule, self.database = inner, rule, inner.database

    def get_organization(self, organization_id: str) -> Organization | None:
        return self.inner.get_organization(organization_id)  # type: ignore[no-any-return]

    def get_default_organization(self, tenant_id: str) -> Organization | None:
        return self.inner.get_default_organization(tenant_id)  # type: ignore[no-any-return]

    def get_role(self, account_id: str, organization_id: str) -> str | None:
        if account_id in self.rule.suspended:
            return None
        return self.inner.get_role(account_id, organization_id)  # type: ignore[no-any-return]

    def reaches_tenant(self, account_id: str, tenant_id: str) -> bool:
        if account_id in self.rule.suspended:
            return False
        return self.inner.reaches_tenant(account_id, tenant_id)  # type: ignore[no-any-return]


class DenyingKeyStore(SQLKeyStore):
    rule = Rule()

    def get_key(self, key_id: str) -> ApiKey | None:
        return None if key_id in self.rule.denied else super().get_key(key_id)


# --- the same, async ----------------------------------------------------------------------


class AsyncSuspendingMembership(AsyncSQLMembership):
    rule = Rule()

    async def get_role(self, account_id: str, organization_id: str) -> str | None:
        if account_id in self.rule.suspended:
            return None
        return await super().get_role(account_id, organization_id)

    async def reaches_tenant(self, account_id: str, tenant_id: str) -> bool:
        if account_id in self.rule.suspended:
            return False
        return await super().reaches_tenant(account_id, tenant_id)


class AsyncHostMembership:
    def __init__(self, inner: Any, rule: Rule) -> None:
        self.inner, self.rule, self.database = inner, rule, inner.database

    async def get_organization(self, organization_id: str) -> Organization | None:
        return await self.inner.get_organization(organization_id)  # type: ignore[no-any-return]

    async def get_default_organization(self, tenant_id: str) -> Organization | None:
        return await self.inner.get_default_organization(tenant_id)  # type: ignore[no-any-return]

    async def get_role(self, account_id: str, organization_id: str) -> str | None:
        if account_id in self.rule.suspended:
            return None
        return await self.inner.get_role(account_id, organization_id)  # type: ignore[no-any-return]

    async def reaches_tenant(self, account_id: str, tenant_id: str) -> bool:
        if account_id in self.rule.suspended:
            return False
        return await self.inner.reaches_tenant(account_id, tenant_id)  # type: ignore[no-any-return]


class AsyncDenyingKeyStore(AsyncSQLKeyStore):
    rule = Rule()

    async def get_key(self, key_id: str) -> ApiKey | None:
        return None if key_id in self.rule.denied else await super().get_key(key_id)


# --- one database, sync or async ----------------------------------------------------------


@attrs.define
class Deployment:
    """keyturn's tables in one database, and how the host's objects are built over it."""

    name: str
    database: Any  # what the Authenticator's store and membership read
    manager: KeyManager  # writes the world (sync, over the same tables)
    runner: asyncio.Runner | None

    @property
    def sync(self) -> bool:
        return self.runner is None

    def suspending(self, rule: Rule) -> Any:
        kind = SuspendingMembership if self.sync else AsyncSuspendingMembership
        membership = kind(self.database)
        membership.rule = rule
        return membership

    def host(self, rule: Rule) -> Any:
        kind = HostMembership if self.sync else AsyncHostMembership
        return kind(self.database.membership, rule)

    def denying(self, rule: Rule) -> Any:
        kind = DenyingKeyStore if self.sync else AsyncDenyingKeyStore
        store = kind(self.database)
        store.rule = rule
        return store

    def decide(self, auth: Authenticator, key: str, organization: str | None = None) -> bool:
        """Whether *key* was accepted."""
        request = AuthRequest((f"Bearer {key}",), () if organization is None else (organization,))
        if self.runner is None:
            outcome = auth.authenticate(request)
        else:
            outcome = self.runner.run(auth.authenticate_async(request))
        return isinstance(outcome, Principal)

    def close(self, auth: Authenticator) -> None:
        if self.runner is None:
            auth.close()
        else:
            self.runner.run(auth.aclose())


def _seeded(manager: KeyManager, membership: Any) -> None:
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")


def _current(database: Any) -> None:
    """Wait (bounded) until the database's change feed answers: the memo's precondition."""
    for _ in range(1000):
        if database.changes() is not None:
            return
        time.sleep(0.01)
    pytest.fail("the change feed did not become current within 10 s")


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("postgres-async", marks=pytest.mark.postgres),
    ]
)
def deployment(request: pytest.FixtureRequest, sqlite_path: Path) -> Iterator[Deployment]:
    name = request.param
    if name == "sqlite":
        with SQLiteDatabase(sqlite_path) as db:
            _seeded(manager := KeyManager(db.keys, db.membership), db.membership)
            yield Deployment(name, db, manager, None)
        return
    from keyturn.stores.postgres import AsyncPostgresDatabase, PostgresDatabase

    url = request.getfixturevalue("postgres_url")
    with PostgresDatabase(url) as db:
        _seeded(manager := KeyManager(db.keys, db.membership), db.membership)
        if name == "postgres":
            _current(db)
            yield Deployment(name, db, manager, None)
            return
        with asyncio.Runner() as runner:
            adb = AsyncPostgresDatabase(url)
            runner.run(adb.open())
            try:
                runner.run(adb.keys.get_key("NoSuchKey000"))  # its first connection starts it
                _current(adb)
                yield Deployment(name, adb, manager, runner)
            finally:
                runner.run(adb.close())


# --- the cases ----------------------------------------------------------------------------

SCOPES = {
    "organization": (Scope.organization("org_main", tenant_id="acme"), None),
    "tenant": (Scope.tenant("acme"), "default"),
}
Build = Callable[[Deployment, Rule], tuple[Any, Any]]
CASES: dict[str, Build] = {
    "a SQLMembership subclass": lambda d, rule: (d.database.keys, d.suspending(rule)),
    "a host provider keeping .database": lambda d, rule: (d.database.keys, d.host(rule)),
    "a SQLKeyStore subclass": lambda d, rule: (d.denying(rule), d.database.membership),
}


def _deny(rule: Rule, case: str, key_id: str) -> None:
    if case == "a SQLKeyStore subclass":
        rule.denied.add(key_id)
    else:
        rule.suspended.add("alice")


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("case", CASES)
def test_a_denied_key_is_refused_by_a_new_authenticator(
    deployment: Deployment, case: str, scope: str
) -> None:
    """Cold: each request decided by a new Authenticator, its combined read the only way in."""
    key_scope, organization = SCOPES[scope]
    created = deployment.manager.create("alice", name="k", scope=key_scope)
    rule = Rule()
    _deny(rule, case, created.info.key_id)
    accepted = 0
    for _ in range(REQUESTS):
        auth = Authenticator(*CASES[case](deployment, rule), usage_interval=None)
        try:
            accepted += deployment.decide(auth, created.secret, organization)
        finally:
            deployment.close(auth)
    assert accepted == 0, f"{accepted}/{REQUESTS} denied keys accepted"


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("case", CASES)
def test_a_key_denied_after_its_use_is_refused_by_the_next_request(
    deployment: Deployment, case: str, scope: str
) -> None:
    """Warm: accepted, then denied by the host with no database write; the memo, were it
    on, would still hold its answer."""
    key_scope, organization = SCOPES[scope]
    created = deployment.manager.create("alice", name="k", scope=key_scope)
    rule = Rule()
    auth = Authenticator(*CASES[case](deployment, rule), usage_interval=None)
    try:
        for _ in range(3):  # allowed, and decided again: the memo's answer, where it is on
            assert deployment.decide(auth, created.secret, organization)
        _deny(rule, case, created.info.key_id)
        accepted = sum(
            deployment.decide(auth, created.secret, organization) for _ in range(REQUESTS)
        )
    finally:
        deployment.close(auth)
    assert accepted == 0, f"{accepted}/{REQUESTS} denied keys accepted"


def test_keyturns_own_classes_keep_the_combined_read_and_the_memo(
    deployment: Deployment,
) -> None:
    """What the rule leaves alone: keyturn's own store and membership over one database."""
    created = deployment.manager.create(
        "alice", name="k", scope=Scope.organization("org_main", tenant_id="acme")
    )
    auth = Authenticator(deployment.database.keys, deployment.database.membership)
    try:
        assert auth.rules.lookup and auth.memo.enabled
        for _ in range(3):
            assert deployment.decide(auth, created.secret)
        assert auth.memo.hits == 2
    finally:
        deployment.close(auth)


# --- the rule itself ----------------------------------------------------------------------


class LoggingStore(MemoryKeyStore):
    """A subclass that adds to a write and answers every read with keyturn's methods."""

    def add_key(self, key: ApiKey) -> None:
        super().add_key(key)


class OwnNumberStore(MemoryKeyStore):
    def changes(self) -> int:
        return 0  # a number of its own: nothing keyturn can trust


class Intercepting(MemoryMembership):
    def __getattribute__(self, name: str) -> Any:
        return super().__getattribute__(name)


def test_only_keyturns_own_methods_take_the_shortcuts(sqlite_path: Path) -> None:
    patched = MemoryKeyStore()
    patched.get_key = lambda key_id: None  # type: ignore[method-assign]
    assert shortcuts(MemoryKeyStore(), MemoryMembership()).feeds is not None
    assert shortcuts(LoggingStore(), MemoryMembership()).feeds is not None
    assert shortcuts(patched, MemoryMembership()) == Shortcuts(lookup=False, feeds=None)
    assert shortcuts(OwnNumberStore(), MemoryMembership()) == Shortcuts(lookup=False, feeds=None)
    assert shortcuts(MemoryKeyStore(), Intercepting()) == Shortcuts(lookup=False, feeds=None)
    with SQLiteDatabase(sqlite_path) as db:
        assert shortcuts(db.keys, db.membership).lookup
        assert shortcuts(db.keys, SQLMembership(db)).lookup  # another object, same database
        assert shortcuts(db.keys, db.membership).feeds == (db.keys.changes, None)
        both = shortcuts(db.keys, MemoryMembership())  # two databases: two numbers
        assert not both.lookup and both.feeds is not None and both.feeds[1] is not None
        assert shortcuts(DenyingKeyStore(db), db.membership) == Shortcuts(False, None)
        assert shortcuts(db.keys, HostMembership(db.membership, Rule())) == Shortcuts(False, None)
