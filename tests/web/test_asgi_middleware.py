"""What only the ASGI middleware does: raw scopes, WebSockets, lifespan, crashes, the accessor."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.websockets import WebSocket

from keyturn import MissingPrincipal, Principal
from keyturn.asgi import ApiKeyMiddleware, principal
from keyturn.wsgi import ApiKeyMiddleware as WsgiMiddleware
from tests.web.web_support import MODELS
from tests.world import World

Message = dict[str, Any]


def call(app: Any, scope: dict[str, Any], incoming: list[Message] | None = None) -> list[Message]:
    """Run one ASGI call as a server would, and return every message the app sent."""
    sent: list[Message] = []
    pending = list(incoming or [])

    async def receive() -> Message:
        return pending.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def http_scope(path: str, headers: list[tuple[bytes, bytes]], **extra: Any) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        **extra,
    }


async def echo_app(scope: Any, receive: Any, send: Any) -> None:
    """A bare ASGI app that answers with the principal's organization and the header names."""
    who = principal(scope)
    names = b",".join(name for name, _ in scope["headers"])
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-names", names)]})
    await send({"type": "http.response.body", "body": who.organization_id.encode()})


def test_raw_header_names_in_any_case(world: World) -> None:
    """Upper-case raw header names from a server are read, and the app sees no Authorization."""
    app = ApiKeyMiddleware(echo_app, authenticator=world.authenticator())
    key = world.keys["tenant"].encode("latin-1")
    scope = http_scope(
        MODELS, [(b"Authorization", b"Bearer " + key), (b"X-Organization-Id", b"org_research")]
    )

    start, body = call(app, scope)

    assert start["status"] == 200
    assert dict(start["headers"])[b"x-names"] == b"X-Organization-Id"
    assert (b"service-organization-id", b"org_research") in start["headers"]
    assert body["body"] == b"org_research"


def test_latin1_header_values_are_refused(world: World) -> None:
    """Header bytes beyond ASCII decode as latin-1 and are refused, never crash."""
    app = ApiKeyMiddleware(echo_app, authenticator=world.authenticator())
    key = world.keys["tenant"].encode("latin-1")
    for headers, status in [
        ([(b"authorization", b"Bearer \xe9" + key[1:])], 401),
        ([(b"authorization", b"Bearer " + key), (b"x-organization-id", b"org_\xe9")], 400),
    ]:
        start, _ = call(app, http_scope(MODELS, headers))
        assert start["status"] == status


def test_refusal_never_reads_the_body(world: World) -> None:
    """A refused request is answered without a single receive() call."""
    app = ApiKeyMiddleware(echo_app, authenticator=world.authenticator())

    start, _ = call(app, http_scope(MODELS, []), incoming=[])  # receive() would fail

    assert start["status"] == 401


def test_root_path_is_not_a_way_around(world: World) -> None:
    """Behind a root_path the prefix is matched on the path the app routes on."""
    app = ApiKeyMiddleware(echo_app, authenticator=world.authenticator())
    scope = http_scope("/api" + MODELS, [], root_path="/api")

    start, _ = call(app, scope)

    assert start["status"] == 401


def test_app_headers_are_copied_not_mutated(world: World) -> None:
    """The app's own header list is left as it was, even when it reuses one list object."""
    shared = [(b"content-type", b"text/plain")]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": shared})
        await send({"type": "http.response.body", "body": b"ok"})

    middleware = ApiKeyMiddleware(app, authenticator=world.authenticator())
    key = world.keys["research"].encode()

    for _ in range(2):
        start, _ = call(middleware, http_scope(MODELS, [(b"authorization", b"Bearer " + key)]))
        assert len(start["headers"]) == 3
    assert shared == [(b"content-type", b"text/plain")]


# --- WebSocket ------------------------------------------------------------------------


