"""The SQL behind the SQLite and PostgreSQL stores: one schema, one set of statements.

Rules of this file:

1. Every operation is a generator in the style of ``_decision.py``: it yields :class:`Query`
   objects and receives their results. The SQLite driver, the psycopg driver and the async
   psycopg driver each run these same operations in a dozen lines, so the three stores
   cannot drift apart, and sync and async never duplicate logic.
2. Statements use ``%s`` placeholders (the SQLite driver rewrites them to ``?``) and only
   SQL that both databases speak. The few differences (the timestamp column type, how to
   ask whether a table exists) are a :class:`Dialect`.
3. Instants go in as UTC datetimes and come out as UTC-aware datetimes, microseconds kept:
   PostgreSQL stores ``timestamptz``; SQLite stores fixed-width ISO 8601 text in UTC, which
   sorts and compares as the instants do.
4. No secret ever reaches this file: a key row holds the argon2id hash and the hint.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple, Protocol, Self, TypeVar

from keyturn._model import ApiKey, Leaked, Organization, Scope
from keyturn.errors import (
    DuplicateKey,
    NotAKeyDatabase,
    OrganizationConflict,
    SchemaTooNew,
    UnknownOrganization,
)

__all__ = [
    "SCHEMA_VERSION",
    "AsyncSQLKeyStore",
    "AsyncSQLMembership",
    "Dialect",
    "Query",
    "SQLKeyStore",
    "SQLMembership",
    "drive",
]

T = TypeVar("T")

# What a driver hands back for a query: the first row, every row, or the rowcount.
ONE: Final = "one"
ALL: Final = "all"
COUNT: Final = "count"


class Query(NamedTuple):
    sql: str
    params: tuple[Any, ...]
    fetch: str  # ONE, ALL or COUNT


Op = Generator[Query, Any, T]


class Dialect(NamedTuple):
    """What differs between the databases: the type of an instant column, catalog queries."""

    timestamp: str  # column type for instants
    has_version_table: str  # one row, one column: truthy when keyturn_schema_version exists
    # One row, one column: truthy when the database holds tables that are not keyturn's.
    # None where sharing a database with the application's tables is normal (PostgreSQL).
    has_foreign_tables: str | None = None


def drive(execute: Callable[[Query], Any], op: Op[T]) -> T:
    """Run *op*, sending each query to *execute* (which returns a DB-API cursor).

    The sync driver of every store; the async one is its twin in ``postgres.py``.
    """
    answer: Any = None
    try:
        while True:
            query = op.send(answer)
            cursor = execute(query)
            if query.fetch == ONE:
                answer = cursor.fetchone()
            elif query.fetch == ALL:
                answer = cursor.fetchall()
            else:
                answer = cursor.rowcount
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


# --- the schema ---------------------------------------------------------------------------

# Each entry upgrades the schema by one version; never edit a released entry, append one.
MIGRATIONS: Final[Sequence[Sequence[str]]] = (
    (
        """CREATE TABLE keyturn_keys (
            key_id          TEXT PRIMARY KEY,
            secret_hash     TEXT NOT NULL,
            hint            TEXT NOT NULL,
            name            TEXT NOT NULL,
            account_id      TEXT NOT NULL,
            tenant_id       TEXT NOT NULL,
            organization_id TEXT,
            created_at      {timestamp} NOT NULL,
            expires_at      {timestamp} NOT NULL,
            revoked_at      {timestamp},
            last_used_at    {timestamp}
        )""",
        "CREATE INDEX keyturn_keys_by_account ON keyturn_keys (account_id, created_at)",
        """CREATE TABLE keyturn_organizations (
            id         TEXT PRIMARY KEY,
            tenant_id  TEXT NOT NULL,
            is_default BOOLEAN NOT NULL DEFAULT FALSE
        )""",
        # At most one default organization per tenant, whatever writes to the table.
        """CREATE UNIQUE INDEX keyturn_organizations_one_default
            ON keyturn_organizations (tenant_id) WHERE is_default""",
        """CREATE TABLE keyturn_memberships (
            account_id      TEXT NOT NULL,
            organization_id TEXT NOT NULL
                REFERENCES keyturn_organizations (id) ON DELETE CASCADE,
            role            TEXT NOT NULL,
            PRIMARY KEY (account_id, organization_id)
        )""",
        """CREATE INDEX keyturn_memberships_by_organization
            ON keyturn_memberships (organization_id)""",
    ),
    (
        # Version 2: where and when a code host's secret scanning first saw a key in public.
        "ALTER TABLE keyturn_keys ADD COLUMN leaked_at {timestamp}",
        "ALTER TABLE keyturn_keys ADD COLUMN leaked_url TEXT",
        """CREATE INDEX keyturn_keys_leaked
            ON keyturn_keys (leaked_at) WHERE leaked_at IS NOT NULL""",
    ),
    (
        # Version 3: rotation. A replacement names the key it replaces, and carries the
        # creator's choice to revoke that key once the replacement's first use is recorded;
        # every key keeps its first recorded use, the confirmation that it works.
        "ALTER TABLE keyturn_keys ADD COLUMN replaces TEXT",
        "ALTER TABLE keyturn_keys ADD COLUMN first_used_at {timestamp}",
        """ALTER TABLE keyturn_keys
            ADD COLUMN revoke_old_on_first_use BOOLEAN NOT NULL DEFAULT FALSE""",
    ),
)
SCHEMA_VERSION: Final = len(MIGRATIONS)

_CREATE_VERSION_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS keyturn_schema_version (version INTEGER PRIMARY KEY)"
)
_SELECT_VERSION: Final = "SELECT coalesce(max(version), 0) FROM keyturn_schema_version"
_INSERT_VERSION: Final = "INSERT INTO keyturn_schema_version (version) VALUES (%s)"


def migrate(dialect: Dialect) -> Op[int]:
    """Bring the schema up to :data:`SCHEMA_VERSION`; the driver runs it in one transaction.

    :raises NotAKeyDatabase: the database has no keyturn schema but other tables (SQLite).
    :raises SchemaTooNew: the schema is newer than this version of keyturn knows.
    """
    current = yield from schema_version(dialect)
    if current == 0 and dialect.has_foreign_tables is not None:
        (foreign,) = yield Query(dialect.has_foreign_tables, (), ONE)
        if foreign:
            raise NotAKeyDatabase(
                "this database holds other tables and no keyturn schema: "
                "point keyturn at a file of its own"
            )
    yield Query(_CREATE_VERSION_TABLE, (), COUNT)
    for version in range(current + 1, SCHEMA_VERSION + 1):
        for statement in MIGRATIONS[version - 1]:
            yield Query(statement.format(timestamp=dialect.timestamp), (), COUNT)
        yield Query(_INSERT_VERSION, (version,), COUNT)
    return SCHEMA_VERSION


def schema_version(dialect: Dialect) -> Op[int]:
    """The schema version in the database, 0 when it has no keyturn tables; creates nothing."""
    (exists,) = yield Query(dialect.has_version_table, (), ONE)
    if not exists:
        return 0
    (version,) = yield Query(_SELECT_VERSION, (), ONE)
    _check_version(version)
    return int(version)


def _check_version(version: int) -> None:
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"the database holds keyturn schema version {version}, newer than the "
            f"{SCHEMA_VERSION} this version of keyturn knows: upgrade keyturn"
        )


# --- keys ---------------------------------------------------------------------------------

# A key row's columns, in the order _key() reads them (the f-strings join constants only).
_KEY_COLUMNS: Final = (
    "key_id, secret_hash, hint, name, account_id, tenant_id, organization_id, created_at, "
    "expires_at, revoked_at, last_used_at, leaked_at, leaked_url, replaces, "
    "revoke_old_on_first_use, first_used_at"
)
_SELECT_KEY: Final = f"SELECT {_KEY_COLUMNS} FROM keyturn_keys WHERE key_id = %s"  # noqa: S608
# key_id breaks ties so that keys created in the same microsecond list in a stable order.
_SELECT_KEYS_OF: Final = (
    f"SELECT {_KEY_COLUMNS} FROM keyturn_keys "  # noqa: S608
    "WHERE account_id = %s ORDER BY created_at DESC, key_id DESC"
)
# ON CONFLICT DO NOTHING + rowcount: a duplicate id is an answer, not a driver exception.
_INSERT_KEY: Final = (
    f"INSERT INTO keyturn_keys ({_KEY_COLUMNS}) "  # noqa: S608
    f"VALUES ({', '.join(['%s'] * 16)}) ON CONFLICT DO NOTHING"
)
# Conditional updates: only one concurrent revoke wins, and last_used_at never moves back.
_REVOKE_KEY: Final = (
    "UPDATE keyturn_keys SET revoked_at = %s WHERE key_id = %s AND revoked_at IS NULL"
)
# One statement writes the use (first_used_at only the first time) and, when the creator
# asked for it at rotation, revokes the key this one replaces: both rows change together or
# not at all, in either database. The old key is revoked at the instant of the use, unless
# it is already Revoked or Expired.
# Each side of the OR is a primary-key lookup, in both databases: no scan.
_MARK_USED: Final = """
    UPDATE keyturn_keys SET
        last_used_at = CASE WHEN key_id = %s THEN %s ELSE last_used_at END,
        first_used_at = CASE WHEN key_id = %s THEN coalesce(first_used_at, %s)
            ELSE first_used_at END,
        revoked_at = CASE WHEN key_id = %s THEN revoked_at ELSE %s END
    WHERE (key_id = %s AND (last_used_at IS NULL OR last_used_at < %s))
       OR (revoked_at IS NULL AND expires_at > %s AND key_id = (
            SELECT replaces FROM keyturn_keys WHERE key_id = %s AND revoke_old_on_first_use))
