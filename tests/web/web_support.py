"""Shared by the web tests: a small world of keys and organizations, and one test app
written twice (Starlette and Werkzeug) so that both adapters face the same routes.

The test apps record each call, so a test can tell that a refused request never reached
the app.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import attrs
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient
from werkzeug.test import Client as WerkzeugClient
from werkzeug.wrappers import Request as WerkzeugRequest
from werkzeug.wrappers import Response as WerkzeugResponse

from keyturn import AuthRequest, Principal
from keyturn import asgi as keyturn_asgi
from keyturn import wsgi as keyturn_wsgi
from tests.world import World, make_world

MODELS = "/managed-agents/v1/models"
WHOAMI = "/managed-agents/v1/whoami"
ADMIN = "/managed-agents/v1/admin"  # the role policy wants an admin here
BOOM = "/managed-agents/v1/boom"  # the app answers 500 itself
SPOOF = "/managed-agents/v1/spoof"  # the app sets the service headers itself
PUBLIC = "/managed-agents/v1/public"  # a public path under the prefix
HEALTHZ = "/healthz"  # outside the prefix
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def admins_only_on_admin(principal: Principal, request: AuthRequest) -> bool:
    """The test apps' role policy: only admins may call the admin route."""
    return request.path != ADMIN or principal.role == "admin"


def make_web_world() -> World:
    """The test world with alice's keys, under the test apps' role policy."""
    return make_world(keys=True, policy=admins_only_on_admin)


# --- one app, two protocols -------------------------------------------------------------


def whoami_body(principal: Principal, authorization: str | None) -> dict[str, Any]:
    return {
        "account_id": principal.account_id,
        "organization_id": principal.organization_id,
        "tenant_id": principal.tenant_id,
        "role": principal.role,
        "authorization": authorization,
    }


def asgi_app(world: World) -> Starlette:
    async def whoami(request: StarletteRequest) -> Response:
        who = keyturn_asgi.principal(request)
        return JSONResponse(whoami_body(who, request.headers.get("authorization")))

    async def items(request: StarletteRequest) -> Response:
        return JSONResponse({"items": []})

    async def boom(request: StarletteRequest) -> Response:
        return JSONResponse({"detail": "boom"}, status_code=500)

    async def spoof(request: StarletteRequest) -> Response:
        return JSONResponse({"items": []}, headers={"Service-Organization-Id": "spoofed"})

    async def not_found(request: StarletteRequest, exc: Exception) -> Response:
        return JSONResponse({"detail": "not found"}, status_code=404)

    routes = [
        Route(path, endpoint)
        for path, endpoint in [
            (MODELS, items),
            (WHOAMI, whoami),
            (ADMIN, items),
            (BOOM, boom),
            (SPOOF, spoof),
            (PUBLIC, items),
            (HEALTHZ, items),
            ("/managed-agents/v1", items),
        ]
    ]

    app = Starlette(routes=routes, exception_handlers={404: not_found})

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            world.calls.append(scope["path"])
        await app(scope, receive, send)

    return recording  # type: ignore[return-value]


def wsgi_app(world: World) -> Any:
    def json_response(
        data: Any, status: int = 200, headers: dict[str, str] | None = None
    ) -> WerkzeugResponse:
        return WerkzeugResponse(
            json.dumps(data), status=status, mimetype="application/json", headers=headers
        )

    @WerkzeugRequest.application
    def app(request: WerkzeugRequest) -> WerkzeugResponse:
        world.calls.append(request.path)
        if request.path == WHOAMI:
            who = keyturn_wsgi.principal(request)
            return json_response(whoami_body(who, request.headers.get("authorization")))
        if request.path == BOOM:
            return json_response({"detail": "boom"}, 500)
        if request.path == SPOOF:
            return json_response({"items": []}, headers={"Service-Organization-Id": "spoofed"})
        if request.path in (MODELS, ADMIN, PUBLIC, HEALTHZ, "/managed-agents/v1"):
            return json_response({"items": []})
        return json_response({"detail": "not found"}, 404)

    return app


@attrs.frozen
class Reply:
    status: int
    headers: list[tuple[str, str]]  # names in lower case, in order, repeats kept
    body: bytes
    reads: int = 0  # how often the request body was read (raw requests only)

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key == name]

    def json(self) -> Any:
        return json.loads(self.body)


