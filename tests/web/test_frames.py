"""No frame of keyturn on the stack while the app runs holds the key.

Error trackers capture the locals of every frame of a traceback (Sentry does by default,
and scrubs by variable name only): a key in a middleware frame would be sent away with the
app's first crash. The app here walks the live stack, as such a tracker would.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from keyturn.asgi import ApiKeyMiddleware as AsgiMiddleware
from keyturn.wsgi import ApiKeyMiddleware as WsgiMiddleware
from tests.web.web_support import MODELS
from tests.world import World


def holds(value: object, secret: str, depth: int = 4) -> bool:
    """Whether *value*, or a container within it, holds *secret* (text or bytes)."""
    if isinstance(value, str):
        return secret in value
    if isinstance(value, bytes | bytearray):
        return secret.encode("latin-1") in value
    if depth == 0:
        return False
    if isinstance(value, tuple | list | set | frozenset):
        return any(holds(item, secret, depth - 1) for item in value)
    if isinstance(value, dict):
        return any(
            holds(key, secret, depth - 1) or holds(item, secret, depth - 1)
            for key, item in value.items()
        )
    return False


def keyturn_frames_holding(secret: str) -> list[str]:
    """The ``function:variable`` of every keyturn frame on the stack whose local holds it."""
    found = []
    frame = sys._getframe(1)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith("keyturn"):
            for name, value in frame.f_locals.items():
                if holds(value, secret):
                    found.append(f"{frame.f_code.co_name}:{name}")
        frame = frame.f_back
    return found


def test_no_asgi_frame_holds_the_key_while_the_app_runs(world: World) -> None:
    """ASGI: the AuthRequest and the header lines are gone before the app is called."""
    secret = world.keys["main"]
    seen: list[list[str]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(keyturn_frames_holding(secret))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    middleware = AsgiMiddleware(app, authenticator=world.authenticator())
    scope = {
        "type": "http",
        "method": "GET",
        "path": MODELS,
        "root_path": "",
        "headers": [(b"authorization", f"Bearer {secret}".encode()), (b"host", b"x")],
    }
    sent: list[Any] = []

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    assert sent[0]["status"] == 200  # the app ran, as the key's owner
    assert seen == [[]]


def test_no_wsgi_frame_holds_the_key_while_the_app_runs(world: World) -> None:
    """WSGI: the AuthRequest is gone and HTTP_AUTHORIZATION removed before the app is called."""
    secret = world.keys["main"]
    seen: list[list[str]] = []

    def app(environ: Any, start_response: Any) -> list[bytes]:
        seen.append(keyturn_frames_holding(secret))
        start_response("200 OK", [])
        return [b"ok"]

    middleware = WsgiMiddleware(app, authenticator=world.authenticator())
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": MODELS,
        "SCRIPT_NAME": "",
        "HTTP_AUTHORIZATION": f"Bearer {secret}",
    }
    statuses: list[str] = []
    body = middleware(environ, lambda status, headers, exc_info=None: statuses.append(status))
    assert (statuses, list(body)) == (["200 OK"], [b"ok"])
    assert seen == [[]]