"""


def _utc(at: datetime) -> datetime:
    return at.astimezone(UTC)


def _instant(value: datetime | str) -> datetime:
    if isinstance(value, str):  # SQLite: ISO 8601 text written by the driver, always UTC
        return datetime.fromisoformat(value)
    return value if value.tzinfo is UTC else value.astimezone(UTC)


def _key(row: Sequence[Any]) -> ApiKey:
    (key_id, secret_hash, hint, name, account_id, tenant_id, organization_id) = row[:7]
    created_at, expires_at, revoked_at, last_used_at, leaked_at, leaked_url = row[7:13]
    replaces, revoke_old_on_first_use, first_used_at = row[13:]
    return ApiKey(
        key_id=key_id,
        secret_hash=secret_hash,
        hint=hint,
        name=name,
        account_id=account_id,
        scope=Scope(tenant_id=tenant_id, organization_id=organization_id),
        created_at=_instant(created_at),
        expires_at=_instant(expires_at),
        revoked_at=None if revoked_at is None else _instant(revoked_at),
        last_used_at=None if last_used_at is None else _instant(last_used_at),
        first_used_at=None if first_used_at is None else _instant(first_used_at),
        leaked=None if leaked_at is None else Leaked(url=leaked_url, at=_instant(leaked_at)),
        replaces=replaces,
        revoke_old_on_first_use=bool(revoke_old_on_first_use),
    )


def get_key(key_id: str) -> Op[ApiKey | None]:
    row = yield Query(_SELECT_KEY, (key_id,), ONE)
    return None if row is None else _key(row)


def add_key(key: ApiKey) -> Op[None]:
    inserted = yield Query(
        _INSERT_KEY,
        (
            key.key_id,
            key.secret_hash,
            key.hint,
            key.name,
            key.account_id,
            key.scope.tenant_id,
            key.scope.organization_id,
            _utc(key.created_at),
            _utc(key.expires_at),
            None if key.revoked_at is None else _utc(key.revoked_at),
            None if key.last_used_at is None else _utc(key.last_used_at),
            None if key.leaked is None else _utc(key.leaked.at),
            None if key.leaked is None else key.leaked.url,
            key.replaces,
            key.revoke_old_on_first_use,
            None if key.first_used_at is None else _utc(key.first_used_at),
        ),
        COUNT,
    )
    if not inserted:
        raise DuplicateKey(f"a key with id {key.key_id!r} already exists")


def keys_of(account_id: str) -> Op[list[ApiKey]]:
    rows = yield Query(_SELECT_KEYS_OF, (account_id,), ALL)
    return [_key(row) for row in rows]


def revoke_key(key_id: str, at: datetime) -> Op[bool]:
    revoked = yield Query(_REVOKE_KEY, (_utc(at), key_id), COUNT)
    return bool(revoked == 1)


def mark_used(key_id: str, at: datetime) -> Op[None]:
    at = _utc(at)
    yield Query(_MARK_USED, (key_id, at, key_id, at, key_id, at, key_id, at, at, key_id), COUNT)


# --- organizations and memberships --------------------------------------------------------

_SELECT_ORGANIZATION: Final = (
    "SELECT id, tenant_id, is_default FROM keyturn_organizations WHERE id = %s"
)
_SELECT_DEFAULT_ORGANIZATION: Final = (
    "SELECT id, tenant_id, is_default FROM keyturn_organizations "
    "WHERE tenant_id = %s AND is_default"
)
# Without a conflict target, this also does nothing when the tenant already has a default.
_INSERT_ORGANIZATION: Final = (
    "INSERT INTO keyturn_organizations (id, tenant_id, is_default) VALUES (%s, %s, %s) "
    "ON CONFLICT DO NOTHING"
)
_SELECT_ROLE: Final = (
    "SELECT role FROM keyturn_memberships WHERE account_id = %s AND organization_id = %s"
)
_REACHES_TENANT: Final = (
    "SELECT 1 FROM keyturn_memberships m "
    "JOIN keyturn_organizations o ON o.id = m.organization_id "
    "WHERE m.account_id = %s AND o.tenant_id = %s LIMIT 1"
)
# Inserts nothing when the organization does not exist: rowcount 0 says so.
_UPSERT_MEMBERSHIP: Final = (
    "INSERT INTO keyturn_memberships (account_id, organization_id, role) "
    "SELECT %s, id, %s FROM keyturn_organizations WHERE id = %s "
    "ON CONFLICT (account_id, organization_id) DO UPDATE SET role = excluded.role"
)
_DELETE_MEMBERSHIP: Final = (
    "DELETE FROM keyturn_memberships WHERE account_id = %s AND organization_id = %s"
)


def _organization(row: Sequence[Any] | None) -> Organization | None:
    if row is None:
        return None
    return Organization(id=row[0], tenant_id=row[1], is_default=bool(row[2]))


def get_organization(organization_id: str) -> Op[Organization | None]:
    return _organization((yield Query(_SELECT_ORGANIZATION, (organization_id,), ONE)))


def get_default_organization(tenant_id: str) -> Op[Organization | None]:
    return _organization((yield Query(_SELECT_DEFAULT_ORGANIZATION, (tenant_id,), ONE)))


def get_role(account_id: str, organization_id: str) -> Op[str | None]:
    row = yield Query(_SELECT_ROLE, (account_id, organization_id), ONE)
    return None if row is None else str(row[0])


def reaches_tenant(account_id: str, tenant_id: str) -> Op[bool]:
    return (yield Query(_REACHES_TENANT, (account_id, tenant_id), ONE)) is not None


def add_organization(organization: Organization) -> Op[Organization]:
    inserted = yield Query(
        _INSERT_ORGANIZATION,
        (organization.id, organization.tenant_id, organization.is_default),
        COUNT,
    )
    if not inserted:
        known = _organization((yield Query(_SELECT_ORGANIZATION, (organization.id,), ONE)))
        if known is None:
            raise OrganizationConflict(
                f"tenant {organization.tenant_id!r} already has a default organization"
            )
        if known != organization:
            raise OrganizationConflict(
                f"organization {organization.id!r} already exists differently"
            )
    return organization


def add_member(account_id: str, organization_id: str, role: str) -> Op[None]:
    if not isinstance(role, str) or not role:
        raise ValueError("role must be a non-empty string")
    added = yield Query(_UPSERT_MEMBERSHIP, (account_id, role, organization_id), COUNT)
    if not added:
        raise UnknownOrganization(f"no organization {organization_id!r}: add it first")


def remove_member(account_id: str, organization_id: str) -> Op[None]:
    yield Query(_DELETE_MEMBERSHIP, (account_id, organization_id), COUNT)


_SELECT_ORGANIZATIONS: Final = (
    "SELECT id, tenant_id, is_default FROM keyturn_organizations ORDER BY tenant_id, id"
)
# Memberships go with the organization: ON DELETE CASCADE.
_DELETE_ORGANIZATION: Final = "DELETE FROM keyturn_organizations WHERE id = %s"
_SELECT_MEMBERS: Final = (
    "SELECT account_id, role FROM keyturn_memberships WHERE organization_id = %s "
    "ORDER BY account_id"
)


def organizations() -> Op[list[Organization]]:
    rows = yield Query(_SELECT_ORGANIZATIONS, (), ALL)
    return [Organization(id=row[0], tenant_id=row[1], is_default=bool(row[2])) for row in rows]


def remove_organization(organization_id: str) -> Op[bool]:
    return bool((yield Query(_DELETE_ORGANIZATION, (organization_id,), COUNT)))


def members_of(organization_id: str) -> Op[list[tuple[str, str]]]:
    rows = yield Query(_SELECT_MEMBERS, (organization_id,), ALL)
    return [(str(account), str(role)) for account, role in rows]


_ORGANIZATIONS_OF: Final = (
    "SELECT o.id, o.tenant_id, o.is_default FROM keyturn_memberships m "
    "JOIN keyturn_organizations o ON o.id = m.organization_id "
    "WHERE m.account_id = %s ORDER BY o.tenant_id, o.is_default DESC, o.id"
)


def organizations_of(account_id: str) -> Op[list[Organization]]:
    rows = yield Query(_ORGANIZATIONS_OF, (account_id,), ALL)
    return [Organization(id=row[0], tenant_id=row[1], is_default=bool(row[2])) for row in rows]


# --- leaks (see keyturn.leaks) ---------------------------------------------------------------

# The first report stands: it says when the key became public; later ones change nothing.
_REPORT_LEAK: Final = (
    "UPDATE keyturn_keys SET leaked_at = %s, leaked_url = %s "
    "WHERE key_id = %s AND leaked_at IS NULL"
)
_SELECT_LEAKED: Final = (
    f"SELECT {_KEY_COLUMNS} FROM keyturn_keys "  # noqa: S608
    "WHERE leaked_at IS NOT NULL ORDER BY leaked_at DESC, key_id DESC"
)


def report_leak(key_id: str, url: str, at: datetime) -> Op[bool]:
    return bool((yield Query(_REPORT_LEAK, (_utc(at), url, key_id), COUNT)) == 1)


def leaked_keys() -> Op[list[ApiKey]]:
    rows = yield Query(_SELECT_LEAKED, (), ALL)
    return [_key(row) for row in rows]


# --- the stores, over a driver --------------------------------------------------------------


class ClosedOnExit:
    """``with database:`` closes the database at the end of the block."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Runner(Protocol):
    """Runs one operation on a connection (a database's ``run`` method)."""

    def __call__(self, op: Op[T]) -> T: ...


