"""What the ASGI and WSGI middleware share: configuration, header names, rendering.

Nothing here decides whether a request passes (that is ``_decision.py``) or which requests
are guarded (``_target.py``): this module holds the one header vocabulary of both adapters,
checks their configuration once, and renders an outcome identically for both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from typing import Final, Generic, TypeVar

from keyturn._model import Principal
from keyturn.authenticator import Authenticator
from keyturn.errors import Refusal

__all__ = [
    "AUTHORIZATION_HEADER",
    "DEFAULT_PREFIX",
    "DEFAULT_REALM",
    "ORGANIZATION_ID_HEADER",
    "PRINCIPAL_KEY",
    "SERVICE_HEADER_NAMES",
    "SERVICE_ORGANIZATION_HEADER",
    "SERVICE_TENANT_HEADER",
    "MiddlewareConfig",
    "Paths",
    "PublicPaths",
    "refusal",
    "service_headers",
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
# The realm sits inside a quoted string of WWW-Authenticate: printable ASCII but '"' and '\'.
_REALM: Final = re.compile(r"[ !#-\[\]-~]+")

PublicPaths = Collection[str] | Callable[[str], bool]
App = TypeVar("App")


class Paths:
    """Which request paths the middleware authenticates.

    Every path under *prefix* is guarded, and so is the prefix without its trailing slash
    (``/managed-agents/v1``): a path that could reach the API is never left open by a
    missing slash. *public_paths* (exact paths, or a predicate on the path) are exempt. A
    path is also guarded when it is ours once its repeated slashes are collapsed and its dot
    segments resolved (``//managed-agents/v1/models``), as some routers read it so.
    """

    def __init__(self, prefix: str, public_paths: PublicPaths) -> None:
        if not prefix.startswith("/"):
            raise ValueError(f"prefix must start with '/', got {prefix!r}")
        if isinstance(public_paths, str):  # "in" on one string would test substrings
            raise TypeError("public_paths must be a collection of paths or a predicate")
        self.prefix = prefix
        self._root = prefix.rstrip("/")
        self._under = self._root + "/"
        self._public = (
            public_paths if callable(public_paths) else frozenset(public_paths).__contains__
        )

    def guarded(self, path: str) -> bool:
        if self._guards(path):
            return True
        # Routers differ on odd paths (Werkzeug drops leading slashes, others collapse runs
        # or resolve dot segments): a path that any of them may read as ours is guarded too.
        return ("//" in path or "/." in path) and self._guards(_normalized(path))

    def _guards(self, path: str) -> bool:
        return (path.startswith(self._under) or path == self._root) and not self._public(path)


def _normalized(path: str) -> str:
    """*path* with runs of slashes collapsed and ``.`` and ``..`` segments resolved."""
    segments: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if segments:
                segments.pop()
        elif segment not in ("", "."):
            segments.append(segment)
    trailing = "/" if segments and path.endswith(("/", "/.", "/..")) else ""
    return "/" + "/".join(segments) + trailing


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


def refusal(error: Refusal, realm: str) -> tuple[list[tuple[str, str]], bytes]:
    """The headers and JSON body of the middleware's own refusal (D6, D7, D16)."""
    body = json.dumps(error.body(), separators=(",", ":")).encode("ascii")
    headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
    headers += error.headers(realm)
    if error.principal is not None:  # the decision says the request reached an organization
        headers += service_headers(error.principal)
    return headers, body


def service_headers(principal: Principal) -> list[tuple[str, str]]:
    """The response headers naming where the request ran: canonical ids, never request text."""
    return [
        (SERVICE_ORGANIZATION_HEADER, principal.organization_id),
        (SERVICE_TENANT_HEADER, principal.tenant_id),
    ]
