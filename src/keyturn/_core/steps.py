"""The steps: every question keyturn puts to a key store, a membership provider or a callback.

A step is a small object that says whom it asks (``via``), how (:meth:`Step.ask`), and
what its answer may be (``answers``). The decision (``_core/decision.py``), the managers'
operations (``manager.py``), the leak responder's flow (``leaks/``), the payload guard's
recording (``payload/``), the leak they share (``_core/leak.py``) and the usage write
(``_run/usage.py``) yield them; the callers of ``_run/capabilities.py`` answer them, driven by
``_run/drive.py``. This module decides nothing and does no I/O: it only names the questions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, datetime
from types import NoneType
from typing import Any, ClassVar, Final

from keyturn._core.events import KeyEvent
from keyturn._core.model import ApiKey, Found, Organization
from keyturn.errors import WrongAnswer

__all__ = [
    "CALLBACK",
    "MEMBERSHIP",
    "STORE",
    "AddKey",
    "ClaimNotice",
    "CountUsage",
    "EventsOf",
    "EventsSince",
    "GetDefaultOrganization",
    "GetKey",
    "GetOrganization",
    "GetRole",
    "KeysOf",
    "LeakedKeys",
    "Lookup",
    "MarkUsed",
    "NotifyLeak",
    "OrganizationsOf",
    "PublicKeyOf",
    "ReachesTenant",
    "RecordEvent",
    "ReleaseNotice",
    "ReportLeak",
    "RevokeKey",
    "Step",
    "UnrevokedKeys",
    "UpgradeHash",
    "UsageOf",
    "WrongAnswer",
]

# Who answers a step: the index of Step.via into its owner's callers.
MEMBERSHIP: Final = 0
STORE: Final = 1
CALLBACK: Final = 2  # a function of the owner's user (the leak responder's hooks)


class Step:
    """A question for the membership provider, the key store or a callback (``via``).

    ``method`` names the method that answers it, ``answers`` the types its answer may have:
    every answer is checked, so a store that returns a coroutine by mistake is a refusal
    (503), never a pass.
    """

    __slots__ = ()
    via: ClassVar[int] = MEMBERSHIP
    method: ClassVar[str]
    answers: ClassVar[tuple[type, ...]]

    def ask(self, target: Any) -> Any:
        """Put the question to *target*, the store or the provider (sync or async alike)."""
        raise NotImplementedError

    def recall(self, target: Any) -> Any:
        """The answer *target* already holds, without blocking, or ``None``: a caller that
        would wait for a thread or a coroutine to ask a blocking target tries this first."""
        return None


# --- the key store ------------------------------------------------------------------------


class GetKey(Step):
    __slots__ = ("key_id",)
    via = STORE
    method = "get_key"
    answers = (ApiKey, NoneType)

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id

    def ask(self, target: Any) -> Any:
        return target.get_key(self.key_id)


class Lookup(Step):
    """Everything the decision reads for one request, from a store that offers it."""

    __slots__ = ("key_id", "organization")
    via = STORE
    method = "lookup"
    answers = (Found,)

    def __init__(self, key_id: str, organization: str | None) -> None:
        self.key_id = key_id
        self.organization = organization

    def ask(self, target: Any) -> Any:
        return target.lookup(self.key_id, self.organization)

    def recall(self, target: Any) -> Any:
        return target.lookup_cached(self.key_id, self.organization)


class KeysOf(Step):
    __slots__ = ("account_id",)
    via = STORE
    method = "keys_of"
    answers = (Sequence,)

    def __init__(self, account_id: str) -> None:
        self.account_id = account_id

    def ask(self, target: Any) -> Any:
        return target.keys_of(self.account_id)


class AddKey(Step):
    """Store a new key; raises ``DuplicateKey`` if its id is taken."""

    __slots__ = ("key",)
    via = STORE
    method = "add_key"
    answers = (object,)  # nothing is read from the answer

    def __init__(self, key: ApiKey) -> None:
        self.key = key

    def ask(self, target: Any) -> Any:
        return target.add_key(self.key)


class RevokeKey(Step):
    """Revoke a key; answered ``True`` if it was revocable and is now revoked."""

    __slots__ = ("at", "key_id")
    via = STORE
    method = "revoke_key"
    answers = (bool,)

    def __init__(self, key_id: str, at: datetime) -> None:
        self.key_id = key_id
        self.at = at

    def ask(self, target: Any) -> Any:
        return target.revoke_key(self.key_id, self.at)


class ReportLeak(Step):
    """Record a leak on a key; answered ``True`` for the key's first report."""

    __slots__ = ("at", "key_id", "url")
    via = STORE
    method = "report_leak"
    answers = (bool,)

    def __init__(self, key_id: str, url: str, at: datetime) -> None:
        self.key_id = key_id
        self.url = url
        self.at = at

    def ask(self, target: Any) -> Any:
        return target.report_leak(self.key_id, self.url, self.at)


