"""
WSGI middleware
===============

Authenticates every request to the agents API in front of any WSGI app: Flask, plain
Werkzeug, Django's WSGI handler. A request under the protected prefix either is refused
with the JSON error the spec prescribes -- the app is not called, the request body not
read -- or reaches the app as a known user in a known organization, and every response to
it carries ``service-organization-id`` and ``service-tenant-id``.

Configure the decision once, on an :class:`~keyturn.Authenticator` (store, membership
provider, role policy, audit hook, timeouts), and hand that to the middleware. Create one
per process and share it: it holds the memo of decisions. ::

    from keyturn import Authenticator
    from keyturn.wsgi import ApiKeyMiddleware, principal

    authenticator = Authenticator(store, membership, policy=..., audit=...)

    # Flask
    app.wsgi_app = ApiKeyMiddleware(app.wsgi_app, authenticator=authenticator)
    # any WSGI app
    application = ApiKeyMiddleware(application, authenticator=authenticator)

    @app.get("/managed-agents/v1/models")
    def list_models():
        who = principal(request)  # a Flask or Werkzeug request, or the environ itself

What it does, precisely:

-   Which paths: every path under *prefix* (default ``/managed-agents/v1/``), and the
    prefix without its trailing slash, so a missing slash never opens the API. Paths
    listed in *public_paths* (or for which it returns true, if it is a function) are not
    authenticated. The target is read the way any router might (``_core/target.py``): a
    request is guarded when ``SCRIPT_NAME + PATH_INFO`` or ``PATH_INFO`` alone is under the
    prefix once read canonically (absolute form dropped, a missing leading slash added,
    slashes collapsed, dot segments resolved, escapes decoded), so neither Werkzeug's
    reading of ``managed-agents/v1/models`` nor a ``SCRIPT_NAME`` a client set opens it. A
    path that routers may read as different paths, one of them under the prefix, is
    refused with 400. Anything else passes through untouched.
-   What it reads: ``HTTP_AUTHORIZATION`` and ``HTTP_X_ORGANIZATION_ID``. WSGI servers
    join a repeated header into one comma-separated value; a joined ``Authorization`` is
    refused with 401 (it is not one key), a joined ``x-organization-id`` with 400 (a comma
    is not part of an organization id). ``x_organization_id`` and ``x-organization-id`` share
    one environ key: most servers drop names with underscores, wsgiref joins both, granian
    keeps the last (``docs/security.md`` has the table). Some servers hide ``Authorization``
    from the app unless told otherwise (mod_wsgi: ``WSGIPassAuthorization On``); every
    request is then refused with 401.
-   The role policy sees the canonical path and the upper-cased method: what the router
    dispatches. A refusal to ``HEAD`` has the headers of the ``GET`` refusal and no body.
-   A refused request gets the error's status, ``content-type: application/json``, the
    body ``{"error": {"code": ..., "message": ...}}`` and ``WWW-Authenticate`` (401) or
    ``Retry-After`` (503). See ``docs/errors.md``.
-   An accepted request reaches the app with the :class:`~keyturn.Principal` in
    ``environ["keyturn.principal"]`` (read it with :func:`principal`) and, unless
    ``strip_authorization=False``, without ``HTTP_AUTHORIZATION``, so the key cannot leak
    into the app's logs.
-   The service headers are added on every ``start_response`` of an accepted request,
    exactly once, replacing any the app set itself -- also on the error response an app
    starts with ``exc_info``. Of the middleware's own refusals only a policy's 403 and a
    rate limit's 429 carry them (the request reached its organization). The app's
    iterable is returned as it is: unbuffered, with its ``close()``.
-   With ``expiry_header=True``, responses to accepted requests also carry
    ``service-key-expires-at``, the key's expiry; refusals and the middleware's own 500
    never do (``docs/expiry.md``).
-   With ``payload_guard=PayloadGuard()`` (:mod:`keyturn.payload`), the body of an accepted
    request is read and scanned before the app is called: one holding a key is refused
    with 400 ``key_in_payload`` (``docs/payload-guard.md``).
-   With a rate limiter on the authenticator (``Authenticator(..., rate_limiter=...)``,
    ``docs/rate-limits.md``), an accepted request past its limit gets 429
    ``rate_limited``, and every response to an accepted request of a limited principal
    carries ``RateLimit-Policy`` and ``RateLimit``.
-   If the app raises before it starts its response (Flask and Django turn their errors
    into responses of their own, which carry the headers), the middleware answers 500 with
    the service headers and logs the traceback on the ``keyturn`` logger: re-raised, the
    exception would become the server's own 500, without them. An exception raised after
    the app started its response propagates to the server unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from keyturn._core.model import Principal
from keyturn._core.target import PublicPaths, Unreadable
from keyturn._web import (
    DEFAULT_PREFIX,
    DEFAULT_REALM,
    PRINCIPAL_KEY,
    RESERVED_LENGTHS,
    check_options,
    environ_request,
    header_name,
    principal_in,
    rendered,
    response_headers,
    unreadable,
    without_reserved,
    wsgi_path,
)
from keyturn.authenticator import Authenticator
from keyturn.errors import Refusal
from keyturn.payload import PayloadGuard

if TYPE_CHECKING:
    from _typeshed import OptExcInfo

__all__ = ["ApiKeyMiddleware", "principal"]

log: Final = logging.getLogger("keyturn")


class ApiKeyMiddleware:
    """Authenticate requests under *prefix* with personal API keys.

    Everything is checked here, at startup, rather than as a 500 on the first request.

    :param app: the WSGI application to wrap.
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
        app: WSGIApplication,
        *,
        authenticator: Authenticator,
        prefix: str = DEFAULT_PREFIX,
        public_paths: PublicPaths = (),
        realm: str = DEFAULT_REALM,
        strip_authorization: bool = True,
        expiry_header: bool = False,
        payload_guard: PayloadGuard | None = None,
    ) -> None:
        # The options' texts above are _web.OPTIONS's, shared with the ASGI and Django ones.
        self.paths = check_options(authenticator, prefix, public_paths, realm)
        self.payload_guard = payload_guard and payload_guard.check(authenticator, prefix)
        self.app = app
        self.authenticator = authenticator
        self.realm = realm
        self.strip_authorization = strip_authorization
        self.expiry_header = expiry_header

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        root, raw = wsgi_path(environ)  # as the app routes on them
        path = self.paths.read(root, raw)
        if path is None:
            return self.app(environ, start_response)
        method = environ.get("REQUEST_METHOD", "GET")
        if isinstance(path, Unreadable):
            error = unreadable(self.authenticator, path, method, root, raw)
            return _refuse(error, self.realm, method, start_response)
        guard = self.payload_guard
        began = None if guard is None else time.monotonic()  # for the audit event
        # Built in the call: no frame of ours holds the key while anything it calls may
        # raise, nor while the app runs (error trackers send a traceback's frame locals).
        # With the guard, an acceptance is counted once the body is read (final=False).
        outcome, limits = self.authenticator.check(
            environ_request(environ, method, path, self.strip_authorization), final=guard is None
        )
        if isinstance(outcome, Refusal):
            return _refuse(outcome, self.realm, method, start_response)
        if guard is not None:  # the body, read before the app
            screened = guard.screen_wsgi(environ, path, outcome, self.authenticator, began)
            if screened is not None:
                return _refuse(screened, self.realm, method, start_response)

        environ[PRINCIPAL_KEY] = outcome
        expires_at = outcome.expires_at if self.expiry_header else None
        extra = response_headers(outcome.organization_id, outcome.tenant_id, expires_at) + limits
        started = False

        def start_with_service_headers(
            status: str, headers: list[tuple[str, str]], exc_info: OptExcInfo | None = None
        ) -> Callable[[bytes], object]:
            nonlocal started
            started = True
            if not RESERVED_LENGTHS.isdisjoint(map(len, map(header_name, headers))):
                headers = without_reserved(headers)
            return start_response(status, [*headers, *extra], exc_info)

        try:
            return self.app(environ, start_with_service_headers)
        except Exception:
            if started:  # the app chose its response: the server's error handling takes over
                raise
            # Re-raised, this would become the server's own 500, without the headers the
            # spec puts on every response of a request that reached an organization.
            log.exception("the application raised before responding; answering 500")
            start_response(  # our own 500: the service headers, never the key's expiry
                "500 Internal Server Error",
                [("content-type", "text/plain; charset=utf-8"), *extra[:2]],
            )
            return [b"Internal Server Error"]


def _refuse(error: Refusal, realm: str, method: str, start_response: StartResponse) -> list[bytes]:
    form = rendered(error, realm, method)
    # A list of the server's own: the rendering is shared by every request refused alike.
    start_response(form.status_line, list(form.headers))
    return [form.body] if form.body else []


class _HasEnviron(Protocol):
    @property
    def environ(self) -> WSGIEnvironment: ...


def principal(request_or_environ: _HasEnviron | Mapping[str, Any]) -> Principal:
    """The :class:`~keyturn.Principal` of an authenticated request.

    Pass a Flask or Werkzeug request (anything with an ``environ``) or the WSGI environ
    itself (Django: ``request.META``).

    :raises MissingPrincipal: the middleware did not authenticate this request.
    """
    environ = (
        request_or_environ
        if isinstance(request_or_environ, Mapping)
        else request_or_environ.environ
    )
    return principal_in(environ)
