"""Every refusal keyturn answers with, and every error it raises.

Two families, and only the second are exceptions:

- :class:`Refusal` and its subclasses (:class:`Unauthorized`, :class:`InvalidRequest`,
  :class:`NotFound`, :class:`PermissionDenied`, :class:`ServiceUnavailable`, the rate
  limiter's :class:`RateLimited`, and the payload guard's :class:`KeyInPayload` and
  :class:`PayloadTooLarge`) are *returned* by :meth:`~keyturn.Authenticator.authenticate`,
  never raised: they are not exceptions, so ``except Unauthorized:`` is a type error, not a
  silent no-op. Each knows its HTTP status,
  its ``code`` for the JSON body, a client-safe ``message`` and the headers to send. The
  precise :class:`Reason` (why a 401 was a 401) is kept for logs and the audit hook, and
  never sent to the client: every 401 looks the same. Test for success with
  ``isinstance(outcome, Principal)``.
- :class:`KeyturnError` is the base of every exception keyturn raises. Each also subclasses
  the builtin a caller would naturally catch (``ValueError``, ``LookupError``,
  ``PermissionError``, ``RuntimeError``, ``ConnectionError``, ``TimeoutError``): the console
  errors raised by :class:`~keyturn.KeyManager`, the store errors raised by
  :mod:`keyturn.stores`, the notices', the console's and the client's errors, and
  :class:`MissingPrincipal` from the principal accessors.

Three exceptions stand apart from :class:`KeyturnError`, each for its reader:
:class:`WrongAnswer` is a ``TypeError`` (a store or provider that answered with the wrong
type has a bug of its own), :class:`CommandError` stops the ``keyturn`` command with its
exit status, and :class:`KeyExpiryWarning` is a warning, not an error. Each is also
importable from the module that raises it.

No message ever contains a secret or text taken from a request; a log line quotes such
text with :func:`loggable`.
"""

from __future__ import annotations

import enum
import inspect
from typing import ClassVar, Protocol

__all__ = [
    "ActivityNotKept",
    "Asked",
    "CommandError",
    "Conflict",
    "ConsoleSetupError",
    "DeliveryFailed",
    "DuplicateKey",
    "InvalidCredentials",
    "InvalidExpiry",
    "InvalidKeyName",
    "InvalidRequest",
    "InvalidStoreURL",
    "KeyAlreadyReplaced",
    "KeyExpiryWarning",
    "KeyInPayload",
    "KeyNotFound",
    "KeyNotRevocable",
    "KeyNotRotatable",
    "KeyturnError",
    "MissingPrincipal",
    "NotAKey",
    "NotAKeyDatabase",
    "NotFound",
    "OrganizationConflict",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "Reached",
    "Reason",
    "Refusal",
    "SchemaTooNew",
    "ScopeNotReachable",
    "ServiceUnavailable",
    "StoreTimeout",
    "StoreUnreachable",
    "Unauthorized",
    "UnknownOrganization",
    "WebhookRejected",
    "WrongAnswer",
]


class Reason(enum.Enum):
    """Why a request was refused: for logs and the audit hook, never for the client."""

    MISSING = "missing"  # no Authorization header
    NOT_BEARER = "not_bearer"  # another scheme, or no token
    AUTHORIZATION_REPEATED = "authorization_repeated"  # more than one Authorization header
    MALFORMED = "malformed"  # not the shape of a key
    BAD_CHECKSUM = "bad_checksum"  # the shape of a key, but mistyped
    UNKNOWN_KEY = "unknown_key"  # no key with that id
    WRONG_SECRET = "wrong_secret"  # noqa: S105 -- a reason code; the id exists, the secret differs
    UNVERIFIABLE = "unverifiable"  # the stored hash is unusable (corrupt or absurd parameters)
    EXPIRED = "expired"
    REVOKED = "revoked"
    INACTIVE = "inactive"  # the creator no longer reaches the key's tenant or organization
    ORG_HEADER_MISSING = "org_header_missing"
    ORG_HEADER_INVALID = "org_header_invalid"
    ORG_HEADER_REPEATED = "org_header_repeated"  # more than one x-organization-id header
    ORG_NOT_FOUND = "org_not_found"  # unknown organization, or another tenant's
    ORG_NOT_REACHABLE = "org_not_reachable"  # the creator has no role there
    ORG_NOT_KEYS_OWN = "org_not_keys_own"  # an organization-scoped key aimed elsewhere
    POLICY = "policy"  # the application's role policy said no
    UNREADABLE_TARGET = "unreadable_target"  # routers may read the path differently (_target)
    BACKEND_ERROR = "backend_error"  # the key store or membership provider failed
    BACKEND_TIMEOUT = "backend_timeout"  # ... or did not answer in time
    CLOSED = "closed"  # the Authenticator was closed: the process is shutting down
    KEY_IN_PAYLOAD = "key_in_payload"  # the body holds a key (keyturn.payload)
    PAYLOAD_TOO_LARGE = "payload_too_large"  # the body is longer than the guard reads
    UNREADABLE_BODY = "unreadable_body"  # the guard cannot read the body as the app may
    RATE_LIMITED = "rate_limited"  # a rate limit of the key, its account or organization
    RATE_LIMIT_ENGINE = "rate_limit_engine"  # the limiter's engine failed, and it fails closed


