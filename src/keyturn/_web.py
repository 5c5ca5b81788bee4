"""What the ASGI and WSGI middleware share: configuration, header names, rendering.

Nothing here decides whether a request passes (that is ``_decision.py``) or which requests
are guarded (``_target.py``): this module holds the one header vocabulary of both adapters,
checks their configuration once, and renders an outcome identically for both.
"""

from __future__ import annotations

import functools
import json
import re
from datetime import UTC, datetime
from typing import Final, Generic, TypeVar

from keyturn._decision import AuthRequest
from keyturn._target import Paths, PublicPaths, Unreadable
from keyturn.authenticator import Authenticator
from keyturn.errors import InvalidRequest, Reason, Refusal

__all__ = [
    "AUTHORIZATION_HEADER",
    "DEFAULT_PREFIX",
    "DEFAULT_REALM",
    "KEY_EXPIRES_HEADER",
    "ORGANIZATION_ID_HEADER",
    "PRINCIPAL_KEY",
    "RESERVED_HEADER_NAMES",
    "SERVICE_HEADER_NAMES",
    "SERVICE_ORGANIZATION_HEADER",
    "SERVICE_TENANT_HEADER",
    "MiddlewareConfig",
    "Paths",
    "PublicPaths",
    "expiry_headers",
    "refusal",
    "service_headers",
    "unreadable",
]


PRINCIPAL_KEY: Final = "keyturn.principal"
DEFAULT_PREFIX: Final = "/managed-agents/v1/"
DEFAULT_REALM: Final = "agents-api"
# The header vocabulary, lower-case (ASGI encodes it; WSGI derives its environ keys).
AUTHORIZATION_HEADER: Final = "authorization"
ORGANIZATION_ID_HEADER: Final = "x-organization-id"  # request: where the client aims
SERVICE_ORGANIZATION_HEADER: Final = "service-organization-id"  # response: where it ran
SERVICE_TENANT_HEADER: Final = "service-tenant-id"
SERVICE_HEADER_NAMES: Final = frozenset({SERVICE_ORGANIZATION_HEADER, SERVICE_TENANT_HEADER})
KEY_EXPIRES_HEADER: Final = "service-key-expires-at"  # response, opt-in: see docs/expiry.md
# Ours on a response to an accepted request: the app's own lines of these names are dropped,
# so a client reads only what keyturn set (the expiry's name too, even with the option off).
RESERVED_HEADER_NAMES: Final = SERVICE_HEADER_NAMES | {KEY_EXPIRES_HEADER}
# The realm sits inside a quoted string of WWW-Authenticate: printable ASCII but '"' and '\'.
_REALM: Final = re.compile(r"[ !#-\[\]-~]+")

App = TypeVar("App")


class MiddlewareConfig(Generic[App]):
    """The configuration both middlewares share; each adds its own ``__call__``.

    Everything is checked here, at startup, rather than as a 500 on the first request.

    :param app: the application to wrap.
    :param authenticator: the :class:`~keyturn.Authenticator` that decides; its options
        carry the store, the membership provider, the role policy and the audit hook.
    :param prefix: the path prefix to protect (the bare prefix without ``/`` included).
    :param public_paths: exact paths, or a predicate on the path, exempt under the prefix.
    :param realm: the realm of ``WWW-Authenticate: Bearer realm="..."``.
    :param strip_authorization: remove the ``Authorization`` header before the app sees it.
    :param expiry_header: add ``service-key-expires-at`` (when the key stops working) to
        every response to an accepted request; never to a refusal.
    """

    def __init__(
        self,
        app: App,
        *,
        authenticator: Authenticator,
        prefix: str = DEFAULT_PREFIX,
        public_paths: PublicPaths = (),
        realm: str = DEFAULT_REALM,
        strip_authorization: bool = True,
        expiry_header: bool = False,
    ) -> None:
        if not isinstance(authenticator, Authenticator):
            raise TypeError(
                "authenticator must be a keyturn.Authenticator, e.g. "
                f"Authenticator(db.keys, db.membership); got {type(authenticator).__name__}"
            )
        if not _REALM.fullmatch(realm):
            raise ValueError(f"realm must be printable ASCII without '\"' or '\\', got {realm!r}")
        self.app = app
        self.authenticator = authenticator
        self.paths = Paths(prefix, public_paths)
        self.realm = realm
        self.strip_authorization = strip_authorization
        self.expiry_header = expiry_header


def refusal(error: Refusal, realm: str, method: str = "GET") -> tuple[list[tuple[str, str]], bytes]:
    """The headers and JSON body of the middleware's own refusal (D6, D7, D16).

    A refusal to HEAD has the headers of the GET refusal and no body (D24): a body there
    would be read as the start of the next response on the connection.
    """
    body = json.dumps(error.body(), separators=(",", ":")).encode("ascii")
    headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
    if method.upper() == "HEAD":
        body = b""
    headers += error.headers(realm)
    if error.principal is not None:  # the decision says the request reached an organization
        headers += service_headers(error.principal.organization_id, error.principal.tenant_id)
    return headers, body


@functools.lru_cache(maxsize=1024)
def service_headers(organization_id: str, tenant_id: str) -> tuple[tuple[str, str], ...]:
    """The response headers naming where the request ran: canonical ids, never request text;
    built once per organization.
    """
    return ((SERVICE_ORGANIZATION_HEADER, organization_id), (SERVICE_TENANT_HEADER, tenant_id))


@functools.lru_cache(maxsize=4096)
def expiry_headers(expires_at: datetime | None) -> tuple[tuple[str, str], ...]:
    """The opt-in expiry header: an RFC 3339 UTC instant, rounded down to the second (the key
    still works then), formatted once per instant.
    """
    if expires_at is None:  # a principal built by hand
        return ()
    return ((KEY_EXPIRES_HEADER, expires_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")),)


def unreadable(
    authenticator: Authenticator, why: Unreadable, method: str, root: str, path: str
) -> Refusal:
    """The 400 for a target routers may read as different paths under the prefix (_target),
    saying what is wrong with it; logged and audited as the decision's refusals are, with the
    target as sent.
    """
    error = InvalidRequest(
        Reason.UNREADABLE_TARGET,
        f"The request path has no single reading: {why.value}. Send it as one path that "
        "starts with a single '/', with no '.' or '..' segments and no percent-escapes of "
        "its own.",
    )
    return authenticator.record(AuthRequest((), (), method.upper(), root + path), error)
