"""The SQL the SQLite and PostgreSQL stores run: one text per statement, and its rows.

Rules of this file:

1. Every statement is written here once, with ``%s`` placeholders, in SQL both databases
   speak; :class:`Statements` hands each database its own copy (SQLite's say ``?``). The
   stores (``_async.py`` and ``_sync.py``, generated from it) only run these texts and
   decode their rows with the functions below. The tables and the change feed they read
   and write are ``_schema.py``'s.
2. A conflict is an answer: conditional writes and their row counts say "already there",
   the same way in both databases, and keep the invariants the schema's indexes and
   triggers guard.
3. A change the feed carries names one of the kinds below (:data:`KEY` and its kin): the
   triggers of ``_schema.py`` write them, the replica reads them.
4. Instants go in as UTC datetimes (SQLite: fixed-width ISO 8601 text, which sorts as the
   instants do) and come out as UTC-aware datetimes, microseconds kept.
5. No secret ever reaches this file: a key row holds the hash of its secret and the hint.
6. The record of key actions (``keyturn_events``) is only ever inserted into.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final, Self

import attrs

from keyturn._core.events import Action, Channel, KeyEvent
from keyturn._core.model import ApiKey, Found, Leaked, Organization, Scope
from keyturn.usage import KEPT_DAYS, DailyUsage

__all__ = [
    "Statements",
    "event",
    "event_params",
    "found",
    "key",
    "key_params",
    "organization",
    "utc",
]

EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)  # before every event: "since the start"
# What a change names (the feed's "kind"): a key by id, an account's memberships, an
# organization, a tenant's organizations (its default among them: version 8), or
# everything (a table emptied, a log that starts anew): the replica empties.
KEY: Final = "k"
MEMBERSHIP: Final = "m"
ORGANIZATION: Final = "o"
TENANT: Final = "t"
EVERYTHING: Final = "*"


# --- the statements -------------------------------------------------------------------------

# A key row's columns, in the order key() reads them (the f-strings join constants only).
_KEY_COLUMN_NAMES: Final = (
    "key_id",
    "secret_hash",
    "hint",
    "name",
    "account_id",
    "tenant_id",
    "organization_id",
    "created_at",
    "expires_at",
    "revoked_at",
    "last_used_at",
    "leaked_at",
    "leaked_url",
    "replaces",
    "revoke_old_on_first_use",
    "first_used_at",
)
_KEY_COLUMNS: Final = ", ".join(_KEY_COLUMN_NAMES)
_SELECT_KEYS: Final = f"SELECT {_KEY_COLUMNS} FROM keyturn_keys"  # noqa: S608
_ORGANIZATION_COLUMNS: Final = "id, tenant_id, is_default"
_EVENT_COLUMN_NAMES: Final = (
    "event_id",
    "at",
    "key_id",
    "account_id",
    "hint",
    "name",
    "action",
    "actor",
    "channel",
    "client_address",
    "user_agent",
    "detail",
)
_EVENT_COLUMNS: Final = ", ".join(_EVENT_COLUMN_NAMES)


@attrs.frozen
class Statements:
    """Every statement the stores run, written for one database's placeholder."""

    get_key: str = f"{_SELECT_KEYS} WHERE key_id = %s"
    add_key: str = (
        f"INSERT INTO keyturn_keys ({_KEY_COLUMNS}) "  # noqa: S608
        f"VALUES ({', '.join(['%s'] * len(_KEY_COLUMN_NAMES))}) ON CONFLICT DO NOTHING"
    )
    live_replacement: str = (
        "SELECT key_id FROM keyturn_keys WHERE replaces = %s AND revoked_at IS NULL"
    )
    # key_id breaks ties so that keys created in the same microsecond list in a stable order.
    keys_of: str = f"{_SELECT_KEYS} WHERE account_id = %s ORDER BY created_at DESC, key_id DESC"
    # Conditional: only one concurrent revoke wins.
    revoke_key: str = (
        "UPDATE keyturn_keys SET revoked_at = %s WHERE key_id = %s AND revoked_at IS NULL"
    )
    # A legacy argon2id hash replaced by its secret's SHA-256 hash (D2), only while the row
    # still holds the old one: the hash is the one column written, so a concurrent revoke or
    # rotation wins, and of two concurrent upgrades one writes. Parameters: new, key_id, old.
    upgrade_hash: str = (
        "UPDATE keyturn_keys SET secret_hash = %s WHERE key_id = %s AND secret_hash = %s"
    )
    # One statement writes the use (first_used_at only the first time) and, when the creator
    # asked for it at rotation, revokes the key this one replaces: both rows change together
    # or not at all. The rule is keyturn._core.lifecycle.revoked_by_use, translated: the old key
    # is revoked at the instant of the use, unless it is already Revoked or Expired. Each
    # side of the OR is a primary-key lookup: no scan. It returns the ids of the rows it
    # changed, each with its first_used_at (the key's: the instant written, on a first use).
    # Parameters: key_id, at, key_id, at, key_id, at, key_id, at, at, key_id.
    mark_used: str = """
        UPDATE keyturn_keys SET
            last_used_at = CASE WHEN key_id = %s THEN %s ELSE last_used_at END,
            first_used_at = CASE WHEN key_id = %s THEN coalesce(first_used_at, %s)
                ELSE first_used_at END,
            revoked_at = CASE WHEN key_id = %s THEN revoked_at ELSE %s END
        WHERE (key_id = %s AND (last_used_at IS NULL OR last_used_at < %s))
           OR (revoked_at IS NULL AND expires_at > %s AND key_id = (
                SELECT replaces FROM keyturn_keys WHERE key_id = %s AND revoke_old_on_first_use))
        RETURNING key_id, first_used_at
    """
    # The first report stands: it says when the key became public.
    report_leak: str = (
        "UPDATE keyturn_keys SET leaked_at = %s, leaked_url = %s "
        "WHERE key_id = %s AND leaked_at IS NULL"
    )
    leaked_keys: str = (
        f"{_SELECT_KEYS} WHERE leaked_at IS NOT NULL ORDER BY leaked_at DESC, key_id DESC"
    )
    # What the decision reads for one request, in one statement (see found()): the key; the
    # organization the request names by id; the key's tenant's default organization; the
    # creator's role in the key's organization, in the named one and in the default one;
    # and whether the creator reaches the tenant at all. Parameters: organization, key_id.
    lookup: str = f"""
        SELECT {", ".join("k." + column for column in _KEY_COLUMN_NAMES)},
            named.id, named.tenant_id, named.is_default, fallback.id,
            (SELECT role FROM keyturn_memberships
                WHERE account_id = k.account_id AND organization_id = k.organization_id),
            (SELECT role FROM keyturn_memberships
                WHERE account_id = k.account_id AND organization_id = named.id),
            (SELECT role FROM keyturn_memberships
                WHERE account_id = k.account_id AND organization_id = fallback.id),
            EXISTS (SELECT 1 FROM keyturn_memberships m
                JOIN keyturn_organizations o ON o.id = m.organization_id
                WHERE m.account_id = k.account_id AND o.tenant_id = k.tenant_id)
        FROM keyturn_keys k
        LEFT JOIN keyturn_organizations named ON named.id = %s
        LEFT JOIN keyturn_organizations fallback
            ON fallback.tenant_id = k.tenant_id AND fallback.is_default
        WHERE k.key_id = %s
    """  # noqa: S608
    # Adds to what other processes counted: one row per (key, day, outcome), rows in the
    # order count_rows() sorts them, so that two writers never wait on each other in a
    # circle. {rows} is USAGE_ROW once per row.
    count_usage: str = (
        "INSERT INTO keyturn_usage (key_id, day, outcome, requests) VALUES {rows} "
        "ON CONFLICT (key_id, day, outcome) "
        "DO UPDATE SET requests = keyturn_usage.requests + excluded.requests"
    )
    usage_row: str = "(%s, %s, %s, %s)"
    prune_usage: str = "DELETE FROM keyturn_usage WHERE day < %s"
    usage_of: str = (
        "SELECT u.key_id, u.day, u.outcome, u.requests FROM keyturn_usage u "
        "JOIN keyturn_keys k ON k.key_id = u.key_id "
        "WHERE k.account_id = %s AND u.day >= %s ORDER BY u.key_id, u.day, u.outcome"
    )
    get_organization: str = (
        f"SELECT {_ORGANIZATION_COLUMNS} FROM keyturn_organizations WHERE id = %s"  # noqa: S608
    )
    get_default_organization: str = (
        f"SELECT {_ORGANIZATION_COLUMNS} FROM keyturn_organizations "  # noqa: S608
        "WHERE tenant_id = %s AND is_default"
    )
    get_role: str = (
        "SELECT role FROM keyturn_memberships WHERE account_id = %s AND organization_id = %s"
    )
    reaches_tenant: str = (
        "SELECT 1 FROM keyturn_memberships m "
        "JOIN keyturn_organizations o ON o.id = m.organization_id "
        "WHERE m.account_id = %s AND o.tenant_id = %s LIMIT 1"
    )
    # A tenant's first organization must be its default one; without a conflict target,
    # the insert also does nothing when the tenant already has a default and this is one.
    # Parameters: id, tenant_id, is_default, is_default, tenant_id.
    add_organization: str = (
        "INSERT INTO keyturn_organizations (id, tenant_id, is_default) SELECT %s, %s, %s "
        "WHERE %s OR EXISTS (SELECT 1 FROM keyturn_organizations "
        "WHERE tenant_id = %s AND is_default) ON CONFLICT DO NOTHING"
    )
    # The default organization goes last: it cannot be removed while its tenant has others.
    # Memberships go with the organization: ON DELETE CASCADE.
    remove_organization: str = (
        "DELETE FROM keyturn_organizations WHERE id = %s AND (NOT is_default OR NOT EXISTS ("
        "SELECT 1 FROM keyturn_organizations other "
        "WHERE other.tenant_id = keyturn_organizations.tenant_id "
        "AND other.id <> keyturn_organizations.id))"
    )
    # Inserts nothing when the organization does not exist: rowcount 0 says so.
    add_member: str = (
        "INSERT INTO keyturn_memberships (account_id, organization_id, role) "
        "SELECT %s, id, %s FROM keyturn_organizations WHERE id = %s "
        "ON CONFLICT (account_id, organization_id) DO UPDATE SET role = excluded.role"
    )
    remove_member: str = (
        "DELETE FROM keyturn_memberships WHERE account_id = %s AND organization_id = %s"
    )
    organizations: str = (
        f"SELECT {_ORGANIZATION_COLUMNS} FROM keyturn_organizations "  # noqa: S608
        "ORDER BY tenant_id, id"
    )
    members_of: str = (
        "SELECT account_id, role FROM keyturn_memberships WHERE organization_id = %s "
        "ORDER BY account_id"
    )
    organizations_of: str = (
        "SELECT o.id, o.tenant_id, o.is_default FROM keyturn_memberships m "
        "JOIN keyturn_organizations o ON o.id = m.organization_id "
        "WHERE m.account_id = %s ORDER BY o.tenant_id, o.is_default DESC, o.id"
    )

    # The record: appended to, never updated or deleted by keyturn.
    record_event: str = (
        f"INSERT INTO keyturn_events ({_EVENT_COLUMNS}) "  # noqa: S608
        f"VALUES ({', '.join(['%s'] * len(_EVENT_COLUMN_NAMES))})"
    )
    events_of: str = (
        f"SELECT {_EVENT_COLUMNS} FROM keyturn_events WHERE account_id = %s "  # noqa: S608
        "ORDER BY at DESC, event_id DESC LIMIT %s"
    )
    events_since: str = (
        f"SELECT {_EVENT_COLUMNS} FROM keyturn_events WHERE at >= %s "  # noqa: S608
        "ORDER BY at, event_id LIMIT %s"
    )
    # The keys a notice may concern: not revoked, and expired after the given instant.
    unrevoked_keys: str = (
        f"{_SELECT_KEYS} WHERE revoked_at IS NULL AND expires_at > %s "
        "ORDER BY account_id, created_at DESC, key_id DESC"
    )
    # Insert-if-absent: the primary key lets one instance claim a notice; rowcount says which.
    claim_notice: str = (
        "INSERT INTO keyturn_notices (key_id, notice, claimed_at) VALUES (%s, %s, %s) "
        "ON CONFLICT DO NOTHING"
    )
    release_notice: str = "DELETE FROM keyturn_notices WHERE key_id = %s AND notice = %s"

    @classmethod
    def with_placeholder(cls, placeholder: str) -> Statements:
        """Every statement, with *placeholder* in place of ``%s``."""
        return cls(
            **{
                field.name: getattr(cls(), field.name).replace("%s", placeholder)
                for field in attrs.fields(cls)
            }
        )


