"""Quart behind the ASGI middleware, under real servers (Hypercorn, uvicorn with h11).

Quart reads a request target as a URI: ``GET http:/managed-agents/v1/models`` reaches its
models view. The middleware must read it the same way, so that neither the key nor the role
policy is skipped. Requests are raw bytes over a socket, so nothing is normalised first.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import hypercorn.asyncio
import hypercorn.config
import pytest
import uvicorn
from quart import Quart

from keyturn import AuthRequest, Principal
from keyturn.asgi import ApiKeyMiddleware
from tests.world import World, make_world

READ_LIMIT = 1000  # recv calls per response, at most
START_POLLS = 500  # 10 ms apart: 5 seconds at most


def admins_only_for_admin(caller: Principal, request: AuthRequest) -> bool:
    """The role policy: ``.../admin`` needs the admin role."""
    return not request.path.endswith("/admin") or caller.role == "admin"


def quart_app(world: World) -> Any:
    app = Quart("agents")

    @app.get("/managed-agents/v1/models")
    async def models() -> dict[str, Any]:
        world.calls.append("models")
        return {"items": ["private"]}

    @app.get("/managed-agents/v1/admin")
    async def admin() -> dict[str, Any]:
        world.calls.append("admin")
        return {"admin": "private"}

    @app.get("/managed-agents/v1/<path:rest>")
    async def nested(rest: str) -> dict[str, Any]:
        world.calls.append(rest)
        return {"nested": rest}

    @app.get("/<path:rest>")
    async def anything(rest: str) -> dict[str, Any]:
        world.calls.append(rest)
        return {"elsewhere": rest}

    return ApiKeyMiddleware(app, authenticator=world.authenticator())


def serve_hypercorn(app: Any, sock: socket.socket) -> Iterator[None]:
    config = hypercorn.config.Config()
    config.bind = [f"fd://{os.dup(sock.fileno())}"]  # hypercorn closes the one it is given
    config.accesslog = config.errorlog = None
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def main() -> None:
        await hypercorn.asyncio.serve(app, config, shutdown_trigger=stop.wait)

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),))
    thread.start()
    try:
        yield
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        assert not thread.is_alive()
        loop.close()


def serve_uvicorn_h11(app: Any, sock: socket.socket) -> Iterator[None]:
    server = uvicorn.Server(uvicorn.Config(app, http="h11", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        for _ in range(START_POLLS):
            if server.started or not thread.is_alive():
                break
            time.sleep(0.01)
        assert server.started, "uvicorn did not start"
        yield
    finally:
        server.should_exit = True
        thread.join(10)
        assert not thread.is_alive()


SERVERS: dict[str, Callable[[Any, socket.socket], Iterator[None]]] = {
    "hypercorn": serve_hypercorn,
    "uvicorn-h11": serve_uvicorn_h11,
}


@pytest.fixture(params=sorted(SERVERS))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[int, World]]:
    world = make_world(keys=True, policy=admins_only_for_admin)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        for _ in SERVERS[request.param](quart_app(world), sock):
            port = sock.getsockname()[1]
            wait_for(port)
            world.calls.clear()
            yield port, world


def wait_for(port: int) -> None:
    """Until the server answers (the socket listens from the start: this waits for the app)."""
    for _ in range(START_POLLS):
        if send(port, "/healthz")[0] == 200:
            return
        time.sleep(0.01)
    raise AssertionError("the server never answered")


def send(port: int, target: str, key: str | None = None) -> tuple[int, bytes]:
    """One raw HTTP/1.1 request: the status and the body."""
    lines = [f"GET {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        data = b""
        for _ in range(READ_LIMIT):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


URI_TARGETS = {
    "scheme, absolute path": "http:/managed-agents/v1/models",
    "scheme, relative path": "http:managed-agents/v1/models",
    "scheme in mixed case": "hTtP:/managed-agents/v1/models",
    "absolute form in upper case": "HTTP://h/managed-agents/v1/models",
    "network-path reference": "//h/managed-agents/v1/models",
}


@pytest.mark.parametrize("target", URI_TARGETS.values(), ids=URI_TARGETS.keys())
def test_a_uri_target_reaches_no_view_without_a_key(served: tuple[int, World], target: str) -> None:
    """However the target spells the models path as a URI, it is refused without a key and
    no Quart view runs.
    """
    port, world = served

    status, body = send(port, target)

    assert status == 401
    assert b"private" not in body
    assert world.calls == []


def test_the_policy_reads_the_path_quart_routes(served: tuple[int, World]) -> None:
    """A member's key gets the models view under the URI spelling and is refused the admin
    view by the policy, as it is under the plain path.
    """
    port, world = served
    member = world.keys["research"]  # alice is a member of org_research, not an admin

    assert send(port, "http:/managed-agents/v1/models", member)[0] == 200
    assert send(port, "http:/managed-agents/v1/admin", member)[0] == 403
    assert send(port, "HTTP:managed-agents/v1/admin", member)[0] == 403
    assert send(port, "/managed-agents/v1/admin", member)[0] == 403
    assert world.calls == ["models"]


@pytest.mark.parametrize(
    "target",
    ["http:/managed-agents/v1/../admin", "http:/managed-agents/v1/%2E%2E/admin"],
    ids=["dot segments", "escaped dot segments"],
)
def test_dot_segments_after_a_scheme_are_refused_saying_why(
    served: tuple[int, World], target: str
) -> None:
    """Quart routes a URI's path as written, dot segments and all: a target whose path starts
    under the prefix and climbs out of it gets a 400 that says so, and reaches no view.
    """
    port, world = served

    status, body = send(port, target, world.keys["main"])

    assert status == 400
    assert b"'.' or '..' segments" in body
    assert world.calls == []
