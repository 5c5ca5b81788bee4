"""What the console needs from the library: organizations_of, KeyManager and its async twin,
and public date bounds."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest

import keyturn
from keyturn import (
    AsyncKeyManager,
    Authenticator,
    AuthRequest,
    ConsoleMembership,
    CustomDate,
    KeyAlreadyReplaced,
    KeyManager,
    KeyNotFound,
    KeyNotRevocable,
    KeyNotRotatable,
    Lifetime,
    Principal,
    Scope,
    ScopeKind,
    ScopeNotReachable,
    Status,
)
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from keyturn.stores.sqlite import SQLiteDatabase

NOW = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)
EXPECTED = [
    ("acme-main", "acme", True),
    ("acme-research", "acme", False),
    ("globex-hq", "globex", False),
]


def seed(membership: Any) -> None:
    """Organizations in two tenants; alice in three of them, bob in one."""
    membership.add_organization("acme-main", tenant_id="acme", default=True)
    membership.add_organization("acme-research", tenant_id="acme")
    membership.add_organization("globex-other", tenant_id="globex", default=True)
    membership.add_organization("globex-hq", tenant_id="globex")
    for organization in ("globex-hq", "acme-research", "acme-main"):
        membership.add_member("alice", organization, role="member")
    membership.add_member("bob", "globex-other", role="member")


def listed(organizations: Any) -> list[tuple[str, str, bool]]:
    return [(o.id, o.tenant_id, o.is_default) for o in organizations]


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh schema on the test PostgreSQL server, dropped afterwards."""
    url = os.environ.get("KEYTURN_TEST_POSTGRES_DSN", "")
    if not url:
        if os.environ.get("KEYTURN_REQUIRE_POSTGRES"):
            pytest.fail("KEYTURN_TEST_POSTGRES_DSN is not set", pytrace=False)
        pytest.skip("KEYTURN_TEST_POSTGRES_DSN is not set")
    import psycopg

    schema = f"keyturn_console_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA {schema} CASCADE")


def test_memory_membership_lists_organizations_of_an_account() -> None:
    """Memory: the account's organizations, by tenant, the default first; none for strangers."""
    membership = MemoryMembership()
    seed(membership)
    assert isinstance(membership, ConsoleMembership)
    assert listed(membership.organizations_of("alice")) == EXPECTED
    membership.remove_member("alice", "acme-main")
    assert listed(membership.organizations_of("alice")) == EXPECTED[1:]
    assert membership.organizations_of("nobody") == []


def test_sqlite_membership_lists_organizations_of_an_account(tmp_path: Path) -> None:
    """SQLite answers organizations_of exactly as the memory membership does."""
    with SQLiteDatabase(tmp_path / "k.sqlite3") as db:
        db.create_schema()
        seed(db.membership)
        assert isinstance(db.membership, ConsoleMembership)
        assert listed(db.membership.organizations_of("alice")) == EXPECTED
        assert db.membership.organizations_of("nobody") == []


@pytest.mark.postgres
def test_postgres_membership_lists_organizations_of_an_account(postgres_url: str) -> None:
    """PostgreSQL, sync and async, answers organizations_of as the others do."""
    from keyturn.stores.postgres import AsyncPostgresDatabase, PostgresDatabase

    with PostgresDatabase(postgres_url) as db:
        db.create_schema()
        seed(db.membership)
        assert listed(db.membership.organizations_of("alice")) == EXPECTED

    async def run() -> list[tuple[str, str, bool]]:
        async with AsyncPostgresDatabase(postgres_url) as adb:
            return listed(await adb.membership.organizations_of("alice"))

    assert asyncio.run(run()) == EXPECTED


def test_key_manager_refuses_async_stores() -> None:
    """An async store or provider is refused at construction: never a silent success."""

    class AsyncStore:
        async def get_key(self, key_id: str) -> None: ...

        async def add_key(self, key: Any) -> None: ...

        async def keys_of(self, account_id: str) -> list[Any]:
            return []

        async def revoke_key(self, key_id: str, at: datetime) -> bool:
            return False

        async def mark_used(self, key_id: str, at: datetime) -> None: ...

    class AsyncMembership:
        async def get_organization(self, organization_id: str) -> None: ...

        async def get_default_organization(self, tenant_id: str) -> None: ...

        async def get_role(self, account_id: str, organization_id: str) -> None: ...

        async def reaches_tenant(self, account_id: str, tenant_id: str) -> bool:
            return True

    with pytest.raises(TypeError, match="KeyManager needs a sync store"):
        KeyManager(AsyncStore(), MemoryMembership())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="KeyManager needs a sync membership"):
        KeyManager(MemoryKeyStore(), AsyncMembership())  # type: ignore[arg-type]