class KeyturnError(Exception):
    """Base of every exception keyturn raises (a :class:`Refusal` is returned, not raised)."""


class Asked(Protocol):
    """A question put to a store or provider (``keyturn._core.steps.Step``), typed by what
    :class:`WrongAnswer` reads of it."""

    @property
    def method(self) -> str: ...

    @property
    def answers(self) -> tuple[type, ...]: ...


class Reached(Protocol):
    """Where a refused request had got to: a :class:`~keyturn.Principal` (typed by what the
    refusal reads, so that this module imports none of the records, which raise its errors)."""

    @property
    def organization_id(self) -> str: ...

    @property
    def tenant_id(self) -> str: ...


class Refusal:
    """A refused request, ready to be rendered as an HTTP response. Returned, never raised.

    *principal* is set when the request did reach an organization (a policy's 403): the
    response then carries the service headers naming it (spec section 5).
    """

    __slots__ = ("key_id", "message", "principal", "reason")
    status: ClassVar[int]
    code: ClassVar[str]
    default_message: ClassVar[str]

    def __init__(
        self,
        reason: Reason,
        message: str | None = None,
        *,
        key_id: str | None = None,
        principal: Reached | None = None,
    ) -> None:
        self.reason = reason
        self.message = message or self.default_message
        self.key_id = key_id  # the presented key's id, once it parsed: for logs, not clients
        self.principal = principal

    def __repr__(self) -> str:
        return f"{type(self).__name__}(reason={self.reason.value!r}, key_id={self.key_id!r})"

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict[str, dict[str, str]]:
        """The JSON body: ``{"error": {"code": ..., "message": ...}}``."""
        return {"error": {"code": self.code, "message": self.message}}

    def headers(self, realm: str = "agents-api") -> list[tuple[str, str]]:
        """Headers to send besides ``content-type``; none of them carries request text."""
        return []


class Unauthorized(Refusal):
    """401: the key is missing, mistyped, unknown, expired, revoked or inactive."""

    __slots__ = ()
    status = 401
    code = "unauthorized"
    default_message = "A valid API key is required: send it as 'Authorization: Bearer <key>'."

    def headers(self, realm: str = "agents-api") -> list[tuple[str, str]]:
        # RFC 6750 section 3.1: no error code when no credential was presented at all.
        challenge = f'Bearer realm="{realm}"'
        if self.reason is not Reason.MISSING:
            challenge += ', error="invalid_token"'
        return [("www-authenticate", challenge)]


class InvalidRequest(Refusal):
    """400: the ``x-organization-id`` header is missing or is not an organization id; or
    the payload guard cannot read the body as the app may (:mod:`keyturn.payload`)."""

    __slots__ = ()
    status = 400
    code = "invalid_request"
    default_message = "The x-organization-id header must be an organization id or 'default'."


class NotFound(Refusal):
    """404: the organization does not exist for this key and its creator."""

    __slots__ = ()
    status = 404
    code = "not_found"
    default_message = "The organization named by x-organization-id was not found."


class PermissionDenied(Refusal):
    """403: the application's role policy refused the creator's role (an extension).

    The request did reach an organization: *principal* says which one.
    """

    __slots__ = ()
    status = 403
    code = "permission_denied"
    default_message = "The key's account does not have a role that allows this request."


