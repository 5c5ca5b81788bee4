"""What the ASGI, WSGI and Django middlewares share: options, header names, rendering.

Nothing here decides whether a request passes (that is ``_decision.py``) or which requests
are guarded (``_target.py``): this module holds the one header vocabulary of the adapters,
checks their options once, renders a refusal identically for each (once per distinct
refusal, not per request), and reads back the principal an adapter stored for the app.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, Final, NamedTuple

from keyturn._decision import AuthRequest
from keyturn._model import Principal
from keyturn._target import Paths, PublicPaths, Unreadable
from keyturn.authenticator import Authenticator
from keyturn.errors import MissingPrincipal, Refusal

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
    "Paths",
    "PublicPaths",
    "Rendered",
    "check_options",
    "expiry_headers",
    "principal_in",
    "rendered",
    "response_headers",
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


def check_options(authenticator: Authenticator, realm: str) -> None:
    """The options every middleware takes, checked at startup rather than as a 500 on the
    first request.
    """
    if not isinstance(authenticator, Authenticator):
        raise TypeError(
            "authenticator must be a keyturn.Authenticator, e.g. "
            f"Authenticator(db.keys, db.membership); got {type(authenticator).__name__}"
        )
    if not _REALM.fullmatch(realm):
        raise ValueError(f"realm must be printable ASCII without '\"' or '\\', got {realm!r}")


def principal_in(stored: Mapping[str, Any] | None) -> Principal:
    """The :class:`~keyturn.Principal` a middleware stored under :data:`PRINCIPAL_KEY` in
    *stored* (an ASGI scope's state, a WSGI environ, Django's ``request.META``).

    :raises MissingPrincipal: no middleware authenticated this request.
    """
    found = (stored or {}).get(PRINCIPAL_KEY)
    if not isinstance(found, Principal):
        raise MissingPrincipal
    return found


class Rendered(NamedTuple):
    """A refusal's wire form, built once per distinct refusal (:func:`rendered`) and shared
    by every request refused alike: read it, never change it. The header lines are tuples:
    an adapter hands the server a list of its own (servers add to what they are given).
    """

    status: int
    status_line: str  # WSGI's "401 Unauthorized"
    headers: tuple[tuple[str, str], ...]  # as text: WSGI, Django
    raw_headers: tuple[tuple[bytes, bytes], ...]  # as ASGI sends them
    body: bytes  # empty for HEAD


# The wire form of each distinct refusal (its class, reason, message, Retry-After and the
# organization it reached; the realm; HEAD or not): a handful in practice, so a full
# table is simply emptied and refilled.
_RENDERED: Final[dict[tuple[object, ...], Rendered]] = {}
_RENDERED_MAX: Final = 1024


def rendered(error: Refusal, realm: str, method: str = "GET") -> Rendered:
    """The middleware's own refusal on the wire (D6, D7, D16), rendered once per kind.

    Every field the wire form reads (``Refusal.body()`` and ``Refusal.headers()`` read the
    class, the reason, the message, a 503's ``retry_after`` and a 429's rate limit fields;
    the service headers read the organization a 403 or 429 reached) is in the key, so two
    refusals share a rendering only when they would render the same.
    """
    head = method == "HEAD" or method.upper() == "HEAD"
    reached = error.principal
    key = (
        type(error),
        error.reason,
        error.message,
        getattr(error, "retry_after", None),
        getattr(error, "limit_headers", None),  # a 429's RateLimit fields
        None if reached is None else reached.organization_id,
        None if reached is None else reached.tenant_id,
        realm,
        head,
    )
    found = _RENDERED.get(key)
    if found is None:
        if len(_RENDERED) >= _RENDERED_MAX:
            _RENDERED.clear()
        found = _RENDERED[key] = _render(error, realm, head)
    return found


def _render(error: Refusal, realm: str, head: bool) -> Rendered:
    # A refusal to HEAD has the headers of the GET refusal and no body (D24): a body there
    # would be read as the start of the next response on the connection.
    body = json.dumps(error.body(), separators=(",", ":")).encode("ascii")
    headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
    headers += error.headers(realm)
    if error.principal is not None:  # the decision says the request reached an organization
        headers += service_headers(error.principal.organization_id, error.principal.tenant_id)
    return Rendered(
        status=error.status,
        status_line=f"{error.status} {HTTPStatus(error.status).phrase}",
        headers=tuple(headers),
        raw_headers=tuple(
            (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers
        ),
        body=b"" if head else body,
    )


@functools.lru_cache(maxsize=1024)
def service_headers(organization_id: str, tenant_id: str) -> tuple[tuple[str, str], ...]:
    """The response headers naming where the request ran: canonical ids, never request text;
    built once per organization.
    """
    return ((SERVICE_ORGANIZATION_HEADER, organization_id), (SERVICE_TENANT_HEADER, tenant_id))


@functools.lru_cache(maxsize=4096)
def response_headers(
    organization_id: str, tenant_id: str, expires_at: datetime | None
) -> tuple[tuple[str, str], ...]:
    """Every header keyturn adds to a response of an accepted request: the service headers,
    then the expiry (none for ``None``: the option is off). Built once per organization,
    tenant and instant, not per request.
    """
    return service_headers(organization_id, tenant_id) + expiry_headers(expires_at)


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
    """The decision's 400 for a target routers may read as different paths under the prefix
    (:meth:`~keyturn._target.Unreadable.refusal`), logged and audited as the decision's
    other refusals are, with the target as sent.
    """
    return authenticator.record(AuthRequest((), (), method.upper(), root + path), why.refusal())
