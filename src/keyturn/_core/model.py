"""The records: keys, scopes, statuses, organizations, principals; and the clock. No I/O.

Every record is a frozen attrs class with keyword-only fields. Only :class:`CreatedKey`
ever holds a secret, and its repr shows the hint instead.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final, TypeVar
from zoneinfo import ZoneInfo

import attrs

from keyturn.errors import InvalidExpiry

__all__ = [
    "ApiKey",
    "Clock",
    "CreatedKey",
    "CustomDate",
    "Found",
    "KeyInfo",
    "Leaked",
    "Lifetime",
    "Organization",
    "Principal",
    "Scope",
    "ScopeKind",
    "Status",
    "utc_now",
]

Clock = Callable[[], datetime]
_T = TypeVar("_T")


#: The default :data:`Clock`: the current time in UTC. A partial, not a function: it is
#: read on every request, and a Python frame around ``datetime.now`` costs a third more.
utc_now: Final[Clock] = functools.partial(datetime.now, UTC)


def _aware(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (value.tzinfo is None or value.utcoffset() is None):
        raise ValueError(f"{attribute.name} must be a timezone-aware datetime, got {value!r}")


def _text(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty string, got {value!r}")


class Status(enum.Enum):
    """A key's state (spec section 3); derived on every request, never trusted from storage."""

    ACTIVE = "Active"
    INACTIVE = "Inactive"
    EXPIRED = "Expired"
    REVOKED = "Revoked"

    @property
    def revocable(self) -> bool:
        return self in (Status.ACTIVE, Status.INACTIVE)


class ScopeKind(enum.Enum):
    TENANT = "tenant"
    ORGANIZATION = "organization"


@attrs.frozen(kw_only=True)
class Scope:
    """Where a key works: a whole tenant, or one organization of it."""

    tenant_id: str = attrs.field(validator=_text)
    organization_id: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(_text)
    )

    @classmethod
    def tenant(cls, tenant_id: str) -> Scope:
        return cls(tenant_id=tenant_id)

    @classmethod
    def organization(cls, organization_id: str, *, tenant_id: str) -> Scope:
        return cls(tenant_id=tenant_id, organization_id=organization_id)

    @property
    def kind(self) -> ScopeKind:
        return ScopeKind.TENANT if self.organization_id is None else ScopeKind.ORGANIZATION

    def __str__(self) -> str:
        if self.organization_id is None:
            return f"tenant {self.tenant_id}"
        return f"organization {self.organization_id} (tenant {self.tenant_id})"


@attrs.frozen(kw_only=True)
class Organization:
    """An organization as the membership provider knows it."""

    id: str = attrs.field(validator=_text)
    tenant_id: str = attrs.field(validator=_text)
    is_default: bool = False


@attrs.frozen(kw_only=True)
class Leaked:
    """A key found in public: where a code host's secret scanning saw it first, and when."""

    url: str
    at: datetime = attrs.field(validator=_aware)


@attrs.frozen(kw_only=True)
class ApiKey:
    """A stored key: everything but the secret, of which only its hash is kept
    (``sha256$<hex>``; an argon2id hash for a key made before SHA-256, until its next use)."""

    key_id: str = attrs.field(validator=_text)
    secret_hash: str = attrs.field(repr=False, validator=_text)
    hint: str
    name: str
    account_id: str = attrs.field(validator=_text)
    scope: Scope
    created_at: datetime = attrs.field(validator=_aware)
    expires_at: datetime = attrs.field(validator=_aware)
    revoked_at: datetime | None = attrs.field(default=None, validator=_aware)
    last_used_at: datetime | None = attrs.field(default=None, validator=_aware)
    # Written once, by the usage write that first sets last_used_at: rotation's confirmation.
    first_used_at: datetime | None = attrs.field(default=None, validator=_aware)
    leaked: Leaked | None = None  # see keyturn.leaks
    # Set on a key made by KeyManager.rotate(): the id of the key it replaces, and the
    # creator's choice to revoke that key once this one's first use is recorded.
    replaces: str | None = None
    revoke_old_on_first_use: bool = False


