"""The console side: create, list, rotate and revoke keys for a signed-in user.

:class:`KeyManager` takes the id of the account signed in to your console -- never an API
key -- so no API key can create, list or revoke keys (spec section 1, D18). A web console is
a thin page over these methods::

    manager = KeyManager(store, membership)
    created = manager.create("alice", name="CI deploys", scope=Scope.tenant("acme"))
    print(created.secret)                       # show once; it cannot be retrieved later
    manager.list("alice", status=Status.ACTIVE)  # hints, never secrets
    manager.revoke("alice", created.info.key_id)
    manager.expiring("alice", within=timedelta(days=14))  # soonest first: rotate these
    new = manager.rotate("alice", old_id, revoke_old_on_first_use=True)  # see rotate()

Rotation (spec section 5: create a new key with the same scope, deploy it, confirm it works,
then revoke the old one) is decided here and recorded on the new key; the confirmation is
the new key's ``first_used_at``, and the revoke the creator may ask for is done by the
store's usage write (``KeyStore.mark_used``, by the rule ``_lifecycle.revoked_by_use``),
never on a request's path. A store that drops the link is refused at rotation.

Each operation decides, so it is written once, as a generator that yields its steps
(``_core/steps.py``, the decision's own vocabulary) and receives their answers. The two managers
write out the same methods, each a call of the operation and of its driver
(``_run/drive.py``): :class:`KeyManager` answers every step in place,
:class:`AsyncKeyManager` awaits it (the two clients of httpx are written the same way). A
store's error is raised into the operation where it asked.
"""

from __future__ import annotations

import builtins
import functools
import logging
from collections.abc import Callable, Generator, Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final, Never, TypeVar

from keyturn._core import token as _token
from keyturn._core.decision import reach_question
from keyturn._core.events import LIBRARY, Action, By, KeyEvent, new_event
from keyturn._core.hashing import hash_secret
from keyturn._core.lifecycle import (
    DEFAULT_LIFETIME,
    MAX_LIFETIME,
    derive_status,
    expiry_for,
    validate_name,
)
from keyturn._core.model import (
    ApiKey,
    Clock,
    CreatedKey,
    CustomDate,
    KeyInfo,
    Lifetime,
    Organization,
    Scope,
    ScopeKind,
    Status,
    utc_now,
)
from keyturn._core.paging import PAGE, events_since
from keyturn._core.steps import (
    MEMBERSHIP,
    STORE,
    AddKey,
    ClaimNotice,
    EventsOf,
    GetKey,
    GetOrganization,
    GetRole,
    KeysOf,
    LeakedKeys,
    OrganizationsOf,
    RecordEvent,
    ReleaseNotice,
    RevokeKey,
    Step,
    UnrevokedKeys,
    UsageOf,
)
from keyturn._run.capabilities import Capabilities, capabilities
from keyturn._run.drive import Conduct, drive, drive_async
from keyturn.errors import (
    DuplicateKey,
    KeyAlreadyReplaced,
    KeyNotFound,
    KeyNotRevocable,
    KeyNotRotatable,
    ScopeNotReachable,
)
from keyturn.protocols import (
    AsyncKeyStore,
    AsyncMembershipProvider,
    KeyStore,
    MembershipProvider,
)
from keyturn.usage import DailyUsage

__all__ = ["AsyncKeyManager", "KeyManager"]

log = logging.getLogger("keyturn.activity")
T = TypeVar("T")

_Op = Generator[Step, Any, T]
_RAISED: Final[Conduct[Never]] = Conduct()  # a store's error is raised where it asked


