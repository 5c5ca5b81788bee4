"""Fixtures of the web tests.

``serve`` and ``client`` are parametrized over ``asgi`` and ``wsgi``: every test that takes
them runs against the ASGI middleware (Starlette's TestClient) and the WSGI middleware
(Werkzeug's test Client) and must pass identically.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from keyturn import asgi as keyturn_asgi
from keyturn import wsgi as keyturn_wsgi
from tests.web.web_support import (
    PUBLIC,
    AsgiClient,
    Client,
    Serve,
    WsgiClient,
    asgi_app,
    make_web_world,
    wsgi_app,
)
from tests.world import World


@pytest.fixture
def world() -> Iterator[World]:
    world = make_web_world()
    yield world
    for authenticator in world.authenticators:
        authenticator.close()


@pytest.fixture(params=["asgi", "wsgi"])
def serve(request: pytest.FixtureRequest, world: World) -> Iterator[Serve]:
    """Build the test app behind one adapter, with the given middleware options."""
    clients: list[AsgiClient | WsgiClient] = []

    def build(**options: Any) -> Client:
        options.setdefault("public_paths", {PUBLIC})
        authenticator = options.pop("authenticator", None) or world.authenticator()
        client: AsgiClient | WsgiClient
        if request.param == "asgi":
            middleware = keyturn_asgi.ApiKeyMiddleware(
                asgi_app(world), authenticator=authenticator, **options
            )
            client = AsgiClient(middleware)
        else:
            client = WsgiClient(
                keyturn_wsgi.ApiKeyMiddleware(
                    wsgi_app(world), authenticator=authenticator, **options
                )
            )
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()


@pytest.fixture
def client(serve: Serve) -> Client:
    """The test app behind one adapter, with the default options."""
    return serve()
