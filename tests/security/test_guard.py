"""The walk-arounds found through real servers, replayed in process against both adapters."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import pytest
from flask import Flask
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from keyturn import AuthRequest, Principal, Reason
from keyturn.asgi import ApiKeyMiddleware as AsgiMiddleware
from keyturn.wsgi import ApiKeyMiddleware as WsgiMiddleware
from tests.web.web_support import ADMIN, MODELS, Client, WsgiClient
from tests.world import World

WALKS = {
    "no leading slash": "managed-agents/v1/models",
    "absolute form": "http://host/managed-agents/v1/models",
    "double-encoded slash": "/managed-agents%252Fv1/models",
}


@pytest.mark.parametrize("path", WALKS.values(), ids=WALKS.keys())
def test_walk_arounds_do_not_reach_the_app(
    client: Client, world: World, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Targets that a router may read as one under the prefix never reach the app keyless;
    each refusal is logged and audited with its reason.
    """
    caplog.set_level("INFO", logger="keyturn")
    reply = client.raw(path, [])

    assert reply.status in (400, 401)
    assert reply.json()["error"]["code"] in ("invalid_request", "unauthorized")
    assert world.calls == []
    (line,) = [r.getMessage() for r in caplog.records if r.name == "keyturn"]
    (event,) = world.audit
    assert event.principal is None and event.error is not None
    expected = Reason.UNREADABLE_TARGET if reply.status == 400 else Reason.MISSING
    assert (event.error.reason, event.method) == (expected, "GET")
    assert expected.value in line


def test_flask_view_behind_a_missing_slash_needs_a_key(world: World) -> None:
    """A real Flask view, which Werkzeug routes for ``managed-agents/v1/models``, is served
    only with a key.
    """
    app = Flask("models")

    @app.get("/managed-agents/v1/models")
    def models() -> Any:
        return {"items": ["private"]}

    client = WsgiClient(WsgiMiddleware(app.wsgi_app, authenticator=world.authenticator()))
    key = f"Bearer {world.keys['research']}".encode()

    refused = client.raw("managed-agents/v1/models", [])
    accepted = client.raw("managed-agents/v1/models", [(b"authorization", key)])

    assert (refused.status, b"private" in refused.body) == (401, False)
    assert (accepted.status, accepted.json()) == (200, {"items": ["private"]})


def run_asgi(app: Any, scope: dict[str, Any]) -> list[MutableMapping[str, Any]]:
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def http_scope(path: str, root_path: str = "", **extra: Any) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "GET",
        "path": path,
        "root_path": root_path,
        "query_string": b"",
        "headers": [],
        **extra,
    }


@pytest.mark.parametrize(
    ("root_path", "path"),
    [("/managed-agents", "/v1/models"), ("/managed-agents", "/managed-agents/v1/models")],
    ids=["daphne: path without root_path", "path repeats root_path"],
)
def test_client_set_root_path_does_not_switch_the_guard_off(
    world: World, root_path: str, path: str
) -> None:
    """A ``root_path`` taken from a request header (daphne's ``Daphne-Root-Path``) cannot
    move a request under the prefix out of the guard.
    """
    called: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        called.append(scope["path"])

    middleware = AsgiMiddleware(app, authenticator=world.authenticator())
    sent = run_asgi(middleware, http_scope(path, root_path))

    assert called == []
    assert sent[0]["status"] == 401


@pytest.mark.parametrize(
    ("script_name", "path_info"),
    [("/managed-agents", "/v1/models"), ("/managed-agents/v1", "/models")],
)
def test_client_set_script_name_does_not_switch_the_guard_off(
    world: World, script_name: str, path_info: str
) -> None:
    """A ``SCRIPT_NAME`` taken from a request header (gunicorn's ``SCRIPT_NAME``) cannot move
    a request under the prefix out of the guard.
    """
    called: list[str] = []

    def app(environ: Any, start_response: Any) -> list[bytes]:
        called.append(environ["PATH_INFO"])
        start_response("200 OK", [])
        return [b"private"]

    middleware = WsgiMiddleware(app, authenticator=world.authenticator())
    environ = {"REQUEST_METHOD": "GET", "SCRIPT_NAME": script_name, "PATH_INFO": path_info}
    statuses: list[str] = []
    body = b"".join(middleware(environ, lambda status, headers, exc=None: statuses.append(status)))

    assert (called, statuses, b"private" in body) == ([], ["401 Unauthorized"], False)


def test_middleware_mounted_at_the_prefix_protects(world: World) -> None:
    """``Mount("/managed-agents/v1", app=middleware)`` guards everything below the mount."""

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"items": ["private"]})

    inner = Starlette(routes=[Route("/models", models)])
    middleware = AsgiMiddleware(inner, authenticator=world.authenticator())
    app = Starlette(routes=[Mount("/managed-agents/v1", app=middleware)])
    key = {"authorization": f"Bearer {world.keys['research']}"}

    with TestClient(app) as client:
        refused = client.get(MODELS)
        accepted = client.get(MODELS, headers=key)

    assert (refused.status_code, "private" in refused.text) == (401, False)
    assert (accepted.status_code, accepted.json()) == (200, {"items": ["private"]})
    assert accepted.headers["service-organization-id"] == "org_research"


def test_unknown_scope_type_under_the_prefix_is_refused(world: World) -> None:
    """An ASGI scope of a type the middleware cannot authenticate never reaches the app
    under the prefix, and passes elsewhere.
    """
    called: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        called.append(scope["path"])

    middleware = AsgiMiddleware(app, authenticator=world.authenticator())
    run_asgi(middleware, {**http_scope(MODELS), "type": "webtransport"})
    run_asgi(middleware, {**http_scope("/elsewhere"), "type": "webtransport"})

    assert called == ["/elsewhere"]


def test_policy_sees_what_the_router_dispatches(serve: Any, world: World) -> None:
    """The role policy gets the canonical path and the upper-cased method: a member's key
    cannot reach the admin view as ``//managed-agents/v1/admin`` with ``delete``.
    """
    seen: list[tuple[str, str]] = []

    def policy(principal: Principal, request: AuthRequest) -> bool:
        seen.append((request.method, request.path))
        return request.path != ADMIN or principal.role == "admin"

    client = serve(authenticator=world.authenticator(policy=policy))
    member = [(b"authorization", f"Bearer {world.keys['research']}".encode())]

    reply = client.raw("//managed-agents/v1/./admin", member, method="delete")

    assert seen == [("DELETE", ADMIN)]
    assert reply.status == 403
    assert world.calls == []


@pytest.mark.parametrize("method", ["HEAD", "head"])
def test_refusal_to_head_has_headers_and_no_body(client: Client, method: str) -> None:
    """A refused HEAD gets the GET refusal's status and headers, and no body (D24)."""
    get = client.raw(MODELS, [])
    head = client.raw(MODELS, [], method=method)

    assert (head.status, head.body) == (401, b"")
    assert head.headers == get.headers
    assert int(head.values("content-length")[0]) == len(get.body) > 0
