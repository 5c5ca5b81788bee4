"""What the ASGI and WSGI middleware share: their configuration, and how a refusal looks.

Nothing here decides whether a request passes (that is ``_decision.py``) or which requests
are guarded (that is ``_target.py``): this module only renders the outcome, identically for
both adapters.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Final, Generic, TypeVar

from keyturn._model import Principal
from keyturn._target import Paths, PublicPaths
from keyturn.authenticator import Authenticator
from keyturn.errors import AuthError, InvalidRequest, PermissionDenied, Reason

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_REALM",
    "ORGANIZATION_HEADER",
    "PRINCIPAL_KEY",
    "SERVICE_HEADER_NAMES",
    "TENANT_HEADER",
    "Guard",
    "Paths",
    "PublicPaths",
    "refusal",
    "service_headers",
    "unreadable",
]

log: Final = logging.getLogger("keyturn")

PRINCIPAL_KEY: Final = "keyturn.principal"
DEFAULT_PREFIX: Final = "/managed-agents/v1/"
DEFAULT_REALM: Final = "agents-api"
ORGANIZATION_HEADER: Final = "service-organization-id"
TENANT_HEADER: Final = "service-tenant-id"
SERVICE_HEADER_NAMES: Final = frozenset({ORGANIZATION_HEADER, TENANT_HEADER})
# The realm sits inside a quoted string of WWW-Authenticate: printable ASCII but '"' and '\'.
_REALM: Final = re.compile(r"[ !#-\[\]-~]+")

App = TypeVar("App")


class Guard(Generic[App]):
    """The configuration both middlewares share; each adds its own ``__call__``.

    Everything is checked here, at startup, rather than as a 500 on the first request.
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
    ) -> None:
        if not isinstance(authenticator, Authenticator):
            raise TypeError(
                "authenticator must be an keyturn.Authenticator, e.g. "
                f"Authenticator(db.keys, db.membership); got {type(authenticator).__name__}"
            )
        if not _REALM.fullmatch(realm):
            raise ValueError(f"realm must be printable ASCII without '\"' or '\\', got {realm!r}")
        self.app = app
        self.authenticator = authenticator
        self.paths = Paths(prefix, public_paths)
        self.realm = realm
        self.strip_authorization = strip_authorization


def refusal(
    error: AuthError, realm: str, method: str = "GET"
) -> tuple[list[tuple[str, str]], bytes]:
    """The headers and JSON body of the middleware's own refusal (D6, D7, D16).

    A refusal to HEAD has the headers of the GET refusal and no body (D24): a body there
    would be read as the start of the next response on the connection.
    """
    body = json.dumps(error.body(), separators=(",", ":")).encode("ascii")
    headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
    if method.upper() == "HEAD":
        body = b""
    headers += error.headers(realm)
    if isinstance(error, PermissionDenied) and error.principal is not None:
        headers += service_headers(error.principal)  # the request did reach an organization
    return headers, body


def service_headers(principal: Principal) -> list[tuple[str, str]]:
    """The response headers naming where the request ran: canonical ids, never request text."""
    return [(ORGANIZATION_HEADER, principal.organization_id), (TENANT_HEADER, principal.tenant_id)]


def unreadable(root: str, path: str) -> InvalidRequest:
    """The 400 for a target routers may read as different paths under the prefix (_target);
    logged like the decision's refusals, the target quoted and cut short.
    """
    log.info(
        "refused path %r (mount prefix %r) with 400: %s",
        path[:200],
        root[:200],
        Reason.UNREADABLE_TARGET.value,
    )
    return InvalidRequest(
        Reason.UNREADABLE_TARGET,
        "The request path has no single reading: send it with single slashes, "
        "no '.' or '..' segments and no percent-escapes of its own.",
    )