@attrs.frozen(kw_only=True)
class Found:
    """What a store's combined read found for one request (``KeyStore.lookup``, optional):
    the key, and enough around it to answer every question the decision asks of a request
    that names *asked* (an organization id; ``None`` when it names none or ``default``).

    ``named`` is the organization *asked* names (``None``: there is none); ``default`` the
    key's tenant's default organization; ``roles`` the creator's role (``None``: no role)
    in the key's own organization, in *named* and in *default*; ``reaches`` whether the
    creator holds a role anywhere in the key's tenant. It answers the decision's questions
    with the methods of a key store and a membership provider, and refuses any other
    question: a store's read and the decision cannot drift apart unseen.
    """

    key: ApiKey | None
    asked: str | None = None
    named: Organization | None = None
    default: Organization | None = None
    roles: dict[str, str | None] = attrs.field(factory=dict)
    reaches: bool = False

    def get_key(self, key_id: str) -> ApiKey | None:
        return self._known(self.key, self.key is None or key_id == self.key.key_id)

    def get_organization(self, organization_id: str) -> Organization | None:
        return self._known(self.named, organization_id == self.asked)

    def get_default_organization(self, tenant_id: str) -> Organization | None:
        return self._known(self.default, self._tenant(tenant_id))

    def get_role(self, account_id: str, organization_id: str) -> str | None:
        known = self._account(account_id) and organization_id in self.roles
        return self._known(self.roles.get(organization_id), known)

    def reaches_tenant(self, account_id: str, tenant_id: str) -> bool:
        return self._known(self.reaches, self._account(account_id) and self._tenant(tenant_id))

    def _account(self, account_id: str) -> bool:
        return self.key is not None and account_id == self.key.account_id

    def _tenant(self, tenant_id: str) -> bool:
        return self.key is not None and tenant_id == self.key.scope.tenant_id

    @staticmethod
    def _known(answer: _T, known: bool) -> _T:
        if not known:
            raise LookupError("the question lies outside what the lookup read")
        return answer


@attrs.frozen(kw_only=True)
class KeyInfo:
    """What the console's key list shows for one key: never the secret."""

    key_id: str
    hint: str
    name: str
    scope: Scope
    status: Status
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None
    first_used_at: datetime | None = None  # the first recorded use; it never moves
    leaked: Leaked | None = None  # reported leaked: show it, and tell the creator to revoke
    # A rotation, seen from both keys (see KeyManager.rotate):
    replaces: str | None = None  # on the new key: the id of the key it replaces
    revoke_old_on_first_use: bool = False  # on the new key: the creator's choice
    replaced_by: str | None = None  # on the old key: the id of its newest replacement
    # On the old key: the replacement's first_used_at. None: the new key has not been seen
    # yet; set: it works (an accepted request), so the old key can go.
    replacement_first_used_at: datetime | None = None

    @property
    def replacement_confirmed(self) -> bool:
        """Whether this key's replacement has been used: the old key can be revoked."""
        return self.replacement_first_used_at is not None


@attrs.frozen(kw_only=True, repr=False)
class CreatedKey:
    """The result of creating a key: the only object that ever holds the full secret.

    Show :attr:`secret` to the user once; it cannot be retrieved later.
    """

    secret: str
    info: KeyInfo

    def __repr__(self) -> str:
        return f"CreatedKey(hint={self.info.hint!r}, info={self.info!r})"


@attrs.frozen(kw_only=True)
class Principal:
    """Who is calling, in which organization: what the application receives."""

    account_id: str
    key_id: str
    key_name: str
    scope: Scope
    organization_id: str
    tenant_id: str
    role: str
    # When the key stops working; None only on a principal built by hand (a test double).
    expires_at: datetime | None = None


class Lifetime(enum.Enum):
    """The console's fixed lifetimes; each is an exact duration from the moment of creation."""

    HOURS_3 = timedelta(hours=3)
    DAYS_1 = timedelta(days=1)
    DAYS_7 = timedelta(days=7)
    DAYS_30 = timedelta(days=30)
    DAYS_90 = timedelta(days=90)

    @property
    def label(self) -> str:
        """The short form: ``3h``, ``1d``, ``7d``, ``30d`` or ``90d``."""
        days, seconds = self.value.days, self.value.seconds
        return f"{days}d" if days else f"{seconds // 3600}h"

    @classmethod
    def parse(cls, text: str) -> Lifetime:
        """The lifetime a short form names: ``Lifetime.parse("30d")``, as the command takes it.

        :raises InvalidExpiry: (a ``ValueError``) *text* names none of the console's lifetimes.
        """
        for lifetime in cls:
            if lifetime.label == str(text).strip().lower():
                return lifetime
        choices = ", ".join(lifetime.label for lifetime in cls)
        raise InvalidExpiry(f"a lifetime is one of {choices}, got {text!r}")


@attrs.frozen
class CustomDate:
    """A custom expiry: the key expires at the end of *day* in the user's time zone."""

    day: date
    time_zone: ZoneInfo | str
