"""Every error keyturn raises or answers with.

Two families share one base, :class:`KeyturnError`:

- :class:`AuthError` and its subclasses are the refusals of a request. Each knows its HTTP
  status, its ``code`` for the JSON body, a client-safe ``message`` and the headers to send.
  The precise :class:`Reason` (why a 401 was a 401) is kept on the error for logs and the
  audit hook, and never sent to the client: every 401 looks the same.
- The console errors (:class:`InvalidKeyName`, :class:`InvalidExpiry`, :class:`KeyNotFound`,
  ...) are raised by :class:`~keyturn.KeyManager` and also subclass the builtin a caller
  would naturally catch (``ValueError``, ``LookupError``, ``PermissionError``).

No message ever contains a secret or text taken from a request.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from keyturn._model import Principal

__all__ = [
    "AuthError",
    "DuplicateKey",
    "InvalidExpiry",
    "InvalidKeyName",
    "InvalidRequest",
    "KeyNotFound",
    "KeyNotRevocable",
    "KeyturnError",
    "MissingPrincipal",
    "NotFound",
    "PermissionDenied",
    "Reason",
    "ScopeNotReachable",
    "ServiceUnavailable",
    "Unauthorized",
]


class Reason(enum.Enum):
    """Why a request was refused: for logs and the audit hook, never for the client."""

    MISSING = "missing"  # no Authorization header
    NOT_BEARER = "not_bearer"  # another scheme, no token, or two Authorization headers
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
    ORG_NOT_FOUND = "org_not_found"  # unknown organization, or another tenant's
    ORG_NOT_REACHABLE = "org_not_reachable"  # the creator has no role there
    ORG_NOT_KEYS_OWN = "org_not_keys_own"  # an organization-scoped key aimed elsewhere
    POLICY = "policy"  # the application's role policy said no
    UNREADABLE_TARGET = "unreadable_target"  # routers may read the path differently (_target)
    BACKEND_ERROR = "backend_error"  # the key store or membership provider failed
    BACKEND_TIMEOUT = "backend_timeout"  # ... or did not answer in time
    OVERLOADED = "overloaded"  # too many secret verifications at once
    CLOSED = "closed"  # the Authenticator was closed: the process is shutting down


class KeyturnError(Exception):
    """Base of every exception keyturn raises."""


class AuthError(KeyturnError):
    """A refused request, ready to be rendered as an HTTP response."""

    status: ClassVar[int]
    code: ClassVar[str]
    default_message: ClassVar[str]

    def __init__(
        self, reason: Reason, message: str | None = None, *, key_id: str | None = None
    ) -> None:
        self.reason = reason
        self.message = message or self.default_message
        self.key_id = key_id  # the presented key's id, once it parsed: for logs, not clients
        super().__init__(self.message)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(reason={self.reason.value!r}, key_id={self.key_id!r})"

    def body(self) -> dict[str, dict[str, str]]:
        """The JSON body: ``{"error": {"code": ..., "message": ...}}``."""
        return {"error": {"code": self.code, "message": self.message}}

    def headers(self, realm: str = "agents-api") -> list[tuple[str, str]]:
        """Headers to send besides ``content-type``; none of them carries request text."""
        return []


class Unauthorized(AuthError):
    """401: the key is missing, mistyped, unknown, expired, revoked or inactive."""

    status = 401
    code = "unauthorized"
    default_message = "A valid API key is required: send it as 'Authorization: Bearer <key>'."

    def headers(self, realm: str = "agents-api") -> list[tuple[str, str]]:
        # RFC 6750 section 3.1: no error code when no credential was presented at all.
        challenge = f'Bearer realm="{realm}"'
        if self.reason is not Reason.MISSING:
            challenge += ', error="invalid_token"'
        return [("www-authenticate", challenge)]


class InvalidRequest(AuthError):
    """400: the ``x-organization-id`` header is missing or is not an organization id."""

    status = 400
    code = "invalid_request"
    default_message = "The x-organization-id header must be an organization id or 'default'."


class NotFound(AuthError):
    """404: the organization does not exist for this key and its creator."""

    status = 404
    code = "not_found"
    default_message = "The organization named by x-organization-id was not found."


class PermissionDenied(AuthError):
    """403: the application's role policy refused the creator's role (an extension).

    The request did reach an organization, so *principal* says which one, and the
    response carries the service headers (spec section 5).
    """

    status = 403
    code = "permission_denied"
    default_message = "The key's account does not have a role that allows this request."

    def __init__(
        self,
        reason: Reason,
        message: str | None = None,
        *,
        key_id: str | None = None,
        principal: Principal | None = None,
    ) -> None:
        super().__init__(reason, message, key_id=key_id)
        self.principal = principal


class ServiceUnavailable(AuthError):
    """503: keys cannot be checked right now; the client should retry with the same key."""

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


# --- console errors -------------------------------------------------------------------


class InvalidKeyName(KeyturnError, ValueError):
    """The key name is empty, longer than 100 characters, or holds control characters."""


class InvalidExpiry(KeyturnError, ValueError):
    """The lifetime or custom expiry date is not one the console allows."""


class ScopeNotReachable(KeyturnError, PermissionError):
    """The account cannot create a key for that tenant or organization."""


class KeyNotFound(KeyturnError, LookupError):
    """No key with that id belongs to the account (another user's key counts as not found)."""


class KeyNotRevocable(KeyturnError, ValueError):
    """The key is already Expired or Revoked; those states are final."""


class DuplicateKey(KeyturnError, ValueError):
    """A key store was asked to add a key id it already holds."""


# --- application errors -----------------------------------------------------------------


class MissingPrincipal(KeyturnError, LookupError):
    """The application asked for the principal of a request the middleware did not authenticate.

    A bug in the application's setup, not the client's fault: the path lies outside the
    middleware's prefix or among its public paths, or the middleware is not installed.
    """
