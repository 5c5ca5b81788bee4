"""No frame of keyturn on the stack while the app runs holds the key, nor any frame of a
traceback keyturn logs or raises when something around the decision fails.

Error trackers capture the locals of every frame of a traceback (Sentry does by default,
and scrubs by variable name only): a key in a middleware frame would be sent away with the
app's first crash. The app here walks the live stack, as such a tracker would.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any

import pytest

from keyturn._core.token import split
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


# --- failure paths: the tracebacks an error tracker would send ---------------------------


def _shown(value: object) -> str:
    try:
        return repr(value)
    except Exception:  # a half-built object: nothing shown
        return ""


def traceback_frames_holding(error: BaseException, secret: str) -> list[str]:
    """The ``function:variable`` of every keyturn frame of *error*'s traceback whose local,
    or that local's repr, holds *secret*.
    """
    found = []
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if str(frame.f_globals.get("__name__", "")).startswith("keyturn"):
            for name, value in frame.f_locals.items():
                if holds(value, secret) or secret in _shown(value):
                    found.append(f"{frame.f_code.co_name}:{name}")
        tb = tb.tb_next
    return found


class Failing(logging.Handler):
    """Keeps the exception of every ``keyturn`` log record that carries one."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.errors: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.errors.append(record.exc_info[1])


class Boom(RuntimeError):
    pass


def _raise(*args: object) -> bool:
    raise Boom("a bug in the host's code")


def _not_a_bool(*args: object) -> bool:
    return "yes"  # type: ignore[return-value]


def _break_store(world: World) -> dict[str, Any]:
    world.store.broken = True
    return {}


def _break_membership(world: World) -> dict[str, Any]:
    world.membership.broken = True
    return {}


FAILURES: dict[str, Callable[[World], dict[str, Any]]] = {
    "key store down": _break_store,
    "membership provider down": _break_membership,
    "audit hook raises": lambda world: {"audit": _raise},
    "policy raises": lambda world: {"policy": _raise},
    "policy answers a non-bool": lambda world: {"policy": _not_a_bool},
}


def _asgi_request(world: World, options: dict[str, Any], secret: str) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    middleware = AsgiMiddleware(app, authenticator=world.authenticator(**options))
    scope = {
        "type": "http",
        "method": "GET",
        "path": MODELS,
        "root_path": "",
        "headers": [(b"authorization", f"Bearer {secret}".encode()), (b"host", b"x")],
    }

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        pass

    asyncio.run(middleware(scope, receive, send))


def _wsgi_request(world: World, options: dict[str, Any], secret: str) -> None:
    def app(environ: Any, start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"ok"]

    middleware = WsgiMiddleware(app, authenticator=world.authenticator(**options))
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": MODELS,
        "SCRIPT_NAME": "",
        "HTTP_AUTHORIZATION": f"Bearer {secret}",
    }
    list(middleware(environ, lambda status, headers, exc_info=None: None))


@pytest.mark.parametrize("failure", FAILURES.values(), ids=FAILURES.keys())
@pytest.mark.parametrize("adapter", [_asgi_request, _wsgi_request], ids=["asgi", "wsgi"])
def test_no_keyturn_frame_of_a_failure_holds_the_key(
    world: World,
    adapter: Callable[[World, dict[str, Any], str], None],
    failure: Callable[[World], dict[str, Any]],
) -> None:
    """Whatever fails around the decision (the store, the provider, the audit hook, the
    policy), no keyturn frame of the traceback that is logged or raised holds the key's
    secret in a local or in a local's repr.
    """
    key = world.keys["main"]
    _, secret = split(key)
    options = failure(world)
    handler = Failing()
    logger = logging.getLogger("keyturn")
    logger.addHandler(handler)
    try:
        adapter(world, options, key)
    except (Boom, TypeError) as raised:  # the policy's bugs propagate, as a 500
        handler.errors.append(raised)
    finally:
        logger.removeHandler(handler)

    assert handler.errors  # a traceback was logged or raised: there is something to check
    for error in handler.errors:
        assert traceback_frames_holding(error, secret) == []
