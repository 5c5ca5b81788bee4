"""Odd spellings of a protected path: none of them reaches the API without a key.

Routers differ: Werkzeug (so Flask) drops leading slashes before matching, others collapse
runs of slashes or resolve dot segments. The middleware guards every path that one of them
may read as a path under the prefix.
"""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import pytest
from flask import Flask

from keyturn.asgi import ApiKeyMiddleware as AsgiMiddleware
from keyturn.wsgi import ApiKeyMiddleware
from tests.adversarial.support import Target, assert_refused, bearer
from tests.web.web_support import PUBLIC, WsgiClient
from tests.world import World

DISGUISED = {
    "leading double slash": "//managed-agents/v1/models",
    "leading triple slash": "///managed-agents/v1/models",
    "double slash inside": "/managed-agents//v1/models",
    "double slash at the end of the prefix": "/managed-agents/v1//models",
    "bare prefix after a double slash": "//managed-agents/v1",
    "dot segment": "/./managed-agents/v1/models",
    "dot segment inside": "/managed-agents/v1/./models",
    "climbing back in": "/elsewhere/../managed-agents/v1/models",
    "climbing out of a public path": PUBLIC + "/../models",
    "climbing above the root": "/../managed-agents/v1/models",
}


@pytest.mark.parametrize("path", DISGUISED.values(), ids=DISGUISED.keys())
def test_disguised_path_needs_a_key(target: Target, world: World, path: str) -> None:
    """A protected path spelled with extra slashes or dot segments is refused without a key."""
    assert_refused(target.send(path=path), 401, world)


@pytest.mark.parametrize("path", DISGUISED.values(), ids=DISGUISED.keys())
def test_disguised_path_works_with_a_key(target: Target, world: World, path: str) -> None:
    """The same spellings with a valid key are authenticated, not refused for their shape."""
    reply = target.send(bearer(world.keys["research"]), path=path)

    assert reply.values("service-organization-id") == ["org_research"]
    assert len(world.calls) == 1  # the app was called (it records the path as it reads it)


def test_public_path_with_a_leading_double_slash_stays_public(target: Target, world: World) -> None:
    """A public path keeps its exemption when a router would read it as that public path."""
    path = "/" + PUBLIC

    reply = target.send(path=path)

    assert reply.status != 401
    assert len(world.calls) == 1


def test_flask_route_behind_a_double_slash(world: World) -> None:
    """A real Flask app, which routes ``//managed-agents/v1/models`` to its models view,
    serves it only with a key.
    """
    app = Flask("models")

    @app.get("/managed-agents/v1/models")
    def models() -> Any:
        return {"items": ["private"]}

    client = WsgiClient(ApiKeyMiddleware(app.wsgi_app, authenticator=world.authenticator()))

    refused = client.raw("//managed-agents/v1/models", [])
    key = f"Bearer {world.keys['research']}".encode()
    accepted = client.raw("//managed-agents/v1/models", [(b"authorization", key)])

    assert refused.status == 401
    assert b"private" not in refused.body
    assert (accepted.status, accepted.json()) == (200, {"items": ["private"]})


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/managed-agents/v1/stream", [(b"authorization", b"Bearer junk")] * 2),
        ("//managed-agents/v1/stream", []),
    ],
    ids=["two Authorization headers", "leading double slash"],
)
@pytest.mark.parametrize("extension", [True, False], ids=["http response", "close"])
def test_hostile_websocket_handshake_is_refused_before_accept(
    world: World, path: str, headers: list[tuple[bytes, bytes]], extension: bool
) -> None:
    """A WebSocket handshake with a bad credential or a disguised path never reaches the
    app: it gets the 401 as an HTTP response where the server allows, else a close.
    """
    called: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        called.append(scope["path"])

    middleware = AsgiMiddleware(app, authenticator=world.authenticator())
    scope = {
        "type": "websocket",
        "path": path,
        "headers": headers,
        "extensions": {"websocket.http.response": {}} if extension else {},
    }
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))

    assert called == []
    if extension:
        assert [m["type"] for m in sent] == [
            "websocket.http.response.start",
            "websocket.http.response.body",
        ]
        assert sent[0]["status"] == 401
    else:
        assert sent == [{"type": "websocket.close", "code": 1008}]
