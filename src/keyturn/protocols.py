"""What keyturn needs from your data: a key store and a membership provider.

Implement these with your own tables (or use :mod:`keyturn.stores`). Both come in a sync
flavour, for the WSGI middleware and scripts, and an async twin for the ASGI middleware.
The async middleware also accepts the sync flavour: it calls it in a worker thread, or
directly when the object says it never blocks (``nonblocking = True``, as the in-memory
implementations do). The sync middleware bounds each blocking call with a watchdog thread
(the Authenticator's ``timeout``), unless the object says it bounds its own calls
(``enforces_timeout = True``, as the SQLite store does with its busy timeout).

Contract, for every method: answer from committed state (a revoke committed anywhere must
be seen by the next call), return ``None``/``False`` for "not there", and raise for "cannot
answer right now" -- keyturn turns a raise into 503, never into 401, so that a client does
not throw away a good key while your database is down.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from keyturn._model import ApiKey, Organization

__all__ = [
    "AsyncKeyStore",
    "AsyncMembershipProvider",
    "ConsoleMembership",
    "KeyStore",
    "MembershipProvider",
]


@runtime_checkable
class KeyStore(Protocol):
    """Where key records live. Never sees a secret: only its argon2id hash."""

    def get_key(self, key_id: str) -> ApiKey | None:
        """The key with this id, or ``None``. Called on every authenticated request."""

    def add_key(self, key: ApiKey) -> None:
        """Store a new key; raise :class:`~keyturn.errors.DuplicateKey` if the id exists."""

    def keys_of(self, account_id: str) -> Sequence[ApiKey]:
        """Every key the account created, newest first."""

    def revoke_key(self, key_id: str, at: datetime) -> bool:
        """Set ``revoked_at`` if it is unset; ``True`` only if this call revoked the key."""

    def mark_used(self, key_id: str, at: datetime) -> None:
        """Record that the key was used at *at* (best effort; keyturn throttles the calls)."""


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
