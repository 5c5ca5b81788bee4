"""The apps under test, their competitors, and drivers that call them in process.

One list-models endpoint, written for Starlette, FastAPI and Flask, is the same in every
variant; only what authenticates in front of it changes:

- the *floor*: a hand-written minimal middleware (ASGI or WSGI) doing the same work as
  keyturn on the warm path -- find the ``Authorization`` and ``x-organization-id`` headers,
  one sha256 of the token, one dict lookup, the organization rule (:class:`Rule`) -- and
  adding the two service headers to the response;
- the frameworks' own mechanisms doing that same work: Starlette's
  ``AuthenticationMiddleware`` (a backend, plus a small middleware for the two headers),
  FastAPI's ``HTTPBearer`` dependency (headers through the injected ``Response``) and
  Flask-HTTPAuth's ``HTTPTokenAuth`` (headers in an ``after_request`` hook);
- the *trivial* versions of each, as a second row: token lookup only, no organization
  check (the floor still adds the headers; the frameworks' mechanisms add none);
- keyturn's middleware, with the real :class:`~keyturn.Authenticator`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from fastapi import Depends, FastAPI, HTTPException
from fastapi import Request as FastAPIRequest
from fastapi import Response as FastAPIResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from flask import Flask, g
from flask import request as flask_request
from starlette.applications import Starlette
from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    AuthenticationError,
    SimpleUser,
)
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from werkzeug.test import EnvironBuilder

from bench._core import Batch
from keyturn import Principal

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = [
    "MODELS",
    "FloorASGI",
    "FloorWSGI",
    "RefuseAllASGI",
    "RefuseAllWSGI",
    "Rule",
    "SameWorkFloorASGI",
    "SameWorkFloorWSGI",
    "Who",
    "asgi_batch",
    "asgi_call",
    "fastapi_app",
    "fastapi_bearer_app",
    "fastapi_bearer_same_work_app",
    "fastapi_caller_app",
    "fastapi_depends_app",
    "fastapi_empty_depends_app",
    "fastapi_request_app",
    "flask_app",
    "flask_httpauth_app",
    "flask_httpauth_same_work_app",
    "http_scope",
    "sha256_keys",
    "starlette_app",
    "starlette_auth_backend",
    "starlette_auth_same_work",
    "wsgi_batch",
    "wsgi_call",
    "wsgi_environ",
]

MODELS: Final = "/managed-agents/v1/models"
ITEMS: Final = [{"id": "agent-small"}, {"id": "agent-large"}]
UNAUTHORIZED: Final = b'{"error":{"code":"unauthorized","message":"Unauthorized"}}'


class Who(NamedTuple):
    """What the hand-written checks know about a key: enough for the organization rule.

    ``organization_id`` is the key's organization, or ``None`` for a tenant-scoped key.
    """

    account_id: str
    organization_id: str | None
    tenant_id: str


class Rule:
    """The organization rule of every same-work baseline, written once, as plainly as it goes.

    An organization-scoped key works in its own organization (an ``x-organization-id``
    naming another is refused); a tenant-scoped key names an organization of its tenant in
    ``x-organization-id``. Either way the account must hold a role there. This is the
    check keyturn makes on the warm path, without its refinements (the ``default`` name,
    repeated headers, the syntax check, precise statuses).
    """

    def __init__(self, organizations: Mapping[str, str], roles: Mapping[tuple[str, str], str]):
        self.organizations = organizations  # organization id -> tenant id
        self.roles = roles  # (account id, organization id) -> role

    def organization(self, who: Who, header: str | None) -> str | None:
        """The organization the request works in, or ``None`` to refuse it."""
        if who.organization_id is not None:
            if header is not None and header != who.organization_id:
                return None
            organization = who.organization_id
        elif header is not None and self.organizations.get(header) == who.tenant_id:
            organization = header
        else:
            return None
        return organization if (who.account_id, organization) in self.roles else None


def sha256_keys(tokens: Mapping[str, Who]) -> dict[bytes, Who]:
    """The trivial checks' key table: sha256 of the token -> who it is."""
    return {hashlib.sha256(token.encode("ascii")).digest(): who for token, who in tokens.items()}


