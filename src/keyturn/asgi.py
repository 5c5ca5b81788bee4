"""
ASGI middleware
===============

Authenticates every request to the agents API in front of any ASGI app: Starlette,
FastAPI, or a bare ASGI callable. A request under the protected prefix either is refused
with the JSON error the spec prescribes -- the app is not called, the request body not
read -- or reaches the app as a known user in a known organization, and every response to
it carries ``service-organization-id`` and ``service-tenant-id``.

Configure the decision once, on an :class:`~keyturn.Authenticator` (store, membership
provider, role policy, audit hook, timeouts), and hand that to the middleware. Create one
per process and share it: it holds the memo of decisions and the threads a blocking store
runs on, off the event loop. ::

    from keyturn import Authenticator
    from keyturn.asgi import ApiKeyMiddleware, current_principal, principal

    authenticator = Authenticator(store, membership, policy=..., audit=...)

    # Starlette
    app = Starlette(routes=routes, middleware=[
        Middleware(ApiKeyMiddleware, authenticator=authenticator),
    ])
    # FastAPI
    app.add_middleware(ApiKeyMiddleware, authenticator=authenticator)
    # any ASGI app
    app = ApiKeyMiddleware(app, authenticator=authenticator)

    async def list_models(request):             # Starlette
        who = principal(request)
    def list_models(who: Principal = Depends(current_principal)):  # FastAPI
        ...

What it does, precisely:

-   Which paths: every path under *prefix* (default ``/managed-agents/v1/``), and the
    prefix without its trailing slash, so a missing slash never opens the API. Paths
    listed in *public_paths* (or for which it returns true, if it is a function) are not
    authenticated. The target is read the way any router might (``_core/target.py``): a
    request is guarded when its full path (``root_path`` included) or the path the app
    routes on is under the prefix once read canonically (absolute form dropped, slashes
    collapsed, dot segments resolved, escapes decoded). A path that routers may read as
    different paths, one of them under the prefix, is refused with 400. Anything else
    passes through untouched; so do lifespan events. A scope of any other type under the
    prefix is dropped: it cannot be authenticated.
-   What it reads: every ``Authorization`` and ``x-organization-id`` header line, whatever
    the spelling of the name, so that a repeated header is refused, not guessed.
-   A refused HTTP request gets the error's status, ``content-type: application/json``,
    the body ``{"error": {"code": ..., "message": ...}}`` and ``WWW-Authenticate`` (401)
    or ``Retry-After`` (503). See ``docs/errors.md``.
-   An accepted request reaches the app with the :class:`~keyturn.Principal` in
    ``scope["state"]["keyturn.principal"]`` (read it with :func:`principal` or
    :func:`current_principal`) and, unless ``strip_authorization=False``, without its
    ``Authorization`` header, so the key cannot leak into the app's logs.
-   The service headers are set on every response to an accepted request, exactly once,
    replacing any the app set itself; of the middleware's own refusals only a policy's 403
    and a rate limit's 429 carry them (the request reached its organization). The
    response's start message is edited in place, as Starlette's own middlewares do: its
    header list is replaced by a new one, and the app's own list is left as it was. If the
    app crashes before it starts a response, the middleware sends a plain 500 with the
    headers and re-raises, so the server still logs the error.
-   WebSocket handshakes under the prefix get the same decision. A refusal is sent as an
    HTTP response when the server supports the ``websocket.http.response`` extension, and
    as a close with code 1008 (policy violation) before accept otherwise. The service
    headers go on the ``websocket.accept``.
-   With ``expiry_header=True``, responses to accepted requests also carry
    ``service-key-expires-at``, the key's expiry (the handshake's accept too); refusals and
    the middleware's own 500 never do (``docs/expiry.md``).
-   With a rate limiter on the authenticator (``Authenticator(..., rate_limiter=...)``,
    ``docs/rate-limits.md``), an accepted request past its limit gets 429
    ``rate_limited`` (a WebSocket handshake too, before accept), and every response to
    an accepted request of a limited principal carries ``RateLimit-Policy`` and
    ``RateLimit`` (the handshake's accept too).
-   A refusal to ``HEAD`` has the headers of the ``GET`` refusal and no body.
-   The role policy sees the canonical path and the upper-cased method: what the router
    dispatches.
-   With ``payload_guard=PayloadGuard()`` (:mod:`keyturn.payload`), the body of an accepted
    HTTP request is read and scanned before the app is called: one holding a key is
    refused with 400 ``key_in_payload`` (``docs/payload-guard.md``).
-   Lifespan events pass through. When the app reports its shutdown complete, the
    middleware first waits (at most five seconds) for the ``last_used_at`` writes still
    running on the loop, so an async store does not lose them to a forgotten ``aclose()``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from keyturn._core.decision import AuthRequest
from keyturn._core.model import Principal
from keyturn._core.target import PublicPaths, Unreadable
from keyturn._web import (
    AUTHORIZATION_HEADER,
    DEFAULT_PREFIX,
    DEFAULT_REALM,
    ORGANIZATION_ID_HEADER,
    PRINCIPAL_KEY,
    RESERVED_LENGTHS,
    ASGIApp,
    ASGIScope,
    Message,
    Receive,
    Send,
    check_options,
    header_name,
    new_request,
    principal_in,
    rendered,
    response_headers,
    unreadable,
    without_reserved,
)
from keyturn.authenticator import Authenticator
from keyturn.errors import Refusal
from keyturn.payload import PayloadGuard

if TYPE_CHECKING:
    from keyturn.fastapi import current_principal as current_principal

__all__ = ["ApiKeyMiddleware", "current_principal", "principal"]

log: Final = logging.getLogger("keyturn")

Header = tuple[bytes, bytes]

_AUTHENTICATED: Final = frozenset({"http", "websocket"})
_RESPONSE_STARTS: Final = frozenset(
    {"http.response.start", "websocket.accept", "websocket.http.response.start"}
)
# The shared header names as ASGI sends them; comparing lengths first spares lower-casing
# every other header name.
_AUTHORIZATION: Final = AUTHORIZATION_HEADER.encode("ascii")
_ORGANIZATION_ID: Final = ORGANIZATION_ID_HEADER.encode("ascii")
_READ_LENGTHS: Final = frozenset({len(_AUTHORIZATION), len(_ORGANIZATION_ID)})


class ApiKeyMiddleware:
    """Authenticate requests under *prefix* with personal API keys.

    Everything is checked here, at startup, rather than as a 500 on the first request.

    :param app: the ASGI application to wrap.
    :param authenticator: the :class:`~keyturn.Authenticator` that decides; its options
        carry the store, the membership provider, the role policy and the audit hook.
    :param prefix: the path prefix to protect (the bare prefix without ``/`` included).
    :param public_paths: exact paths, or a predicate on the path, exempt under the prefix.
    :param realm: the realm of ``WWW-Authenticate: Bearer realm="..."``.
    :param strip_authorization: remove the ``Authorization`` header before the app sees it,
        so the key cannot reach its logs.
    :param expiry_header: add ``service-key-expires-at`` (when the key stops working) to
        every response to an accepted request; never to a refusal.
    :param payload_guard: a :class:`~keyturn.payload.PayloadGuard`: refuse accepted requests
        whose body holds a key, and record the key as leaked.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        authenticator: Authenticator,
        prefix: str = DEFAULT_PREFIX,
        public_paths: PublicPaths = (),
        realm: str = DEFAULT_REALM,
        strip_authorization: bool = True,
        expiry_header: bool = False,
        payload_guard: PayloadGuard | None = None,
    ) -> None:
        # The options' texts above are _web.OPTIONS's, shared with the WSGI and Django ones.
        self.paths = check_options(authenticator, prefix, public_paths, realm)
        self.payload_guard = payload_guard and payload_guard.check(authenticator, prefix)
        self.app = app
        self.authenticator = authenticator
        self.realm = realm
        self.strip_authorization = strip_authorization
        self.expiry_header = expiry_header

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self.app(scope, receive, self._flush_at_shutdown(send))
            return
        root, raw = scope.get("root_path", ""), scope.get("path", "")
        path = self.paths.read(root, raw)
        if path is None:  # not ours to guard
            await self.app(scope, receive, send)
            return
        if kind not in _AUTHENTICATED:  # no way to authenticate it, nor to answer it
            log.warning("refused an ASGI %r scope under the protected prefix", kind)
            return
        if isinstance(path, Unreadable):
            error = unreadable(self.authenticator, path, scope.get("method", "GET"), root, raw)
            await self._refuse(error, scope, send)
            return
        guard = self.payload_guard if kind == "http" else None
        began = None if guard is None else time.monotonic()  # for the audit event
        # Built in the call: no frame of ours holds the key while anything it calls may
        # raise, nor while the app runs (error trackers send a traceback's frame locals).
        # With the guard, an acceptance is counted once the body is read (final=False).
        outcome, limits = await self.authenticator.check_async(
            _read(scope, path, self.strip_authorization), final=guard is None
        )
        if isinstance(outcome, Refusal):
            await self._refuse(outcome, scope, send)
            return
        if guard is not None:  # the body, read before the app
            screened = await guard.screen_asgi(
                scope, receive, path, outcome, self.authenticator, began
            )
            if isinstance(screened, Refusal):
                await self._refuse(screened, scope, send)
                return
            receive = screened
        state = scope.get("state")
        if state is None:
            scope["state"] = {PRINCIPAL_KEY: outcome}
        else:
            state[PRINCIPAL_KEY] = outcome
        # Encoded now, so a provider id that is no header value fails before the app runs.
        expires_at = outcome.expires_at if self.expiry_header else None
        extra = _response_headers(outcome.organization_id, outcome.tenant_id, expires_at)
        if limits:  # the rate limit's fields, after the service headers
            extra = (*extra, *[(_limit_name(n), v.encode("latin-1")) for n, v in limits])
        started = False

        async def send_with_service_headers(message: Message) -> None:
            nonlocal started
            if message["type"] in _RESPONSE_STARTS:
                started = True
                headers = message.get("headers", ())
                if not RESERVED_LENGTHS.isdisjoint(map(len, map(header_name, headers))):
                    headers = without_reserved(headers)
                # In place, as Starlette's own middlewares do; the app's list is left as is.
                message["headers"] = [*headers, *extra]
            await send(message)

        try:
            await self.app(scope, receive, send_with_service_headers)
        except Exception:
            # Left alone, the server would answer this crash outside us, without the headers.
            if kind == "http" and not started:
                await send(  # our own 500: the service headers, never the key's expiry
                    {
                        "type": "http.response.start",
                        "status": 500,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8"), *extra[:2]],
                    }
                )
                await send({"type": "http.response.body", "body": b"Internal Server Error"})
            raise

    def _flush_at_shutdown(self, send: Send) -> Send:
        async def send_after_usage(message: Message) -> None:
            usage = self.authenticator.usage
            if message["type"].startswith("lifespan.shutdown.") and usage is not None:
                await usage.flush()  # the loop ends after this message: land the writes first
            await send(message)

        return send_after_usage

    async def _refuse(self, error: Refusal, scope: ASGIScope, send: Send) -> None:
        form = rendered(error, self.realm, scope.get("method", "GET"))
        if scope["type"] == "http":
            start, body = "http.response.start", "http.response.body"
        elif "websocket.http.response" in (scope.get("extensions") or {}):
            start, body = "websocket.http.response.start", "websocket.http.response.body"
        else:  # no way to answer the handshake with HTTP: close before accept
            await send({"type": "websocket.close", "code": 1008})
            return
        # A list of the server's own: the rendering is shared by every request refused alike.
        await send({"type": start, "status": form.status, "headers": list(form.raw_headers)})
        await send({"type": body, "body": form.body})


