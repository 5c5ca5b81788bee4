"""keyturn: personal API keys for the agents API.

Importing this package pulls in no web framework: the middleware lives in
:mod:`keyturn.asgi` and :mod:`keyturn.wsgi`, the stores in :mod:`keyturn.stores`.
"""

from keyturn._decision import AuthRequest, Policy
from keyturn._hashing import KEY_PROFILE, SecretVerifier, VerifiedTokenCache
from keyturn._lifecycle import custom_date_bounds, expiry_for
from keyturn._model import (
    ApiKey,
    CreatedKey,
    CustomDate,
    KeyInfo,
    Leaked,
    Lifetime,
    Organization,
    Principal,
    Scope,
    ScopeKind,
    Status,
)
from keyturn._token import SecretInfo, describe_secret
from keyturn.authenticator import AuditEvent, AuditHook, Authenticator, Clock
from keyturn.errors import (
    AuthError,
    DuplicateKey,
    InvalidExpiry,
    InvalidKeyName,
    InvalidRequest,
    KeyNotFound,
    KeyNotRevocable,
    KeyturnError,
    MissingPrincipal,
    NotFound,
    PermissionDenied,
    Reason,
    ScopeNotReachable,
    ServiceUnavailable,
    Unauthorized,
)
from keyturn.manager import AsyncKeyManager, KeyManager
from keyturn.protocols import (
    AsyncKeyStore,
    AsyncMembershipProvider,
    ConsoleMembership,
    KeyStore,
    MembershipProvider,
)

__all__ = [
    "KEY_PROFILE",
    "ApiKey",
    "AsyncKeyManager",
    "AsyncKeyStore",
    "AsyncMembershipProvider",
    "AuditEvent",
    "AuditHook",
    "AuthError",
    "AuthRequest",
    "Authenticator",
    "Clock",
    "ConsoleMembership",
    "CreatedKey",
    "CustomDate",
    "DuplicateKey",
    "InvalidExpiry",
    "InvalidKeyName",
    "InvalidRequest",
    "KeyInfo",
    "KeyManager",
    "KeyNotFound",
    "KeyNotRevocable",
    "KeyStore",
    "KeyturnError",
    "Leaked",
    "Lifetime",
    "MembershipProvider",
    "MissingPrincipal",
    "NotFound",
    "Organization",
    "PermissionDenied",
    "Policy",
    "Principal",
    "Reason",
    "Scope",
    "ScopeKind",
    "ScopeNotReachable",
    "SecretInfo",
    "SecretVerifier",
    "ServiceUnavailable",
    "Status",
    "Unauthorized",
    "VerifiedTokenCache",
    "custom_date_bounds",
    "describe_secret",
    "expiry_for",
]
