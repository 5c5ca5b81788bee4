"""The apps under test, their competitors, and drivers that call them in process.

One list-models endpoint, written for Starlette, FastAPI and Flask, is the same in every
variant; only what authenticates in front of it changes:

- the *floor*: a hand-written minimal middleware (ASGI or WSGI) doing what any API-key
  check must do -- find the header, one sha256 of the token, one dict lookup -- and adding
  the two service headers to the response;
- the frameworks' own mechanisms (Starlette's ``AuthenticationMiddleware``, FastAPI's
  ``HTTPBearer``, Flask-HTTPAuth's ``HTTPTokenAuth``) with an equally trivial check;
- keyturn's middleware, with the real :class:`~keyturn.Authenticator`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from fastapi import Depends, FastAPI, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from flask import Flask
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

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = [
    "MODELS",
    "FloorASGI",
    "FloorWSGI",
    "Who",
    "asgi_batch",
    "asgi_call",
    "fastapi_app",
    "fastapi_bearer_app",
    "flask_app",
    "flask_httpauth_app",
    "http_scope",
    "sha256_keys",
    "starlette_app",
    "starlette_auth_backend",
    "wsgi_batch",
    "wsgi_call",
    "wsgi_environ",
]

MODELS: Final = "/managed-agents/v1/models"
ITEMS: Final = [{"id": "agent-small"}, {"id": "agent-large"}]
UNAUTHORIZED: Final = b'{"error":{"code":"unauthorized","message":"Unauthorized"}}'


class Who(NamedTuple):
    """What the trivial checks know about a key: enough for the service headers."""

    account_id: str
    organization_id: str
    tenant_id: str


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


def fastapi_app(*middleware: Middleware) -> FastAPI:
    app = FastAPI(middleware=list(middleware), openapi_url=None)

    @app.get(MODELS)
    async def models() -> JSONResponse:
        return JSONResponse({"items": ITEMS})

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

    @app.get(MODELS)
    async def models(who: Who = Depends(caller)) -> JSONResponse:  # noqa: B008
        return JSONResponse({"items": ITEMS})

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
