"""The opt-in ``service-key-expires-at`` header, through both adapters and their frameworks.

Off by default; with ``expiry_header=True`` on every response to an accepted request (HEAD
and the app's own errors too), exactly once, and on no refusal: not the 400/401/403/404/503
of the decision, nor the middleware's own 500 for an app that crashed before responding.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import attrs
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket
from werkzeug.test import Client as WerkzeugClient

from keyturn import asgi as keyturn_asgi
from keyturn import wsgi as keyturn_wsgi
from keyturn._web import expiry_headers
from tests.servers.loopback import serve_uvicorn, serve_waitress
from tests.web.test_web_table import ACCEPTED, REFUSED, Case, send
from tests.web.web_support import MODELS, Client, Serve
from tests.world import START, World

HEADER = "service-key-expires-at"
# The world's keys are created at START with the default lifetime of 30 days.
EXPIRES = "2026-12-21T12:00:00Z"
assert datetime.fromisoformat(EXPIRES) == START + timedelta(days=30)


@pytest.mark.parametrize("case", ACCEPTED)
def test_every_accepted_response_carries_it_once(serve: Serve, world: World, case: Case) -> None:
    """Every accepted row of the web table (the app's own 404 and 500 too) carries it once."""
    reply = send(serve(expiry_header=True), world, case)

    assert reply.status == case.status
    assert reply.values(HEADER) == [EXPIRES]
    assert reply.values("service-organization-id") == [case.organization]


@pytest.mark.parametrize("case", ACCEPTED)
def test_absent_by_default(client: Client, world: World, case: Case) -> None:
    """Without the option, no accepted response carries it."""
    reply = send(client, world, case)

    assert reply.status == case.status
    assert reply.values(HEADER) == []


@pytest.mark.parametrize("case", REFUSED)
def test_never_on_a_refusal(serve: Serve, world: World, case: Case) -> None:
    """No refusal carries it, the 403 that names the organization included."""
    reply = send(serve(expiry_header=True), world, case)

    assert reply.status == case.status
    assert reply.values(HEADER) == []


def test_head_carries_it_and_a_refused_head_does_not(serve: Serve, world: World) -> None:
    """HEAD is a request like any other: accepted, it carries the header; refused, not."""
    client = serve(expiry_header=True)
    key = world.keys["research"].encode("ascii")

    accepted = client.raw(MODELS, [(b"authorization", b"Bearer " + key)], method="HEAD")
    refused = client.raw(MODELS, [], method="HEAD")

    assert (accepted.status, accepted.values(HEADER)) == (200, [EXPIRES])
    assert (refused.status, refused.values(HEADER)) == (401, [])


def test_a_changed_expiry_is_sent_at_once(serve: Serve, world: World) -> None:
    """The header follows the stored record: a key whose expiry changes (a store of one's own
    may extend it) gets the new instant on its next request, not a cached principal's.
    """
    client = serve(expiry_header=True)
    headers = [("authorization", f"Bearer {world.keys['research']}")]
    assert client.get(MODELS, headers).values(HEADER) == [EXPIRES]
    key = world.store.get_key(world.key_ids["research"])
    assert key is not None

    world.store.edit(attrs.evolve(key, expires_at=key.expires_at + timedelta(days=7)))

    assert client.get(MODELS, headers).values(HEADER) == ["2026-12-28T12:00:00Z"]


# --- the application's own lines of the name, and the middleware's own 500 -----------------


def spoofing_asgi() -> Any:
    async def spoof(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok", headers={"Service-Key-Expires-At": "never"})

    starlette = Starlette(routes=[Route(MODELS, spoof)])

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("path") == "/managed-agents/v1/crash":  # raw: no framework makes it a 500
            raise RuntimeError("the app broke")
        await starlette(scope, receive, send)

    return app


def spoofing_wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    if environ["PATH_INFO"] == "/managed-agents/v1/crash":
        raise RuntimeError("the app broke")
    start_response("200 OK", [("Service-Key-Expires-At", "never"), ("content-length", "2")])
    return [b"ok"]


def asgi_get(world: World, path: str, **options: Any) -> tuple[int, list[str], str]:
    app = keyturn_asgi.ApiKeyMiddleware(
        spoofing_asgi(), authenticator=world.authenticator(), **options
    )
    with TestClient(app, raise_server_exceptions=False) as client:
        reply = client.get(path, headers={"authorization": f"Bearer {world.keys['research']}"})
    return reply.status_code, reply.headers.get_list(HEADER), reply.headers["service-tenant-id"]


def wsgi_get(world: World, path: str, **options: Any) -> tuple[int, list[str], str]:
    app = keyturn_wsgi.ApiKeyMiddleware(
        spoofing_wsgi, authenticator=world.authenticator(), **options
    )
    reply = WerkzeugClient(app).get(
        path, headers={"authorization": f"Bearer {world.keys['research']}"}
    )
    return reply.status_code, reply.headers.getlist(HEADER), reply.headers["service-tenant-id"]


@pytest.mark.parametrize("get", [asgi_get, wsgi_get], ids=["asgi", "wsgi"])
def test_the_apps_own_line_is_replaced_or_dropped(world: World, get: Any) -> None:
    """The name is keyturn's: an app's own line is replaced when on, dropped when off."""
    assert get(world, MODELS, expiry_header=True) == (200, [EXPIRES], "acme")
    assert get(world, MODELS) == (200, [], "acme")


@pytest.mark.parametrize("get", [asgi_get, wsgi_get], ids=["asgi", "wsgi"])
def test_the_middlewares_own_500_names_the_organization_not_the_expiry(
    world: World, get: Any
) -> None:
    """An app that raises before responding gets the middleware's 500: service headers only."""
    assert get(world, "/managed-agents/v1/crash", expiry_header=True) == (500, [], "acme")


# --- the value --------------------------------------------------------------------------------

ZONES = st.integers(min_value=-14 * 60, max_value=14 * 60).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)


@given(
    instant=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2200, 1, 1), timezones=ZONES
    )
)
def test_the_value_is_the_instant_in_utc_to_the_second(instant: datetime) -> None:
    """Whatever the zone and precision of the stored instant: RFC 3339 in UTC with a ``Z``,
    whole seconds, never later than the instant (the key still works at the stated time).
    """
    ((name, value),) = expiry_headers(instant)
    stated = datetime.fromisoformat(value)

    assert name == HEADER
    assert len(value) == 20 and value.endswith("Z") and value[10] == "T"
    assert stated.tzinfo is not None and stated.utcoffset() == timedelta(0)
    assert stated <= instant < stated + timedelta(seconds=1)
    assert value.isascii()  # a header value in any server


