"""The SQL behind the SQLite and PostgreSQL stores: one schema, one set of statements.

Rules of this file:

1. Every operation is a generator in the style of ``_decision.py``: it yields :class:`Query`
   objects and receives their results. The SQLite driver, the psycopg driver and the async
   psycopg driver each run these same operations in a dozen lines, and each store method,
   sync or async, is made from its operation (:func:`_sync`, :func:`_async`), so the three
   stores cannot drift apart, and sync and async never duplicate logic.
2. Statements use ``%s`` placeholders (the SQLite driver rewrites them to ``?``) and only
   SQL that both databases speak. The few differences (the timestamp column type, how to
   ask whether a table exists) are a :class:`Dialect`.
3. Instants go in as UTC datetimes and come out as UTC-aware datetimes, microseconds kept:
   PostgreSQL stores ``timestamptz``; SQLite stores fixed-width ISO 8601 text in UTC, which
   sorts and compares as the instants do.
4. No secret ever reaches this file: a key row holds the argon2id hash and the hint.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Generator, Sequence
from datetime import UTC, datetime
from typing import Any, Concatenate, Final, NamedTuple, ParamSpec, Self, TypeVar

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
P = ParamSpec("P")
M = TypeVar("M", bound=Callable[..., Any])

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
        yield Query("INSERT INTO keyturn_schema_version (version) VALUES (%s)", (version,), COUNT)
    return SCHEMA_VERSION


def schema_version(dialect: Dialect) -> Op[int]:
    """The schema version in the database, 0 when it has no keyturn tables; creates nothing."""
    (exists,) = yield Query(dialect.has_version_table, (), ONE)
    if not exists:
        return 0
    (version,) = yield Query(
        "SELECT coalesce(max(version), 0) FROM keyturn_schema_version", (), ONE
    )
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"the database holds keyturn schema version {version}, newer than the "
            f"{SCHEMA_VERSION} this version of keyturn knows: upgrade keyturn"
        )
    return int(version)


# --- keys ---------------------------------------------------------------------------------

# A key row's columns, in the order _key() reads them (the f-strings join constants only).
_KEY_COLUMNS: Final = (
    "key_id, secret_hash, hint, name, account_id, tenant_id, organization_id, created_at, "
    "expires_at, revoked_at, last_used_at, leaked_at, leaked_url, replaces, "
    "revoke_old_on_first_use, first_used_at"
)
_SELECT_KEYS: Final = f"SELECT {_KEY_COLUMNS} FROM keyturn_keys"  # noqa: S608
_SELECT_KEY: Final = f"{_SELECT_KEYS} WHERE key_id = %s"
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


def _utc(at: datetime | None) -> datetime | None:
    return None if at is None else at.astimezone(UTC)


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
    # ON CONFLICT DO NOTHING + rowcount: a duplicate id is an answer, not a driver exception.
    inserted = yield Query(
        f"INSERT INTO keyturn_keys ({_KEY_COLUMNS}) "  # noqa: S608
        f"VALUES ({', '.join(['%s'] * 16)}) ON CONFLICT DO NOTHING",
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
            _utc(key.revoked_at),
            _utc(key.last_used_at),
            None if key.leaked is None else _utc(key.leaked.at),
            None if key.leaked is None else key.leaked.url,
            key.replaces,
            key.revoke_old_on_first_use,
            _utc(key.first_used_at),
        ),
        COUNT,
    )
    if not inserted:
        raise DuplicateKey(f"a key with id {key.key_id!r} already exists")


def keys_of(account_id: str) -> Op[Sequence[ApiKey]]:
    # key_id breaks ties so that keys created in the same microsecond list in a stable order.
    rows = yield Query(
        f"{_SELECT_KEYS} WHERE account_id = %s ORDER BY created_at DESC, key_id DESC",
        (account_id,),
        ALL,
    )
    return [_key(row) for row in rows]


def revoke_key(key_id: str, at: datetime) -> Op[bool]:
    # Conditional updates: only one concurrent revoke wins, and last_used_at never moves back.
    revoked = yield Query(
        "UPDATE keyturn_keys SET revoked_at = %s WHERE key_id = %s AND revoked_at IS NULL",
        (_utc(at), key_id),
        COUNT,
    )
    return bool(revoked == 1)


def mark_used(key_id: str, at: datetime) -> Op[None]:
    utc = _utc(at)
    yield Query(
        _MARK_USED, (key_id, utc, key_id, utc, key_id, utc, key_id, utc, utc, key_id), COUNT
    )


def report_leak(key_id: str, url: str, at: datetime) -> Op[bool]:
    """Record that the key was found in public at *url*; ``False`` if already recorded."""
    # The first report stands: it says when the key became public; later ones change nothing.
    reported = yield Query(
        "UPDATE keyturn_keys SET leaked_at = %s, leaked_url = %s "
        "WHERE key_id = %s AND leaked_at IS NULL",
        (_utc(at), url, key_id),
        COUNT,
    )
    return bool(reported == 1)


def leaked_keys() -> Op[list[ApiKey]]:
    """Every key reported leaked, most recently reported first."""
    rows = yield Query(
        f"{_SELECT_KEYS} WHERE leaked_at IS NOT NULL ORDER BY leaked_at DESC, key_id DESC", (), ALL
    )
    return [_key(row) for row in rows]


# --- organizations and memberships --------------------------------------------------------


def _organization(row: Sequence[Any]) -> Organization:
    return Organization(id=row[0], tenant_id=row[1], is_default=bool(row[2]))


def get_organization(organization_id: str) -> Op[Organization | None]:
    row = yield Query(
        "SELECT id, tenant_id, is_default FROM keyturn_organizations WHERE id = %s",
        (organization_id,),
        ONE,
    )
    return None if row is None else _organization(row)


def get_default_organization(tenant_id: str) -> Op[Organization | None]:
    row = yield Query(
        "SELECT id, tenant_id, is_default FROM keyturn_organizations "
        "WHERE tenant_id = %s AND is_default",
        (tenant_id,),
        ONE,
    )
    return None if row is None else _organization(row)


def get_role(account_id: str, organization_id: str) -> Op[str | None]:
    row = yield Query(
        "SELECT role FROM keyturn_memberships WHERE account_id = %s AND organization_id = %s",
        (account_id, organization_id),
        ONE,
    )
    return None if row is None else str(row[0])


def reaches_tenant(account_id: str, tenant_id: str) -> Op[bool]:
    row = yield Query(
        "SELECT 1 FROM keyturn_memberships m "
        "JOIN keyturn_organizations o ON o.id = m.organization_id "
        "WHERE m.account_id = %s AND o.tenant_id = %s LIMIT 1",
        (account_id, tenant_id),
        ONE,
    )
    return row is not None


def add_organization(
    organization_id: str, *, tenant_id: str, default: bool = False
) -> Op[Organization]:
    """Add an organization; ``default=True`` makes it the tenant's ``default`` one.

    :raises OrganizationConflict: it exists differently, or the tenant has a default.
    """
    # Built before the operation runs: invalid ids are refused without touching the database.
    return _add_organization(
        Organization(id=organization_id, tenant_id=tenant_id, is_default=default)
    )


def _add_organization(organization: Organization) -> Op[Organization]:
    # Without a conflict target, this also does nothing when the tenant already has a default.
    inserted = yield Query(
        "INSERT INTO keyturn_organizations (id, tenant_id, is_default) VALUES (%s, %s, %s) "
        "ON CONFLICT DO NOTHING",
        (organization.id, organization.tenant_id, organization.is_default),
        COUNT,
    )
    if not inserted:
        known = yield from get_organization(organization.id)
        if known is None:
            raise OrganizationConflict(
                f"tenant {organization.tenant_id!r} already has a default organization"
            )
        if known != organization:
            raise OrganizationConflict(
                f"organization {organization.id!r} already exists differently"
            )
    return organization


def add_member(account_id: str, organization_id: str, *, role: str) -> Op[None]:
    """Give *account_id* a *role* in the organization (replacing any previous role).

    :raises UnknownOrganization: there is no such organization.
    """
    if not isinstance(role, str) or not role:
        raise ValueError("role must be a non-empty string")
    # Inserts nothing when the organization does not exist: rowcount 0 says so.
    added = yield Query(
        "INSERT INTO keyturn_memberships (account_id, organization_id, role) "
        "SELECT %s, id, %s FROM keyturn_organizations WHERE id = %s "
        "ON CONFLICT (account_id, organization_id) DO UPDATE SET role = excluded.role",
        (account_id, role, organization_id),
        COUNT,
    )
    if not added:
        raise UnknownOrganization(f"no organization {organization_id!r}: add it first")


def remove_member(account_id: str, organization_id: str) -> Op[None]:
    """Take the account's role in the organization away (nothing if it had none)."""
    yield Query(
        "DELETE FROM keyturn_memberships WHERE account_id = %s AND organization_id = %s",
        (account_id, organization_id),
        COUNT,
    )