def test_date_bounds_and_expiry_are_public() -> None:
    """A date picker can ask the library for the bounds and the resulting expiry."""
    now = datetime(2026, 6, 30, 12, 0, tzinfo=UTC)
    assert keyturn.custom_date_bounds(now, "Pacific/Auckland") == (
        date(2026, 7, 2),
        date(2027, 7, 1),
    )
    assert keyturn.custom_date_bounds(now, "America/Los_Angeles") == (
        date(2026, 7, 1),
        date(2027, 6, 30),
    )
    choice = CustomDate(date(2026, 7, 2), "Pacific/Auckland")
    assert keyturn.expiry_for(choice, now) == datetime(2026, 7, 2, 12, 0, tzinfo=UTC)
    assert keyturn.expiry_for(Lifetime.DAYS_1, now) == datetime(2026, 7, 1, 12, 0, tzinfo=UTC)


class Awaited:
    """An async face over a sync store or provider: each method is awaited, as a real
    async store's are (AsyncPostgresDatabase runs below when a server is configured)."""

    def __init__(self, target: Any) -> None:
        self._target = target
        for name in (
            "get_key",
            "add_key",
            "keys_of",
            "revoke_key",
            "mark_used",
            "usage_of",
            "get_organization",
            "get_default_organization",
            "get_role",
            "reaches_tenant",
            "organizations_of",
            "record_event",
            "events_of",
            "events_since",
        ):
            if hasattr(target, name):
                setattr(self, name, self._async(getattr(target, name)))

    @staticmethod
    def _async(method: Any) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0)
            return method(*args, **kwargs)

        return call


async def _async_walk(manager: AsyncKeyManager) -> list[Any]:
    """Create, list, filter and revoke through the async manager; what it answered."""
    tenant = await manager.create("alice", name="tenant", scope=Scope.tenant("acme"))
    research = Scope.organization("acme-research", tenant_id="acme")
    org = await manager.create("alice", name="research", scope=research, expiry=Lifetime.DAYS_1)
    with pytest.raises(ScopeNotReachable):
        await manager.create("alice", name="x", scope=Scope.tenant("nowhere"))
    with pytest.raises(ScopeNotReachable):
        await manager.create(
            "alice", name="x", scope=Scope.organization("acme-main", tenant_id="x")
        )
    revoked = await manager.revoke("alice", org.info.key_id)
    with pytest.raises(KeyNotRevocable):
        await manager.revoke("alice", org.info.key_id)
    with pytest.raises(KeyNotFound):
        await manager.revoke("bob", tenant.info.key_id)
    listed = await manager.list("alice")
    active = await manager.list("alice", status=Status.ACTIVE)
    organizations = await manager.list("alice", scope=ScopeKind.ORGANIZATION)
    return [tenant, revoked, listed, active, organizations]


def test_async_key_manager_stores_what_it_creates_and_checks_membership() -> None:
    """AsyncKeyManager awaits every call: the key is stored, works, lists, and revokes."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    seed(membership)
    manager = AsyncKeyManager(Awaited(store), Awaited(membership), clock=lambda: NOW)  # type: ignore[arg-type]
    tenant, revoked, listed, active, organizations = asyncio.run(_async_walk(manager))
    assert len(store) == 2
    assert revoked.status is Status.REVOKED
    assert sorted(info.name for info in listed) == ["research", "tenant"]  # same instant
    assert [info.name for info in active] == ["tenant"]
    assert [info.name for info in organizations] == ["research"]
    authenticator = Authenticator(store, membership, clock=lambda: NOW)
    try:
        principal = authenticator.authenticate(
            AuthRequest(authorization=(f"Bearer {tenant.secret}",), organization=("default",))
        )
    finally:
        authenticator.close()
    assert isinstance(principal, Principal)
    assert principal.organization_id == "acme-main"


def test_async_key_manager_creates_by_organization_alone() -> None:
    """As KeyManager.create: organization= names the scope, its tenant read from the provider."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    seed(membership)
    manager = AsyncKeyManager(Awaited(store), Awaited(membership), clock=lambda: NOW)  # type: ignore[arg-type]

    async def run() -> Any:
        with pytest.raises(ScopeNotReachable, match="there is no organization 'nowhere'"):
            await manager.create("alice", name="x", organization="nowhere")
        with pytest.raises(TypeError, match="not both"):
            await manager.create(
                "alice", name="x", organization="acme-research", scope=Scope.tenant("acme")
            )
        return await manager.create("alice", name="research", organization="acme-research")

    created = asyncio.run(run())
    assert created.info.scope == Scope.organization("acme-research", tenant_id="acme")
    assert [key.key_id for key in store.keys_of("alice")] == [created.info.key_id]


