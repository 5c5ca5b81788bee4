"""Fixtures of the adversarial tests.

``serve`` and ``client`` are the web tests' own fixtures, so every test that takes them --
or ``attack`` and ``target``, built on them -- runs against the ASGI and the WSGI middleware.

The canary watches everything this package's tests see leave the library: records of every
logger at DEBUG, warnings, stdout and stderr, the repr and str of the objects the tests
make, every reply. A test whose material holds any key's secret fails, and so does the
package at its end if a secret turns up anywhere at all.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from keyturn import Scope
from keyturn import asgi as keyturn_asgi
from tests.adversarial.support import Canary, Target
from tests.web.conftest import client, serve  # noqa: F401 -- the same two-adapter fixtures
from tests.web.web_support import AsgiClient, Serve, asgi_app, make_web_world
from tests.world import World

_watching: list[Canary] = []  # the package's canary, for the warning hook


class _CanaryHandler(logging.Handler):
    def __init__(self, canary: Canary) -> None:
        super().__init__(logging.DEBUG)
        self.canary = canary
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        # The formatted line (with any traceback) and the raw arguments it was made from.
        self.canary.saw(f"log {record.name}", self.format(record) + repr(record.args))


@pytest.fixture(scope="package")
def canary() -> Iterator[Canary]:
    """One canary for the whole adversarial run; every logger feeds it at DEBUG meanwhile."""
    canary = Canary()
    handler = _CanaryHandler(canary)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    _watching.append(canary)
    try:
        yield canary
    finally:
        _watching.remove(canary)
        root.removeHandler(handler)
        root.setLevel(level)
    assert canary.leaks() == [], "a secret left the library"


@pytest.fixture(autouse=True)
def watched(canary: Canary, capfd: pytest.CaptureFixture[str]) -> Iterator[None]:
    """After each test its output joins the canary, and nothing it produced holds a secret."""
    since = len(canary.texts)
    yield
    out, err = capfd.readouterr()
    sys.stdout.write(out)  # put back, so a failing test's report still shows it
    sys.stderr.write(err)
    canary.saw("stdout", out)
    canary.saw("stderr", err)
    assert canary.leaks(since) == [], "a secret left the library"


def pytest_warning_recorded(
    warning_message: warnings.WarningMessage, when: str, nodeid: str, location: object
) -> None:
    for canary in _watching:
        canary.saw(f"warning in {nodeid}", str(warning_message.message))


@pytest.fixture
def world(canary: Canary) -> Iterator[World]:
    """The web tests' world; its keys join the canary, and so, at the end, do the repr and
    str of every object made around it: keys, records, authenticators, audit events, errors.
    """
    world = make_web_world()
    for key in world.keys.values():
        canary.secret(key)
    created = world.manager.create("alice", name="canary", scope=Scope.tenant("acme"))
    canary.secret(created.secret)
    yield world
    infos = world.manager.list("alice")
    canary.observe(created, world.store, world.membership, world.manager, *infos)
    canary.observe(*(world.store.get_key(info.key_id) for info in infos))
    for authenticator in world.authenticators:
        canary.observe(authenticator, authenticator.memo)
    for event in world.audit:
        canary.observe(event, event.principal if event.allowed else event.error)
    for authenticator in world.authenticators:
        authenticator.close()


@pytest.fixture
def attack(
    serve: Serve,  # noqa: F811 -- the fixture imported above, taken as fixtures are
    world: World,
    canary: Canary,
) -> Iterator[Callable[..., Target]]:
    """Build the test app behind one adapter, with the given middleware options, as a Target."""
    made: list[Target] = []

    def build(**options: object) -> Target:
        target = Target(serve(**options), world, canary)
        made.append(target)
        return target

    yield build
    canary.observe(*(target.client.app for target in made))


@pytest.fixture
def target(attack: Callable[..., Target]) -> Target:
    """The test app behind one adapter, with the default options."""
    return attack()


@pytest.fixture
def asgi_target(world: World, canary: Canary) -> Iterator[Callable[..., Target]]:
    """Build the test app behind the ASGI middleware only, for attacks only it can face."""
    made: list[AsgiClient] = []

    def build(**options: Any) -> Target:
        authenticator = options.pop("authenticator", None) or world.authenticator()
        app = keyturn_asgi.ApiKeyMiddleware(asgi_app(world), authenticator=authenticator, **options)
        made.append(AsgiClient(app))
        return Target(made[-1], world, canary)

    yield build
    for asgi_client in made:
        canary.observe(asgi_client.app)
        asgi_client.close()