def organizations() -> Op[list[Organization]]:
    """Every organization, by tenant and id."""
    rows = yield Query(
        "SELECT id, tenant_id, is_default FROM keyturn_organizations ORDER BY tenant_id, id",
        (),
        ALL,
    )
    return [_organization(row) for row in rows]


def remove_organization(organization_id: str) -> Op[bool]:
    """Remove the organization and its memberships; ``False`` if there was none."""
    # Memberships go with the organization: ON DELETE CASCADE.
    query = Query("DELETE FROM keyturn_organizations WHERE id = %s", (organization_id,), COUNT)
    return bool((yield query))


def members_of(organization_id: str) -> Op[list[tuple[str, str]]]:
    """The ``(account_id, role)`` pairs of the organization, by account."""
    rows = yield Query(
        "SELECT account_id, role FROM keyturn_memberships WHERE organization_id = %s "
        "ORDER BY account_id",
        (organization_id,),
        ALL,
    )
    return [(str(account), str(role)) for account, role in rows]


def organizations_of(account_id: str) -> Op[Sequence[Organization]]:
    """Every organization in which the account holds a role, by tenant, default first."""
    rows = yield Query(
        "SELECT o.id, o.tenant_id, o.is_default FROM keyturn_memberships m "
        "JOIN keyturn_organizations o ON o.id = m.organization_id "
        "WHERE m.account_id = %s ORDER BY o.tenant_id, o.is_default DESC, o.id",
        (account_id,),
        ALL,
    )
    return [_organization(row) for row in rows]


