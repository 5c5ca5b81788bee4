"""What keyturn's web edges share: options, header names, rendering, and the plumbing.

Nothing here decides whether a request passes (that is ``_core/decision.py``) or which requests
are guarded (``_core/target.py``): this module holds the one header vocabulary of the adapters,
checks their options once, reads the decision's input from an environ (WSGI's, Django's
``request.META``), keeps the app's own lines of keyturn's names off a response, renders a
refusal identically for each (once per distinct refusal, not per request), and reads back the
principal an adapter stored for the app.

It is also the one home of the web plumbing every edge (the middlewares, the payload
guard, the leak endpoints, the console) uses: the ASGI types, the three body readers (ASGI,
WSGI, Django), each bounded by a byte limit, the lifespan loop of an app with nothing to
start, and the path an app routes on. No other module of keyturn awaits ``receive()`` or
reads ``wsgi.input`` (``tests/hygiene/test_web.py`` counts).
"""

from __future__ import annotations

import functools
import json
import operator
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, AnyStr, Final, NamedTuple
from wsgiref.types import WSGIEnvironment

from keyturn._core.decision import AuthRequest
from keyturn._core.model import Principal
from keyturn._core.target import Paths, PublicPaths, Unreadable, below
from keyturn.authenticator import Authenticator
from keyturn.errors import MissingPrincipal, Refusal

__all__ = [
    "AUTHORIZATION_HEADER",
    "DEFAULT_PREFIX",
    "DEFAULT_REALM",
    "KEY_EXPIRES_HEADER",
    "OPTIONS",
    "ORGANIZATION_ID_HEADER",
    "PRINCIPAL_KEY",
    "RESERVED_HEADER_NAMES",
    "RESERVED_LENGTHS",
    "SERVICE_HEADER_NAMES",
    "SERVICE_ORGANIZATION_HEADER",
    "SERVICE_TENANT_HEADER",
    "ASGIApp",
    "ASGIScope",
    "Body",
    "Message",
    "Paths",
    "PublicPaths",
    "Receive",
    "Rendered",
    "Send",
    "asgi_path",
    "check_options",
    "environ_request",
    "expiry_headers",
    "header_name",
    "lifespan",
    "new_request",
    "principal_in",
    "read_asgi_body",
    "read_django_body",
    "read_wsgi_body",
    "rendered",
    "replay",
    "response_headers",
    "service_headers",
    "unreadable",
    "without_reserved",
    "wsgi_path",
]

# The ASGI types, declared once for every edge.
ASGIScope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[ASGIScope, Receive, Send], Awaitable[None]]


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
# Their lengths: a response with no header name of these (the usual one) holds none of ours,
# which map(len, map(header_name, lines)) finds without a Python loop or lower-casing a name.
RESERVED_LENGTHS: Final = frozenset(map(len, RESERVED_HEADER_NAMES))
_RESERVED_EITHER: Final[frozenset[str | bytes]] = frozenset(
    (*RESERVED_HEADER_NAMES, *(name.encode("ascii") for name in RESERVED_HEADER_NAMES))
)
header_name: Final = operator.itemgetter(0)
# The two request headers as WSGI environ keys (Django's request.META too).
_AUTHORIZATION_KEY: Final = "HTTP_AUTHORIZATION"
_ORGANIZATION_ID_KEY: Final = "HTTP_X_ORGANIZATION_ID"
# The realm sits inside a quoted string of WWW-Authenticate: printable ASCII but '"' and '\'.
_REALM: Final = re.compile(r"[ !#-\[\]-~]+")


# The options the three middlewares share, documented here once. The ASGI and WSGI
# ApiKeyMiddleware take them as keywords, and their docstrings' :param lines show these
# texts word for word (help(), editors and the docs site read each class's own docstring);
# Django's reads them from settings.KEYTURN, upper-cased (the authenticator: AUTHENTICATOR or
# STORE_URL). tests/web/test_options.py holds the copies to these texts.
OPTIONS: Final[Mapping[str, str]] = {
    "authenticator": (
        "the :class:`~keyturn.Authenticator` that decides; its options carry the store, the "
        "membership provider, the role policy and the audit hook."
    ),
    "prefix": "the path prefix to protect (the bare prefix without ``/`` included).",
    "public_paths": "exact paths, or a predicate on the path, exempt under the prefix.",
    "realm": 'the realm of ``WWW-Authenticate: Bearer realm="..."``.',
    "strip_authorization": (
        "remove the ``Authorization`` header before the app sees it, so the key cannot reach "
        "its logs."
    ),
    "expiry_header": (
        "add ``service-key-expires-at`` (when the key stops working) to every response to an "
        "accepted request; never to a refusal."
    ),
    "payload_guard": (
        "a :class:`~keyturn.payload.PayloadGuard`: refuse accepted requests whose body holds "
        "a key, and record the key as leaked."
    ),
}