# --- ASGI -----------------------------------------------------------------------------------


async def list_models(request: Request) -> Response:
    return JSONResponse({"items": ITEMS})


def starlette_app(*middleware: Middleware) -> Starlette:
    return Starlette(routes=[Route(MODELS, list_models)], middleware=list(middleware))


class FloorASGI:
    """The practical floor: header scan, one sha256, one dict lookup, two response headers."""

    def __init__(self, app: ASGIApp, *, keys: Mapping[bytes, Who]) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        found = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                if value[:7].lower() == b"bearer ":
                    found = self.keys.get(hashlib.sha256(value[7:]).digest())
                break
        if found is None:
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": UNAUTHORIZED})
            return
        scope.setdefault("state", {})["principal"] = found
        extra = [
            (b"service-organization-id", found.organization_id.encode("latin-1")),
            (b"service-tenant-id", found.tenant_id.encode("latin-1")),
        ]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class RefuseAllASGI:
    """What any refusal costs at least: a fixed 401, nothing read, the app never called."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": UNAUTHORIZED})


class SameWorkFloorASGI:
    """The floor doing keyturn's warm-path work: both headers, lookup, the rule, two headers."""

    def __init__(self, app: ASGIApp, *, keys: Mapping[bytes, Who], rule: Rule) -> None:
        self.app = app
        self.keys = keys
        self.rule = rule

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        found = header = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                if value[:7].lower() == b"bearer ":
                    found = self.keys.get(hashlib.sha256(value[7:]).digest())
            elif name == b"x-organization-id":
                header = value.decode("latin-1")
        organization = None if found is None else self.rule.organization(found, header)
        if found is None or organization is None:
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": UNAUTHORIZED})
            return
        scope.setdefault("state", {})["principal"] = (found, organization)
        extra = [
            (b"service-organization-id", organization.encode("latin-1")),
            (b"service-tenant-id", found.tenant_id.encode("latin-1")),
        ]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class _TrivialBackend(AuthenticationBackend):
    def __init__(self, keys: Mapping[bytes, Who]) -> None:
        self.keys = keys

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser]:
        header = conn.headers.get("authorization", "")
        found = None
        if header[:7].lower() == "bearer ":
            found = self.keys.get(hashlib.sha256(header[7:].encode("latin-1")).digest())
        if found is None:
            raise AuthenticationError("unauthorized")
        return AuthCredentials(["authenticated"]), SimpleUser(found.account_id)


def _unauthorized(conn: HTTPConnection, exc: AuthenticationError) -> Response:
    return Response(UNAUTHORIZED, status_code=401, media_type="application/json")


def starlette_auth_backend(keys: Mapping[bytes, Who]) -> Middleware:
    """Starlette's AuthenticationMiddleware with a trivial backend that refuses with 401."""
    return Middleware(
        AuthenticationMiddleware, backend=_TrivialBackend(keys), on_error=_unauthorized
    )


class KeyUser(SimpleUser):
    """Starlette's user of the same-work backend: who, and the organization it works in."""

    def __init__(self, who: Who, organization_id: str) -> None:
        super().__init__(who.account_id)
        self.who = who
        self.organization_id = organization_id


class _SameWorkBackend(AuthenticationBackend):
    def __init__(self, keys: Mapping[bytes, Who], rule: Rule) -> None:
        self.keys = keys
        self.rule = rule

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, KeyUser]:
        headers = conn.headers
        header = headers.get("authorization", "")
        found = organization = None
        if header[:7].lower() == "bearer ":
            found = self.keys.get(hashlib.sha256(header[7:].encode("latin-1")).digest())
        if found is not None:
            organization = self.rule.organization(found, headers.get("x-organization-id"))
        if found is None or organization is None:
            raise AuthenticationError("unauthorized")
        return AuthCredentials(["authenticated"]), KeyUser(found, organization)