# --- the stores, over a driver --------------------------------------------------------------


class ClosedOnExit:
    """``with database:`` closes the database at the end of the block."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _OnDatabase:
    """A view of a database whose ``run`` drives the operations above."""

    def __init__(self, database: Any) -> None:
        self.database = database
        self._run: Any = database.run
        # SQLite bounds its own calls (busy timeout): no watchdog thread around them.
        self.enforces_timeout: bool = getattr(database, "enforces_timeout", False)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.database!r})"


def _sync(op: Callable[P, Op[T]]) -> Callable[Concatenate[_OnDatabase, P], T]:
    """The store method that runs *op* on the database."""

    def method(self: _OnDatabase, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(op(*args, **kwargs))  # type: ignore[no-any-return]

    return _named(method, op)


def _async(op: Callable[P, Op[T]]) -> Callable[Concatenate[_OnDatabase, P], Coroutine[Any, Any, T]]:
    """The async store method that runs *op* on the database."""

    async def method(self: _OnDatabase, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run(op(*args, **kwargs))  # type: ignore[no-any-return]

    return _named(method, op)


def _named(method: M, op: Callable[..., Any]) -> M:
    """*method* as ``help()`` and ``inspect`` should show it: *op*'s name, docstring and
    parameters, after ``self``.
    """
    signature = inspect.signature(op)
    self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    method.__name__ = method.__qualname__ = op.__name__
    method.__doc__ = op.__doc__
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self, *signature.parameters.values()],
        return_annotation=inspect.Signature.empty,  # the operation's is a generator's
    )
    return method


class SQLKeyStore(_OnDatabase):
    """A :class:`~keyturn.protocols.KeyStore` in a SQL database: ``db.keys``."""

    get_key = _sync(get_key)
    add_key = _sync(add_key)
    keys_of = _sync(keys_of)
    revoke_key = _sync(revoke_key)
    mark_used = _sync(mark_used)
    report_leak = _sync(report_leak)
    leaked_keys = _sync(leaked_keys)


class SQLMembership(_OnDatabase):
    """A :class:`~keyturn.protocols.WritableMembership` in a SQL database: ``db.membership``.

    Tables ``keyturn_organizations`` (``id``, ``tenant_id``, ``is_default``; at most one
    default per tenant) and ``keyturn_memberships`` (``account_id``, ``organization_id``,
    ``role``). A reference implementation: replace it with a provider over your own tables
    whenever your application already knows who belongs where.
    """

    add_organization = _sync(add_organization)
    add_member = _sync(add_member)
    remove_member = _sync(remove_member)
    get_organization = _sync(get_organization)
    get_default_organization = _sync(get_default_organization)
    get_role = _sync(get_role)
    reaches_tenant = _sync(reaches_tenant)
    organizations = _sync(organizations)
    remove_organization = _sync(remove_organization)
    members_of = _sync(members_of)
    organizations_of = _sync(organizations_of)


class AsyncSQLKeyStore(_OnDatabase):
    """The async twin of :class:`SQLKeyStore`."""

    get_key = _async(get_key)
    add_key = _async(add_key)
    keys_of = _async(keys_of)
    revoke_key = _async(revoke_key)
    mark_used = _async(mark_used)
    report_leak = _async(report_leak)
    leaked_keys = _async(leaked_keys)


class AsyncSQLMembership(_OnDatabase):
    """The async twin of :class:`SQLMembership`."""

    add_organization = _async(add_organization)
    add_member = _async(add_member)
    remove_member = _async(remove_member)
    get_organization = _async(get_organization)
    get_default_organization = _async(get_default_organization)
    get_role = _async(get_role)
    reaches_tenant = _async(reaches_tenant)
    organizations = _async(organizations)
    remove_organization = _async(remove_organization)
    members_of = _async(members_of)
    organizations_of = _async(organizations_of)
