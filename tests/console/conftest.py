"""Fixtures of the console tests: a world, a client per edge (ASGI, WSGI, Django), a browser.

``browser`` is Debian's Chromium under Playwright. Without either, the tests that need it
skip, saying why -- except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.console.support import BROWSER_EDGES, Client, World, django_settings, make_world


@pytest.fixture
def world() -> World:
    return make_world()


@pytest.fixture(params=BROWSER_EDGES)
def client(request: pytest.FixtureRequest, world: World) -> Iterator[Client]:
    """A test client of the console mounted at /console/, signed in as alice: under ASGI,
    WSGI, and in the tests' Django project."""
    client = Client(request.param, world.console)
    client.account = "alice"
    if request.param == "django":
        with django_settings(world.console):
            yield client
    else:
        yield client


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _missing() -> str | None:
    if not Path(CHROMIUM).is_file():
        return f"{CHROMIUM} is missing: apt-get install chromium"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is missing: pip install playwright"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module."""
    reason = _missing()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser tests are mandatory in CI: {reason}", pytrace=False)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