def check_options(
    authenticator: Authenticator, prefix: str, public_paths: PublicPaths, realm: str
) -> Paths:
    """The options every middleware takes (:data:`OPTIONS`), checked at startup rather than
    as a 500 on the first request; the paths they guard.
    """
    if not isinstance(authenticator, Authenticator):
        raise TypeError(
            "authenticator must be a keyturn.Authenticator, e.g. "
            f"Authenticator(db.keys, db.membership); got {type(authenticator).__name__}"
        )
    if not _REALM.fullmatch(realm):
        raise ValueError(f"realm must be printable ASCII without '\"' or '\\', got {realm!r}")
    return Paths(prefix, public_paths)


# The named tuple's own __new__ is Python code; the tuple's is not (the same record, built
# once per request).
new_request: Final = tuple.__new__


def environ_request(
    environ: MutableMapping[str, Any], method: str, path: str, strip: bool
) -> AuthRequest:
    """The decision's input from a WSGI environ or Django's ``request.META``, where servers
    join a repeated header into one value; with *strip*, the ``Authorization`` value is taken
    out of the environ now, before anything is called.
    """
    key = environ.pop(_AUTHORIZATION_KEY, None) if strip else environ.get(_AUTHORIZATION_KEY)
    organization = environ.get(_ORGANIZATION_ID_KEY)
    return new_request(
        AuthRequest,
        (
            () if key is None else (key,),
            () if organization is None else (organization,),
            method.upper(),  # what the router dispatches on
            path,
        ),
    )


def without_reserved(lines: Iterable[tuple[AnyStr, AnyStr]]) -> list[tuple[AnyStr, AnyStr]]:
    """A response's header *lines* (text, or bytes as ASGI sends them) without the app's own
    of :data:`RESERVED_HEADER_NAMES`: a client reads only what keyturn set. A new list: the
    app may pass the same one to every response.
    """
    return [line for line in lines if line[0].lower() not in _RESERVED_EITHER]


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
    (:meth:`~keyturn._core.target.Unreadable.refusal`), logged and audited as the decision's
    other refusals are, with the target as sent.
    """
    return authenticator.record(AuthRequest((), (), method.upper(), root + path), why.refusal())


# --- the plumbing: bodies, lifespan, paths ---------------------------------------------------

_CHUNK: Final = 64 * 1024  # bytes read from wsgi.input at a time
_DIGITS: Final = re.compile(r"[0-9]+", re.ASCII)  # a Content-Length as RFC 9110 writes it


class Body(NamedTuple):
    """At most *limit* bytes of a request's body, as a reader (:func:`read_asgi_body`,
    :func:`read_wsgi_body`, :func:`read_django_body`) found it.
    """

    data: bytes
    over: bool = False  # longer than the limit: its Content-Length said so, or its bytes did
    read: bool = True  # False: nothing was read (said to be too long, or WSGI has no body)


async def read_asgi_body(scope: ASGIScope, receive: Receive, limit: int) -> tuple[Body, Receive]:
    """The body of an HTTP request, and the ``receive`` to hand the app after it.

    A ``Content-Length`` over *limit* is believed without reading a byte; otherwise the body
    is read until its last message (``more_body`` false), until a message would take it
    past *limit* (the first *limit* bytes are kept, ``over`` is set), or until the client
    goes away. The ``receive`` returned answers the whole body as one message, or first the
    message that cut it short (a disconnect, which the app is owed), then whatever the
    server sends next; for a body over the limit it is *receive* itself.
    """
    length = _asgi_length(scope.get("headers", ()))
    if length is not None and length > limit:
        return Body(b"", over=True, read=False), receive
    chunks: list[bytes] = []
    size = 0
    for _ in range(limit + 2):  # each message but the last brings a byte, or is empty
        message = await receive()
        if message["type"] != "http.request":  # the client went away: the app is told
            return Body(b"".join(chunks)), replay(message, receive)
        chunk: bytes = message.get("body", b"")
        if size + len(chunk) > limit:
            chunks.append(chunk[: limit - size])
            return Body(b"".join(chunks), over=True), receive
        size += len(chunk)
        chunks.append(chunk)
        if not message.get("more_body", False):
            data = b"".join(chunks)
            whole = {"type": "http.request", "body": data, "more_body": False}
            return Body(data), replay(whole, receive)
    return Body(b"".join(chunks), over=True), receive  # a server sending empty messages forever


def _asgi_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The ``Content-Length`` of a scope's header lines, when it is one number (the last
    line of that name counts)."""
    length: int | None = None
    for name, value in headers:
        if len(name) == 14 and name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            length = int(text) if text.isascii() and text.isdigit() else None
    return length


