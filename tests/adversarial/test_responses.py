"""Around the app: its crashes stay crashes, its streams stay streams, and a refused request's
body is never read -- not even a 100 MB upload over a real socket.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
import sys
import wsgiref.handlers
import wsgiref.util
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import pytest

from keyturn.asgi import ApiKeyMiddleware as AsgiMiddleware
from keyturn.wsgi import ApiKeyMiddleware as WsgiMiddleware
from tests.adversarial.support import SpyStore, Target, assert_refused, bearer
from tests.servers.loopback import serve_uvicorn
from tests.web.web_support import MODELS, asgi_app
from tests.world import World

Message = MutableMapping[str, Any]
SERVICE = [(b"service-organization-id", b"org_research"), (b"service-tenant-id", b"acme")]
HUNDRED_MB = 100 * 1024 * 1024


def asgi_call(app: Any, headers: list[tuple[bytes, bytes]]) -> tuple[list[Message], Any]:
    """Run one HTTP request into *app*; return the messages it sent and what it raised."""
    sent: list[Message] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": MODELS,
        "raw_path": MODELS.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
    }

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    try:
        asyncio.run(app(scope, receive, send))
    except Exception as exc:
        return sent, exc
    return sent, None


def key_header(world: World) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {world.keys['research']}".encode())]


# --- the app crashes ----------------------------------------------------------------------

CRASH_POINTS = ["before the response", "after the start", "after the first chunk"]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_asgi_app_crash_propagates_with_one_response_start(world: World, point: str) -> None:
    """An app crashing after authentication re-raises to the server; the client sees one
    response start (the app's, or the middleware's 500 with the service headers), never a 401.
    """

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if point != "before the response":
            await send({"type": "http.response.start", "status": 200, "headers": []})
        if point == "after the first chunk":
            await send({"type": "http.response.body", "body": b"a", "more_body": True})
        raise RuntimeError("the app broke")

    middleware = AsgiMiddleware(app, authenticator=world.authenticator())

    sent, raised = asgi_call(middleware, key_header(world))

    assert isinstance(raised, RuntimeError)
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert len(starts) == 1
    assert starts[0]["status"] == (500 if point == "before the response" else 200)
    assert starts[0]["headers"][-2:] == SERVICE


class PepServer:
    """The server side of one WSGI call as PEP 3333 has it: start_response may be called
    again with exc_info only until the headers went out; afterwards it re-raises.
    """

    def __init__(self) -> None:
        self.starts: list[tuple[str, list[tuple[str, str]]]] = []
        self.events: list[str] = []  # what the app made and the server delivered, in order
        self.headers_sent = False

    def start_response(self, status: str, headers: list[Any], exc_info: Any = None) -> Any:
        if exc_info is not None and self.headers_sent:
            raise exc_info[1].with_traceback(exc_info[2])
        self.starts.append((status, list(headers)))
        return self.deliver

    def deliver(self, chunk: bytes) -> None:
        self.headers_sent = True
        self.events.append(f"delivered {chunk.decode()}")

    def call(self, app: Any, world: World) -> None:
        environ = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": MODELS,
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "80",
            "wsgi.input": None,
            "HTTP_AUTHORIZATION": f"Bearer {world.keys['research']}",
        }
        body = app(environ, self.start_response)
        try:
            for chunk in body:
                self.deliver(chunk)
        finally:
            if hasattr(body, "close"):
                body.close()


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_wsgi_app_crash_propagates(world: World, point: str) -> None:
    """A WSGI app crashing after authentication is never a 401: before it responds the
    middleware answers 500 itself (with the service headers); after, the error propagates.
    """

    def body(start_response: Any) -> Iterator[bytes]:
        if point == "after the first chunk":
            yield b"a"
        raise RuntimeError("the app broke")

    def app(environ: Any, start_response: Any) -> Iterator[bytes]:
        if point == "before the response":
            raise RuntimeError("the app broke")
        start_response("200 OK", [("content-type", "text/plain")])
        return body(start_response)

    server = PepServer()
    middleware = WsgiMiddleware(app, authenticator=world.authenticator())

    if point == "before the response":
        server.call(middleware, world)
        assert [status for status, _ in server.starts] == ["500 Internal Server Error"]
        return
    with pytest.raises(RuntimeError, match="the app broke"):
        server.call(middleware, world)
    assert [status for status, _ in server.starts] == ["200 OK"]


def test_wsgi_server_500_for_a_crash_names_the_organization(world: World) -> None:
    """Spec 5.4: the 500 a WSGI server sends for a crash after authentication has the headers."""

    def app(environ: Any, start_response: Any) -> Iterator[bytes]:
        raise RuntimeError("the app broke")

    environ = {"PATH_INFO": MODELS, "HTTP_AUTHORIZATION": f"Bearer {world.keys['research']}"}
    wsgiref.util.setup_testing_defaults(environ)
    output = io.BytesIO()
    server = wsgiref.handlers.SimpleHandler(io.BytesIO(), output, io.StringIO(), environ)
    server.run(WsgiMiddleware(app, authenticator=world.authenticator()))

    head = output.getvalue().partition(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.0 500 ")
    assert b"\r\nservice-organization-id: org_research" in head
    assert b"\r\nservice-tenant-id: acme" in head


@pytest.mark.parametrize("sent", [False, True], ids=["headers not sent", "headers sent"])
def test_wsgi_exc_info_keeps_the_service_headers(world: World, sent: bool) -> None:
    """An app that restarts its response with exc_info keeps the service headers, once; once
    the headers went out, the server re-raises the app's error through the middleware.
    """

    def app(environ: Any, start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("content-type", "text/plain")])
        if sent:
            yield b"partial"
        try:
            raise ValueError("rendering failed")
        except ValueError:
            start_response("500 Internal Server Error", [], sys.exc_info())
        yield b"failed"

    server = PepServer()
    middleware = WsgiMiddleware(app, authenticator=world.authenticator())

    if sent:
        with pytest.raises(ValueError, match="rendering failed"):
            server.call(middleware, world)
        assert len(server.starts) == 1
    else:
        server.call(middleware, world)
        assert [status for status, _ in server.starts] == ["200 OK", "500 Internal Server Error"]
    for _, headers in server.starts:
        assert [h for h in headers if h[0].startswith("service-")] == [
            ("service-organization-id", "org_research"),
            ("service-tenant-id", "acme"),
        ]


# --- streams ------------------------------------------------------------------------------


def test_asgi_stream_is_unbuffered_with_headers_once(world: World) -> None:
    """Each more_body chunk reaches the server before the app makes the next, and the
    service headers come once, on the one response start.
    """
    sent: list[Message] = []
    seen_by_server_before_second: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SERVICE[:1]})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        seen_by_server_before_second.append(any(m.get("body") == b"first" for m in sent))
        await send({"type": "http.response.body", "body": b"second", "more_body": False})

    middleware = AsgiMiddleware(app, authenticator=world.authenticator())

    async def run() -> None:
        scope = {"type": "http", "method": "GET", "path": MODELS, "headers": key_header(world)}

        async def receive() -> Message:
            raise AssertionError("the body is not read")

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        await middleware(scope, receive, send)

    asyncio.run(run())

    assert seen_by_server_before_second == [True]
    assert [m["type"] for m in sent] == [
        "http.response.start",
        "http.response.body",
        "http.response.body",
    ]
    assert sent[0]["headers"] == SERVICE  # the app's own copy replaced, not doubled


def test_wsgi_generator_is_unbuffered_with_headers_once(world: World) -> None:
    """The app's generator is handed to the server as it is: the first chunk is out before
    the app makes the second, and the service headers are on the one start.
    """
    server = PepServer()

    def app(environ: Any, start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("service-tenant-id", "spoofed")])
        server.events.append("made first")
        yield b"first"
        server.events.append("made second")
        yield b"second"

    server.call(WsgiMiddleware(app, authenticator=world.authenticator()), world)

    assert server.events == ["made first", "delivered first", "made second", "delivered second"]
    assert server.starts == [
        (
            "200 OK",
            [("service-organization-id", "org_research"), ("service-tenant-id", "acme")],
        )
    ]


# --- bodies of refused requests -----------------------------------------------------------

REFUSALS = {
    "no key": ([], 401),
    "junk key": ([("authorization", "Bearer junk")], 401),
    "mistyped key": ([("authorization", "Bearer {tenant_typo}")], 401),
    "missing organization": ([("authorization", "Bearer {tenant}")], 400),
    "organization out of reach": (
        [("authorization", "Bearer {tenant}"), ("x-organization-id", "org_secret")],
        404,
    ),
}


@pytest.mark.parametrize(("pairs", "status"), REFUSALS.values(), ids=REFUSALS.keys())
def test_refused_upload_is_never_read(
    target: Target, world: World, pairs: list[tuple[str, str]], status: int
) -> None:
    """A refused 100 MB upload is answered without one read of its body."""
    lines = [(name, value.format(**world.keys)) for name, value in pairs]

    reply = target.send(lines, method="POST", body_size=HUNDRED_MB)

    assert_refused(reply, status, world)
    assert reply.reads == 0


def test_upload_while_the_store_is_down_is_never_read(
    attack: Callable[..., Target], world: World
) -> None:
    """A 503 does not read the upload either."""
    store = SpyStore(world.store)
    store.failing = True
    target = attack(authenticator=world.authenticator(store=store))

    reply = target.send(bearer(world.keys["research"]), method="POST", body_size=HUNDRED_MB)

    assert_refused(reply, 503, world)
    assert reply.reads == 0


def test_refused_upload_over_a_real_socket(world: World) -> None:
    """Under uvicorn, a bad key announcing a 100 MB body gets its 401 after the headers and
    a small part of the body: the client never has to send the rest.
    """
    app = AsgiMiddleware(asgi_app(world), authenticator=world.authenticator())
    head = (
        f"POST {MODELS} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer junk\r\n"
        f"content-type: application/octet-stream\r\ncontent-length: {HUNDRED_MB}\r\n\r\n"
    ).encode()
    for port in serve_uvicorn(app):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            client.sendall(head + bytes(16 * 1024))
            response = read_response(client)  # arrives though 99.98% of the body is unsent

    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401 Unauthorized\r\n")
    assert json.loads(body)["error"]["code"] == "unauthorized"
    assert world.calls == []


def read_response(sock: socket.socket) -> bytes:
    """Read one HTTP response with a content-length, bounded by the socket's timeout."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed before answering"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed mid-response"
        body += chunk
    return head + b"\r\n\r\n" + body
