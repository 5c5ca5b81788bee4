"""THE authentication decision: whether one request passes, and as whom, where.

Rules of this file (keep them):

1. Whether a request passes is decided here, or in the pure modules named below; every
   other file only carries a request in or an outcome out:

   - ``_core/target.py``: which requests are guarded at all (the canonical path under the
     prefix), and the 400 for a target with no single reading;
   - this file: the credential (:func:`credential`, with which the leak responder and
     the payload guard check keys too), the header syntax, the organization, the Inactive
     reach rule (:func:`reach_question`, which the console's :class:`~keyturn.KeyManager`
     uses too), the policy's 403 and the service headers it carries (``Refusal.principal``),
     and the mapping of a failing store or provider to 503 (:func:`unavailable`);
   - ``_core/token.py``: the key layout and checksum; ``_core/lifecycle.py``: a key's status, and
     whether its use is a rotation's first (:func:`~keyturn._core.lifecycle.revokes_at_first_use`);
     ``_core/hashing.py``: whether a secret matches its hash, and whether that hash is a legacy
     argon2id one to replace.

   ``authenticator.py`` runs it with ``_run/drive.py``'s drivers, and the callers of
   ``_run/capabilities.py`` answer its steps;
   the adapters ``_web.py``, ``asgi.py``, ``wsgi.py``, ``django.py`` and ``fastapi.py``
   translate a request into an :class:`AuthRequest` and the outcome into a response;
   ``_run/memo.py`` gives back this decision's last answer while nothing it read has changed.
2. No I/O and no framework. :func:`decide` is a generator: it yields steps (``_core/steps.py``:
   read a key, resolve an organization, get a role) and receives their answers. It mutates
   nothing it is given; its writes are steps too (a rotation's first use,
   :class:`~keyturn._core.steps.MarkUsed`, and a legacy hash's upgrade,
   :class:`~keyturn._core.steps.UpgradeHash`). The sync and async drivers of
   ``_run/drive.py`` run it; neither holds any logic.
3. No CPU-heavy step: a secret is checked in place with one SHA-256 (D2). A key still
   holding a legacy argon2id hash runs argon2 once per process, then has its hash replaced
   (``_core/hashing.py`` bounds that path).
4. The order of checks is fixed (D4): credential (401), then ``x-organization-id`` syntax (400),
   then organization resolution and reach (404), then the application's role policy (403).
   A refusal carries the precise :class:`~keyturn.errors.Reason` for logs, never the client.
"""

from __future__ import annotations

import binascii
import contextlib
import functools
import inspect
import re
from collections.abc import Callable, Generator, Sequence
from datetime import datetime
from typing import Any, Final, NamedTuple

import attrs

from keyturn._core import token as _token
from keyturn._core.hashing import check_secret, hash_secret, is_legacy
from keyturn._core.lifecycle import derive_status, revokes_at_first_use
from keyturn._core.model import ApiKey, Found, Principal, Scope, Status
from keyturn._core.steps import (
    GetDefaultOrganization,
    GetKey,
    GetOrganization,
    GetRole,
    Lookup,
    MarkUsed,
    ReachesTenant,
    Step,
    UpgradeHash,
)
from keyturn.errors import (
    InvalidRequest,
    NotFound,
    PermissionDenied,
    Reason,
    Refusal,
    ServiceUnavailable,
    Unauthorized,
)

__all__ = [
    "DEFAULT_ORGANIZATION",
    "DEFAULT_ORGANIZATION_PATTERN",
    "AuthRequest",
    "Policy",
    "Rules",
    "credential",
    "decide",
    "holds_key",
    "police",
    "reach_question",
    "unavailable",
]

DEFAULT_ORGANIZATION: Final = "default"
DEFAULT_ORGANIZATION_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"
_HTTP_WHITESPACE: Final = " \t"
_BEARER: Final = "Bearer "
_BEARER_LINE_LENGTH: Final[int] = len(_BEARER) + _token.TOKEN_LENGTH


class AuthRequest(NamedTuple):
    """What the decision reads from a request: every value of the two headers, and the route.

    Header values are given as received (latin-1 text), one entry per header line, so that
    repeated headers can be refused. The repr counts the ``Authorization`` lines and never
    shows them: they hold the key. (A named tuple, not an attrs class: the middleware builds
    one per request, and this is the cheapest immutable record Python has.)
    """

    # Typed as sequences, built as tuples: a bare str (a sequence of str) is refused by the
    # parsers below, with their message.
    authorization: Sequence[str] = ()
    organization: Sequence[str] = ()
    method: str = "GET"
    path: str = "/"

    def __repr__(self) -> str:
        return (
            f"AuthRequest(authorization=<{len(self.authorization)} hidden>, "
            f"organization={self.organization!r}, method={self.method!r}, path={self.path!r})"
        )