class MarkUsed(Step):
    """Record a key's use at *at* (``last_used_at``, and ``first_used_at`` once)."""

    __slots__ = ("at", "key_id")
    via = STORE
    method = "mark_used"
    answers = (object,)  # a store written before first use was reported answers None

    def __init__(self, key_id: str, at: datetime) -> None:
        self.key_id = key_id
        self.at = at

    def ask(self, target: Any) -> Any:
        return target.mark_used(self.key_id, self.at)


class UpgradeHash(Step):
    """Replace a key's legacy hash by *new_hash*, only while it still holds *old_hash*
    (a conditional write: a concurrent revoke or rotation wins); nothing is read from the
    answer."""

    __slots__ = ("key_id", "new_hash", "old_hash")
    via = STORE
    method = "upgrade_hash"
    answers = (object,)

    def __init__(self, key_id: str, old_hash: str, new_hash: str) -> None:
        self.key_id = key_id
        self.old_hash = old_hash
        self.new_hash = new_hash

    def __repr__(self) -> str:
        return f"UpgradeHash(key_id={self.key_id!r})"

    def ask(self, target: Any) -> Any:
        return target.upgrade_hash(self.key_id, self.old_hash, self.new_hash)


class RecordEvent(Step):
    """Append an event to the record of key actions (:mod:`keyturn.activity`)."""

    __slots__ = ("event",)
    via = STORE
    method = "record_event"
    answers = (object,)  # nothing is read from the answer

    def __init__(self, event: KeyEvent) -> None:
        self.event = event

    def ask(self, target: Any) -> Any:
        return target.record_event(self.event)


class EventsOf(Step):
    """The events of an account's own keys, newest first, at most *limit*."""

    __slots__ = ("account_id", "limit")
    via = STORE
    method = "events_of"
    answers = (Sequence,)

    def __init__(self, account_id: str, limit: int) -> None:
        self.account_id = account_id
        self.limit = limit

    def ask(self, target: Any) -> Any:
        return target.events_of(self.account_id, self.limit)


class CountUsage(Step):
    """Add request counts (``(key_id, outcome) -> requests``) to a UTC day's."""

    __slots__ = ("counts", "day")
    via = STORE
    method = "count_usage"
    answers = (object,)

    def __init__(self, day: date, counts: Mapping[tuple[str, str], int]) -> None:
        self.day = day
        self.counts = counts

    def ask(self, target: Any) -> Any:
        return target.count_usage(self.day, self.counts)


class EventsSince(Step):
    """Every account's events from *since* on (``None``: from the first), oldest first, at
    most *limit*."""

    __slots__ = ("limit", "since")
    via = STORE
    method = "events_since"
    answers = (Sequence,)

    def __init__(self, since: datetime | None, limit: int) -> None:
        self.since = since
        self.limit = limit

    def ask(self, target: Any) -> Any:
        return target.events_since(self.since, self.limit)


class LeakedKeys(Step):
    """Every account's keys reported leaked, the latest report first."""

    __slots__ = ()
    via = STORE
    method = "leaked_keys"
    answers = (Sequence,)

    def ask(self, target: Any) -> Any:
        return target.leaked_keys()


class UnrevokedKeys(Step):
    """Every account's keys not revoked that expire after *expired_after*."""

    __slots__ = ("expired_after",)
    via = STORE
    method = "unrevoked_keys"
    answers = (Sequence,)

    def __init__(self, expired_after: datetime) -> None:
        self.expired_after = expired_after

    def ask(self, target: Any) -> Any:
        return target.unrevoked_keys(self.expired_after)