class _ServiceHeaders:
    """The two service headers from Starlette's ``scope["user"]``, as a pure ASGI middleware."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        user = scope.get("user")
        if not isinstance(user, KeyUser):
            await self.app(scope, receive, send)
            return
        extra = [
            (b"service-organization-id", user.organization_id.encode("latin-1")),
            (b"service-tenant-id", user.who.tenant_id.encode("latin-1")),
        ]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def starlette_auth_same_work(keys: Mapping[bytes, Who], rule: Rule) -> list[Middleware]:
    """AuthenticationMiddleware with the same-work backend, then the service headers."""
    return [
        Middleware(
            AuthenticationMiddleware,
            backend=_SameWorkBackend(keys, rule),
            on_error=_unauthorized,
        ),
        Middleware(_ServiceHeaders),
    ]


# Every FastAPI endpoint returns a dict (no response model), so that FastAPI builds the
# response and applies the headers a dependency set on the injected ``Response``.


def fastapi_app(*middleware: Middleware) -> FastAPI:
    app = FastAPI(middleware=list(middleware), openapi_url=None)

    @app.get(MODELS, response_model=None)
    async def models() -> dict[str, Any]:
        return {"items": ITEMS}

    return app


def fastapi_caller_app(*middleware: Middleware) -> FastAPI:
    """keyturn's middleware, and the route takes its caller as ``keyturn.fastapi.Caller``."""
    from keyturn.fastapi import api_key

    app = FastAPI(middleware=list(middleware), openapi_url=None)

    @app.get(MODELS, response_model=None)
    async def models(caller: Principal = Depends(api_key)) -> dict[str, Any]:  # noqa: B008
        return {"items": ITEMS}

    return app


def fastapi_depends_app(*middleware: Middleware) -> FastAPI:
    """keyturn's middleware, and the route takes ``Depends(keyturn.asgi.current_principal)``."""
    from keyturn.asgi import current_principal

    app = FastAPI(middleware=list(middleware), openapi_url=None)

    @app.get(MODELS, response_model=None)
    async def models(who: Principal = Depends(current_principal)) -> dict[str, Any]:  # noqa: B008
        return {"items": ITEMS}

    return app


async def _nothing() -> None:
    return None


def fastapi_empty_depends_app() -> FastAPI:
    """No guard; the route takes one async dependency that does nothing: what FastAPI itself
    spends on any one dependency, whatever it does.
    """
    app = FastAPI(openapi_url=None)

    @app.get(MODELS, response_model=None)
    async def models(nothing: None = Depends(_nothing)) -> dict[str, Any]:
        return {"items": ITEMS}

    return app


def fastapi_request_app(*middleware: Middleware) -> FastAPI:
    """keyturn's middleware, and the route reads ``keyturn.asgi.principal(request)``."""
    from keyturn.asgi import principal

    app = FastAPI(middleware=list(middleware), openapi_url=None)

    @app.get(MODELS, response_model=None)
    async def models(request: FastAPIRequest) -> dict[str, Any]:
        principal(request)
        return {"items": ITEMS}

    return app


def fastapi_bearer_app(keys: Mapping[bytes, Who]) -> FastAPI:
    """FastAPI's HTTPBearer dependency, then a trivial check (async: no thread hop)."""
    app = FastAPI(openapi_url=None)
    bearer = HTTPBearer()

    # Defaults, not Annotated: under postponed annotations FastAPI resolves names in the
    # module's globals, and these dependencies are local.
    async def caller(
        credentials: HTTPAuthorizationCredentials = Depends(bearer),  # noqa: B008
    ) -> Who:
        found = keys.get(hashlib.sha256(credentials.credentials.encode("latin-1")).digest())
        if found is None:
            raise HTTPException(401, "unauthorized")
        return found

    @app.get(MODELS, response_model=None)
    async def models(who: Who = Depends(caller)) -> dict[str, Any]:  # noqa: B008
        return {"items": ITEMS}

    return app