Policy = Callable[[Principal, AuthRequest], bool]


def _compile(pattern: str | re.Pattern[str]) -> re.Pattern[str]:
    return re.compile(pattern, re.ASCII) if isinstance(pattern, str) else pattern


@attrs.frozen(kw_only=True)
class Rules:
    """The knobs of the decision. ``policy`` returning ``False`` refuses with 403."""

    organization_pattern: re.Pattern[str] = attrs.field(
        default=DEFAULT_ORGANIZATION_PATTERN, converter=_compile
    )
    policy: Policy | None = None
    # The store reads what a request needs at once (``KeyStore.lookup``, optional): the
    # decision asks it one question, and answers the rest from what it found.
    lookup: bool = False
    # Uses are recorded (the Authenticator's usage write is on): a rotation's first use is
    # then written by the decision itself, before the answer (:func:`decide`).
    records_use: bool = False
    # The store can replace a key's legacy argon2id hash (``upgrade_hash``, optional): a
    # key's first successful use writes its SHA-256 hash in its place.
    upgrades: bool = False


def reach_question(account_id: str, scope: Scope) -> GetRole | ReachesTenant:
    """The question whose answer says whether *account_id* still reaches *scope* (D11).

    A key whose creator no longer reaches its scope is Inactive: an organization scope is
    reached with a role there, a tenant scope with a role in any of its organizations. The
    answer is truthy exactly when the scope is reached (a role, or ``True``).
    """
    if scope.organization_id is None:
        return ReachesTenant(account_id, scope.tenant_id)
    return GetRole(account_id, scope.organization_id)


def unavailable(exc: Exception, retry_after: int) -> ServiceUnavailable:
    """The 503 for a store or provider that failed or timed out (D15)."""
    reason = Reason.BACKEND_TIMEOUT if isinstance(exc, TimeoutError) else Reason.BACKEND_ERROR
    return ServiceUnavailable(reason, retry_after=retry_after)


# --- header parsing -----------------------------------------------------------------------


def bearer_token(values: Sequence[str]) -> str | Reason:
    """The token of the one ``Authorization: Bearer <token>`` header, or why there is none (D5)."""
    if isinstance(values, str):  # a str is a sequence of str: refuse the misuse, loudly
        raise TypeError("AuthRequest.authorization is a tuple of header values, not a str")
    if not values:
        return Reason.MISSING
    if len(values) > 1:
        return Reason.AUTHORIZATION_REPEATED
    scheme, _, rest = values[0].strip(_HTTP_WHITESPACE).partition(" ")
    token = rest.lstrip(" ")  # RFC 6750: 1*SP between scheme and token
    if scheme.lower() != "bearer" or not token:
        return Reason.NOT_BEARER
    return token


def holds_key(values: Sequence[str]) -> bool:
    """Whether any ``Authorization`` line holds something keyed like a key, in any scheme or
    none: every line read whole (``Bearer<TAB>rma_...``, ``Token rma_...``), and a ``Basic``
    line's credentials once base64-decoded. The console refuses such a request (D30).
    """
    for line in values:
        texts = [line]
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[0].lower() == "basic":
            with contextlib.suppress(binascii.Error, ValueError):  # no base64: the line is read
                texts.append(binascii.a2b_base64(parts[1].strip() + "==").decode("latin-1"))
        if any(_token.PREFIX in text.lower() for text in texts):
            return True
    return False


def organization_header(values: Sequence[str], pattern: re.Pattern[str]) -> str | Reason | None:
    """The organization named by ``x-organization-id``, ``None`` if absent, or why not (D8)."""
    if isinstance(values, str):
        raise TypeError("AuthRequest.organization is a tuple of header values, not a str")
    if not values:
        return None
    if len(values) > 1:
        return Reason.ORG_HEADER_REPEATED
    value = values[0].strip(_HTTP_WHITESPACE)
    if value == DEFAULT_ORGANIZATION or pattern.fullmatch(value):
        return value
    return Reason.ORG_HEADER_INVALID


_MESSAGES: Final = {
    Reason.ORG_HEADER_MISSING: (
        "A tenant-scoped key needs the x-organization-id header: an organization id or 'default'."
    ),
    Reason.ORG_HEADER_REPEATED: "Send exactly one x-organization-id header.",
}