def _read(scope: ASGIScope, path: str, strip: bool) -> AuthRequest:
    """The decision's input, from one pass over the header lines; with *strip*, the
    ``Authorization`` lines are taken out of the scope now, before anything is called (a new
    list: the server's is left as is).
    """
    headers = scope["headers"]
    authorization: tuple[str, ...] = ()
    organization: tuple[str, ...] = ()
    credentials: Header | None = None
    for line in headers:
        # Servers may pass the client's spelling of a name through: compare lower-cased.
        # Only the two lengths are read, and a name already lower-case is not lowered again.
        name = line[0]
        if len(name) in _READ_LENGTHS:
            if name != _AUTHORIZATION and name != _ORGANIZATION_ID:
                name = name.lower()
            if name == _AUTHORIZATION:
                authorization += (line[1].decode("latin-1"),)
                if credentials is None:
                    credentials = line
            elif name == _ORGANIZATION_ID:
                organization += (line[1].decode("latin-1"),)
    if strip and credentials is not None:
        if len(authorization) == 1:  # the usual request: drop that one line
            headers = headers.copy()
            del headers[headers.index(credentials)]
            scope["headers"] = headers
        else:
            scope["headers"] = [line for line in headers if line[0].lower() != _AUTHORIZATION]
    # What the router dispatches on: the upper-cased method (a WebSocket handshake is a GET).
    method = scope.get("method", "GET").upper()
    return new_request(AuthRequest, (authorization, organization, method, path))