async def ws_endpoint(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_json({"organization_id": principal(websocket).organization_id})
    await websocket.close()


def ws_app(world: World) -> Starlette:
    return Starlette(
        routes=[WebSocketRoute("/managed-agents/v1/stream", ws_endpoint)],
        middleware=[Middleware(ApiKeyMiddleware, authenticator=world.authenticator())],
    )


def test_websocket_accepted(world: World) -> None:
    """An authenticated handshake is accepted with the service headers and the principal."""
    headers = {"authorization": f"Bearer {world.keys['research']}"}
    with (
        TestClient(ws_app(world)) as client,
        client.websocket_connect("/managed-agents/v1/stream", headers=headers) as ws,
    ):
        assert ws.receive_json() == {"organization_id": "org_research"}
        assert (b"service-organization-id", b"org_research") in (ws.extra_headers or [])


def test_websocket_refused_with_http_response(world: World) -> None:
    """With websocket.http.response the refusal is the same JSON error as over HTTP."""
    client = TestClient(ws_app(world))
    with (
        client,
        pytest.raises(WebSocketDenialResponse) as refused,
        client.websocket_connect("/managed-agents/v1/stream"),
    ):
        pass  # the handshake itself is refused
    assert refused.value.status_code == 401
    assert refused.value.json()["error"]["code"] == "unauthorized"
    assert refused.value.headers["www-authenticate"] == 'Bearer realm="agents-api"'


def test_websocket_refused_by_the_policy_names_the_organization(world: World) -> None:
    """A policy's 403 to a handshake carries the service headers, as it does over HTTP."""
    app = Starlette(
        routes=[WebSocketRoute("/managed-agents/v1/stream", ws_endpoint)],
        middleware=[
            Middleware(
                ApiKeyMiddleware,
                authenticator=world.authenticator(policy=lambda principal, request: False),
            )
        ],
    )
    headers = {"authorization": f"Bearer {world.keys['research']}"}
    with (
        TestClient(app) as client,
        pytest.raises(WebSocketDenialResponse) as refused,
        client.websocket_connect("/managed-agents/v1/stream", headers=headers),
    ):
        pass  # the handshake itself is refused
    assert refused.value.status_code == 403
    assert refused.value.json()["error"]["code"] == "permission_denied"
    assert refused.value.headers["service-organization-id"] == "org_research"
    assert refused.value.headers["service-tenant-id"] == "acme"


def test_websocket_refused_with_close(world: World) -> None:
    """Without the extension the handshake is closed with 1008 before accept."""
    app = ApiKeyMiddleware(echo_app, authenticator=world.authenticator())
    scope = http_scope("/managed-agents/v1/stream", [], type="websocket", extensions={})

    sent = call(app, scope, incoming=[{"type": "websocket.connect"}])

    assert sent == [{"type": "websocket.close", "code": 1008}]


# --- lifespan and crashes -------------------------------------------------------------


def test_lifespan_passes_through(world: World) -> None:
    """Lifespan events reach the app, and its state reaches requests beside the principal."""
    events = []

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, str]]:
        events.append("startup")
        yield {"greeting": "hello"}
        events.append("shutdown")

    async def endpoint(request: Request) -> Response:
        return JSONResponse([request.state.greeting, principal(request).organization_id])

    app = Starlette(
        routes=[Route(MODELS, endpoint)],
        middleware=[Middleware(ApiKeyMiddleware, authenticator=world.authenticator())],
        lifespan=lifespan,
    )
    with TestClient(app) as client:
        headers = {"authorization": f"Bearer {world.keys['research']}"}
        assert client.get(MODELS, headers=headers).json() == ["hello", "org_research"]
    assert events == ["startup", "shutdown"]


def crashing_app(world: World) -> Starlette:
    async def endpoint(request: Request) -> Response:
        raise RuntimeError("the app broke")

    return Starlette(
        routes=[Route(MODELS, endpoint)],
        middleware=[Middleware(ApiKeyMiddleware, authenticator=world.authenticator())],
    )


