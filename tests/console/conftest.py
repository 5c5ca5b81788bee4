"""Fixtures of the console tests: a fresh world and a client per edge (ASGI and WSGI)."""

from __future__ import annotations

import pytest

from tests.console.support import EDGES, Client, World, make_world


@pytest.fixture
def world() -> World:
    return make_world()


@pytest.fixture(params=EDGES)
def client(request: pytest.FixtureRequest, world: World) -> Client:
    """A test client of the console mounted at /console/, signed in as alice."""
    client = Client(request.param, world.console)
    client.account = "alice"
    return client
