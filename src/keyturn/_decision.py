"""THE authentication decision: whether one request passes, and as whom, where.

Rules of this file (keep them):

1. Everything that decides whether a request passes is here, or in the pure modules it calls
   (``_token``, ``_lifecycle``). The middleware translates a request into an
   :class:`AuthRequest` and the outcome into a response; it decides nothing.
2. No I/O and no framework. :func:`decide` is a generator: it yields small step objects (read
   a key, verify a secret, resolve an organization, get a role) and receives their answers.
   The sync and async drivers in ``authenticator.py`` run it; neither holds any logic.
3. Argon2 is a yielded step (:class:`VerifySecret`), so an async driver runs it off the loop.
4. The order of checks is fixed (D4): credential (401), then ``x-organization-id`` syntax (400),
   then organization resolution and reach (404), then the application's role policy (403).
   A refusal carries the precise :class:`~keyturn.errors.Reason` for logs, never the client.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator, Sequence
from datetime import datetime
from typing import Any, ClassVar, Final, NamedTuple

import attrs

from keyturn import _token
from keyturn._hashing import VerifiedTokenCache, fingerprint
from keyturn._lifecycle import derive_status
from keyturn._model import Principal, Status
from keyturn.errors import (
    AuthError,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    Reason,
    Unauthorized,
)

__all__ = [
    "DEFAULT_ORGANIZATION",
    "DEFAULT_ORGANIZATION_PATTERN",
    "AuthRequest",
    "Policy",
    "Rules",
    "Step",
    "decide",
]

DEFAULT_ORGANIZATION: Final = "default"
DEFAULT_ORGANIZATION_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"
_HTTP_WHITESPACE: Final = " \t"
_SECRET_START: Final = len(_token.PREFIX) + _token.ID_LENGTH
_SECRET_END: Final = _SECRET_START + _token.SECRET_LENGTH


class AuthRequest(NamedTuple):
    """What the decision reads from a request: every value of the two headers, and the route.

    Header values are given as received (latin-1 text), one entry per header line, so that
    repeated headers can be refused. The repr counts the ``Authorization`` lines and never
    shows them: they hold the key. (A named tuple, not an attrs class: the middleware builds
    one per request, and this is the cheapest immutable record Python has.)
    """

    authorization: tuple[str, ...] = ()
    organization: tuple[str, ...] = ()
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


# --- the steps the decision yields ------------------------------------------------------


class Step:
    """A question for the key store (``uses_store``) or the membership provider."""

    __slots__ = ()
    uses_store: ClassVar[bool] = False

    def ask(self, store: Any, membership: Any) -> Any:
        """Put the question to the store or provider (sync or async flavour alike)."""
        raise NotImplementedError


class GetKey(Step):
    __slots__ = ("key_id",)
    uses_store = True

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id

    def ask(self, store: Any, membership: Any) -> Any:
        return store.get_key(self.key_id)


class VerifySecret(Step):
    """Run argon2; answered with ``None`` (it matches) or the :class:`Reason` it does not."""

    __slots__ = ("account_id", "digest", "secret", "secret_hash")

    def __init__(
        self, digest: bytes, secret_hash: str, secret: str, account_id: str | None = None
    ) -> None:
        self.digest = digest
        self.secret_hash = secret_hash
        self.secret = secret
        self.account_id = account_id  # whose key: the verifier bounds each account's share

    def __repr__(self) -> str:
        return "VerifySecret(...)"


class GetOrganization(Step):
    __slots__ = ("organization_id",)

    def __init__(self, organization_id: str) -> None:
        self.organization_id = organization_id

    def ask(self, store: Any, membership: Any) -> Any:
        return membership.get_organization(self.organization_id)


class GetDefaultOrganization(Step):
    __slots__ = ("tenant_id",)

    def __init__(self, tenant_id: str) -> None:
        self.tenant_id = tenant_id

    def ask(self, store: Any, membership: Any) -> Any:
        return membership.get_default_organization(self.tenant_id)


class GetRole(Step):
    __slots__ = ("account_id", "organization_id")

    def __init__(self, account_id: str, organization_id: str) -> None:
        self.account_id = account_id
        self.organization_id = organization_id

    def ask(self, store: Any, membership: Any) -> Any:
        return membership.get_role(self.account_id, self.organization_id)


class ReachesTenant(Step):
    __slots__ = ("account_id", "tenant_id")

    def __init__(self, account_id: str, tenant_id: str) -> None:
        self.account_id = account_id
        self.tenant_id = tenant_id

    def ask(self, store: Any, membership: Any) -> Any:
        return membership.reaches_tenant(self.account_id, self.tenant_id)


# --- header parsing -----------------------------------------------------------------------


def bearer_token(values: Sequence[str]) -> str | Reason:
    """The token of the one ``Authorization: Bearer <token>`` header, or why there is none (D5)."""
    if isinstance(values, str):  # a str is a sequence of str: refuse the misuse, loudly
        raise TypeError("AuthRequest.authorization is a tuple of header values, not a str")
    if not values:
        return Reason.MISSING
    if len(values) > 1:
        return Reason.NOT_BEARER
    scheme, _, rest = values[0].strip(_HTTP_WHITESPACE).partition(" ")
    token = rest.lstrip(" ")  # RFC 6750: 1*SP between scheme and token
    if scheme.lower() != "bearer" or not token:
        return Reason.NOT_BEARER
    return token


def organization_header(
    values: Sequence[str], pattern: re.Pattern[str], key_id: str | None = None
) -> str | InvalidRequest | None:
    """The organization named by ``x-organization-id``, ``None`` if absent, or a 400 (D8)."""
    if isinstance(values, str):
        raise TypeError("AuthRequest.organization is a tuple of header values, not a str")
    if not values:
        return None
    if len(values) > 1:
        return InvalidRequest(
            Reason.ORG_HEADER_INVALID, "Send exactly one x-organization-id header.", key_id=key_id
        )
    value = values[0].strip(_HTTP_WHITESPACE)
    if value == DEFAULT_ORGANIZATION or pattern.fullmatch(value):
        return value
    return InvalidRequest(Reason.ORG_HEADER_INVALID, key_id=key_id)


_MISSING_ORGANIZATION: Final = (
    "A tenant-scoped key needs the x-organization-id header: an organization id or 'default'."
)


# --- the decision -------------------------------------------------------------------------


PrincipalMemo = dict[tuple[str | None, ...], Principal]
_MEMO_SIZE: Final = 10_000


def decide(
    request: AuthRequest,
    now: datetime,
    cache: VerifiedTokenCache,
    rules: Rules,
    principals: PrincipalMemo,
) -> Generator[Step, Any, Principal | AuthError]:
    """Decide one request; yields steps, returns a :class:`Principal` or the refusal.

    *principals* remembers the immutable principals already built, keyed by every field
    they are made of, so the warm path builds none and a changed record is never hidden.
    """
    # 1. The credential: any failure here is the same 401 to the client.
    token = bearer_token(request.authorization)
    if isinstance(token, Reason):
        return Unauthorized(token)
    if len(token) != _token.TOKEN_LENGTH or not token.isascii():
        return Unauthorized(Reason.MALFORMED)
    digest = cache.digest(token)
    verified = cache.lookup(digest)
    if verified is None:  # not seen before: check shape and checksum before any lookup
        parsed = _token.parse(token)
        if isinstance(parsed, Reason):
            return Unauthorized(parsed)
    key_id = token[len(_token.PREFIX) : _SECRET_START]

    key = yield GetKey(key_id)
    if key is None:
        return Unauthorized(Reason.UNKNOWN_KEY, key_id=key_id)
    if verified != fingerprint(key.secret_hash):
        failure = yield VerifySecret(
            digest, key.secret_hash, token[_SECRET_START:_SECRET_END], key.account_id
        )
        if failure is not None:
            return Unauthorized(failure, key_id=key_id)

    status = derive_status(key, now, reaches_scope=True)
    if status is Status.REVOKED:
        return Unauthorized(Reason.REVOKED, key_id=key_id)
    if status is Status.EXPIRED:
        return Unauthorized(Reason.EXPIRED, key_id=key_id)

    scope = key.scope
    account_id = key.account_id
    target = organization_header(request.organization, rules.organization_pattern, key_id)

    if scope.organization_id is not None:
        # 2-3. An organization-scoped key works in its own organization only (D9, D10).
        organization_id = scope.organization_id
        role = yield GetRole(account_id, organization_id)
        if role is None:
            return Unauthorized(Reason.INACTIVE, key_id=key_id)
        if isinstance(target, InvalidRequest):
            return target
        if target == DEFAULT_ORGANIZATION:
            default = yield GetDefaultOrganization(scope.tenant_id)
            if default is None or default.id != organization_id:
                return NotFound(Reason.ORG_NOT_KEYS_OWN, key_id=key_id)
        elif target is not None and target != organization_id:
            return NotFound(Reason.ORG_NOT_KEYS_OWN, key_id=key_id)
    else:
        # 2-3. A tenant-scoped key names its organization on every request.
        organization = role = None
        if isinstance(target, str):
            organization = yield (
                GetDefaultOrganization(scope.tenant_id)
                if target == DEFAULT_ORGANIZATION
                else GetOrganization(target)
            )
            if organization is not None and organization.tenant_id == scope.tenant_id:
                role = yield GetRole(account_id, organization.id)
        if role is None:
            # Inactive (401) outranks a bad header (400) and an unreachable organization (404).
            if not (yield ReachesTenant(account_id, scope.tenant_id)):
                return Unauthorized(Reason.INACTIVE, key_id=key_id)
            if target is None:
                return InvalidRequest(
                    Reason.ORG_HEADER_MISSING, _MISSING_ORGANIZATION, key_id=key_id
                )
            if isinstance(target, InvalidRequest):
                return target
            if organization is None or organization.tenant_id != scope.tenant_id:
                return NotFound(Reason.ORG_NOT_FOUND, key_id=key_id)
            return NotFound(Reason.ORG_NOT_REACHABLE, key_id=key_id)
        assert organization is not None
        organization_id = organization.id

    memo = (
        key_id,
        key.name,
        account_id,
        scope.tenant_id,
        scope.organization_id,
        organization_id,
        role,
    )
    principal = principals.get(memo)
    if principal is None:
        principal = Principal(
            account_id=account_id,
            key_id=key_id,
            key_name=key.name,
            scope=scope,
            organization_id=organization_id,
            tenant_id=scope.tenant_id,
            role=role,
        )
        if len(principals) >= _MEMO_SIZE:
            principals.clear()  # rare, and rebuilding costs one record per key
        principals[memo] = principal
    # 4. The application's own rule on roles, if it has one.
    if rules.policy is not None and not rules.policy(principal, request):
        return PermissionDenied(Reason.POLICY, key_id=key_id, principal=principal)
    return principal