def test_crash_gets_500_with_service_headers(world: World) -> None:
    """If the app crashes before responding, the 500 still names the organization."""
    headers = {"authorization": f"Bearer {world.keys['research']}"}
    with TestClient(crashing_app(world), raise_server_exceptions=False) as client:
        reply = client.get(MODELS, headers=headers)

    assert reply.status_code == 500
    assert reply.headers.get_list("service-organization-id") == ["org_research"]
    assert reply.headers["service-tenant-id"] == "acme"


def test_crash_is_reraised(world: World) -> None:
    """The middleware re-raises the app's exception, so the server still logs it."""
    headers = {"authorization": f"Bearer {world.keys['research']}"}
    with TestClient(crashing_app(world)) as client, pytest.raises(RuntimeError, match="broke"):
        client.get(MODELS, headers=headers)


def test_crash_after_the_response_started(world: World) -> None:
    """A crash mid-response is re-raised as it is, with no second response start."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("the app broke mid-stream")

    middleware = ApiKeyMiddleware(app, authenticator=world.authenticator())
    key = world.keys["research"].encode()
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        raise AssertionError("the body is not read")

    scope = http_scope(MODELS, [(b"authorization", b"Bearer " + key)])
    with pytest.raises(RuntimeError, match="mid-stream"):
        asyncio.run(middleware(scope, receive, send))
    assert [message["type"] for message in sent] == ["http.response.start"]


# --- the accessor and options ---------------------------------------------------------


def test_principal_without_middleware() -> None:
    """Asking for the principal of a request the middleware did not see is a clear error."""
    with pytest.raises(MissingPrincipal, match="outside the middleware's prefix"):
        principal({"type": "http", "state": {}})
    with pytest.raises(LookupError):
        principal({"type": "http"})


def test_principal_outside_the_prefix(world: World) -> None:
    """A route outside the prefix that asks for the principal fails loudly, not silently."""

    async def endpoint(request: Request) -> Response:
        return JSONResponse(str(principal(request)))

    app = Starlette(
        routes=[Route("/elsewhere", endpoint)],
        middleware=[Middleware(ApiKeyMiddleware, authenticator=world.authenticator())],
    )
    with TestClient(app) as client, pytest.raises(MissingPrincipal):
        client.get("/elsewhere")


def test_principal_from_scope_and_request(world: World) -> None:
    """The accessor takes a Starlette request or the scope itself, and returns a Principal."""
    seen: list[Principal] = []

    async def endpoint(request: Request) -> Response:
        seen.extend([principal(request), principal(request.scope)])
        return Response()

    starlette = Starlette(routes=[Route(MODELS, endpoint)])
    app = ApiKeyMiddleware(starlette, authenticator=world.authenticator())  # around it all
    with TestClient(app) as client:
        client.get(MODELS, headers={"authorization": f"Bearer {world.keys['main']}"})

    assert seen[0] is seen[1]
    assert seen[0].organization_id == "org_main"


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"prefix": "managed-agents/v1/"}, ValueError),
        ({"realm": 'a"b'}, ValueError),
        ({"realm": ""}, ValueError),
        ({"public_paths": "/healthz"}, TypeError),
    ],
)
def test_bad_options(world: World, options: dict[str, Any], error: type[Exception]) -> None:
    """Options that would misbehave at request time are refused at construction."""
    with pytest.raises(error):
        ApiKeyMiddleware(echo_app, authenticator=world.authenticator(), **options)


@pytest.mark.parametrize("middleware", [ApiKeyMiddleware, WsgiMiddleware], ids=["asgi", "wsgi"])
def test_an_authenticator_of_the_wrong_kind_is_refused_at_startup(middleware: Any) -> None:
    """Anything but an Authenticator fails when the middleware is built, not on a request."""
    with pytest.raises(TypeError, match=r"must be a keyturn\.Authenticator"):
        middleware(lambda *args: None, authenticator=object())
