"""In-memory key store and membership: thread-safe, for tests, examples and single-process demos.

Everything is lost when the process ends; use :mod:`keyturn.stores.sqlite` to keep keys.

    >>> from keyturn.stores.memory import MemoryMembership
    >>> membership = MemoryMembership()
    >>> _ = membership.add_organization("org_acme", tenant_id="acme", default=True)
    >>> membership.add_member("alice", "org_acme", role="admin")
    >>> membership.get_role("alice", "org_acme")
    'admin'
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import date, datetime, timedelta

import attrs

from keyturn._core.events import EventHook, KeyEvent, auto_revoked, emit
from keyturn._core.lifecycle import revoked_by_use
from keyturn._core.model import ApiKey, Leaked, Organization
from keyturn.errors import (
    DuplicateKey,
    KeyAlreadyReplaced,
    OrganizationConflict,
    UnknownOrganization,
)
from keyturn.stores._sql import KEY, MEMBERSHIP, ORGANIZATION, TENANT
from keyturn.stores._versions import Versions
from keyturn.usage import KEPT_DAYS, DailyUsage

__all__ = ["MemoryKeyStore", "MemoryMembership"]


class MemoryKeyStore:
    """A :class:`~keyturn.protocols.KeyStore` in a dict. Reads take no lock; writes do.

    :param on_event: called with each :class:`~keyturn.activity.KeyEvent` once it is
        recorded (see :mod:`keyturn.activity`); its failures are logged.
    """

    nonblocking = True  # the async middleware may call it directly on the event loop

    def __init__(self, *, on_event: EventHook | None = None) -> None:
        self._keys: dict[str, ApiKey] = {}
        self._events: list[KeyEvent] = []  # in the order recorded
        self._notices: dict[tuple[str, str], datetime] = {}
        self._usage: Counter[tuple[str, date, str]] = Counter()  # (key, day, outcome) -> n
        self._lock = threading.Lock()
        self.on_event = on_event
        # When each key last changed, moved by every write the decision could see, after it.
        self._versions = Versions()

    def __repr__(self) -> str:
        return f"MemoryKeyStore(keys={len(self._keys)})"

    def __len__(self) -> int:
        return len(self._keys)

    def changes(self) -> Versions:
        """When each key the decision reads last changed (``_run/memo.py``)."""
        return self._versions

    def get_key(self, key_id: str) -> ApiKey | None:
        return self._keys.get(key_id)

    def add_key(self, key: ApiKey) -> None:
        with self._lock:
            if key.key_id in self._keys:
                raise DuplicateKey(f"a key with id {key.key_id!r} already exists")
            if key.replaces is not None and key.revoked_at is None:
                for other in self._keys.values():  # one live replacement per key
                    if other.replaces == key.replaces and other.revoked_at is None:
                        raise KeyAlreadyReplaced.in_store(key.replaces, other.key_id)
            self._keys[key.key_id] = key
            self._versions.moved(((KEY, key.key_id),))

    def keys_of(self, account_id: str) -> Sequence[ApiKey]:
        with self._lock:
            keys = [key for key in self._keys.values() if key.account_id == account_id]
        return sorted(keys, key=lambda key: key.created_at, reverse=True)

    def revoke_key(self, key_id: str, at: datetime) -> bool:
        with self._lock:
            key = self._keys.get(key_id)
            if key is None or key.revoked_at is not None:
                return False
            self._keys[key_id] = attrs.evolve(key, revoked_at=at)
            self._versions.moved(((KEY, key_id),))
            return True

    def upgrade_hash(self, key_id: str, old_hash: str, new_hash: str) -> bool:
        """Replace the key's hash *old_hash* by *new_hash*, only if it still holds it;
        ``True`` if this call replaced it (a legacy hash's upgrade at first use, D2)."""
        with self._lock:  # the record as it is now: a revoke since is kept
            key = self._keys.get(key_id)
            if key is None or key.secret_hash != old_hash:
                return False
            self._keys[key_id] = attrs.evolve(key, secret_hash=new_hash)
            self._versions.moved(((KEY, key_id),))
            return True

    def mark_used(self, key_id: str, at: datetime) -> None:
        with self._lock:  # one write: the use, and the revoke the creator asked for at rotation
            key = self._keys.get(key_id)
            if key is None:
                return
            if key.last_used_at is None or key.last_used_at < at:
                first = key.first_used_at or at
                self._keys[key_id] = attrs.evolve(key, last_used_at=at, first_used_at=first)
                if key.first_used_at is None:  # a first use: the decision reads it (rotation)
                    self._versions.moved(((KEY, key_id),))
            old = self._keys.get(key.replaces or "")
            revoked = revoked_by_use(key, old, at)
            if old is not None and revoked:
                self._keys[old.key_id] = attrs.evolve(old, revoked_at=at)
                self._versions.moved(((KEY, old.key_id),))
        if old is not None and revoked:
            self.record_event(auto_revoked(old, at, key_id))

    def report_leak(self, key_id: str, url: str, at: datetime) -> bool:
        """Record that the key was found in public at *url*; ``False`` if already recorded."""
        with self._lock:
            key = self._keys.get(key_id)
            if key is None or key.leaked is not None:
                return False
            self._keys[key_id] = attrs.evolve(key, leaked=Leaked(url=url, at=at))
            return True

    def leaked_keys(self) -> list[ApiKey]:
        """Every key reported leaked, most recently reported first."""
        with self._lock:
            keys = [key for key in self._keys.values() if key.leaked is not None]
        return sorted(keys, key=_reported, reverse=True)

    def record_event(self, event: KeyEvent) -> None:
        """Append *event* to the record, then hand it to the ``on_event`` hook."""
        with self._lock:
            self._events.append(event)
        emit(self.on_event, event)

    def events_of(self, account_id: str, limit: int = 100) -> list[KeyEvent]:
        """The events of the account's keys, newest first, at most *limit*."""
        with self._lock:
            mine = [event for event in self._events if event.account_id == account_id]
        return sorted(mine, key=_order, reverse=True)[:limit]

    def events_since(self, since: datetime | None, limit: int = 1000) -> list[KeyEvent]:
        """Every account's events at or after *since* (all when ``None``), oldest first."""
        with self._lock:
            found = [event for event in self._events if since is None or event.at >= since]
        return sorted(found, key=_order)[:limit]

    def unrevoked_keys(self, expired_after: datetime) -> list[ApiKey]:
        """Every account's keys that are not revoked and expire after *expired_after*."""
        with self._lock:
            keys = [
                key
                for key in self._keys.values()
                if key.revoked_at is None and key.expires_at > expired_after
            ]
        return sorted(keys, key=lambda key: (key.account_id, key.created_at), reverse=True)

    def claim_notice(self, key_id: str, notice: str, at: datetime) -> bool:
        """Claim the sending of *notice* about the key; ``False`` if it was claimed before."""
        with self._lock:
            if (key_id, notice) in self._notices:
                return False
            self._notices[key_id, notice] = at
            return True

    def release_notice(self, key_id: str, notice: str) -> None:
        """Give a claim back (its delivery failed), so that a later run sends it."""
        with self._lock:
            self._notices.pop((key_id, notice), None)

    def count_usage(self, day: date, counts: Mapping[tuple[str, str], int]) -> None:
        """Add *counts* (``(key_id, outcome) -> requests``) to *day*; forget old days."""
        kept_from = day - timedelta(days=KEPT_DAYS - 1)
        with self._lock:
            for (key_id, outcome), requests in counts.items():
                if requests > 0:
                    self._usage[key_id, day, outcome] += requests
            for old in [entry for entry in self._usage if entry[1] < kept_from]:
                del self._usage[old]

    def usage_of(self, account_id: str, since: date) -> list[DailyUsage]:
        """The counts of the account's keys from the day *since* on."""
        with self._lock:
            rows = [
                DailyUsage(key_id=key_id, day=day, outcome=outcome, requests=requests)
                for (key_id, day, outcome), requests in self._usage.items()
                if day >= since
                and getattr(self._keys.get(key_id), "account_id", None) == account_id
            ]
        return sorted(rows, key=lambda row: (row.key_id, row.day, row.outcome))


def _order(event: KeyEvent) -> tuple[datetime, str]:
    return event.at, event.event_id


def _reported(key: ApiKey) -> tuple[datetime, str]:
    assert key.leaked is not None
    return key.leaked.at, key.key_id


class MemoryMembership:
    """A :class:`~keyturn.protocols.WritableMembership` in dicts: organizations and roles."""

    nonblocking = True

    def __init__(self) -> None:
        self._organizations: dict[str, Organization] = {}
        self._defaults: dict[str, Organization] = {}
        self._roles: dict[tuple[str, str], str] = {}
        self._reach: Counter[tuple[str, str]] = Counter()  # (account, tenant) -> memberships
        self._lock = threading.Lock()
        # When each organization, tenant and account last changed: moved by every write,
        # after it, with the names it touched.
        self._versions = Versions()

    def __repr__(self) -> str:
        return (
            f"MemoryMembership(organizations={len(self._organizations)}, "
            f"memberships={len(self._roles)})"
        )

    def add_organization(
        self, organization_id: str, *, tenant_id: str, default: bool = False
    ) -> Organization:
        """Add an organization; ``default=True`` makes it the tenant's ``default`` one."""
        organization = Organization(id=organization_id, tenant_id=tenant_id, is_default=default)
        with self._lock:
            known = self._organizations.get(organization_id)
            # A tenant's first organization is its default one, and it has one default only.
            if known != organization and (
                known is not None or default == (tenant_id in self._defaults)
            ):
                raise OrganizationConflict.adding(
                    organization_id, tenant_id, default=default, exists=known is not None
                )
            self._organizations[organization_id] = organization
            if default:
                self._defaults[tenant_id] = organization
            self._versions.moved(((ORGANIZATION, organization_id), (TENANT, tenant_id)))
        return organization

    def add_member(self, account_id: str, organization_id: str, *, role: str) -> None:
        """Give *account_id* a *role* in the organization (replacing any previous role)."""
        if not role:
            raise ValueError("role must be a non-empty string")
        with self._lock:
            organization = self._organizations.get(organization_id)
            if organization is None:
                raise UnknownOrganization(f"no organization {organization_id!r}: add it first")
            if (account_id, organization_id) not in self._roles:
                self._reach[account_id, organization.tenant_id] += 1
            self._roles[account_id, organization_id] = role
            self._versions.moved(((MEMBERSHIP, account_id),))

    def remove_member(self, account_id: str, organization_id: str) -> None:
        with self._lock:
            if self._roles.pop((account_id, organization_id), None) is not None:
                self._unreach(account_id, self._organizations[organization_id].tenant_id)
                self._versions.moved(((MEMBERSHIP, account_id),))

    def changes(self) -> Versions:
        """When each organization, tenant's default and account's memberships the decision
        reads last changed (``_run/memo.py``)."""
        return self._versions

    def get_organization(self, organization_id: str) -> Organization | None:
        return self._organizations.get(organization_id)

    def get_default_organization(self, tenant_id: str) -> Organization | None:
        return self._defaults.get(tenant_id)

    def get_role(self, account_id: str, organization_id: str) -> str | None:
        return self._roles.get((account_id, organization_id))

    def reaches_tenant(self, account_id: str, tenant_id: str) -> bool:
        return (account_id, tenant_id) in self._reach

    def organizations(self) -> list[Organization]:
        """Every organization, by tenant and id."""
        return sorted(self._organizations.values(), key=lambda o: (o.tenant_id, o.id))

    def remove_organization(self, organization_id: str) -> bool:
        """Remove the organization and its memberships; ``False`` if there was none."""
        with self._lock:
            organization = self._organizations.get(organization_id)
            if organization is None:
                return False
            if organization.is_default and any(
                other.tenant_id == organization.tenant_id and other.id != organization_id
                for other in self._organizations.values()
            ):
                raise OrganizationConflict.removing_default(organization_id, organization.tenant_id)
            del self._organizations[organization_id]
            if self._defaults.get(organization.tenant_id) == organization:
                del self._defaults[organization.tenant_id]
            members = [account_id for account_id, _ in self._members(organization_id)]
            for account_id in members:
                del self._roles[account_id, organization_id]
                self._unreach(account_id, organization.tenant_id)
            touched = [(MEMBERSHIP, account_id) for account_id in members]
            self._versions.moved(
                ((ORGANIZATION, organization_id), (TENANT, organization.tenant_id), *touched)
            )
        return True

    def _unreach(self, account_id: str, tenant_id: str) -> None:
        self._reach[account_id, tenant_id] -= 1
        if not self._reach[account_id, tenant_id]:
            del self._reach[account_id, tenant_id]

    def members_of(self, organization_id: str) -> list[tuple[str, str]]:
        """The ``(account_id, role)`` pairs of the organization, by account."""
        with self._lock:
            return self._members(organization_id)

    def _members(self, organization_id: str) -> list[tuple[str, str]]:
        return sorted(
            (account, role)
            for (account, org), role in self._roles.items()
            if org == organization_id
        )

    def organizations_of(self, account_id: str) -> Sequence[Organization]:
        """Every organization in which the account holds a role, by tenant, default first."""
        with self._lock:
            reached = [self._organizations[o] for (a, o) in self._roles if a == account_id]
        return sorted(reached, key=lambda org: (org.tenant_id, not org.is_default, org.id))