def replay(first: Message, receive: Receive) -> Receive:
    """A ``receive`` that answers *first*, then whatever the server sends next."""
    pending = [first]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replayed


def read_wsgi_body(environ: WSGIEnvironment, limit: int) -> Body | None:
    """The body of a WSGI request, read from ``wsgi.input``; ``None`` when its
    ``CONTENT_LENGTH`` is not plain digits (``int()`` reads ``"+59"``, ``" 59"``, ``"5_9"``
    and ``"٥٩"``: servers and apps differ on them).

    A ``CONTENT_LENGTH`` over *limit* is believed without reading a byte; a chunked body
    (``wsgi.input_terminated``: the server ends the stream) is read up to a byte past
    *limit*; a request with neither has no body the app may read (PEP 3333) and nothing is
    read. The stream is read until its length, or its end.
    """
    declared = environ.get("CONTENT_LENGTH") or ""
    if _DIGITS.fullmatch(declared):
        left = int(declared)
        if left > limit:
            return Body(b"", over=True, read=False)
    elif declared:
        return None
    elif environ.get("wsgi.input_terminated"):
        left = limit + 1
    else:
        return Body(b"", read=False)
    stream = environ["wsgi.input"]
    chunks: list[bytes] = []
    size = 0
    while size < left:  # each pass reads at least a byte, or ends
        chunk = stream.read(min(_CHUNK, left - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    data = b"".join(chunks)
    return Body(data[:limit] if size > limit else data, over=size > limit)


def read_django_body(request: Any, limit: int) -> Body:
    """The body of a Django ``HttpRequest``, read through Django (``request.body``: its
    handlers may hold it already, and the view reads it again from there). A
    ``CONTENT_LENGTH`` over *limit* is believed without reading a byte.
    """
    declared = str(request.META.get("CONTENT_LENGTH") or "").strip()
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        return Body(b"", over=True, read=False)
    body: bytes = request.body  # what Django read, whatever CONTENT_LENGTH said
    return Body(body[:limit], over=True) if len(body) > limit else Body(body)


async def lifespan(receive: Receive, send: Send) -> None:
    """Answer a lifespan scope for an app with nothing to start or stop."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def asgi_path(scope: ASGIScope) -> str:
    """The path an ASGI app routes on: ``path`` without ``root_path`` when it repeats it
    (servers differ on whether it does)."""
    path: str = scope["path"]
    rest = below(scope.get("root_path", ""), path)
    return path if rest is None else rest


def wsgi_path(environ: WSGIEnvironment) -> tuple[str, str]:
    """``SCRIPT_NAME`` and ``PATH_INFO`` as the text apps route on: PEP 3333 hands their raw
    bytes over as latin-1, apps read UTF-8. The usual request's are ASCII: the same either
    way, and not decoded again.
    """
    root: str = environ.get("SCRIPT_NAME", "")
    path: str = environ.get("PATH_INFO", "")
    if root.isascii() and path.isascii():
        return root, path
    return _utf8(root), _utf8(path)


def _utf8(raw: str) -> str:
    return raw.encode("latin-1").decode("utf-8", "replace")