def test_async_key_manager_lists_keys_expiring_soon() -> None:
    """AsyncKeyManager.expiring answers as KeyManager.expiring: working keys, soonest first."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    seed(membership)
    manager = AsyncKeyManager(Awaited(store), Awaited(membership), clock=lambda: NOW)  # type: ignore[arg-type]
    sync = KeyManager(store, membership, clock=lambda: NOW)
    tenant = Scope.tenant("acme")

    async def run() -> list[str]:
        await manager.create("alice", name="week", scope=tenant, expiry=Lifetime.DAYS_7)
        await manager.create("alice", name="day", scope=tenant, expiry=Lifetime.DAYS_1)
        await manager.create("alice", name="month", scope=tenant, expiry=Lifetime.DAYS_30)
        return [info.name for info in await manager.expiring("alice", within=timedelta(days=7))]

    assert asyncio.run(run()) == ["day", "week"]
    assert [i.name for i in sync.expiring("alice", within=timedelta(days=7))] == ["day", "week"]


def test_async_key_manager_refuses_sync_stores() -> None:
    """A sync store given to AsyncKeyManager is refused at construction, and named."""
    with pytest.raises(TypeError, match="AsyncKeyManager needs an async store"):
        AsyncKeyManager(MemoryKeyStore(), Awaited(MemoryMembership()))  # type: ignore[arg-type]


@pytest.mark.postgres
def test_async_key_manager_over_async_postgres(postgres_url: str) -> None:
    """Over AsyncPostgresDatabase the key is really stored, and the sync side sees it."""
    from keyturn.stores.postgres import AsyncPostgresDatabase, PostgresDatabase

    with PostgresDatabase(postgres_url) as db:
        db.create_schema()
        seed(db.membership)

    async def run() -> list[Any]:
        async with AsyncPostgresDatabase(postgres_url) as adb:
            return await _async_walk(AsyncKeyManager(adb.keys, adb.membership, clock=lambda: NOW))

    tenant, revoked, listed, _, _ = asyncio.run(run())
    with PostgresDatabase(postgres_url) as db:
        stored = db.keys.get_key(tenant.info.key_id)
        assert stored is not None
        assert stored.hint == tenant.info.hint
    assert revoked.status is Status.REVOKED
    assert len(listed) == 2


async def _async_rotation(manager: AsyncKeyManager) -> list[Any]:
    """Rotate through the async manager: refusals, the link, and the creator's choice."""
    old = await manager.create("alice", name="deploys", scope=Scope.tenant("acme"))
    with pytest.raises(KeyNotFound):
        await manager.rotate("bob", old.info.key_id)
    new = await manager.rotate("alice", old.info.key_id, revoke_old_on_first_use=True)
    with pytest.raises(KeyAlreadyReplaced):
        await manager.rotate("alice", old.info.key_id)
    await manager.store.mark_used(new.info.key_id, NOW + timedelta(minutes=1))
    revoked = await manager.revoke("alice", new.info.key_id)
    with pytest.raises(KeyNotRotatable):
        await manager.rotate("alice", new.info.key_id)
    return [old, new, revoked, await manager.list("alice")]


def _check_rotation(old: Any, new: Any, revoked: Any, listed: list[Any]) -> None:
    assert (new.info.replaces, new.info.revoke_old_on_first_use) == (old.info.key_id, True)
    assert new.info.expires_at - new.info.created_at == Lifetime.DAYS_30.value
    assert revoked.replaces == old.info.key_id
    old_info = next(info for info in listed if info.key_id == old.info.key_id)
    assert old_info.status is Status.REVOKED  # by the replacement's usage write
    assert old_info.revoked_at == NOW + timedelta(minutes=1)
    assert old_info.replaced_by == new.info.key_id
    assert old_info.replacement_first_used_at == NOW + timedelta(minutes=1)


def test_async_key_manager_rotates() -> None:
    """AsyncKeyManager.rotate answers as KeyManager.rotate, awaiting every call."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    seed(membership)
    manager = AsyncKeyManager(Awaited(store), Awaited(membership), clock=lambda: NOW)  # type: ignore[arg-type]
    _check_rotation(*asyncio.run(_async_rotation(manager)))


@pytest.mark.postgres
def test_async_key_manager_rotates_over_async_postgres(postgres_url: str) -> None:
    """The same over AsyncPostgresDatabase: the link and the revoke are really stored."""
    from keyturn.stores.postgres import AsyncPostgresDatabase, PostgresDatabase

    with PostgresDatabase(postgres_url) as db:
        db.create_schema()
        seed(db.membership)

    async def run() -> list[Any]:
        async with AsyncPostgresDatabase(postgres_url) as adb:
            manager = AsyncKeyManager(adb.keys, adb.membership, clock=lambda: NOW)
            return await _async_rotation(manager)

    _check_rotation(*asyncio.run(run()))


def test_async_key_manager_refuses_a_store_that_drops_the_rotation() -> None:
    """As the sync manager: the new key read back without its link is revoked, and said so."""

    class ForgetfulStore(MemoryKeyStore):
        def add_key(self, key: Any) -> None:
            super().add_key(attrs.evolve(key, replaces=None, revoke_old_on_first_use=False))

    store, membership = ForgetfulStore(), MemoryMembership()
    seed(membership)
    manager = AsyncKeyManager(Awaited(store), Awaited(membership), clock=lambda: NOW)  # type: ignore[arg-type]

    async def run() -> None:
        old = await manager.create("alice", name="x", scope=Scope.tenant("acme"))
        with pytest.raises(KeyNotRotatable, match="does not keep rotations"):
            await manager.rotate("alice", old.info.key_id, revoke_old_on_first_use=True)

    asyncio.run(run())
    statuses = sorted(key.revoked_at is None for key in store.keys_of("alice"))
    assert statuses == [False, True]  # the old key works; the unlinked new one is revoked
