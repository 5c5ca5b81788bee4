"""Old databases of every schema version, holding argon2id hashes, keep their keys working.

Before SHA-256 (D2), keyturn stored an argon2id hash of each secret. For every schema
version from the first to this one, on SQLite, PostgreSQL and async PostgreSQL, a database
is built as that version left it, with keys hashed by argon2-cffi as the old versions did;
today's store opens it (migrating it), and then:

- each key passes; its stored hash is ``sha256$<hex>`` of its secret after its first use,
  and argon2 ran once for it, whatever the requests and authenticators after;
- a key revoked by another instance between its verification and its upgrade stays
  revoked: the upgrade writes the hash only, while the old one is there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest

from keyturn import Authenticator, AuthRequest, Principal, Reason, Refusal
from keyturn._core import token as _token
from keyturn._core.hashing import hash_secret
from keyturn.stores import _schema
from keyturn.stores.sqlite import SQLiteDatabase
from tests.legacy import legacy_hash, legacy_runs
from tests.stores.test_migrations import POSTGRES, SQLITE

VERSIONS = range(1, _schema.SCHEMA_VERSION + 1)
CREATED = datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)
# The key columns of version 1, which every later version keeps.
KEY_COLUMNS = (
    "key_id, secret_hash, hint, name, account_id, tenant_id, organization_id, "
    "created_at, expires_at"
)


@attrs.frozen
class OldKey:
    """A key an old version made: its string, and the argon2id hash stored for it."""

    token: str
    key_id: str
    secret: str
    hint: str
    stored: str

    @classmethod
    def make(cls) -> OldKey:
        new = _token.generate()
        return cls(new.token, new.key_id, new.secret, new.hint, legacy_hash(new.secret))


def build(connection: Any, dialect: _schema.Dialect, version: int, keys: list[OldKey]) -> None:
    """The schema as *version* left it, holding a tenant, its default organization, alice
    (admin there) and *keys* (alice's, organization-scoped), with argon2id hashes."""
    connection.execute(_schema.CREATE_VERSION_TABLE)
    for step in range(1, version + 1):
        for statement in _schema.migration(step, dialect):
            connection.execute(statement)
        connection.execute(f"INSERT INTO keyturn_schema_version VALUES ({step})")  # noqa: S608
    text = dialect.placeholder == "?"

    def instant(at: datetime) -> Any:
        return at.isoformat(timespec="microseconds") if text else at

    mark = dialect.placeholder
    connection.execute(
        "INSERT INTO keyturn_organizations (id, tenant_id, is_default) "
        "VALUES ('org_main', 'acme', TRUE)"
    )
    connection.execute(
        "INSERT INTO keyturn_memberships (account_id, organization_id, role) "
        "VALUES ('alice', 'org_main', 'admin')"
    )
    for key in keys:
        connection.execute(
            f"INSERT INTO keyturn_keys ({KEY_COLUMNS}) "  # noqa: S608
            f"VALUES ({', '.join([mark] * 9)})",
            (
                key.key_id,
                key.stored,
                key.hint,
                "made before SHA-256",
                "alice",
                "acme",
                "org_main",
                instant(CREATED),
                instant(CREATED + timedelta(days=30)),
            ),
        )


@attrs.define
class Opened:
    """An old database opened by today's store: its key store, and how to decide with it."""

    keys: Any  # a sync view of the key store (get_key, revoke_key)
    authenticator: Callable[[Any], Authenticator]  # given a key store (the native one: None)
    decide: Callable[[Authenticator, str], Principal | Refusal]
    version: Callable[[], int]


BACKENDS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("postgres-async", marks=pytest.mark.postgres),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def request_of(token: str) -> AuthRequest:
    return AuthRequest(authorization=(f"Bearer {token}",))


@pytest.fixture
def open_old(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[[int, list[OldKey]], Opened]]:
    """Build an old database of a version with keys, and open it with today's store."""
    closing: list[Callable[[], None]] = []

    def sync_authenticator(native: Any) -> Callable[[Any], Authenticator]:
        def make(store: Any) -> Authenticator:
            auth = Authenticator(store or native.keys, native.membership, usage_interval=None)
            closing.append(auth.close)
            return auth

        return make

    def sync_decide(auth: Authenticator, token: str) -> Principal | Refusal:
        return auth.authenticate(request_of(token))

    def opened(version: int, keys: list[OldKey]) -> Opened:
        if backend == "sqlite":
            import sqlite3

            path = tmp_path / f"v{version}.sqlite3"
            raw = sqlite3.connect(path, isolation_level=None)
            build(raw, SQLITE, version, keys)
            raw.close()
            db = SQLiteDatabase(path)
            closing.append(db.close)
            db.create_schema()
            return Opened(db.keys, sync_authenticator(db), sync_decide, db.schema_version)
        import psycopg

        url = request.getfixturevalue("make_postgres_schema")()
        with psycopg.connect(url, autocommit=True) as raw:
            build(raw, POSTGRES, version, keys)
        if backend == "postgres":
            from keyturn.stores.postgres import PostgresDatabase

            pg = PostgresDatabase(url)
            closing.append(pg.close)
            pg.create_schema()
            return Opened(pg.keys, sync_authenticator(pg), sync_decide, pg.schema_version)
        from keyturn.stores.postgres import AsyncPostgresDatabase
        from tests.stores.conftest import Synced

        runner = asyncio.Runner()
        adb = AsyncPostgresDatabase(url)
        runner.run(adb.open())
        closing.append(runner.close)
        closing.append(lambda: runner.run(adb.close()))
        runner.run(adb.create_schema())

        def make(store: Any) -> Authenticator:
            auth = Authenticator(store or adb.keys, adb.membership, usage_interval=None)
            closing.append(lambda: runner.run(auth.aclose()))
            return auth

        def decide(auth: Authenticator, token: str) -> Principal | Refusal:
            return runner.run(auth.authenticate_async(request_of(token)))

        return Opened(
            Synced(adb.keys, runner), make, decide, lambda: runner.run(adb.schema_version())
        )

    yield opened
    for close in reversed(closing):
        close()


class RevokedMeanwhile:
    """A host's view of the key store whose hash upgrade first lets another instance revoke
    the key (committed before the upgrade is written): the race, made certain."""

    def __init__(self, keys: Any) -> None:
        self.keys = keys

    def get_key(self, key_id: str) -> Any:
        return self.keys.get_key(key_id)

    def upgrade_hash(self, key_id: str, old_hash: str, new_hash: str) -> bool:
        assert self.keys.revoke_key(key_id, datetime.now(UTC))  # the other instance's revoke
        return bool(self.keys.upgrade_hash(key_id, old_hash, new_hash))


class AsyncRevokedMeanwhile(RevokedMeanwhile):
    """The same, over an async key store."""

    async def get_key(self, key_id: str) -> Any:  # type: ignore[override]
        return await self.keys.get_key(key_id)

    async def upgrade_hash(self, key_id: str, old_hash: str, new_hash: str) -> bool:  # type: ignore[override]
        assert await self.keys.revoke_key(key_id, datetime.now(UTC))
        return bool(await self.keys.upgrade_hash(key_id, old_hash, new_hash))


@pytest.mark.parametrize("version", VERSIONS)
def test_an_old_database_keeps_its_keys_working_and_upgrades_each_hash_at_first_use(
    open_old: Callable[[int, list[OldKey]], Opened], version: int
) -> None:
    """Every key of an old database passes; after its first use it holds its SHA-256 hash;
    argon2 ran once per key, across requests and a second authenticator."""
    keys = [OldKey.make(), OldKey.make()]
    db = open_old(version, keys)
    assert db.version() == _schema.SCHEMA_VERSION
    for key in keys:
        stored = db.keys.get_key(key.key_id)
        assert stored is not None and stored.secret_hash == key.stored  # kept as it was

    runs = legacy_runs()
    first = db.authenticator(None)
    for key in keys:
        for _ in range(3):
            assert isinstance(db.decide(first, key.token), Principal)
    assert legacy_runs() == runs + len(keys)
    for key in keys:
        stored = db.keys.get_key(key.key_id)
        assert stored is not None
        assert stored.secret_hash == hash_secret(key.secret)
        assert stored.secret_hash.startswith("sha256$")
    later = db.authenticator(None)  # another instance: it reads the SHA-256 hashes
    for key in keys:
        assert isinstance(db.decide(later, key.token), Principal)
    assert legacy_runs() == runs + len(keys)


@pytest.mark.parametrize("version", [1, _schema.SCHEMA_VERSION])
def test_a_revoke_between_verification_and_upgrade_wins(
    open_old: Callable[[int, list[OldKey]], Opened], backend: str, version: int
) -> None:
    """A key of an old database, revoked by another instance after its argon2 verification
    and before its upgrade is written: the upgrade changes the hash only, so the key stays
    revoked, and is refused from the next request on."""
    key = OldKey.make()
    db = open_old(version, [key])
    native = db.keys if backend != "postgres-async" else db.keys._target
    racing = (AsyncRevokedMeanwhile if backend == "postgres-async" else RevokedMeanwhile)(native)
    # It read the key before the revoke: this request's pass is fair (as any in flight).
    assert isinstance(db.decide(db.authenticator(racing), key.token), Principal)

    stored = db.keys.get_key(key.key_id)
    assert stored is not None
    assert stored.revoked_at is not None  # the revoke stands
    assert stored.secret_hash == hash_secret(key.secret)  # and the hash was replaced alone
    for auth in (db.authenticator(racing), db.authenticator(None)):
        refused = db.decide(auth, key.token)
        assert isinstance(refused, Refusal) and refused.reason is Reason.REVOKED