@functools.lru_cache(maxsize=16)
def _limit_name(name: str) -> bytes:
    """A rate limit field's name as ASGI sends it (lower case), encoded once."""
    return name.lower().encode("latin-1")


@functools.lru_cache(maxsize=4096)
def _response_headers(
    organization_id: str, tenant_id: str, expires_at: datetime | None
) -> tuple[Header, ...]:
    """:func:`~keyturn._web.response_headers` as ASGI sends them (the two service headers
    first), encoded once per organization, tenant and instant, not per request.
    """
    lines = response_headers(organization_id, tenant_id, expires_at)
    return tuple((name.encode("latin-1"), value.encode("latin-1")) for name, value in lines)


def principal(request_or_scope: Mapping[str, Any]) -> Principal:
    """The :class:`~keyturn.Principal` of an authenticated request.

    Pass a Starlette ``Request`` or ``WebSocket`` (both are mappings over their scope) or
    the ASGI scope itself.

    :raises MissingPrincipal: the middleware did not authenticate this request.
    """
    return principal_in(request_or_scope.get("state"))


def __getattr__(name: str) -> Any:
    """``current_principal``, the FastAPI dependency (:mod:`keyturn.fastapi`), imported on
    first use: FastAPI finds the request to pass it by a Starlette annotation, and importing
    this module imports no framework.
    """
    if name == "current_principal":
        from keyturn.fastapi import current_principal

        return current_principal
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
