"""Fixtures for the core tests; every decision test runs through both drivers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from keyturn import Authenticator, AuthRequest, Principal, Refusal
from tests.world import World, make_world

Decide = Callable[[AuthRequest], Principal | Refusal]


@pytest.fixture
def world() -> World:
    return make_world()


@pytest.fixture(params=["sync", "async"])
def driver(request: pytest.FixtureRequest) -> str:
    """Which driver runs the decision: every decision test runs through both."""
    return str(request.param)


@pytest.fixture
def make_decide(driver: str) -> Iterator[Callable[..., Decide]]:
    """Build an Authenticator over a world and return its driver as a plain function."""
    made: list[Authenticator] = []
    loop = asyncio.new_event_loop()  # one loop per test, as a server would keep one

    def build(
        world: World, store: object = None, membership: object = None, **options: object
    ) -> Decide:
        auth = Authenticator(
            store if store is not None else world.store,
            membership if membership is not None else world.membership,
            clock=world.clock,
            **options,  # type: ignore[arg-type]
        )
        made.append(auth)
        if driver == "sync":
            return auth.authenticate
        return lambda request: loop.run_until_complete(auth.authenticate_async(request))

    yield build
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()
    for auth in made:
        auth.close()


@pytest.fixture
def decide(world: World, make_decide: Callable[..., Decide]) -> Decide:
    return make_decide(world)