class _Operations:
    """The operations, each a generator of steps; a subclass runs them (sync or awaited)."""

    def __init__(self, store: Any, membership: Any, clock: Clock) -> None:
        self.clock = clock
        # What each can do, read once: the notifier and the console read the store's.
        self.store_capabilities = capabilities(store)
        self._membership_capabilities = capabilities(membership)
        # Indexed by Step.via: MEMBERSHIP, STORE. No deadline: a console waits for its store.
        self._callers = (
            self._membership_capabilities.caller(),
            self.store_capabilities.caller(),
        )

    def _named(self) -> tuple[tuple[str, Capabilities], ...]:
        return (("store", self.store_capabilities), ("membership", self._membership_capabilities))

    @property
    def store(self) -> Any:
        """The key store."""
        return self._callers[STORE].target

    @property
    def membership(self) -> Any:
        """The membership provider."""
        return self._callers[MEMBERSHIP].target

    def __repr__(self) -> str:
        return f"{type(self).__name__}(store={self.store!r}, membership={self.membership!r})"

    def _now(self) -> datetime:
        # Stored instants are UTC (D12), whatever zone the clock answers in.
        now = self.clock()
        return now if now.utcoffset() is None else now.astimezone(UTC)

    def _create(
        self,
        account_id: str,
        *,
        name: str,
        scope: Scope | None = None,
        organization: str | None = None,
        expiry: Lifetime | CustomDate = DEFAULT_LIFETIME,
        by: By | None = None,
    ) -> _Op[CreatedKey]:
        """The operation behind :meth:`KeyManager.create`."""
        account_id = _account(account_id)
        name = validate_name(name)
        if organization is not None:
            if scope is not None:
                raise TypeError("give scope or organization, not both")
            found = yield GetOrganization(organization)
            if found is None:
                raise ScopeNotReachable(f"there is no organization {organization!r}")
            scope = Scope.organization(found.id, tenant_id=found.tenant_id)
        if not isinstance(scope, Scope):
            raise TypeError(
                "scope must be Scope.tenant(tenant_id) or "
                f"Scope.organization(organization_id, tenant_id=...) (or pass organization=...), "
                f"got {scope!r}"
            )
        now = self._now()
        expires_at = expiry_for(expiry, now)
        scope = yield from _reachable(account_id, scope)
        draft = functools.partial(
            ApiKey,
            name=name,
            account_id=account_id,
            scope=scope,
            created_at=now,
            expires_at=expires_at,
        )
        return (yield from self._add(draft, by))

    def _rotate(
        self,
        account_id: str,
        key_id: str,
        *,
        revoke_old_on_first_use: bool = False,
        by: By | None = None,
    ) -> _Op[CreatedKey]:
        """The operation behind :meth:`KeyManager.rotate`."""
        account_id = _account(account_id)
        key_id = _key_id(key_id, revoke_old_on_first_use)
        now = self._now()
        old = _rotatable(key_id, (yield KeysOf(account_id)), now)
        scope = yield from _reachable(account_id, old.scope)
        # The old key's lifetime choice is kept as its span: a fixed lifetime stays that
        # lifetime; a custom date becomes the same span from now, capped as any expiry is.
        span = min(old.expires_at - old.created_at, MAX_LIFETIME)
        draft = functools.partial(
            ApiKey,
            name=old.name,
            account_id=old.account_id,
            scope=scope,
            created_at=now,
            expires_at=now + span,
            replaces=old.key_id,
            revoke_old_on_first_use=revoke_old_on_first_use,
        )
        return (yield from self._add(draft, by, f"replaces {old.hint} (key {old.key_id})"))

    def _add(
        self, draft: Callable[..., ApiKey], by: By | None, replaces: str | None = None
    ) -> _Op[CreatedKey]:
        """Store the key *draft* makes with a fresh id and secret (only the secret's hash)."""
        for _ in range(3):  # a clash of 71 random bits is astronomically rare; never silent
            token = _token.generate()
            key = draft(key_id=token.key_id, secret_hash=hash_secret(token.secret), hint=token.hint)
            try:
                yield AddKey(key)
            except DuplicateKey:
                continue
            if key.replaces is not None and not _kept((yield GetKey(key.key_id)), key):
                yield RevokeKey(key.key_id, key.created_at)
                raise KeyNotRotatable(
                    f"the key store {type(self.store).__name__} does not keep rotations "
                    "(ApiKey.replaces and revoke_old_on_first_use), so the new key was revoked "
                    "at once: see KeyStore.add_key and KeyStore.mark_used"
                )
            action = Action.CREATED if replaces is None else Action.ROTATED
            yield from self._record(key, action, by, replaces)
            return CreatedKey(secret=token.token, info=_info(key, Status.ACTIVE))
        raise DuplicateKey("could not find a free key id; is the key store's random source broken?")

    def _list(
        self,
        account_id: str,
        *,
        status: Status | None = None,
        scope: ScopeKind | Scope | None = None,
    ) -> _Op[list[KeyInfo]]:
        """The operation behind :meth:`KeyManager.list`."""
        account_id = _account(account_id)
        if status is not None and not isinstance(status, Status):
            raise TypeError(f"status must be a Status (e.g. Status.ACTIVE), got {status!r}")
        if scope is not None and not isinstance(scope, ScopeKind | Scope):
            raise TypeError(
                f"scope must be a ScopeKind (e.g. ScopeKind.TENANT) or a Scope, got {scope!r}"
            )
        now = self._now()
        keys: Sequence[ApiKey] = yield KeysOf(account_id)
        replacements = _replacements(keys)
        reach: dict[Scope, bool] = {}  # one membership question per scope, not per key
        infos = []
        for key in keys:
            if key.scope not in reach:  # the decision's own Inactive rule, asked the same way
                reach[key.scope] = bool((yield reach_question(account_id, key.scope)))
            info = _info(
                key,
                derive_status(key, now, reaches_scope=reach[key.scope]),
                replacements.get(key.key_id),
            )
            if (status is None or info.status is status) and (
                scope is None
                or (
                    info.scope.kind is scope
                    if isinstance(scope, ScopeKind)
                    else info.scope == scope
                )
            ):
                infos.append(info)
        return infos

    def _revoke(self, account_id: str, key_id: str, by: By | None = None) -> _Op[KeyInfo]:
        """The operation behind :meth:`KeyManager.revoke`."""
        account_id = _account(account_id)
        key_id = _key_id(key_id)
        key: ApiKey | None = (yield GetKey(key_id)) if key_id else None
        if key is None or key.account_id != account_id:
            raise _not_found(key_id)
        now = self._now()
        # Inactive keys are revocable too, so membership does not matter here.
        status = derive_status(key, now, reaches_scope=True)
        if not status.revocable or not (yield RevokeKey(key_id, now)):
            status = derive_status((yield GetKey(key_id)) or key, now, reaches_scope=True)
            raise KeyNotRevocable(
                f"key {key.hint} is already {status.value}; Expired and Revoked keys stay that way"
            )
        revoked = yield GetKey(key_id)
        assert revoked is not None, "the store lost a key it just revoked"
        yield from self._record(revoked, Action.REVOKED, by)
        replacement = _replacements((yield KeysOf(account_id))).get(key_id)
        return _info(revoked, Status.REVOKED, replacement)

    def _activity(self, account_id: str, limit: int) -> _Op[list[KeyEvent]]:
        """The operation behind :meth:`KeyManager.activity`."""
        account_id = _account(account_id)
        self.store_capabilities.require_record("KeyManager.activity")
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        events: list[KeyEvent] = yield EventsOf(account_id, limit)
        return events

    def _record(
        self, key: ApiKey, action: Action, by: By | None, detail: str | None = None
    ) -> _Op[None]:
        """Append the action to the record, if the store keeps one. It is done: a record
        that fails is logged, never raised, so a new key's secret is never lost to it."""
        if not self.store_capabilities.has("record_event"):
            return
        event = new_event(key, action, self._now(), by or LIBRARY, detail=detail)
        try:
            yield RecordEvent(event)
        except Exception:
            log.exception("could not record %s of key %s", action.value, key.key_id)

    def _expiring(self, account_id: str, *, within: timedelta) -> _Op[list[KeyInfo]]:
        """The operation behind :meth:`KeyManager.expiring`."""
        account_id = _account(account_id)
        now = self._now()
        if not isinstance(within, timedelta):
            raise TypeError(f"within must be a timedelta (e.g. timedelta(days=14)), got {within!r}")
        if within < timedelta(0):
            raise ValueError(f"within must not be negative, got {within}")
        horizon = now + within
        # Active and Inactive keys have not expired yet (status is derived against now).
        return sorted(
            (
                info
                for info in (yield from self._list(account_id))
                if info.status in (Status.ACTIVE, Status.INACTIVE) and info.expires_at <= horizon
            ),
            key=lambda info: (info.expires_at, info.key_id),
        )

    # --- asked by keyturn's own console, notifier and command: not the signed-in user's API.
    # Each is one question, but asked here, so that the managers own every question put to
    # the store and the provider outside a request.

    def _get(self, key_id: str) -> _Op[ApiKey | None]:
        found: ApiKey | None = yield GetKey(key_id)
        return found

    def _usage(self, account_id: str, since: date) -> _Op[Sequence[DailyUsage]]:
        rows: Sequence[DailyUsage] = yield UsageOf(account_id, since)
        return rows

    def _organizations_of(self, account_id: str) -> _Op[Sequence[Organization]]:
        found: Sequence[Organization] = yield OrganizationsOf(account_id)
        return found

    def _role_of(self, account_id: str, organization_id: str) -> _Op[str | None]:
        role: str | None = yield GetRole(account_id, organization_id)
        return role

    def _leaked(self) -> _Op[Sequence[ApiKey]]:
        keys: Sequence[ApiKey] = yield LeakedKeys()
        return keys

    def _unrevoked(self, expired_after: datetime) -> _Op[Sequence[ApiKey]]:
        keys: Sequence[ApiKey] = yield UnrevokedKeys(expired_after)
        return keys

    def _claim_notice(self, key_id: str, notice: str, at: datetime) -> _Op[bool]:
        claimed: bool = yield ClaimNotice(key_id, notice, at)
        return claimed

    def _release_notice(self, key_id: str, notice: str) -> _Op[None]:
        yield ReleaseNotice(key_id, notice)

    def _record_event(self, event: KeyEvent) -> _Op[None]:
        yield RecordEvent(event)

    def _events_since(
        self, since: datetime | None, write: Callable[[KeyEvent], object], page: int = PAGE
    ) -> _Op[int]:
        """Hand every event from *since* on to *write*, oldest first; the number handed over
        (the paging of :func:`keyturn.activity.each_event_since`, asked as steps)."""
        return (yield from events_since(since, write, page))