class AsyncRunner(Protocol):
    def __call__(self, op: Op[T]) -> Awaitable[T]: ...


class _OnDatabase:
    """A view of a database whose ``run`` drives the operations above."""

    def __init__(self, database: Any) -> None:
        self.database = database
        self._run: Any = database.run
        # SQLite bounds its own calls (busy timeout): no watchdog thread around them.
        self.enforces_timeout: bool = getattr(database, "enforces_timeout", False)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.database!r})"


class SQLKeyStore(_OnDatabase):
    """A :class:`~keyturn.protocols.KeyStore` in a SQL database: ``db.keys``."""

    _run: Runner

    def get_key(self, key_id: str) -> ApiKey | None:
        return self._run(get_key(key_id))

    def add_key(self, key: ApiKey) -> None:
        self._run(add_key(key))

    def keys_of(self, account_id: str) -> Sequence[ApiKey]:
        return self._run(keys_of(account_id))

    def revoke_key(self, key_id: str, at: datetime) -> bool:
        return self._run(revoke_key(key_id, at))

    def mark_used(self, key_id: str, at: datetime) -> None:
        self._run(mark_used(key_id, at))

    def report_leak(self, key_id: str, url: str, at: datetime) -> bool:
        """Record that the key was found in public at *url*; ``False`` if already recorded."""
        return self._run(report_leak(key_id, url, at))

    def leaked_keys(self) -> list[ApiKey]:
        """Every key reported leaked, most recently reported first."""
        return self._run(leaked_keys())