def fastapi_bearer_same_work_app(keys: Mapping[bytes, Who], rule: Rule) -> FastAPI:
    """HTTPBearer, the lookup and the rule in one dependency, headers on its ``Response``."""
    app = FastAPI(openapi_url=None)
    bearer = HTTPBearer()

    async def caller(
        request: FastAPIRequest,
        response: FastAPIResponse,
        credentials: HTTPAuthorizationCredentials = Depends(bearer),  # noqa: B008
    ) -> tuple[Who, str]:
        found = keys.get(hashlib.sha256(credentials.credentials.encode("latin-1")).digest())
        organization = (
            None
            if found is None
            else rule.organization(found, request.headers.get("x-organization-id"))
        )
        if found is None or organization is None:
            raise HTTPException(401, "unauthorized")
        response.headers["service-organization-id"] = organization
        response.headers["service-tenant-id"] = found.tenant_id
        return found, organization

    @app.get(MODELS, response_model=None)
    async def models(who: tuple[Who, str] = Depends(caller)) -> dict[str, Any]:
        return {"items": ITEMS}

    return app


def http_scope(headers: Iterable[tuple[str, str]], path: str = MODELS) -> dict[str, Any]:
    """An HTTP scope as uvicorn builds it for ``GET path`` with these extra headers."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "scheme": "http",
        "method": "GET",
        "root_path": "",
        "path": path,
        "raw_path": path.encode("ascii"),
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"user-agent", b"bench"),
            (b"accept", b"*/*"),
            *((name.encode("latin-1"), value.encode("latin-1")) for name, value in headers),
        ],
    }


async def _receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _discard(message: Message) -> None:
    return None


AsyncRun = Callable[[Any], Any]  # loop.run_until_complete


def asgi_batch(run: AsyncRun, app: ASGIApp, scope: Mapping[str, Any]) -> Batch:
    """Call *app* n times with a fresh copy of *scope*, inside one coroutine on *run*'s loop."""

    async def many(n: int) -> int:
        start = time.perf_counter_ns()
        for _ in range(n):
            await app(dict(scope), _receive, _discard)
        return time.perf_counter_ns() - start

    def batch(n: int) -> int:
        elapsed: int = run(many(n))
        return elapsed

    return batch


class Reply(NamedTuple):
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key == name), None)


async def asgi_call(app: ASGIApp, scope: Mapping[str, Any]) -> Reply:
    """One request; its status, headers (names lower-cased) and body."""
    messages: list[MutableMapping[str, Any]] = []

    async def keep(message: Message) -> None:
        messages.append(message)

    await app(dict(scope), _receive, keep)
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in start["headers"]]
    return Reply(start["status"], headers, body)


# --- WSGI -----------------------------------------------------------------------------------


def flask_app() -> Flask:
    app = Flask("bench_flask")

    @app.get(MODELS)
    def models() -> dict[str, Any]:
        return {"items": ITEMS}

    return app


def flask_httpauth_app(keys: Mapping[bytes, Who]) -> Flask:
    """Flask-HTTPAuth's HTTPTokenAuth (Bearer) with a trivial verify_token."""
    from flask_httpauth import HTTPTokenAuth  # type: ignore[import-untyped]

    app = Flask("bench_flask_httpauth")
    auth = HTTPTokenAuth(scheme="Bearer")

    def verify(token: str) -> Who | None:
        return keys.get(hashlib.sha256(token.encode("latin-1")).digest())

    def models() -> dict[str, Any]:
        return {"items": ITEMS}

    auth.verify_token(verify)
    app.add_url_rule(MODELS, "models", auth.login_required(models), methods=["GET"])
    return app


def flask_httpauth_same_work_app(keys: Mapping[bytes, Who], rule: Rule) -> Flask:
    """HTTPTokenAuth doing the lookup and the rule; the headers in an ``after_request`` hook."""
    from flask_httpauth import HTTPTokenAuth  # type: ignore[import-untyped]

    app = Flask("bench_flask_httpauth_same_work")
    auth = HTTPTokenAuth(scheme="Bearer")

    def verify(token: str) -> tuple[Who, str] | None:
        found = keys.get(hashlib.sha256(token.encode("latin-1")).digest())
        if found is None:
            return None
        organization = rule.organization(found, flask_request.headers.get("X-Organization-Id"))
        if organization is None:
            return None
        g.service_headers = (organization, found.tenant_id)
        return found, organization

    def models() -> dict[str, Any]:
        return {"items": ITEMS}

    def service_headers(response: Any) -> Any:
        where = g.get("service_headers")
        if where is not None:
            response.headers["service-organization-id"] = where[0]
            response.headers["service-tenant-id"] = where[1]
        return response

    auth.verify_token(verify)
    app.add_url_rule(MODELS, "models", auth.login_required(models), methods=["GET"])
    app.after_request(service_headers)
    return app