class KeyManager(_Operations):
    """Console operations over a :class:`KeyStore` and a :class:`MembershipProvider`."""

    def __init__(
        self, store: KeyStore, membership: MembershipProvider, *, clock: Clock = utc_now
    ) -> None:
        super().__init__(store, membership, clock)
        # Called synchronously, an async store's answer would be a coroutine never awaited:
        # a secret returned for a key never stored, a truthy membership answer.
        for name, can in self._named():
            if can.is_async:
                raise TypeError(
                    f"KeyManager needs a sync {name}, got the async {can.name}: "
                    "use AsyncKeyManager, or the sync twin (PostgresDatabase rather than "
                    "AsyncPostgresDatabase)"
                )

    def create(
        self,
        account_id: str,
        *,
        name: str,
        scope: Scope | None = None,
        organization: str | None = None,
        expiry: Lifetime | CustomDate = DEFAULT_LIFETIME,
        by: By | None = None,
    ) -> CreatedKey:
        """Create a key for *account_id*. The returned secret is shown once and never again.

        Give either *scope*, or *organization* alone: an organization id whose tenant the
        membership provider knows (``organization="org_research"``). *by* says who acts and
        through what, for the record (:mod:`keyturn.activity`); by default the account,
        through the library.

        :raises InvalidKeyName: the name is empty, too long or holds control characters.
        :raises InvalidExpiry: the custom date is outside [tomorrow, today + 1 year].
        :raises ScopeNotReachable: the account cannot reach that tenant or organization.
        """
        return self._run(
            self._create(
                account_id,
                name=name,
                scope=scope,
                organization=organization,
                expiry=expiry,
                by=by,
            )
        )

    def rotate(
        self,
        account_id: str,
        key_id: str,
        *,
        revoke_old_on_first_use: bool = False,
        by: By | None = None,
    ) -> CreatedKey:
        """Create the replacement of one of the account's keys; its secret is shown once.

        The new key has the old one's name and scope, and its lifetime: the same span from
        now (at most 365 days). It records which key it replaces; the old key keeps working
        until it is revoked. Once the new key has been used (its ``first_used_at``), the old
        key's :class:`KeyInfo` says so (``replacement_first_used_at``): revoke it then.
        With *revoke_old_on_first_use*, the store revokes the old key itself when it
        records the new key's first use.

        :raises KeyNotFound: no such key among the account's own (as :meth:`revoke`).
        :raises KeyNotRotatable: the key is Expired or Revoked: create a new key instead.
        :raises KeyAlreadyReplaced: the key already has a replacement that works.
        :raises ScopeNotReachable: the account no longer reaches the key's scope (Inactive).
        """
        return self._run(
            self._rotate(account_id, key_id, revoke_old_on_first_use=revoke_old_on_first_use, by=by)
        )

    def revoke(self, account_id: str, key_id: str, *, by: By | None = None) -> KeyInfo:
        """Revoke one of the account's keys: immediate and irreversible. *by* says who acts,
        for the record: the account by default, or an operator (:meth:`By.operator`).

        :raises KeyNotFound: no such key among the account's own (another user's key included).
        :raises KeyNotRevocable: the key is already Expired or Revoked.
        """
        return self._run(self._revoke(account_id, key_id, by))

    def expiring(self, account_id: str, *, within: timedelta) -> builtins.list[KeyInfo]:
        """The account's keys that still work or could again (Active or Inactive) and expire
        within *within* of the clock's now, the soonest first: the ones to rotate.

        :raises ValueError: *within* is negative.
        """
        return self._run(self._expiring(account_id, within=within))

    def activity(self, account_id: str, *, limit: int = 100) -> builtins.list[KeyEvent]:
        """What was done to the account's own keys, and by whom: newest first, at most
        *limit* events (see :mod:`keyturn.activity`).

        :raises ActivityNotKept: the key store keeps no record.
        """
        return self._run(self._activity(account_id, limit))

    def list(
        self,
        account_id: str,
        *,
        status: Status | None = None,
        scope: ScopeKind | Scope | None = None,
    ) -> builtins.list[KeyInfo]:
        """The account's own keys, newest first, optionally filtered by status and scope.

        *scope* is a :class:`ScopeKind` (all tenant keys, all organization keys) or one
        :class:`Scope`.
        """
        return self._run(self._list(account_id, status=status, scope=scope))

    def _run(self, flow: _Op[T]) -> T:
        """Answer each step of *flow* in place; a store's error is raised where it asked."""
        return drive(flow, self._callers, _RAISED, None)