class ServiceUnavailable(Refusal):
    """503: keys cannot be checked right now; the client should retry with the same key."""

    __slots__ = ("retry_after",)
    status = 503
    code = "service_unavailable"
    default_message = "API keys cannot be checked right now; retry shortly with the same key."

    def __init__(
        self,
        reason: Reason,
        message: str | None = None,
        *,
        key_id: str | None = None,
        retry_after: int = 1,
    ) -> None:
        super().__init__(reason, message, key_id=key_id)
        self.retry_after = retry_after

    def headers(self, realm: str = "agents-api") -> list[tuple[str, str]]:
        return [("retry-after", str(self.retry_after))]


class RateLimited(Refusal):
    """429: the key, its account or its organization has no room left in its rate limit
    (an extension; D33). The request reached an organization: *principal* says which one.

    *limit_headers* are the limiter's ``RateLimit-Policy``, ``RateLimit`` and
    ``Retry-After`` fields (:class:`keyturn.ratelimits.Admission`); *policy* names the
    limit that refused (``key``, ``account``, ``organization``), for logs, not clients.
    """

    __slots__ = ("limit_headers", "policy", "retry_after")
    status = 429
    code = "rate_limited"
    default_message = (
        "Too many requests for this key or its account: retry after the seconds in Retry-After."
    )

    def __init__(
        self,
        limit_headers: tuple[tuple[str, str], ...],
        *,
        retry_after: int,
        policy: str | None = None,
        key_id: str | None = None,
        principal: Reached | None = None,
    ) -> None:
        super().__init__(Reason.RATE_LIMITED, key_id=key_id, principal=principal)
        self.limit_headers = limit_headers
        self.retry_after = retry_after
        self.policy = policy

    def headers(self, realm: str = "agents-api") -> list[tuple[str, str]]:
        return list(self.limit_headers)


class KeyInPayload(Refusal):
    """400: the request body holds an API key (the payload guard, an extension; D32).

    The request did reach an organization: *principal* says which one. The message never
    repeats the key; *key_id* names the first one found, for logs.
    """

    __slots__ = ()
    status = 400
    code = "key_in_payload"
    default_message = (
        "An API key was found in the request body: remove it and send the request again. "
        "A key belongs only in the Authorization header, never in a prompt or message."
    )


class PayloadTooLarge(Refusal):
    """413: the request body is longer than the payload guard reads (an extension; D32).

    The request did reach an organization: *principal* says which one.
    """

    __slots__ = ()
    status = 413
    code = "payload_too_large"
    default_message = "The request body is longer than this API reads: send a smaller one."


# --- console errors -------------------------------------------------------------------


class InvalidKeyName(KeyturnError, ValueError):
    """The key name is empty, longer than 100 characters, or holds control characters."""


class InvalidExpiry(KeyturnError, ValueError):
    """The lifetime or custom expiry date is not one the console allows."""


class NotAKey(KeyturnError, ValueError):
    """The text is not a well-formed key: wrong shape, or a checksum that does not match."""


class ScopeNotReachable(KeyturnError, PermissionError):
    """The account cannot create a key for that tenant or organization."""


class KeyNotFound(KeyturnError, LookupError):
    """No key with that id belongs to the account (another user's key counts as not found)."""


class KeyNotRevocable(KeyturnError, ValueError):
    """The key is already Expired or Revoked; those states are final."""


class KeyNotRotatable(KeyturnError, ValueError):
    """The key is Expired or Revoked (nothing uses it any more: create a new key instead), or
    the key store does not record rotations."""


class KeyAlreadyReplaced(KeyNotRotatable):
    """The key already has a replacement that still works; *replacement_id* names it."""

    def __init__(self, message: str, *, replacement_id: str) -> None:
        super().__init__(message)
        self.replacement_id = replacement_id

    @classmethod
    def in_store(cls, key_id: str, replacement_id: str) -> KeyAlreadyReplaced:
        """A store's refusal of a second live replacement of *key_id*."""
        return cls(
            f"key {key_id} already has a replacement that works, key {replacement_id}: deploy "
            "that one and revoke the old key, or revoke the replacement to rotate again",
            replacement_id=replacement_id,
        )


class ActivityNotKept(KeyturnError, TypeError):
    """The key store keeps no record of key actions (``record_event``, ``events_of`` and
    ``events_since``): use one of keyturn's stores, or add those methods to yours."""