class FloorWSGI:
    """The WSGI floor: one environ read, one sha256, one dict lookup, two response headers."""

    def __init__(self, app: WSGIApplication, *, keys: Mapping[bytes, Who]) -> None:
        self.app = app
        self.keys = keys

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        header: str = environ.get("HTTP_AUTHORIZATION", "")
        found = None
        if header[:7].lower() == "bearer ":
            found = self.keys.get(hashlib.sha256(header[7:].encode("latin-1")).digest())
        if found is None:
            start_response("401 Unauthorized", [("content-type", "application/json")])
            return [UNAUTHORIZED]
        environ["bench.principal"] = found
        extra = [
            ("service-organization-id", found.organization_id),
            ("service-tenant-id", found.tenant_id),
        ]

        def start_with_headers(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], object]:
            return start_response(status, headers + extra, exc_info)

        return self.app(environ, start_with_headers)


class RefuseAllWSGI:
    """What any refusal costs at least: a fixed 401, nothing read, the app never called."""

    def __init__(self, app: WSGIApplication) -> None:
        self.app = app

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        start_response("401 Unauthorized", [("content-type", "application/json")])
        return [UNAUTHORIZED]


class SameWorkFloorWSGI:
    """The WSGI floor doing keyturn's warm-path work: lookup, the rule, two headers."""

    def __init__(self, app: WSGIApplication, *, keys: Mapping[bytes, Who], rule: Rule) -> None:
        self.app = app
        self.keys = keys
        self.rule = rule

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        header: str = environ.get("HTTP_AUTHORIZATION", "")
        found = organization = None
        if header[:7].lower() == "bearer ":
            found = self.keys.get(hashlib.sha256(header[7:].encode("latin-1")).digest())
        if found is not None:
            organization = self.rule.organization(found, environ.get("HTTP_X_ORGANIZATION_ID"))
        if found is None or organization is None:
            start_response("401 Unauthorized", [("content-type", "application/json")])
            return [UNAUTHORIZED]
        environ["bench.principal"] = (found, organization)
        extra = [
            ("service-organization-id", organization),
            ("service-tenant-id", found.tenant_id),
        ]

        def start_with_headers(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], object]:
            return start_response(status, headers + extra, exc_info)

        return self.app(environ, start_with_headers)


def wsgi_environ(headers: Mapping[str, str], path: str = MODELS) -> dict[str, Any]:
    builder = EnvironBuilder(
        path=path, base_url="http://127.0.0.1:8000", headers=list(headers.items())
    )
    try:
        return dict(builder.get_environ())
    finally:
        builder.close()


def _write(data: bytes) -> None:
    return None


def _start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
    return _write


def wsgi_batch(app: WSGIApplication, environ: Mapping[str, Any]) -> Batch:
    """Call *app* n times with a fresh copy of *environ*; consume and close each iterable."""

    def batch(n: int) -> int:
        start = time.perf_counter_ns()
        for _ in range(n):
            body = app(dict(environ), _start_response)
            for _chunk in body:
                pass
            close = getattr(body, "close", None)
            if close is not None:
                close()
        return time.perf_counter_ns() - start

    return batch


def wsgi_call(app: WSGIApplication, environ: Mapping[str, Any]) -> Reply:
    started: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started.append((status, headers))
        return _write

    body = app(dict(environ), start_response)
    try:
        data = b"".join(body)
    finally:
        close = getattr(body, "close", None)
        if close is not None:
            close()
    status, headers = started[-1]
    return Reply(int(status.split()[0]), [(k.lower(), v) for k, v in headers], data)
