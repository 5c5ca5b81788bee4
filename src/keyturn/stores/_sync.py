# Generated from _async.py by tools/async_to_sync.py: edit that file, not this one.
"""The key store and membership over a synchronous SQL database: SQLite's and PostgreSQL's.

:class:`SQLKeyStore` and :class:`SQLMembership` are ``_async.py`` without its awaits,
method for method: see that module for what they do and what a database gives them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any

from keyturn._core.events import KeyEvent, auto_revoked, emit
from keyturn._core.model import ApiKey, Found, Organization
from keyturn.errors import (
    Conflict,
    DuplicateKey,
    KeyAlreadyReplaced,
    OrganizationConflict,
    UnknownOrganization,
)
from keyturn.stores import _sql
from keyturn.stores._versions import Versions
from keyturn.usage import DailyUsage

__all__ = ["SQLKeyStore", "SQLMembership"]


class SQLKeyStore:
    """A :class:`~keyturn.protocols.KeyStore` in a SQL database: ``db.keys``."""

    def __init__(self, database: Any) -> None:
        self.database = database
        # SQLite bounds its own calls (busy timeout): no watchdog thread around them.
        self.enforces_timeout: bool = database.enforces_timeout
        self._sql: _sql.Statements = database.sql

    def __repr__(self) -> str:
        return f"SQLKeyStore({self.database!r})"

    def changes(self) -> Versions | None:
        """When each thing the decision reads here last changed (``_run/memo.py``)."""
        return self.database.changes()  # type: ignore[no-any-return]

    def get_key(self, key_id: str) -> ApiKey | None:
        with self.database.connection() as connection:
            row = connection.execute(self._sql.get_key, (key_id,)).fetchone()
        return None if row is None else _sql.key(row)

    def lookup_cached(self, key_id: str, organization: str | None) -> Found | None:
        """What :meth:`lookup` would answer, from the replica only; ``None`` if it cannot."""
        return self.database.lookup_cached(key_id, organization)  # type: ignore[no-any-return]

    def lookup(self, key_id: str, organization: str | None) -> Found:
        """Everything the decision reads for one request: from the replica, or in one
        statement (see :class:`~keyturn.Found`)."""
        cached = self.database.lookup_cached(key_id, organization)
        if cached is not None:
            return cached  # type: ignore[no-any-return]
        replica = self.database.replica  # the one to keep what is read in, if current
        epoch = replica.epoch
        with self.database.connection() as connection:
            row = connection.execute(self._sql.lookup, (organization, key_id)).fetchone()
        found = _sql.found(row, organization)
        replica.keep(key_id, found, epoch)
        return found

    def add_key(self, key: ApiKey) -> None:
        params = _sql.key_params(key, self.database.instant)
        with self.database.connection() as connection:
            for _ in range(3):  # a conflict that is gone when asked about: try again
                if connection.execute(self._sql.add_key, params).rowcount:
                    break
                if connection.execute(self._sql.get_key, (key.key_id,)).fetchone():
                    raise DuplicateKey(f"a key with id {key.key_id!r} already exists")
                live = connection.execute(self._sql.live_replacement, (key.replaces,)).fetchone()
                if live is not None:
                    raise KeyAlreadyReplaced.in_store(str(key.replaces), live[0])
            else:
                raise Conflict(f"key {key.key_id!r} could not be stored: try again")
        self.database.replica.changed(_sql.KEY, key.key_id)

    def keys_of(self, account_id: str) -> Sequence[ApiKey]:
        with self.database.connection() as connection:
            rows = connection.execute(self._sql.keys_of, (account_id,)).fetchall()
        return [_sql.key(row) for row in rows]

    def revoke_key(self, key_id: str, at: datetime) -> bool:
        with self.database.connection() as connection:
            revoked = connection.execute(
                self._sql.revoke_key, (self.database.instant(at), key_id)
            ).rowcount
        self.database.replica.changed(_sql.KEY, key_id)
        return bool(revoked == 1)

    def upgrade_hash(self, key_id: str, old_hash: str, new_hash: str) -> bool:
        """Replace the key's hash *old_hash* by *new_hash*, only if it still holds it;
        ``True`` if this call replaced it (a legacy hash's upgrade at first use, D2)."""
        with self.database.connection() as connection:
            upgraded = connection.execute(
                self._sql.upgrade_hash, (new_hash, key_id, old_hash)
            ).rowcount
        self.database.replica.changed(_sql.KEY, key_id)
        return bool(upgraded == 1)

    def mark_used(self, key_id: str, at: datetime) -> None:
        utc = self.database.instant(at)
        with self.database.connection() as connection:
            changed = connection.execute(
                self._sql.mark_used,
                (key_id, utc, key_id, utc, key_id, utc, key_id, utc, utc, key_id),
            ).fetchall()
        # A first use (the decision reads it) and the old key it revoked at rotation's
        # request: both dropped from the replica before this returns, so this process's next
        # request with either is decided afresh.
        for changed_id, first_used_at in changed:
            if changed_id != key_id or first_used_at == utc:
                self.database.replica.changed(_sql.KEY, changed_id)
        for changed_id, _ in changed:
            if changed_id != key_id:
                old = self.get_key(changed_id)
                if old is not None:
                    self.record_event(auto_revoked(old, at, key_id))

    def report_leak(self, key_id: str, url: str, at: datetime) -> bool:
        """Record that the key was found in public at *url*; ``False`` if already recorded."""
        with self.database.connection() as connection:
            reported = connection.execute(
                self._sql.report_leak, (self.database.instant(at), url, key_id)
            ).rowcount
        return bool(reported == 1)

    def leaked_keys(self) -> list[ApiKey]:
        """Every key reported leaked, most recently reported first."""
        with self.database.connection() as connection:
            rows = connection.execute(self._sql.leaked_keys).fetchall()
        return [_sql.key(row) for row in rows]

    def record_event(self, event: KeyEvent) -> None:
        """Append *event* to the record, then hand it to the database's ``on_event`` hook."""
        params = _sql.event_params(event, self.database.instant)
        with self.database.connection() as connection:
            connection.execute(self._sql.record_event, params)
        emit(self.database.on_event, event)

    def events_of(self, account_id: str, limit: int = 100) -> list[KeyEvent]:
        """The events of the account's keys, newest first, at most *limit*."""
        with self.database.connection() as connection:
            rows = connection.execute(self._sql.events_of, (account_id, limit)).fetchall()
        return [_sql.event(row) for row in rows]

    def events_since(self, since: datetime | None, limit: int = 1000) -> list[KeyEvent]:
        """Every account's events at or after *since* (all when ``None``), oldest first."""
        start = self.database.instant(since or _sql.EPOCH)
        with self.database.connection() as connection:
            rows = connection.execute(self._sql.events_since, (start, limit)).fetchall()
        return [_sql.event(row) for row in rows]

    def unrevoked_keys(self, expired_after: datetime) -> list[ApiKey]:
        """Every account's keys that are not revoked and expire after *expired_after*."""
        after = self.database.instant(expired_after)
        with self.database.connection() as connection:
            rows = connection.execute(self._sql.unrevoked_keys, (after,)).fetchall()
        return [_sql.key(row) for row in rows]

    def claim_notice(self, key_id: str, notice: str, at: datetime) -> bool:
        """Claim the sending of *notice* about the key; ``False`` if it was claimed before."""
        params = (key_id, notice, self.database.instant(at))
        with self.database.connection() as connection:
            claimed = connection.execute(self._sql.claim_notice, params).rowcount
        return bool(claimed == 1)

    def release_notice(self, key_id: str, notice: str) -> None:
        """Give a claim back (its delivery failed), so that a later run sends it."""
        with self.database.connection() as connection:
            connection.execute(self._sql.release_notice, (key_id, notice))

    def count_usage(self, day: date, counts: Mapping[tuple[str, str], int]) -> None:
        """Add *counts* (``(key_id, outcome) -> requests``) to *day*; forget old days."""
        with self.database.connection() as connection:
            for text, params in _sql.count_rows(self._sql, day, counts):
                connection.execute(text, params)
            connection.execute(self._sql.prune_usage, (_sql.kept_from(day),))

    def usage_of(self, account_id: str, since: date) -> list[DailyUsage]:
        """The counts of the account's keys from the day *since* on."""
        with self.database.connection() as connection:
            rows = connection.execute(
                self._sql.usage_of, (account_id, since.isoformat())
            ).fetchall()
        return [_sql.daily_usage(row) for row in rows]


class SQLMembership:
    """A writable :class:`~keyturn.protocols.MembershipProvider` in a SQL database:
    ``db.membership``.

    Tables ``keyturn_organizations`` (``id``, ``tenant_id``, ``is_default``; exactly one
    default per tenant, its first organization, removed last) and ``keyturn_memberships``
    (``account_id``, ``organization_id``, ``role``). A reference implementation: replace
    it with a provider over your own tables whenever your application already knows who
    belongs where.
    """

    def __init__(self, database: Any) -> None:
        self.database = database
        self.enforces_timeout: bool = database.enforces_timeout
        self._sql: _sql.Statements = database.sql

    def __repr__(self) -> str:
        return f"SQLMembership({self.database!r})"

    def changes(self) -> Versions | None:
        """When each thing the decision reads here last changed (``_run/memo.py``)."""
        return self.database.changes()  # type: ignore[no-any-return]

    def get_organization(self, organization_id: str) -> Organization | None:
        with self.database.connection() as connection:
            row = connection.execute(self._sql.get_organization, (organization_id,)).fetchone()
        return None if row is None else _sql.organization(row)

    def get_default_organization(self, tenant_id: str) -> Organization | None:
        with self.database.connection() as connection:
            row = connection.execute(self._sql.get_default_organization, (tenant_id,)).fetchone()
        return None if row is None else _sql.organization(row)

    def get_role(self, account_id: str, organization_id: str) -> str | None:
        with self.database.connection() as connection:
            row = connection.execute(self._sql.get_role, (account_id, organization_id)).fetchone()
        return None if row is None else str(row[0])

    def reaches_tenant(self, account_id: str, tenant_id: str) -> bool:
        with self.database.connection() as connection:
            row = connection.execute(self._sql.reaches_tenant, (account_id, tenant_id)).fetchone()
        return row is not None

    def add_organization(
        self, organization_id: str, *, tenant_id: str, default: bool = False
    ) -> Organization:
        """Add an organization; ``default=True`` makes it the tenant's ``default`` one.

        A tenant's first organization must be its default one.

        :raises OrganizationConflict: it exists differently, the tenant has a default
            already, or has none yet and this is not it.
        """
        wanted = Organization(id=organization_id, tenant_id=tenant_id, is_default=default)
        params = (wanted.id, wanted.tenant_id, default, default, wanted.tenant_id)
        known = None
        with self.database.connection(lock=wanted.tenant_id) as connection:
            inserted = connection.execute(self._sql.add_organization, params).rowcount
            if not inserted:
                row = connection.execute(self._sql.get_organization, (wanted.id,)).fetchone()
                known = None if row is None else _sql.organization(row)
        if not inserted and known != wanted:
            exists = known is not None
            raise OrganizationConflict.adding(wanted.id, tenant_id, default=default, exists=exists)
        # What the feed will name too (schema version 8): this process sees it at once.
        self.database.replica.changed(_sql.ORGANIZATION, wanted.id)
        self.database.replica.changed(_sql.TENANT, wanted.tenant_id)
        return wanted

    def remove_organization(self, organization_id: str) -> bool:
        """Remove the organization and its memberships; ``False`` if there was none.

        :raises OrganizationConflict: it is its tenant's default organization, and the
            tenant has others: remove those first.
        """
        known = self.get_organization(organization_id)
        if known is None:
            return False
        members = self.members_of(known.id)  # their reach goes with it
        with self.database.connection(lock=known.tenant_id) as connection:
            removed = connection.execute(self._sql.remove_organization, (known.id,)).rowcount
        # What the feed will name too (schema version 8): this process sees it at once,
        # before the feed's changes come in.
        self.database.replica.changed(_sql.ORGANIZATION, known.id)
        self.database.replica.changed(_sql.TENANT, known.tenant_id)
        for account, _ in members:
            self.database.replica.changed(_sql.MEMBERSHIP, account)
        if not removed and self.get_organization(organization_id) is not None:
            raise OrganizationConflict.removing_default(known.id, known.tenant_id)
        return bool(removed)

    def add_member(self, account_id: str, organization_id: str, *, role: str) -> None:
        """Give *account_id* a *role* in the organization (replacing any previous role).

        :raises UnknownOrganization: there is no such organization.
        """
        if not isinstance(role, str) or not role:
            raise ValueError("role must be a non-empty string")
        with self.database.connection() as connection:
            added = connection.execute(
                self._sql.add_member, (account_id, role, organization_id)
            ).rowcount
        if not added:
            raise UnknownOrganization(f"no organization {organization_id!r}: add it first")
        self.database.replica.changed(_sql.MEMBERSHIP, account_id)

    def remove_member(self, account_id: str, organization_id: str) -> None:
        """Take the account's role in the organization away (nothing if it had none)."""
        with self.database.connection() as connection:
            connection.execute(self._sql.remove_member, (account_id, organization_id))
        self.database.replica.changed(_sql.MEMBERSHIP, account_id)

    def organizations(self) -> list[Organization]:
        """Every organization, by tenant and id."""
        with self.database.connection() as connection:
            rows = connection.execute(self._sql.organizations).fetchall()
        return [_sql.organization(row) for row in rows]

    def members_of(self, organization_id: str) -> list[tuple[str, str]]:
        """The ``(account_id, role)`` pairs of the organization, by account."""
        with self.database.connection() as connection:
            rows = connection.execute(self._sql.members_of, (organization_id,)).fetchall()
        return [(str(account), str(role)) for account, role in rows]

    def organizations_of(self, account_id: str) -> list[Organization]:
        """Every organization in which the account holds a role, by tenant, default first."""
        with self.database.connection() as connection:
            rows = connection.execute(self._sql.organizations_of, (account_id,)).fetchall()
        return [_sql.organization(row) for row in rows]