class AsyncKeyManager(_Operations):
    """The async twin of :class:`KeyManager`, over an :class:`AsyncKeyStore` and an
    :class:`AsyncMembershipProvider` (such as ``AsyncPostgresDatabase``'s): the same
    operations, every store and membership call awaited."""

    def __init__(
        self,
        store: AsyncKeyStore,
        membership: AsyncMembershipProvider,
        *,
        clock: Clock = utc_now,
    ) -> None:
        super().__init__(store, membership, clock)
        for name, can in self._named():
            if not can.is_async:
                raise TypeError(
                    f"AsyncKeyManager needs an async {name}, got {can.name}: "
                    "use KeyManager for a sync one"
                )

    async def create(
        self,
        account_id: str,
        *,
        name: str,
        scope: Scope | None = None,
        organization: str | None = None,
        expiry: Lifetime | CustomDate = DEFAULT_LIFETIME,
        by: By | None = None,
    ) -> CreatedKey:
        """:meth:`KeyManager.create`, awaited: the secret is shown once and never again."""
        return await self._run(
            self._create(
                account_id,
                name=name,
                scope=scope,
                organization=organization,
                expiry=expiry,
                by=by,
            )
        )

    async def rotate(
        self,
        account_id: str,
        key_id: str,
        *,
        revoke_old_on_first_use: bool = False,
        by: By | None = None,
    ) -> CreatedKey:
        """:meth:`KeyManager.rotate`, awaited."""
        return await self._run(
            self._rotate(account_id, key_id, revoke_old_on_first_use=revoke_old_on_first_use, by=by)
        )

    async def revoke(self, account_id: str, key_id: str, *, by: By | None = None) -> KeyInfo:
        """:meth:`KeyManager.revoke`, awaited."""
        return await self._run(self._revoke(account_id, key_id, by))

    async def expiring(self, account_id: str, *, within: timedelta) -> builtins.list[KeyInfo]:
        """:meth:`KeyManager.expiring`, awaited."""
        return await self._run(self._expiring(account_id, within=within))

    async def activity(self, account_id: str, *, limit: int = 100) -> builtins.list[KeyEvent]:
        """:meth:`KeyManager.activity`, awaited."""
        return await self._run(self._activity(account_id, limit))

    async def list(
        self,
        account_id: str,
        *,
        status: Status | None = None,
        scope: ScopeKind | Scope | None = None,
    ) -> builtins.list[KeyInfo]:
        """:meth:`KeyManager.list`, awaited."""
        return await self._run(self._list(account_id, status=status, scope=scope))

    async def _run(self, flow: _Op[T]) -> T:
        """:meth:`KeyManager._run` with each step awaited."""
        return await drive_async(flow, self._callers, _RAISED, None)


