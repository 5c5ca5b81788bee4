"""agentkey: personal API keys for the agents API.

Importing this package pulls in no web framework: the middleware lives in
:mod:`agentkey.asgi` and :mod:`agentkey.wsgi`, the stores in :mod:`agentkey.stores`.
"""

from agentkey._decision import AuthRequest, Policy
from agentkey._hashing import KEY_PROFILE, SecretVerifier, VerifiedTokenCache
from agentkey._model import (
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
from agentkey.authenticator import AuditEvent, AuditHook, Authenticator, Clock
from agentkey.errors import (
    AgentKeyError,
    AuthError,
    DuplicateKey,
    InvalidExpiry,
    InvalidKeyName,
    InvalidRequest,
    KeyNotFound,
    KeyNotRevocable,
    MissingPrincipal,
    NotFound,
    PermissionDenied,
    Reason,
    ScopeNotReachable,
    ServiceUnavailable,
    Unauthorized,
)
from agentkey.manager import KeyManager
from agentkey.protocols import AsyncKeyStore, AsyncMembershipProvider, KeyStore, MembershipProvider

__all__ = [
    "KEY_PROFILE",
    "AgentKeyError",
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
    "SecretVerifier",
    "ServiceUnavailable",
    "Status",
    "Unauthorized",
    "VerifiedTokenCache",
]