class SQLMembership(_OnDatabase):
    """A :class:`~keyturn.protocols.WritableMembership` in a SQL database: ``db.membership``.

    Tables ``keyturn_organizations`` (``id``, ``tenant_id``, ``is_default``; at most one
    default per tenant) and ``keyturn_memberships`` (``account_id``, ``organization_id``,
    ``role``). A reference implementation: replace it with a provider over your own tables
    whenever your application already knows who belongs where.
    """

    _run: Runner

    def add_organization(
        self, organization_id: str, *, tenant_id: str, default: bool = False
    ) -> Organization:
        """Add an organization; ``default=True`` makes it the tenant's ``default`` one.

        :raises OrganizationConflict: it exists differently, or the tenant has a default.
        """
        organization = Organization(id=organization_id, tenant_id=tenant_id, is_default=default)
        return self._run(add_organization(organization))

    def add_member(self, account_id: str, organization_id: str, *, role: str) -> None:
        """Give *account_id* a *role* in the organization (replacing any previous role).

        :raises UnknownOrganization: there is no such organization.
        """
        self._run(add_member(account_id, organization_id, role))

    def remove_member(self, account_id: str, organization_id: str) -> None:
        """Take the account's role in the organization away (nothing if it had none)."""
        self._run(remove_member(account_id, organization_id))

    def get_organization(self, organization_id: str) -> Organization | None:
        return self._run(get_organization(organization_id))

    def get_default_organization(self, tenant_id: str) -> Organization | None:
        return self._run(get_default_organization(tenant_id))

    def get_role(self, account_id: str, organization_id: str) -> str | None:
        return self._run(get_role(account_id, organization_id))

    def reaches_tenant(self, account_id: str, tenant_id: str) -> bool:
        return self._run(reaches_tenant(account_id, tenant_id))

    def organizations(self) -> list[Organization]:
        """Every organization, by tenant and id."""
        return self._run(organizations())

    def remove_organization(self, organization_id: str) -> bool:
        """Remove the organization and its memberships; ``False`` if there was none."""
        return self._run(remove_organization(organization_id))

    def members_of(self, organization_id: str) -> list[tuple[str, str]]:
        """The ``(account_id, role)`` pairs of the organization, by account."""
        return self._run(members_of(organization_id))

    def organizations_of(self, account_id: str) -> Sequence[Organization]:
        """Every organization in which the account holds a role, by tenant, default first."""
        return self._run(organizations_of(account_id))