class ClaimNotice(Step):
    """Claim a key's notice for sending; answered ``True`` by the one claim that wins."""

    __slots__ = ("at", "key_id", "notice")
    via = STORE
    method = "claim_notice"
    answers = (bool,)

    def __init__(self, key_id: str, notice: str, at: datetime) -> None:
        self.key_id = key_id
        self.notice = notice
        self.at = at

    def ask(self, target: Any) -> Any:
        return target.claim_notice(self.key_id, self.notice, self.at)


class ReleaseNotice(Step):
    """Give back a claim whose notice could not be delivered; nothing is read from the answer."""

    __slots__ = ("key_id", "notice")
    via = STORE
    method = "release_notice"
    answers = (object,)

    def __init__(self, key_id: str, notice: str) -> None:
        self.key_id = key_id
        self.notice = notice

    def ask(self, target: Any) -> Any:
        return target.release_notice(self.key_id, self.notice)


class UsageOf(Step):
    """The daily request counts of an account's keys from the UTC day *since* on."""

    __slots__ = ("account_id", "since")
    via = STORE
    method = "usage_of"
    answers = (Sequence,)

    def __init__(self, account_id: str, since: date) -> None:
        self.account_id = account_id
        self.since = since

    def ask(self, target: Any) -> Any:
        return target.usage_of(self.account_id, self.since)


# --- the membership provider --------------------------------------------------------------


class GetOrganization(Step):
    __slots__ = ("organization_id",)
    method = "get_organization"
    answers = (Organization, NoneType)

    def __init__(self, organization_id: str) -> None:
        self.organization_id = organization_id

    def ask(self, target: Any) -> Any:
        return target.get_organization(self.organization_id)


class GetDefaultOrganization(Step):
    __slots__ = ("tenant_id",)
    method = "get_default_organization"
    answers = (Organization, NoneType)

    def __init__(self, tenant_id: str) -> None:
        self.tenant_id = tenant_id

    def ask(self, target: Any) -> Any:
        return target.get_default_organization(self.tenant_id)


class GetRole(Step):
    __slots__ = ("account_id", "organization_id")
    method = "get_role"
    answers = (str, NoneType)

    def __init__(self, account_id: str, organization_id: str) -> None:
        self.account_id = account_id
        self.organization_id = organization_id

    def ask(self, target: Any) -> Any:
        return target.get_role(self.account_id, self.organization_id)


class ReachesTenant(Step):
    __slots__ = ("account_id", "tenant_id")
    method = "reaches_tenant"
    answers = (bool,)

    def __init__(self, account_id: str, tenant_id: str) -> None:
        self.account_id = account_id
        self.tenant_id = tenant_id

    def ask(self, target: Any) -> Any:
        return target.reaches_tenant(self.account_id, self.tenant_id)


class OrganizationsOf(Step):
    """The organizations an account has a role in (a console's membership answers it)."""

    __slots__ = ("account_id",)
    method = "organizations_of"
    answers = (Sequence,)

    def __init__(self, account_id: str) -> None:
        self.account_id = account_id

    def ask(self, target: Any) -> Any:
        return target.organizations_of(self.account_id)


# --- the leak responder's callbacks (keyturn.leaks) ----------------------------------------


class PublicKeyOf(Step):
    """The PEM of a signing key, from a *public_keys* callable (or ``None``: unknown)."""

    __slots__ = ("identifier",)
    via = CALLBACK
    method = "public_keys"
    answers = (str, bytes, NoneType)

    def __init__(self, identifier: str) -> None:
        self.identifier = identifier

    def ask(self, target: Any) -> Any:
        return target.public_key(self.identifier)


class NotifyLeak(Step):
    """Hand a :class:`~keyturn.leaks.LeakReport` to *on_leak* (its failures are logged,
    never raised)."""

    __slots__ = ("report",)
    via = CALLBACK
    method = "on_leak"
    answers = (object,)

    def __init__(self, report: object) -> None:
        self.report = report

    def ask(self, target: Any) -> Any:
        return target.notify(self.report)