def _bad_header(reason: Reason, key_id: str) -> InvalidRequest:
    return InvalidRequest(reason, _MESSAGES.get(reason), key_id=key_id)


@functools.lru_cache(maxsize=10_000)
def _principal(
    account_id: str,
    key_id: str,
    key_name: str,
    tenant_id: str,
    scope_organization_id: str | None,
    organization_id: str,
    role: str,
    expires_at: datetime,
) -> Principal:
    # Principals are immutable values: the warm path builds none, and a changed record
    # (another name, role, organization or expiry) is another entry, never a stale one.
    return Principal(
        account_id=account_id,
        key_id=key_id,
        key_name=key_name,
        scope=Scope(tenant_id=tenant_id, organization_id=scope_organization_id),
        organization_id=organization_id,
        tenant_id=tenant_id,
        role=role,
        expires_at=expires_at,
    )


# --- the credential ---------------------------------------------------------------------


def credential(
    key_id: str,
    secret: str,
    view: Found | None = None,
    *,
    usable_at: datetime | None = None,
    upgrades: bool = False,
) -> Generator[Step, Any, ApiKey | Reason]:
    """The stored key *key_id* names, if *secret* is its secret; else why not.

    Why not: ``UNKNOWN_KEY`` (no such id), then what :func:`~keyturn._core.hashing.check_secret`
    says (``WRONG_SECRET``, ``UNVERIFIABLE``); with *usable_at*, then ``REVOKED`` or
    ``EXPIRED`` at that time. The decision answers each with the same 401; the leak responder
    and the payload guard (*usable_at* ``None``: a leak is a leak, whatever the key's state)
    record none of them. *view*: the store's answer to :class:`~keyturn._core.steps.Lookup`, read
    instead of asking. *upgrades*: the store can replace a usable key's legacy hash.
    """
    step = GetKey(key_id)
    key: ApiKey | None = step.ask(view) if view is not None else (yield step)
    if key is None:
        return Reason.UNKNOWN_KEY
    failure = check_secret(key.secret_hash, secret)  # the one place a secret is compared
    if failure is not None:
        return failure
    if usable_at is not None:
        status = derive_status(key, usable_at, reaches_scope=True)
        if status is Status.REVOKED:
            return Reason.REVOKED
        if status is Status.EXPIRED:
            return Reason.EXPIRED
    if upgrades and is_legacy(key.secret_hash):
        # The key's first successful use since SHA-256 (D2): its argon2id hash is replaced,
        # only while the store still holds it, so a revoke or rotation since wins. A write
        # that fails is this request's 503, as any store's (D15); the next one tries again,
        # without argon2 (``_core/hashing.py`` remembers the secret's hash).
        yield UpgradeHash(key_id, key.secret_hash, hash_secret(secret))
    return key


# --- the decision -------------------------------------------------------------------------


