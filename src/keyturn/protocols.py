"""What keyturn needs from your data: a key store and a membership provider.

Implement these with your own tables (or use :mod:`keyturn.stores`). Both come in a sync
flavour, for the WSGI middleware and scripts, and an async twin for the ASGI middleware.
The async middleware also accepts the sync flavour: it calls it on threads of its own, or
directly when the object says it never blocks (``nonblocking = True``, as the in-memory
implementations do). The sync middleware calls it in place, on a thread of its own only to
keep the Authenticator's ``timeout``, unless the object says it bounds its own calls
(``enforces_timeout = True``, as the SQLite store does with its busy timeout).

The stores keyturn ships also satisfy :class:`WritableMembership` (what the ``keyturn``
command and the demo use to add organizations and members) and :class:`Database` (one
database holding both: what :func:`keyturn.stores.open_database` returns).

A key store may also offer ``lookup(key_id, organization) -> Found`` (and an async twin):
everything the decision reads for one request, at once (see :class:`~keyturn.Found`).
keyturn's SQL stores do, from their replica or in one statement; the ``Authenticator`` uses
it when the membership provider is the same database's (``store.database is
membership.database``), and otherwise asks the step-by-step methods below.

A key store may also offer ``upgrade_hash(key_id, old_hash, new_hash) -> bool`` (and an
async twin): replace the key's stored hash, only while it is still *old_hash* (a
conditional write that touches nothing else). keyturn's stores do; the ``Authenticator``
calls it at the first successful use of a key that still holds an argon2id hash from
before SHA-256 (D2). Without it, such a key keeps working, verified by argon2 once per
process.

Contract, for every method: answer from committed state (a revoke committed anywhere must
be seen by the next call), return ``None``/``False`` for "not there", and raise for "cannot
answer right now" -- keyturn turns a raise into 503, never into 401, so that a client does
not throw away a good key while your database is down. Answers are type-checked: a value of
another type (a coroutine from a sync wrapper around an async function, say) is a 503 too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Protocol, runtime_checkable

from keyturn._core.events import KeyEvent
from keyturn._core.model import ApiKey, Organization
from keyturn.usage import DailyUsage

__all__ = [
    "AsyncKeyStore",
    "AsyncMembershipProvider",
    "AsyncUsageStore",
    "ConsoleMembership",
    "Database",
    "KeyStore",
    "LeakRecordingStore",
    "MembershipProvider",
    "RecordKeepingStore",
    "UsageStore",
    "WritableMembership",
]


@runtime_checkable
class KeyStore(Protocol):
    """Where key records live. Never sees a secret: only its hash (``sha256$<hex>``)."""

    def get_key(self, key_id: str) -> ApiKey | None:
        """The key with this id, or ``None``. Called on every authenticated request."""

    def add_key(self, key: ApiKey) -> None:
        """Store a new key, every field kept (``replaces`` and ``revoke_old_on_first_use``
        too); raise :class:`~keyturn.errors.DuplicateKey` if the id exists."""

    def keys_of(self, account_id: str) -> Sequence[ApiKey]:
        """Every key the account created, newest first."""

    def revoke_key(self, key_id: str, at: datetime) -> bool:
        """Set ``revoked_at`` if it is unset; ``True`` only if this call revoked the key."""

    def mark_used(self, key_id: str, at: datetime) -> None:
        """Record that the key was used at *at* (best effort; keyturn throttles the calls).

        ``last_used_at`` never moves backwards; ``first_used_at`` is set by the first such
        write and never changes after. If the key has ``revoke_old_on_first_use``,
        the same write also sets ``revoked_at = at`` on the key it ``replaces``, unless that
        one is already revoked or expired at *at*: the creator's choice at rotation (the
        rule is ``keyturn._core.lifecycle.revoked_by_use``; the memory store applies it).
        """


@runtime_checkable
class MembershipProvider(Protocol):
    """Who reaches which organization, and with which role. Asked on every request."""

    def get_organization(self, organization_id: str) -> Organization | None:
        """The organization with this id, or ``None``."""

    def get_default_organization(self, tenant_id: str) -> Organization | None:
        """The tenant's organization named ``default``."""

    def get_role(self, account_id: str, organization_id: str) -> str | None:
        """The account's role in the organization, or ``None`` if it does not reach it."""

    def reaches_tenant(self, account_id: str, tenant_id: str) -> bool:
        """Whether the account holds a role in at least one organization of the tenant."""


@runtime_checkable
class WritableMembership(MembershipProvider, Protocol):
    """A :class:`MembershipProvider` that can also be written, as keyturn's own stores can."""

    def add_organization(
        self, organization_id: str, *, tenant_id: str, default: bool = False
    ) -> Organization:
        """Add an organization; ``default=True`` makes it the tenant's ``default`` one.

        :raises OrganizationConflict: it exists differently, or the tenant has a default.
        """

    def add_member(self, account_id: str, organization_id: str, *, role: str) -> None:
        """Give the account a role in the organization (replacing any previous role).

        :raises UnknownOrganization: there is no such organization.
        """

    def remove_member(self, account_id: str, organization_id: str) -> None:
        """Take the account's role in the organization away (nothing if it had none)."""

    def organizations(self) -> Sequence[Organization]:
        """Every organization, by tenant and id."""

    def remove_organization(self, organization_id: str) -> bool:
        """Remove the organization and its memberships; ``False`` if there was none."""

    def members_of(self, organization_id: str) -> Sequence[tuple[str, str]]:
        """The ``(account_id, role)`` pairs of the organization, by account."""


