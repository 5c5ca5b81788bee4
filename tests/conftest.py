"""Fixtures shared across the suite's top-level tests."""

from __future__ import annotations

import pytest

from tests.environments import Environments
from tests.skip_summary import pytest_terminal_summary  # noqa: F401 -- a hook: pytest finds it here


@pytest.fixture(scope="session")
def environments() -> Environments:
    """The test run's built wheel and clean environments (see ``tests/environments.py``)."""
    return Environments()