def _account(account_id: object) -> str:
    if not isinstance(account_id, str) or not account_id:
        raise TypeError(
            f"account_id must be the signed-in account's id (a non-empty str), got {account_id!r}"
        )
    return account_id


def _reachable(account_id: str, scope: Scope) -> _Op[Scope]:
    """*scope* as the provider names it, if the account reaches it (D16: canonical ids)."""
    if scope.organization_id is None:
        if not (yield reach_question(account_id, scope)):
            raise ScopeNotReachable(
                f"account {account_id!r} reaches no organization of tenant {scope.tenant_id!r}"
            )
        return scope
    organization = yield GetOrganization(scope.organization_id)
    if organization is None or organization.tenant_id != scope.tenant_id:
        raise ScopeNotReachable(
            f"there is no organization {scope.organization_id!r} in tenant {scope.tenant_id!r}"
        )
    if (yield GetRole(account_id, organization.id)) is None:
        raise ScopeNotReachable(
            f"account {account_id!r} has no role in organization {scope.organization_id!r}"
        )
    return Scope.organization(organization.id, tenant_id=organization.tenant_id)


def _key_id(key_id: object, revoke_old_on_first_use: object = False) -> str:
    """The *key_id* argument, type-checked with rotate()'s flag."""
    if not isinstance(key_id, str):
        raise TypeError(f"key_id must be a str, got {type(key_id).__name__}")
    if not isinstance(revoke_old_on_first_use, bool):
        raise TypeError(
            f"revoke_old_on_first_use must be True or False, got {revoke_old_on_first_use!r}"
        )
    return key_id