class ClosedOnExit:
    """``with database:`` closes the database at the end of the block."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# --- rows in, rows out ------------------------------------------------------------------------


def utc(at: datetime | None) -> datetime | None:
    """An instant as stored: in UTC."""
    return None if at is None else at.astimezone(UTC)


def _instant(value: datetime | str) -> datetime:
    if isinstance(value, str):  # SQLite: ISO 8601 text written by the store, always UTC
        return datetime.fromisoformat(value)
    return value if value.tzinfo is UTC else value.astimezone(UTC)


def _maybe_instant(value: datetime | str | None) -> datetime | None:
    return None if value is None else _instant(value)


def key(row: Sequence[Any]) -> ApiKey:
    """The :class:`ApiKey` of a row of the key columns."""
    (key_id, secret_hash, hint, name, account_id, tenant_id, organization_id) = row[:7]
    created_at, expires_at, revoked_at, last_used_at, leaked_at, leaked_url = row[7:13]
    replaces, revoke_old_on_first_use, first_used_at = row[13:16]
    return ApiKey(
        key_id=key_id,
        secret_hash=secret_hash,
        hint=hint,
        name=name,
        account_id=account_id,
        scope=Scope(tenant_id=tenant_id, organization_id=organization_id),
        created_at=_instant(created_at),
        expires_at=_instant(expires_at),
        revoked_at=_maybe_instant(revoked_at),
        last_used_at=_maybe_instant(last_used_at),
        first_used_at=_maybe_instant(first_used_at),
        leaked=None if leaked_at is None else Leaked(url=leaked_url, at=_instant(leaked_at)),
        replaces=replaces,
        revoke_old_on_first_use=bool(revoke_old_on_first_use),
    )


def key_params(key: ApiKey, instant: Callable[[datetime | None], Any]) -> tuple[Any, ...]:
    """The parameters of ``add_key`` for *key*, each instant as *instant* makes it."""
    return (
        key.key_id,
        key.secret_hash,
        key.hint,
        key.name,
        key.account_id,
        key.scope.tenant_id,
        key.scope.organization_id,
        instant(key.created_at),
        instant(key.expires_at),
        instant(key.revoked_at),
        instant(key.last_used_at),
        None if key.leaked is None else instant(key.leaked.at),
        None if key.leaked is None else key.leaked.url,
        key.replaces,
        key.revoke_old_on_first_use,
        instant(key.first_used_at),
    )


def event(row: Sequence[Any]) -> KeyEvent:
    """The :class:`~keyturn.activity.KeyEvent` of a row of the event columns."""
    (event_id, at, key_id, account_id, hint, name, action, actor, channel) = row[:9]
    client_address, user_agent, detail = row[9:12]
    return KeyEvent(
        event_id=event_id,
        at=_instant(at),
        key_id=key_id,
        account_id=account_id,
        hint=hint,
        name=name,
        action=Action(action),
        actor=actor,
        channel=Channel(channel),
        client_address=client_address,
        user_agent=user_agent,
        detail=detail,
    )


def event_params(event: KeyEvent, instant: Callable[[datetime | None], Any]) -> tuple[Any, ...]:
    """The parameters of ``record_event`` for *event*."""
    return (
        event.event_id,
        instant(event.at),
        event.key_id,
        event.account_id,
        event.hint,
        event.name,
        event.action.value,
        event.actor,
        event.channel.value,
        event.client_address,
        event.user_agent,
        event.detail,
    )


# Rows per count_usage statement: 4 parameters each, under SQLite's oldest limit of 999.
USAGE_ROWS_PER_STATEMENT: Final = 200


def count_rows(
    sql: Statements, day: date, counts: Mapping[tuple[str, str], int]
) -> list[tuple[str, list[Any]]]:
    """The ``count_usage`` statements, as (text, parameters), that add *counts* to *day*:
    rows sorted, at most :data:`USAGE_ROWS_PER_STATEMENT` each, counts of zero left out."""
    rows = sorted((key, n) for key, n in counts.items() if n > 0)
    statements = []
    for start in range(0, len(rows), USAGE_ROWS_PER_STATEMENT):
        chunk = rows[start : start + USAGE_ROWS_PER_STATEMENT]
        text = sql.count_usage.format(rows=", ".join([sql.usage_row] * len(chunk)))
        params = [
            value
            for (key_id, outcome), requests in chunk
            for value in (key_id, day.isoformat(), outcome, int(requests))
        ]
        statements.append((text, params))
    return statements


def kept_from(day: date) -> str:
    """The first day ``count_usage`` keeps, written for ``prune_usage``."""
    return (day - timedelta(days=KEPT_DAYS - 1)).isoformat()


def daily_usage(row: Sequence[Any]) -> DailyUsage:
    """The :class:`~keyturn.usage.DailyUsage` of a row of ``usage_of``."""
    key_id, day, outcome, requests = row
    if isinstance(day, str):  # SQLite: ISO text
        day = date.fromisoformat(day)
    return DailyUsage(key_id=key_id, day=day, outcome=outcome, requests=int(requests))


def organization(row: Sequence[Any]) -> Organization:
    """The :class:`Organization` of a row of ``id, tenant_id, is_default``."""
    return Organization(id=row[0], tenant_id=row[1], is_default=bool(row[2]))


def found(row: Sequence[Any] | None, organization: str | None) -> Found:
    """Decode a row of the ``lookup`` statement run for *organization*."""
    if row is None:
        return Found(key=None, asked=organization)
    stored = key(row)
    named_id, named_tenant, named_default, default_id, *roles, reaches = row[16:]
    named = (
        None
        if named_id is None
        else Organization(id=named_id, tenant_id=named_tenant, is_default=bool(named_default))
    )
    default = (
        None
        if default_id is None
        else Organization(id=default_id, tenant_id=stored.scope.tenant_id, is_default=True)
    )
    own = stored.scope.organization_id
    places = (own, None if named is None else named.id, default_id)
    return Found(
        key=stored,
        asked=organization,
        named=named,
        default=default,
        roles={place: role for place, role in zip(places, roles, strict=True) if place},
        reaches=bool(reaches),
    )
