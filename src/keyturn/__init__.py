"""keyturn: personal API keys for the agents API.

Importing this package pulls in no web framework: the middleware lives in
:mod:`keyturn.asgi` and :mod:`keyturn.wsgi`, the stores in :mod:`keyturn.stores`.
"""

from keyturn._decision import AuthRequest, Policy
from keyturn._hashing import KEY_PROFILE, SecretVerifier, VerifiedTokenCache
from keyturn._model import (
    ApiKey,
    CreatedKey,
    CustomDate,
    KeyInfo,
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
from keyturn.manager import KeyManager
from keyturn.protocols import AsyncKeyStore, AsyncMembershipProvider, KeyStore, MembershipProvider

__all__ = [
    "KEY_PROFILE",
    "ApiKey",
    "AsyncKeyStore",
    "AsyncMembershipProvider",
    "AuditEvent",
    "AuditHook",
    "AuthError",
    "AuthRequest",
    "Authenticator",
    "Clock",
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
    "describe_secret",
]
