"""The keyturn schema of the SQLite and PostgreSQL stores: its tables, the triggers of its
change feed, and the migrations that bring a database to :data:`SCHEMA_VERSION`.

Rules of this file:

1. Each migration upgrades the schema by one version; a released one is never edited, a
   new one is appended. The few differences between the databases (the type of an
   instant, catalog queries, the change feed's triggers) are a :class:`Dialect`.
2. The database keeps keyturn's invariants, whoever writes: at most one default
   organization per tenant and one live replacement per key (unique indexes); a tenant's
   first organization is its default, and the default goes last (triggers, and the
   conditional writes of ``_sql.py``).
3. Every write the decision could see (a key's credential, name, scope, expiry or
   revocation; a membership; an organization) reaches the change feed in the writing
   transaction, by triggers, so a change made with plain SQL is seen too: PostgreSQL sends
   ``NOTIFY keyturn_changes``; SQLite appends to ``keyturn_changes``. A change names what
   it touches (a key, an account, an organization: ``_sql.KEY`` and its kin) and, for an
   organization, its tenants and, when it appears, goes or moves, its members' accounts
   (version 8), so a replica drops exactly that.
4. The record of key actions (``keyturn_events``) is only ever inserted into.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from keyturn.errors import NotAKeyDatabase, SchemaTooNew
from keyturn.stores._sql import EVERYTHING, KEY, MEMBERSHIP, ORGANIZATION, TENANT

__all__ = [
    "NOTIFY_CHANNEL",
    "SCHEMA_VERSION",
    "Dialect",
    "migrate",
    "migration",
    "schema_version",
]

NOTIFY_CHANNEL: Final = "keyturn_changes"


class Dialect(NamedTuple):
    """What differs between the databases."""

    timestamp: str  # column type for instants
    has_version_table: str  # one row, one column: truthy when keyturn_schema_version exists
    # One row, one column: truthy when the database holds tables that are not keyturn's.
    # None where sharing a database with the application's tables is normal (PostgreSQL).
    has_foreign_tables: str | None
    change_feed: Sequence[str]  # version 4: the tables and triggers of the change feed
    placeholder: str  # what stands for a parameter: "%s" or "?"
    # Version 7: every write heard (TRUNCATE, replication, restores) and the default
    # organization's rule kept by the database itself.
    every_write_heard: Sequence[str] = ()
    # Version 8: an organization's change names its tenants and, when it appears, goes or
    # moves, its members' accounts.
    organizations_placed: Sequence[str] = ()


# --- the schema ---------------------------------------------------------------------------

# Stand in a migration for a dialect's own statements.
CHANGE_FEED: Final = "-- the dialect's change feed"
EVERY_WRITE_HEARD: Final = "-- the dialect's triggers for every write"
ORGANIZATIONS_PLACED: Final = "-- the dialect's triggers naming an organization's tenant"

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
    (
        # Version 4: the invariants, kept by the database, and the change feed.
        # Rotations raced before this version could leave several live replacements of one
        # key: the newest stays the replacement; the others become keys of their own.
        """UPDATE keyturn_keys SET replaces = NULL, revoke_old_on_first_use = FALSE
            WHERE replaces IS NOT NULL AND revoked_at IS NULL AND EXISTS (
                SELECT 1 FROM keyturn_keys newer
                WHERE newer.replaces = keyturn_keys.replaces AND newer.revoked_at IS NULL
                  AND (newer.created_at > keyturn_keys.created_at
                       OR (newer.created_at = keyturn_keys.created_at
                           AND newer.key_id > keyturn_keys.key_id)))""",
        # A replacement expires after the key it replaces, so "not revoked" is "live" here.
        """CREATE UNIQUE INDEX keyturn_keys_one_live_replacement
            ON keyturn_keys (replaces) WHERE replaces IS NOT NULL AND revoked_at IS NULL""",
        # A tenant without a default organization gets its first one, by id, as default.
        """UPDATE keyturn_organizations SET is_default = TRUE
            WHERE NOT EXISTS (
                SELECT 1 FROM keyturn_organizations d
                WHERE d.tenant_id = keyturn_organizations.tenant_id AND d.is_default)
              AND id = (SELECT min(o.id) FROM keyturn_organizations o
                        WHERE o.tenant_id = keyturn_organizations.tenant_id)""",
        CHANGE_FEED,
    ),
    (
        # Version 5: the record of key actions (keyturn.activity), appended to and never
        # changed by keyturn; no reference to the key, so it outlives anything done to it.
        # And the notices sent (keyturn.notices): one row per key and notice, the claim that
        # makes several instances send one notice, not several.
        """CREATE TABLE keyturn_events (
            event_id       TEXT PRIMARY KEY,
            at             {timestamp} NOT NULL,
            key_id         TEXT NOT NULL,
            account_id     TEXT NOT NULL,
            hint           TEXT NOT NULL,
            name           TEXT NOT NULL,
            action         TEXT NOT NULL,
            actor          TEXT NOT NULL,
            channel        TEXT NOT NULL,
            client_address TEXT,
            user_agent     TEXT,
            detail         TEXT
        )""",
        "CREATE INDEX keyturn_events_by_account ON keyturn_events (account_id, at)",
        "CREATE INDEX keyturn_events_by_time ON keyturn_events (at)",
        """CREATE TABLE keyturn_notices (
            key_id     TEXT NOT NULL,
            notice     TEXT NOT NULL,
            claimed_at {timestamp} NOT NULL,
            PRIMARY KEY (key_id, notice)
        )""",
    ),
    (
        # Version 6: usage, requests per key, UTC day and outcome ("accepted", or the
        # refusal's reason), added to by every process; rows older than KEPT_DAYS go as it
        # writes. No trigger: the decision never reads it. DATE holds ISO text in SQLite.
        """CREATE TABLE keyturn_usage (
            key_id   TEXT NOT NULL,
            day      DATE NOT NULL,
            outcome  TEXT NOT NULL,
            requests BIGINT NOT NULL,
            PRIMARY KEY (key_id, day, outcome)
        )""",
        "CREATE INDEX keyturn_usage_by_day ON keyturn_usage (day)",
    ),
    (
        # Version 7: every write is heard, whoever makes it and however (TRUNCATE, logical
        # replication, a restored file), and a key's first use is a change; the default
        # organization's rule (a tenant's first organization, removed last) is kept by
        # triggers, so plain SQL cannot break it either.
        EVERY_WRITE_HEARD,
    ),
    (
        # Version 8: a change of an organization names what it touches beyond itself, so a
        # replica drops exactly that: its tenant (old and new), whose default it may be or
        # become, and, when the organization appears, goes or moves to another tenant, the
        # accounts of its members, whose reach of a tenant moves with it (a cascade sends
        # their changes too, but plain SQL may run without one).
        ORGANIZATIONS_PLACED,
    ),
)
SCHEMA_VERSION: Final = len(MIGRATIONS)
# The first version whose feed places every organization change: replicas need it.
PLACED_FROM: Final = 8

CREATE_VERSION_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS keyturn_schema_version (version INTEGER PRIMARY KEY)"
)
SELECT_VERSION: Final = "SELECT coalesce(max(version), 0) FROM keyturn_schema_version"
INSERT_VERSION: Final = "INSERT INTO keyturn_schema_version (version) VALUES (%s)"

# The key columns a change of which the decision could see: a usage write changes none.
_DECIDING_COLUMNS: Final = (
    "secret_hash",
    "name",
    "account_id",
    "tenant_id",
    "organization_id",
    "expires_at",
    "revoked_at",
)

_FED: Final = (  # table, what a change of a row names, the column naming it, deciding columns
    ("keys", KEY, "key_id", _DECIDING_COLUMNS),
    ("memberships", MEMBERSHIP, "account_id", ("account_id", "organization_id", "role")),
    ("organizations", ORGANIZATION, "id", ("id", "tenant_id", "is_default")),
)

SQLITE_CHANGE_FEED: Final[Sequence[str]] = (
    """CREATE TABLE keyturn_changes (
        seq  INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        id   TEXT NOT NULL
    )""",
    # The log keeps the last 10,000 changes; a reader further behind starts afresh.
    """CREATE TRIGGER keyturn_changes_pruned AFTER INSERT ON keyturn_changes BEGIN
        DELETE FROM keyturn_changes WHERE seq <= NEW.seq - 10000; END""",
    *(
        f"CREATE TRIGGER keyturn_{table}_inserted AFTER INSERT ON keyturn_{table} BEGIN "  # noqa: S608
        f"INSERT INTO keyturn_changes (kind, id) VALUES ('{kind}', NEW.{column}); END"
        for table, kind, column, _ in _FED
    ),
    *(
        f"CREATE TRIGGER keyturn_{table}_deleted AFTER DELETE ON keyturn_{table} BEGIN "  # noqa: S608
        f"INSERT INTO keyturn_changes (kind, id) VALUES ('{kind}', OLD.{column}); END"
        for table, kind, column, _ in _FED
    ),
    # An update names the row's new id and, if it moved, its old one.
    *(
        f"CREATE TRIGGER keyturn_{table}_updated AFTER UPDATE ON keyturn_{table} "  # noqa: S608
        f"WHEN NOT ({' AND '.join(f'OLD.{c} IS NEW.{c}' for c in deciding)}) BEGIN "
        f"INSERT INTO keyturn_changes (kind, id) VALUES ('{kind}', NEW.{column}); "
        f"INSERT INTO keyturn_changes (kind, id) SELECT '{kind}', OLD.{column} "
        f"WHERE OLD.{column} IS NOT NEW.{column}; END"
        for table, kind, column, deciding in _FED
    ),
)

POSTGRES_CHANGE_FEED: Final[Sequence[str]] = (
    # The payload names the schema, so that instances on other schemas of one database
    # ignore it: "schema<TAB>kind<TAB>id". An update names the row's new id and, if it
    # moved, its old one.
    f"""CREATE OR REPLACE FUNCTION keyturn_notify_change() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            prefix text := TG_TABLE_SCHEMA || chr(9) || TG_ARGV[0] || chr(9);
            new_id text;
            old_id text;
        BEGIN
            IF TG_OP <> 'DELETE' THEN
                new_id := to_jsonb(NEW) ->> TG_ARGV[1];
                PERFORM pg_notify('{NOTIFY_CHANNEL}', prefix || new_id);
            END IF;
            IF TG_OP <> 'INSERT' THEN
                old_id := to_jsonb(OLD) ->> TG_ARGV[1];
                IF old_id IS DISTINCT FROM new_id THEN
                    PERFORM pg_notify('{NOTIFY_CHANNEL}', prefix || old_id);
                END IF;
            END IF;
            RETURN NULL;
        END $$""",
    *(
        f"CREATE TRIGGER keyturn_{table}_added_or_removed AFTER INSERT OR DELETE "
        f"ON keyturn_{table} FOR EACH ROW "
        f"EXECUTE FUNCTION keyturn_notify_change('{kind}', '{column}')"
        for table, kind, column, _ in _FED
    ),
    *(
        f"CREATE TRIGGER keyturn_{table}_changed AFTER UPDATE ON keyturn_{table} FOR EACH ROW "
        f"WHEN ({' OR '.join(f'OLD.{c} IS DISTINCT FROM NEW.{c}' for c in deciding)}) "
        f"EXECUTE FUNCTION keyturn_notify_change('{kind}', '{column}')"
        for table, kind, column, deciding in _FED
    ),
)


# Version 7 (both dialects): a key's first use is a change the decision reads (rotation's
# revoke-on-first-use is decided on it), and a tenant left without a default organization
# by plain SQL before this version gets its first one back.
_KEY_DECIDING_7: Final = (*_DECIDING_COLUMNS, "first_used_at")
_DEFAULT_RESTORED: Final = MIGRATIONS[3][2]
_NO_DEFAULT: Final = "keyturn: a tenant that has organizations must keep its default organization"

SQLITE_EVERY_WRITE_HEARD: Final[Sequence[str]] = (
    _DEFAULT_RESTORED,
    # Each change carries a random tag: a reader that finds its last change gone or
    # different (a restored or replaced file, a log pruned past it) starts afresh. The log
    # is never empty from here on, so there is always a change to check against.
    "ALTER TABLE keyturn_changes ADD COLUMN tag BLOB",
    """CREATE TRIGGER keyturn_changes_tagged AFTER INSERT ON keyturn_changes
        WHEN NEW.tag IS NULL BEGIN
        UPDATE keyturn_changes SET tag = randomblob(8) WHERE seq = NEW.seq; END""",
    f"INSERT INTO keyturn_changes (kind, id) VALUES ('{EVERYTHING}', '')",  # noqa: S608
    "DROP TRIGGER keyturn_keys_updated",
    "CREATE TRIGGER keyturn_keys_updated AFTER UPDATE ON keyturn_keys "  # noqa: S608
    f"WHEN NOT ({' AND '.join(f'OLD.{c} IS NEW.{c}' for c in _KEY_DECIDING_7)}) BEGIN "
    f"INSERT INTO keyturn_changes (kind, id) VALUES ('{KEY}', NEW.key_id); "
    f"INSERT INTO keyturn_changes (kind, id) SELECT '{KEY}', OLD.key_id "
    "WHERE OLD.key_id IS NOT NEW.key_id; END",
    # The default organization's rule, whoever writes (SQLite fires these per row).
    f"""CREATE TRIGGER keyturn_organizations_default_first AFTER INSERT ON keyturn_organizations
        WHEN NOT EXISTS (SELECT 1 FROM keyturn_organizations
                         WHERE tenant_id = NEW.tenant_id AND is_default)
        BEGIN SELECT RAISE(ABORT, '{_NO_DEFAULT}'); END""",  # noqa: S608
    f"""CREATE TRIGGER keyturn_organizations_default_last AFTER DELETE ON keyturn_organizations
        WHEN OLD.is_default AND EXISTS (SELECT 1 FROM keyturn_organizations
                                        WHERE tenant_id = OLD.tenant_id)
        BEGIN SELECT RAISE(ABORT, '{_NO_DEFAULT}'); END""",  # noqa: S608
    f"""CREATE TRIGGER keyturn_organizations_default_kept
        AFTER UPDATE OF tenant_id, is_default ON keyturn_organizations
        WHEN EXISTS (SELECT 1 FROM keyturn_organizations o
                     WHERE o.tenant_id IN (OLD.tenant_id, NEW.tenant_id) AND NOT EXISTS (
                         SELECT 1 FROM keyturn_organizations d
                         WHERE d.tenant_id = o.tenant_id AND d.is_default))
        BEGIN SELECT RAISE(ABORT, '{_NO_DEFAULT}'); END""",  # noqa: S608
)

POSTGRES_EVERY_WRITE_HEARD: Final[Sequence[str]] = (
    _DEFAULT_RESTORED,
    # TRUNCATE fires no row trigger: a statement trigger says "everything changed".
    f"""CREATE OR REPLACE FUNCTION keyturn_notify_everything() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('{NOTIFY_CHANNEL}',
                TG_TABLE_SCHEMA || chr(9) || '{EVERYTHING}' || chr(9));
            RETURN NULL;
        END $$""",
    *(
        f"CREATE TRIGGER keyturn_{table}_emptied AFTER TRUNCATE ON keyturn_{table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION keyturn_notify_everything()"
        for table, _, _, _ in _FED
    ),
    "DROP TRIGGER keyturn_keys_changed ON keyturn_keys",
    "CREATE TRIGGER keyturn_keys_changed AFTER UPDATE ON keyturn_keys FOR EACH ROW "
    f"WHEN ({' OR '.join(f'OLD.{c} IS DISTINCT FROM NEW.{c}' for c in _KEY_DECIDING_7)}) "
    f"EXECUTE FUNCTION keyturn_notify_change('{KEY}', 'key_id')",
    # Heard also under session_replication_role = replica: a logical replication
    # subscriber's apply worker and restores that disable ordinary triggers.
    *(
        f"ALTER TABLE keyturn_{table} ENABLE ALWAYS TRIGGER keyturn_{table}_{trigger}"
        for table, _, _, _ in _FED
        for trigger in ("added_or_removed", "changed", "emptied")
    ),
    # The default organization's rule, checked once the statement is done (an AFTER row
    # trigger sees the statement's end state), in the schema of the table written.
    f"""CREATE OR REPLACE FUNCTION keyturn_keep_default() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            tenant text;
            broken boolean;
        BEGIN
            FOR tenant IN SELECT DISTINCT t FROM unnest(ARRAY[
                CASE WHEN TG_OP <> 'DELETE' THEN NEW.tenant_id END,
                CASE WHEN TG_OP <> 'INSERT' THEN OLD.tenant_id END]) AS t
                WHERE t IS NOT NULL
            LOOP
                EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.keyturn_organizations '
                    'WHERE tenant_id = $1) AND NOT EXISTS (SELECT 1 FROM '
                    '%I.keyturn_organizations WHERE tenant_id = $1 AND is_default)',
                    TG_TABLE_SCHEMA, TG_TABLE_SCHEMA) INTO broken USING tenant;
                IF broken THEN
                    RAISE EXCEPTION '{_NO_DEFAULT}' USING ERRCODE = 'check_violation',
                        DETAIL = format('tenant %s', tenant);
                END IF;
            END LOOP;
            RETURN NULL;
        END $$""",  # noqa: S608
    """CREATE TRIGGER keyturn_organizations_default_kept
        AFTER INSERT OR DELETE OR UPDATE OF tenant_id, is_default ON keyturn_organizations
        FOR EACH ROW EXECUTE FUNCTION keyturn_keep_default()""",
)


# Version 8 (both dialects): what an organization's change touches beyond itself.
_MEMBERS_OF: Final = "SELECT '{kind}', account_id FROM keyturn_memberships WHERE organization_id"
SQLITE_ORGANIZATIONS_PLACED: Final[Sequence[str]] = (
    "CREATE TRIGGER keyturn_organizations_placed_inserted AFTER INSERT ON keyturn_organizations "  # noqa: S608
    f"BEGIN INSERT INTO keyturn_changes (kind, id) VALUES ('{TENANT}', NEW.tenant_id); "
    f"INSERT INTO keyturn_changes (kind, id) {_MEMBERS_OF.format(kind=MEMBERSHIP)} = NEW.id; "
    "END",
    "CREATE TRIGGER keyturn_organizations_placed_deleted AFTER DELETE ON keyturn_organizations "  # noqa: S608
    f"BEGIN INSERT INTO keyturn_changes (kind, id) VALUES ('{TENANT}', OLD.tenant_id); "
    f"INSERT INTO keyturn_changes (kind, id) {_MEMBERS_OF.format(kind=MEMBERSHIP)} = OLD.id; "
    "END",
    "CREATE TRIGGER keyturn_organizations_placed_updated AFTER UPDATE ON keyturn_organizations "  # noqa: S608
    "WHEN NOT (OLD.id IS NEW.id AND OLD.tenant_id IS NEW.tenant_id "
    "AND OLD.is_default IS NEW.is_default) BEGIN "
    f"INSERT INTO keyturn_changes (kind, id) VALUES ('{TENANT}', NEW.tenant_id); "
    f"INSERT INTO keyturn_changes (kind, id) SELECT '{TENANT}', OLD.tenant_id "
    "WHERE OLD.tenant_id IS NOT NEW.tenant_id; "
    f"INSERT INTO keyturn_changes (kind, id) {_MEMBERS_OF.format(kind=MEMBERSHIP)} "
    "IN (OLD.id, NEW.id) AND (OLD.id IS NOT NEW.id OR OLD.tenant_id IS NOT NEW.tenant_id); "
    "END",
)

POSTGRES_ORGANIZATIONS_PLACED: Final[Sequence[str]] = (
    f"""CREATE OR REPLACE FUNCTION keyturn_notify_organization() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            prefix text := TG_TABLE_SCHEMA || chr(9);
            old_row jsonb := CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END;
            new_row jsonb := CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END;
            tenant text;
            account text;
        BEGIN
            FOR tenant IN SELECT DISTINCT t FROM unnest(ARRAY[
                new_row ->> 'tenant_id', old_row ->> 'tenant_id']) AS t WHERE t IS NOT NULL
            LOOP
                PERFORM pg_notify('{NOTIFY_CHANNEL}', prefix || '{TENANT}' || chr(9) || tenant);
            END LOOP;
            IF (new_row ->> 'id') IS DISTINCT FROM (old_row ->> 'id')
                OR (new_row ->> 'tenant_id') IS DISTINCT FROM (old_row ->> 'tenant_id') THEN
                FOR account IN EXECUTE format('SELECT DISTINCT account_id FROM '
                    '%I.keyturn_memberships WHERE organization_id = ANY ($1)', TG_TABLE_SCHEMA)
                    USING ARRAY[new_row ->> 'id', old_row ->> 'id']
                LOOP
                    PERFORM pg_notify('{NOTIFY_CHANNEL}',
                        prefix || '{MEMBERSHIP}' || chr(9) || account);
                END LOOP;
            END IF;
            RETURN NULL;
        END $$""",  # noqa: S608
    """CREATE TRIGGER keyturn_organizations_placed AFTER INSERT OR DELETE
        ON keyturn_organizations FOR EACH ROW EXECUTE FUNCTION keyturn_notify_organization()""",
    """CREATE TRIGGER keyturn_organizations_placed_changed AFTER UPDATE ON keyturn_organizations
        FOR EACH ROW WHEN (OLD.id IS DISTINCT FROM NEW.id
            OR OLD.tenant_id IS DISTINCT FROM NEW.tenant_id
            OR OLD.is_default IS DISTINCT FROM NEW.is_default)
        EXECUTE FUNCTION keyturn_notify_organization()""",
    *(
        f"ALTER TABLE keyturn_organizations ENABLE ALWAYS TRIGGER {trigger}"
        for trigger in ("keyturn_organizations_placed", "keyturn_organizations_placed_changed")
    ),
)


def migration(version: int, dialect: Dialect) -> list[str]:
    """The statements that bring the schema from ``version - 1`` to *version*."""
    statements: list[str] = []
    for statement in MIGRATIONS[version - 1]:
        if statement == CHANGE_FEED:
            statements.extend(dialect.change_feed)
        elif statement == EVERY_WRITE_HEARD:
            statements.extend(dialect.every_write_heard)
        elif statement == ORGANIZATIONS_PLACED:
            statements.extend(dialect.organizations_placed)
        else:
            statements.append(statement.format(timestamp=dialect.timestamp))
    return statements


def migrate(connection: Any, dialect: Dialect) -> int:
    """Bring the schema up to :data:`SCHEMA_VERSION`, in the caller's transaction.

    *connection* is a DB-API connection with ``execute`` (sqlite3's or psycopg's).

    :raises NotAKeyDatabase: the database has no keyturn schema but other tables (SQLite).
    :raises SchemaTooNew: the schema is newer than this version of keyturn knows.
    """
    current = schema_version(connection, dialect)
    foreign = dialect.has_foreign_tables
    if current == 0 and foreign is not None and connection.execute(foreign).fetchone()[0]:
        raise NotAKeyDatabase(
            "this database holds other tables and no keyturn schema: "
            "point keyturn at a file of its own"
        )
    connection.execute(CREATE_VERSION_TABLE)
    insert_version = INSERT_VERSION.replace("%s", dialect.placeholder)
    for version in range(current + 1, SCHEMA_VERSION + 1):
        for statement in migration(version, dialect):
            connection.execute(statement)
        connection.execute(insert_version, (version,))
    return SCHEMA_VERSION


def schema_version(connection: Any, dialect: Dialect) -> int:
    """The schema version in the database, 0 when it has no keyturn tables; creates nothing.

    :raises SchemaTooNew: the schema is newer than this version of keyturn knows.
    """
    (exists,) = connection.execute(dialect.has_version_table).fetchone()
    if not exists:
        return 0
    (version,) = connection.execute(SELECT_VERSION).fetchone()
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"the database holds keyturn schema version {version}, newer than the "
            f"{SCHEMA_VERSION} this version of keyturn knows: upgrade keyturn"
        )
    return int(version)
