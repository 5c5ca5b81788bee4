"""No request carrying an API key reaches the console (D25, D30), in any form the gate reads,
and the console's own edges fail closed on forms of unknown origin and on their redirects.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient
from werkzeug.exceptions import NotFound
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.test import Client as WerkzeugClient

from keyturn import Authenticator, Scope
from keyturn.asgi import ApiKeyMiddleware as AsgiMiddleware
from keyturn.console._visit import HEADERS
from keyturn.wsgi import ApiKeyMiddleware as WsgiMiddleware
from tests.console.support import ACCOUNT_COOKIE, EDGES, World, asgi_app, wsgi_app

Lines = list[tuple[str, str]]
# (status, headers with lower-case names, body) for a GET with these header lines
Get = Callable[[str, Lines], tuple[int, dict[str, str], str]]


def _asgi_get(app: Any) -> Get:
    client = TestClient(app, follow_redirects=False)

    def get(path: str, lines: Lines) -> tuple[int, dict[str, str], str]:
        reply = client.get(path, headers=lines)
        return reply.status_code, {k.lower(): v for k, v in reply.headers.items()}, reply.text

    return get


def _wsgi_get(app: Any) -> Get:
    client = WerkzeugClient(app)

    def get(path: str, lines: Lines) -> tuple[int, dict[str, str], str]:
        client._cookies.clear()  # Werkzeug's client sends its own jar, never a Cookie line
        for name, value in lines:
            if name == "Cookie":
                client.set_cookie(*value.split("=", 1))
        lines = [(name, value) for name, value in lines if name != "Cookie"]
        reply = client.open(path, method="GET", headers=lines)
        headers = {k.lower(): v for k, v in reply.headers.items()}
        return reply.status_code, headers, reply.get_data(as_text=True)

    return get


@pytest.fixture(params=EDGES)
def get(request: pytest.FixtureRequest, world: World) -> Get:
    """GET the console mounted at /console/, on one edge, with raw header lines."""
    if request.param == "asgi":
        return _asgi_get(asgi_app(world.console))
    return _wsgi_get(wsgi_app(world.console))


def _key(world: World) -> str:
    return world.manager.create("alice", name="k", scope=Scope.tenant("acme")).secret


def _basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


CARRIERS: dict[str, Callable[[str], Lines]] = {
    "a second Authorization line after Basic": lambda key: [
        ("Authorization", _basic("alice:pw")),
        ("Authorization", f"Bearer {key}"),
    ],
    "a second Authorization line after an empty one": lambda key: [
        ("Authorization", ""),
        ("Authorization", f"Bearer {key}"),
    ],
    "Bearer and a tab": lambda key: [("Authorization", f"Bearer\t{key}")],
    "the Token scheme": lambda key: [("Authorization", f"Token {key}")],
    "Basic holding the key as password": lambda key: [("Authorization", _basic(f"x:{key}"))],
    "Basic holding the key, unpadded": lambda key: [
        ("Authorization", _basic(f"{key}:").rstrip("="))
    ],
    "no scheme at all": lambda key: [("Authorization", key)],
}


@pytest.mark.parametrize("carry", CARRIERS.values(), ids=CARRIERS.keys())
def test_a_key_in_any_form_the_gate_reads_is_refused(
    get: Get, world: World, carry: Callable[[str], Lines]
) -> None:
    """Signed in or not, a request whose Authorization lines hold a key, in any line and any
    scheme, gets 403 and never the key list.
    """
    key = _key(world)
    signed_in = [("Cookie", f"{ACCOUNT_COOKIE}=alice")]

    status, _, body = get("/console/", [*signed_in, *carry(key)])

    assert status == 403
    assert "API keys cannot manage keys" in body
    assert get("/console/", signed_in)[0] == 200  # the same request without the key


def test_a_password_is_no_key(get: Get, world: World) -> None:
    """Basic credentials without a key are not refused as one (the host may use them)."""
    lines = [("Cookie", f"{ACCOUNT_COOKIE}=alice"), ("Authorization", _basic("alice:pw"))]

    assert get("/console/", lines)[0] == 200


def _under_the_prefix_asgi(world: World) -> Get:
    app = Starlette(routes=[Mount("/managed-agents/v1/console", app=world.console.asgi())])
    authenticator = Authenticator(world.store, world.membership, clock=world.clock)
    return _asgi_get(AsgiMiddleware(app, authenticator=authenticator))


def _under_the_prefix_wsgi(world: World) -> Get:
    app = DispatcherMiddleware(NotFound(), {"/managed-agents/v1/console": world.console.wsgi()})
    authenticator = Authenticator(world.store, world.membership, clock=world.clock)
    return _wsgi_get(WsgiMiddleware(app, authenticator=authenticator))


@pytest.fixture(params=EDGES)
def under_the_prefix(request: pytest.FixtureRequest, world: World) -> Get:
    """The console mounted under the API prefix, behind the API middleware."""
    build = _under_the_prefix_asgi if request.param == "asgi" else _under_the_prefix_wsgi
    return build(world)


def test_a_key_is_refused_when_the_middleware_stripped_it(
    under_the_prefix: Get, world: World
) -> None:
    """Under the API prefix the middleware takes the key out before the console runs: the
    console still refuses the request it authenticated, though it has a session too.
    """
    key = _key(world)
    lines = [
        ("Cookie", f"{ACCOUNT_COOKIE}=alice"),
        ("Authorization", f"Bearer {key}"),
        ("x-organization-id", "default"),
    ]

    status, _, body = under_the_prefix("/managed-agents/v1/console/", lines)

    assert status == 403
    assert "API keys cannot manage keys" in body


@pytest.mark.parametrize("edge", EDGES)
def test_a_form_with_neither_origin_nor_fetch_site_is_refused(world: World, edge: str) -> None:
    """A POST that says nothing of where it comes from is refused: the check fails closed."""
    headers = [
        ("Cookie", f"{ACCOUNT_COOKIE}=alice"),
        ("Content-Type", "application/x-www-form-urlencoded"),
    ]
    body = b"name=ci&lifetime=30d&scope=tenant&token=x"
    if edge == "asgi":
        reply = TestClient(asgi_app(world.console)).post("/console/", content=body, headers=headers)
        status, text = reply.status_code, reply.text
    else:
        werkzeug = WerkzeugClient(wsgi_app(world.console))
        werkzeug.set_cookie(ACCOUNT_COOKIE, "alice")
        answer = werkzeug.post("/console/", data=body, headers=headers[1:])
        status, text = answer.status_code, answer.get_data(as_text=True)

    assert status == 403
    assert "another site" in text
    assert world.store.keys_of("alice") == []


@pytest.mark.parametrize("edge", EDGES)
def test_the_edges_redirect_carries_the_security_headers(world: World, edge: str) -> None:
    """The edge's own redirect from its mount point to the slash has every page's headers."""
    if edge == "asgi":  # called at its mount point itself, as a router without redirects does
        client = TestClient(world.console.asgi(), root_path="/console", follow_redirects=False)
        reply = client.get("/console")
        status, headers = reply.status_code, {k.lower(): v for k, v in reply.headers.items()}
    else:
        status, headers, _ = _wsgi_get(wsgi_app(world.console))("/console", [])

    assert status == 308
    assert headers["location"] == "/console/"
    for name, value in HEADERS:
        assert headers[name.lower()] == value