class LeakRecordingStore(KeyStore, Protocol):
    """A :class:`KeyStore` that also keeps leak reports, as keyturn's own stores do
    (see :mod:`keyturn.leaks`)."""

    def report_leak(self, key_id: str, url: str, at: datetime) -> bool:
        """Record that the key was found in public at *url*; ``False`` if already recorded."""

    def leaked_keys(self) -> Sequence[ApiKey]:
        """Every key reported leaked, most recently reported first."""


class RecordKeepingStore(LeakRecordingStore, Protocol):
    """A key store that keeps leak reports and also the record of key actions
    (:mod:`keyturn.activity`) and the notices sent (:mod:`keyturn.notices`), as keyturn's
    own stores do. A host store without these works for everything else."""

    def record_event(self, event: KeyEvent) -> None:
        """Append *event* to the record (and hand it to the store's ``on_event`` hook)."""

    def events_of(self, account_id: str, limit: int = 100) -> Sequence[KeyEvent]:
        """The events of the account's keys, newest first, at most *limit*."""

    def events_since(self, since: datetime | None, limit: int = 1000) -> Sequence[KeyEvent]:
        """Every account's events at or after *since* (all when ``None``), oldest first."""

    def unrevoked_keys(self, expired_after: datetime) -> Sequence[ApiKey]:
        """Every account's keys that are not revoked and expire after *expired_after*."""

    def claim_notice(self, key_id: str, notice: str, at: datetime) -> bool:
        """Claim the sending of *notice* about the key, insert-if-absent: ``False`` if it
        was claimed before, by this process or any other."""

    def release_notice(self, key_id: str, notice: str) -> None:
        """Give a claim back (its delivery failed), so that a later run sends it."""


@runtime_checkable
class UsageStore(Protocol):
    """A key store that also keeps daily request counts per key, as keyturn's own stores do
    (see :mod:`keyturn.usage`). A store without these methods simply keeps no counts."""

    def count_usage(self, day: date, counts: Mapping[tuple[str, str], int]) -> None:
        """Add *counts* (``(key_id, outcome) -> requests``) to the UTC *day*'s counts, and
        forget the days more than :data:`~keyturn.usage.KEPT_DAYS` - 1 before *day*.

        Called by several processes at once for the same key and day, it must add up: no
        count lost, none counted twice (an upsert that adds, ``+=`` on conflict).
        """

    def usage_of(self, account_id: str, since: date) -> Sequence[DailyUsage]:
        """The counts of every key the account created, from the UTC day *since* on, by
        key, day and outcome."""


@runtime_checkable
class AsyncUsageStore(Protocol):
    """The async twin of :class:`UsageStore`."""

    async def count_usage(self, day: date, counts: Mapping[tuple[str, str], int]) -> None: ...

    async def usage_of(self, account_id: str, since: date) -> Sequence[DailyUsage]: ...


@runtime_checkable
class Database(Protocol):
    """One database holding keyturn's tables: a key store and a writable membership."""

    @property
    def keys(self) -> RecordKeepingStore: ...

    @property
    def membership(self) -> WritableMembership: ...

    def create_schema(self) -> int:
        """Create or upgrade the tables (idempotent); returns the schema version."""

    def schema_version(self) -> int:
        """The schema version in the database; 0 when it holds no keyturn tables."""

    def close(self) -> None:
        """Release the database's connections."""


@runtime_checkable
class AsyncKeyStore(Protocol):
    """The async twin of :class:`KeyStore`."""

    async def get_key(self, key_id: str) -> ApiKey | None: ...

    async def add_key(self, key: ApiKey) -> None: ...

    async def keys_of(self, account_id: str) -> Sequence[ApiKey]: ...

    async def revoke_key(self, key_id: str, at: datetime) -> bool: ...

    async def mark_used(self, key_id: str, at: datetime) -> None: ...


@runtime_checkable
class AsyncMembershipProvider(Protocol):
    """The async twin of :class:`MembershipProvider`."""

    async def get_organization(self, organization_id: str) -> Organization | None: ...

    async def get_default_organization(self, tenant_id: str) -> Organization | None: ...

    async def get_role(self, account_id: str, organization_id: str) -> str | None: ...

    async def reaches_tenant(self, account_id: str, tenant_id: str) -> bool: ...


@runtime_checkable
class ConsoleMembership(MembershipProvider, Protocol):
    """A membership provider that can also list an account's organizations.

    Only the web console (:mod:`keyturn.console`) needs this: its scope choice offers the
    tenants and organizations the signed-in account reaches. A provider that never serves a
    console may leave it out; the console refuses such a provider when it is built.
    """

    def organizations_of(self, account_id: str) -> Sequence[Organization]:
        """Every organization in which the account holds a role, by tenant, default first."""