def test_a_principal_built_by_hand_has_no_expiry_to_send() -> None:
    """A Principal made without expires_at (a test double) adds no header, and no error."""
    assert expiry_headers(None) == ()
    assert expiry_headers(datetime(2026, 1, 1, tzinfo=UTC)) == ((HEADER, "2026-01-01T00:00:00Z"),)


# --- over real HTTP ---------------------------------------------------------------------------


def wsgi_models(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    found = environ["PATH_INFO"] == MODELS
    start_response("200 OK" if found else "404 Not Found", [("content-length", "2")])
    return [] if environ["REQUEST_METHOD"] == "HEAD" else [b"ok"]


async def asgi_models(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        return
    found = scope["path"] == MODELS
    headers = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200 if found else 404, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else b"ok"})


@pytest.mark.parametrize("server", ["uvicorn", "waitress"])
def test_over_a_real_server_on_loopback(world: World, server: str) -> None:
    """uvicorn (ASGI) and waitress (WSGI) on 127.0.0.1: GET, HEAD and the app's 404 carry
    the header; a 401 and a 404 of the decision do not.
    """
    authenticator = world.authenticator()
    if server == "uvicorn":
        app: Any = keyturn_asgi.ApiKeyMiddleware(
            asgi_models, authenticator=authenticator, expiry_header=True
        )
        ports = serve_uvicorn(app)
    else:
        app = keyturn_wsgi.ApiKeyMiddleware(
            wsgi_models, authenticator=authenticator, expiry_header=True
        )
        ports = serve_waitress(app)
    key = {"authorization": f"Bearer {world.keys['tenant']}"}
    with contextlib.closing(ports):  # the server stops here, whatever happened
        port = next(ports)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            replies = {
                "get": http.get(MODELS, headers={**key, "x-organization-id": "default"}),
                "head": http.head(MODELS, headers={**key, "x-organization-id": "org_research"}),
                "app 404": http.get(MODELS + "/x", headers={**key, "x-organization-id": "default"}),
                "401": http.get(MODELS),
                "400": http.get(MODELS, headers=key),  # a tenant key names its organization
                "404": http.get(MODELS, headers={**key, "x-organization-id": "org_globex"}),
            }
    statuses = {name: reply.status_code for name, reply in replies.items()}
    assert statuses == {"get": 200, "head": 200, "app 404": 404, "401": 401, "400": 400, "404": 404}
    stated = {name: reply.headers.get_list(HEADER) for name, reply in replies.items()}
    assert stated == {
        "get": [EXPIRES],
        "head": [EXPIRES],
        "app 404": [EXPIRES],
        "401": [],
        "400": [],
        "404": [],
    }


def test_a_websocket_accept_carries_it(world: World) -> None:
    """An accepted WebSocket handshake is an accepted request: its accept carries the expiry."""

    async def stream(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.close()

    app = keyturn_asgi.ApiKeyMiddleware(
        Starlette(routes=[WebSocketRoute("/managed-agents/v1/stream", stream)]),
        authenticator=world.authenticator(),
        expiry_header=True,
    )
    headers = {"authorization": f"Bearer {world.keys['research']}"}
    with (
        TestClient(app) as client,
        client.websocket_connect("/managed-agents/v1/stream", headers=headers) as ws,
    ):
        assert (HEADER.encode(), EXPIRES.encode()) in (ws.extra_headers or [])