def decide(
    request: AuthRequest, now: datetime, rules: Rules
) -> Generator[Step, Any, Principal | Refusal]:
    """Decide one request; yields steps, returns a :class:`Principal` or the refusal."""
    # 1. The credential: any failure here is the same 401 to the client.
    values = request.authorization
    line = values[0] if len(values) == 1 else ""
    if len(line) == _BEARER_LINE_LENGTH and line.startswith(_BEARER) and line.isascii():
        # The common spelling, read without the general parse: where they differ (blanks
        # around the token), the token fails the shape check below, as the 401 it would be.
        token = line[len(_BEARER) :]
    else:
        parsed_header = bearer_token(values)
        if isinstance(parsed_header, Reason):
            return Unauthorized(parsed_header)
        if len(parsed_header) != _token.TOKEN_LENGTH or not parsed_header.isascii():
            return Unauthorized(Reason.MALFORMED)
        token = parsed_header
    wrong = _token.check(token)  # shape and checksum, before any lookup
    if wrong is not None:
        return Unauthorized(wrong)
    key_id, secret = _token.split(token)
    target = (
        organization_header(request.organization, rules.organization_pattern)
        if request.organization
        else None  # the usual request of an organization key: nothing to read
    )
    # A store that reads what a request needs at once is asked once; every question below
    # is then answered from what it found (``view``), else yielded to its store or provider.
    view: Found | None = None
    if rules.lookup:
        named = target if isinstance(target, str) and target != DEFAULT_ORGANIZATION else None
        view = yield Lookup(key_id, named)

    key = yield from credential(key_id, secret, view, usable_at=now, upgrades=rules.upgrades)
    if isinstance(key, Reason):
        return Unauthorized(key, key_id=key_id)

    scope = key.scope
    account_id = key.account_id
    step: Step  # each question below, answered from the view or by its store or provider

    if scope.organization_id is not None:
        # 2-3. An organization-scoped key works in its own organization only (D9, D10).
        organization_id = scope.organization_id
        step = reach_question(account_id, scope)
        role = step.ask(view) if view is not None else (yield step)  # its role, or Inactive
        if role is None:
            return Unauthorized(Reason.INACTIVE, key_id=key_id)
        if isinstance(target, Reason):
            return _bad_header(target, key_id)
        if target == DEFAULT_ORGANIZATION:
            step = GetDefaultOrganization(scope.tenant_id)
            default = step.ask(view) if view is not None else (yield step)
            if default is None or default.id != organization_id:
                return NotFound(Reason.ORG_NOT_KEYS_OWN, key_id=key_id)
        elif target is not None and target != organization_id:
            return NotFound(Reason.ORG_NOT_KEYS_OWN, key_id=key_id)
    else:
        # 2-3. A tenant-scoped key names its organization on every request.
        organization = role = None
        if isinstance(target, str):
            step = (
                GetDefaultOrganization(scope.tenant_id)
                if target == DEFAULT_ORGANIZATION
                else GetOrganization(target)
            )
            organization = step.ask(view) if view is not None else (yield step)
            if organization is not None and organization.tenant_id == scope.tenant_id:
                step = GetRole(account_id, organization.id)
                role = step.ask(view) if view is not None else (yield step)
        if role is None:
            # Inactive (401) outranks a bad header (400) and an unreachable organization (404).
            step = reach_question(account_id, scope)
            if not (step.ask(view) if view is not None else (yield step)):
                return Unauthorized(Reason.INACTIVE, key_id=key_id)
            if target is None:
                return _bad_header(Reason.ORG_HEADER_MISSING, key_id)
            if isinstance(target, Reason):
                return _bad_header(target, key_id)
            if organization is None or organization.tenant_id != scope.tenant_id:
                return NotFound(Reason.ORG_NOT_FOUND, key_id=key_id)
            return NotFound(Reason.ORG_NOT_REACHABLE, key_id=key_id)
        assert organization is not None
        organization_id = organization.id

    if rules.records_use and revokes_at_first_use(key):
        # The creator asked for the old key's revoke at this key's first use: written now,
        # so the old key is refused from the next request on (spec: a revoke is immediate),
        # and a write that fails is this request's 503, never a pass with the old key alive.
        # Before the policy: the memo keeps a principal the policy refused, and may answer
        # this key's next request without a decision.
        yield MarkUsed(key_id, now)
    principal = _principal(
        account_id,
        key_id,
        key.name,
        scope.tenant_id,
        scope.organization_id,
        organization_id,
        role,
        key.expires_at,
    )
    # 4. The application's own rule on roles, if it has one.
    if rules.policy is not None:
        # The policy may raise, and error trackers send the locals of a traceback's frames:
        # from here on, neither this frame nor the policy holds any part of the key.
        organization, method, path = request.organization, request.method, request.path
        request, values, line, token, secret, parsed_header = _NO_KEY, (), "", "", "", ""
        return police(principal, organization, method, path, rules)
    return principal


_NO_KEY: Final = AuthRequest()


def police(
    principal: Principal, organization: Sequence[str], method: str, path: str, rules: Rules
) -> Principal | Refusal:
    """4. The application's own rule on roles, if it has one: *principal*, or its 403.

    Its 403 names the organization the request reached, so the response carries the service
    headers (D16). The policy sees the request without its ``Authorization`` lines. (Also
    run on every request the memo answers: ``_run/memo.py``.)
    """
    if rules.policy is None:
        return principal
    # Read as any object: a policy may break its bool contract, and the check below says
    # so with its message.
    policy: Callable[[Principal, AuthRequest], object] = rules.policy
    allowed = policy(principal, AuthRequest((), organization, method, path))
    if allowed is True:
        return principal
    if allowed is False:
        return PermissionDenied(Reason.POLICY, key_id=principal.key_id, principal=principal)
    if inspect.iscoroutine(allowed):
        allowed.close()
    # Like a policy that raises: a bug, so a 500, never a pass (D15).
    raise TypeError(f"the policy must return a bool, got {type(allowed).__name__}")
