"""Fixtures shared across the suite's top-level tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from tests.environments import Environments
from tests.skip_summary import pytest_terminal_summary  # noqa: F401 -- a hook: pytest finds it here

# No example is timed: on a loaded machine a slow example is no failure (the suite asserts
# what is counted, never how long it took).
settings.register_profile("keyturn", deadline=None)
settings.load_profile("keyturn")


@pytest.fixture(scope="session")
def environments() -> Environments:
    """The test run's built wheel and clean environments (see ``tests/environments.py``),
    under ``$KEYTURN_TEST_ENVS`` if set: two runs at once need two folders."""
    folder = os.environ.get("KEYTURN_TEST_ENVS")
    return Environments(Path(folder)) if folder else Environments()