class ConsoleSetupError(KeyturnError, TypeError):
    """The console was built with something it cannot work with; the message says what."""


# --- store errors -----------------------------------------------------------------------


class Conflict(KeyturnError, ValueError):
    """A store was asked to add something that already exists differently."""


class DuplicateKey(Conflict):
    """A key store was asked to add a key id it already holds."""


class OrganizationConflict(Conflict):
    """The organization exists with other values, or its tenant already has a default."""

    @classmethod
    def adding(
        cls, organization_id: str, tenant_id: str, *, default: bool, exists: bool
    ) -> OrganizationConflict:
        """Why an organization was not added: it *exists* differently; or its tenant has a
        default organization already (*default*, it was to be one) or none yet."""
        if exists:
            return cls(f"organization {organization_id!r} already exists differently")
        if default:
            return cls(f"tenant {tenant_id!r} already has a default organization")
        return cls(
            f"tenant {tenant_id!r} has no default organization yet: add that one "
            f"first (default=True), then {organization_id!r}"
        )

    @classmethod
    def removing_default(cls, organization_id: str, tenant_id: str) -> OrganizationConflict:
        """Why a tenant's default organization was not removed: the tenant has others."""
        return cls(
            f"organization {organization_id!r} is the default organization of tenant "
            f"{tenant_id!r}, which has others: remove those first"
        )


class UnknownOrganization(KeyturnError, LookupError):
    """No organization with that id: add it first."""


class SchemaTooNew(KeyturnError, RuntimeError):
    """The database holds a keyturn schema newer than this version knows: upgrade keyturn."""


class StoreUnreachable(KeyturnError, ConnectionError):
    """The database server refused the connection or could not be reached.

    *reason* is the driver's one-line account, without the password.
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class StoreTimeout(KeyturnError, TimeoutError):
    """The store got no connection for the call within its pool's ``timeout``.

    The server is down or unreachable, or the pool is too small for the load. The
    middleware answers 503 with reason ``backend_timeout``, as for its own ``timeout``.
    """


class NotAKeyDatabase(KeyturnError, ValueError):
    """The file is not a SQLite database, or one holding other tables and no keyturn schema."""


class InvalidStoreURL(KeyturnError, ValueError):
    """The store URL names no store keyturn can open (see :func:`keyturn.stores.open_database`)."""


class WrongAnswer(TypeError):
    """A store or provider answered a step with a value of the wrong type."""

    def __init__(self, step: Asked, answer: object) -> None:
        if inspect.iscoroutine(answer):
            answer.close()  # never awaited, on purpose: no warning about it
        expected = " or ".join(t.__name__ for t in step.answers)
        super().__init__(f"{step.method}() answered {type(answer).__name__}, not {expected}")
        self.method = step.method
        self.answered = type(answer).__name__


# --- notices ----------------------------------------------------------------------------


class DeliveryFailed(KeyturnError, ConnectionError):
    """A notice could not be delivered; the notifier gives its claim back."""


class WebhookRejected(KeyturnError, ValueError):
    """A webhook's signature or timestamp does not check out; the message says which."""


# --- the client and the command ---------------------------------------------------------


class InvalidCredentials(KeyturnError, ValueError):
    """The key or organization given to :class:`~keyturn.client.ApiKeyAuth` cannot be sent
    as it is."""


class KeyExpiryWarning(UserWarning):
    """The key the client sends expires soon: create its replacement and rotate."""


class CommandError(Exception):
    """A failure the ``keyturn`` command reports in one line, with its exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


# --- application errors -----------------------------------------------------------------


class MissingPrincipal(KeyturnError, LookupError):
    """The application asked for the principal of a request the middleware did not authenticate.

    A bug in the application's setup, not the client's fault: the path lies outside the
    middleware's prefix or among its public paths, or the middleware is not installed.
    """

    def __init__(self) -> None:
        super().__init__(
            "this request carries no keyturn principal: its path is outside the "
            "middleware's prefix or among its public paths, or ApiKeyMiddleware is "
            "not installed in front of this app"
        )


# --- text taken from a request, in a log line --------------------------------------------


def loggable(text: str, limit: int = 200) -> str:
    """*text* (a method, a path, a URL: whatever its sender chose) for a log line: quoted
    and escaped, so one line with no control characters, and at most *limit* characters of
    it, followed by ``...`` when cut."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")