def _not_found(key_id: str) -> KeyNotFound:
    return KeyNotFound(f"you have no key with {_token.naming_id(key_id)}")


def _kept(stored: ApiKey | None, key: ApiKey) -> bool:
    """Whether the store kept a replacement's link and the creator's choice: a store
    written before rotation existed may drop them, and the choice would be silently lost."""
    return stored is not None and (stored.replaces, stored.revoke_old_on_first_use) == (
        key.replaces,
        key.revoke_old_on_first_use,
    )


def _replacements(keys: Iterable[ApiKey]) -> dict[str, ApiKey]:
    """Old key id -> its newest replacement, from an account's keys listed newest first."""
    found: dict[str, ApiKey] = {}
    for key in keys:
        if key.replaces is not None:
            found.setdefault(key.replaces, key)
    return found


def _rotatable(key_id: str, keys: Sequence[ApiKey], now: datetime) -> ApiKey:
    """The key to rotate among the account's *keys*, if rotating it is allowed at *now*."""
    old = next((key for key in keys if key.key_id == key_id), None) if key_id else None
    if old is None:
        raise _not_found(key_id)
    status = derive_status(old, now, reaches_scope=True)
    if not status.revocable:
        raise KeyNotRotatable(
            f"key {old.hint} is {status.value}: nothing can use it any more, so there is "
            "nothing to rotate; create a new key instead"
        )
    new = _replacements(keys).get(key_id)
    if new is not None and derive_status(new, now, reaches_scope=True).revocable:
        raise KeyAlreadyReplaced(
            f"key {old.hint} already has a replacement, key {new.key_id} ({new.hint}): "
            "deploy that one and revoke the old key, or revoke the replacement to rotate again",
            replacement_id=new.key_id,
        )
    return old


def _info(key: ApiKey, status: Status, replacement: ApiKey | None = None) -> KeyInfo:
    return KeyInfo(
        key_id=key.key_id,
        hint=key.hint,
        name=key.name,
        scope=key.scope,
        status=status,
        created_at=key.created_at,
        expires_at=key.expires_at,
        revoked_at=key.revoked_at,
        last_used_at=key.last_used_at,
        first_used_at=key.first_used_at,
        leaked=key.leaked,
        replaces=key.replaces,
        revoke_old_on_first_use=key.revoke_old_on_first_use,
        replaced_by=None if replacement is None else replacement.key_id,
        replacement_first_used_at=None if replacement is None else replacement.first_used_at,
    )