class AsyncSQLKeyStore(_OnDatabase):
    """The async twin of :class:`SQLKeyStore`."""

    _run: AsyncRunner

    async def get_key(self, key_id: str) -> ApiKey | None:
        return await self._run(get_key(key_id))

    async def add_key(self, key: ApiKey) -> None:
        await self._run(add_key(key))

    async def keys_of(self, account_id: str) -> Sequence[ApiKey]:
        return await self._run(keys_of(account_id))

    async def revoke_key(self, key_id: str, at: datetime) -> bool:
        return await self._run(revoke_key(key_id, at))

    async def mark_used(self, key_id: str, at: datetime) -> None:
        await self._run(mark_used(key_id, at))

    async def report_leak(self, key_id: str, url: str, at: datetime) -> bool:
        return await self._run(report_leak(key_id, url, at))

    async def leaked_keys(self) -> list[ApiKey]:
        return await self._run(leaked_keys())


class AsyncSQLMembership(_OnDatabase):
    """The async twin of :class:`SQLMembership`."""

    _run: AsyncRunner

    async def add_organization(
        self, organization_id: str, *, tenant_id: str, default: bool = False
    ) -> Organization:
        organization = Organization(id=organization_id, tenant_id=tenant_id, is_default=default)
        return await self._run(add_organization(organization))

    async def add_member(self, account_id: str, organization_id: str, *, role: str) -> None:
        await self._run(add_member(account_id, organization_id, role))

    async def remove_member(self, account_id: str, organization_id: str) -> None:
        await self._run(remove_member(account_id, organization_id))

    async def get_organization(self, organization_id: str) -> Organization | None:
        return await self._run(get_organization(organization_id))

    async def get_default_organization(self, tenant_id: str) -> Organization | None:
        return await self._run(get_default_organization(tenant_id))

    async def get_role(self, account_id: str, organization_id: str) -> str | None:
        return await self._run(get_role(account_id, organization_id))

    async def reaches_tenant(self, account_id: str, tenant_id: str) -> bool:
        return await self._run(reaches_tenant(account_id, tenant_id))

    async def organizations(self) -> list[Organization]:
        return await self._run(organizations())

    async def remove_organization(self, organization_id: str) -> bool:
        return await self._run(remove_organization(organization_id))

    async def members_of(self, organization_id: str) -> list[tuple[str, str]]:
        return await self._run(members_of(organization_id))

    async def organizations_of(self, account_id: str) -> Sequence[Organization]:
        return await self._run(organizations_of(account_id))