Headers = Sequence[tuple[str, str]]
RawHeaders = Sequence[tuple[bytes, bytes]]
CHUNK = 64 * 1024


class Client(Protocol):
    adapter: str
    app: Any  # the middleware

    def get(self, path: str, headers: Headers = ()) -> Reply: ...

    def raw(
        self, path: str, headers: RawHeaders, *, method: str = "GET", body_size: int = 0
    ) -> Reply: ...


class AsgiClient:
    """Requests through Starlette's TestClient, or raw: a scope built as a server would."""

    adapter = "asgi"

    def __init__(self, app: Any) -> None:
        self.app = app
        self.client = TestClient(app)

    def get(self, path: str, headers: Headers = ()) -> Reply:
        response = self.client.get(path, headers=list(headers))
        pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw]
        return Reply(response.status_code, pairs, response.content)

    async def exchange(
        self, path: str, headers: RawHeaders, *, method: str = "GET", body_size: int = 0
    ) -> Reply:
        """One request with the header bytes as given; the body is *body_size* zero bytes."""
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode("utf-8"),
            "root_path": "",
            "query_string": b"",
            "headers": list(headers),
            "server": ("127.0.0.1", 80),
            "client": ("127.0.0.1", 50000),
        }
        reads = 0
        left = body_size
        status, pairs, body = 0, [], b""

        async def receive() -> dict[str, Any]:
            nonlocal reads, left
            reads += 1
            size = min(left, CHUNK)
            left -= size
            return {"type": "http.request", "body": bytes(size), "more_body": left > 0}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status, pairs, body
            if message["type"] == "http.response.start":
                assert status == 0, "a second http.response.start"
                status = message["status"]
                pairs = [
                    (k.decode("latin-1").lower(), v.decode("latin-1"))
                    for k, v in message.get("headers", [])
                ]
            elif message["type"] == "http.response.body":
                body += message.get("body", b"")

        await self.app(scope, receive, send)
        return Reply(status, pairs, body, reads)

    def raw(
        self, path: str, headers: RawHeaders, *, method: str = "GET", body_size: int = 0
    ) -> Reply:
        return asyncio.run(self.exchange(path, headers, method=method, body_size=body_size))

    def close(self) -> None:
        self.client.close()


class ZeroBody:
    """A ``wsgi.input`` of *size* zero bytes that counts how often it is read."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.reads = 0

    def read(self, size: int = -1) -> bytes:
        self.reads += 1
        size = self.left if size < 0 else min(size, self.left)
        self.left -= size
        return bytes(size)

    def readline(self, size: int = -1) -> bytes:
        return self.read(size)


class WsgiClient:
    """Requests through Werkzeug's test Client, or raw: an environ built as a server would."""

    adapter = "wsgi"

    def __init__(self, app: Any) -> None:
        self.app = app
        self.client = WerkzeugClient(app)

    def get(self, path: str, headers: Headers = ()) -> Reply:
        response = self.client.get(path, headers=list(headers))
        try:
            pairs = [(k.lower(), v) for k, v in response.headers.to_wsgi_list()]
            return Reply(response.status_code, pairs, response.get_data())
        finally:
            response.close()

    def raw(
        self, path: str, headers: RawHeaders, *, method: str = "GET", body_size: int = 0
    ) -> Reply:
        """One request with the header bytes as a server hands them over: latin-1 text in
        the environ, repeated headers joined with ", " (Werkzeug's and most servers' way).
        """
        body = ZeroBody(body_size)
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method,
            "SCRIPT_NAME": "",
            "PATH_INFO": path.encode("utf-8").decode("latin-1"),
            "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "80",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "CONTENT_LENGTH": str(body_size),
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": body,
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        for name, value in headers:
            key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
            text = value.decode("latin-1")
            environ[key] = f"{environ[key]}, {text}" if key in environ else text
        started: list[Any] = []

        def start_response(status: str, pairs: Any, exc_info: Any = None) -> Any:
            started[:] = [int(status.split()[0]), [(k.lower(), v) for k, v in pairs]]
            return lambda data: None

        chunks = self.app(environ, start_response)
        try:
            data = b"".join(chunks)
        finally:
            if hasattr(chunks, "close"):
                chunks.close()
        return Reply(started[0], started[1], data, body.reads)

    def close(self) -> None:
        pass


Serve = Callable[..., Client]


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` (the examples are files to copy, not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
