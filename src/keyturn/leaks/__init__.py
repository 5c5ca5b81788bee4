"""
Leaked keys answered
====================

A secret-scanning endpoint for a code host's partner program (GitHub's is the reference;
``docs/leaks.md`` is the guide): the host POSTs the candidates it found in public, signed;
this module decides which are real keys, records the leak on each, and hands it to your
code. The code host sends no API key, so the endpoint lives outside ``/managed-agents/v1/``.
The ``leaks`` extra brings ``cryptography`` for the signature::

    responder = LeakResponder(db.keys, public_keys={identifier: pem}, on_leak=tell_creator)
    app = WSGILeakEndpoint(app, responder=responder)   # or ASGILeakEndpoint

What the endpoint and its responder decide, in order:

-   Not a ``POST``: 405. A body over *max_body* bytes (1 MiB by default): 413.
-   The signature over the raw body, before anything else is read: missing or unreadable
    ``Github-Public-Key-Identifier`` / ``Github-Public-Key-Signature`` headers get 401, an
    unknown key or a signature that does not verify (ECDSA P-256, SHA-256) 403.
-   A body that is not a JSON array of candidates (string ``token``, ``type``, ``url``; a
    string or absent ``source``), JSON nested deeper than Python's stack included: 400,
    all or nothing.
-   Each candidate as the authenticator checks a key: shape and checksum (junk never reaches
    the store), key id in the store, secret against the stored hash (one SHA-256; a legacy
    argon2id hash as the authenticator verifies one, once per process). A real id with a
    wrong secret is a false positive. The answer is
    ``200``, one ``{"token_hash", "token_type", "label"}`` per candidate in order: a hash,
    never the secret.
-   A true positive, whatever the key's state, is recorded on the key (``KeyInfo.leaked``:
    the first report's URL and time) and handed to *on_leak* as a :class:`LeakReport`. The
    key is revoked only with ``revoke=True``: the spec lets only its creator revoke it. A
    store that keeps the record of key actions (:mod:`keyturn.activity`) gets the report,
    and the revoke, as events of the leak endpoint.
-   A store that fails, times out or answers the wrong type, or a public-key callable that
    fails: 503, and the host sends the batch again. A failing *on_leak* is logged; the
    answer stands.

The public keys are yours to supply, never fetched here: a mapping of key identifier to PEM
(see :func:`github_public_keys`), or a callable returning the PEM for an identifier, or
``None``.

Here are the WSGI and ASGI endpoints; the report is checked in ``leaks/_report.py``, the
rest decided in ``leaks/_responder.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any, ClassVar, Final, Generic, TypeVar

from keyturn._web import (
    DEFAULT_PREFIX,
    ASGIApp,
    ASGIScope,
    Paths,
    Receive,
    Send,
    asgi_path,
    lifespan,
    read_asgi_body,
    read_wsgi_body,
    wsgi_path,
)
from keyturn.leaks._report import KEY_ID_HEADER, SIGNATURE_HEADER, github_public_keys
from keyturn.leaks._responder import (
    AsyncLeakStore,
    LeakReport,
    LeakResponder,
    LeakStore,
    Response,
    error,
)

__all__ = [
    "DEFAULT_PATH",
    "KEY_ID_HEADER",
    "SIGNATURE_HEADER",
    "ASGILeakEndpoint",
    "AsyncLeakStore",
    "LeakReport",
    "LeakResponder",
    "LeakStore",
    "Response",
    "WSGILeakEndpoint",
    "github_public_keys",
]

DEFAULT_PATH: Final = "/keyturn/secret-scanning"


def _header_lists(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    headers: dict[str, list[str]] = {}
    for name, value in pairs:
        headers.setdefault(name.lower(), []).append(value)
    return headers


_NOT_FOUND: Final = error(404, "not_found", "Not found.")

App = TypeVar("App")
WSGIApp = Callable[..., Iterable[bytes]]


class _Endpoint(Generic[App]):
    _sync: ClassVar[bool] = False  # the endpoint drives the responder with respond()

    def __init__(
        self,
        app: App | None = None,
        *,
        responder: LeakResponder,
        path: str = DEFAULT_PATH,
        api_prefix: str = DEFAULT_PREFIX,
    ) -> None:
        if self._sync and responder.is_async:
            raise TypeError("an async store needs the ASGI endpoint (ASGILeakEndpoint)")
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/', got {path!r}")
        if Paths(api_prefix, ()).read("", path) is not None:  # guarded, or unreadable there
            raise ValueError(
                f"the secret-scanning endpoint must not sit under {api_prefix}: the code host "
                "sends no API key, so the API key middleware would refuse every report"
            )
        self.app = app
        self.responder = responder
        self.path = path


class ASGILeakEndpoint(_Endpoint[ASGIApp]):
    """Serves the responder at *path*; everything else goes to *app* (or gets 404 without one).

    :raises ValueError: *path* is under the API's prefix (*api_prefix*).
    """

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and asgi_path(scope) == self.path:
            headers = _header_lists(
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in scope["headers"]
            )
            found, _ = await read_asgi_body(scope, receive, self.responder.max_body)
            body = None if found.over else found.data  # None: 413
            response = await self.responder.respond_async(scope["method"], headers, body)
        elif self.app is not None:
            await self.app(scope, receive, send)
            return
        elif scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        elif scope["type"] == "http":
            response = _NOT_FOUND
        else:
            return  # a WebSocket with nothing to serve it is refused by the server
        raw = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in response.headers]
        await send({"type": "http.response.start", "status": response.status, "headers": raw})
        await send({"type": "http.response.body", "body": response.body})


class WSGILeakEndpoint(_Endpoint[WSGIApp]):
    """The WSGI twin of :class:`ASGILeakEndpoint`; an async store needs that one."""

    _sync = True

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        if wsgi_path(environ)[1] != self.path:
            if self.app is not None:
                return self.app(environ, start_response)
            response = _NOT_FOUND
        else:
            headers = _header_lists(
                (name[5:].replace("_", "-"), value)
                for name, value in environ.items()
                if name.startswith("HTTP_")
            )
            found = read_wsgi_body(environ, self.responder.max_body)
            # None: 413; a CONTENT_LENGTH that is not digits is read as no body
            body = b"" if found is None else None if found.over else found.data
            response = self.responder.respond(environ.get("REQUEST_METHOD", "GET"), headers, body)
        start_response(f"{response.status} {HTTPStatus(response.status).phrase}", response.headers)
        return [response.body]
