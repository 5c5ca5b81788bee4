"""Fixtures shared across the suite's top-level tests."""

from __future__ import annotations

import pytest

from tests.environments import Environments


@pytest.fixture(scope="session")
def environments() -> Environments:
    """The test run's built wheel and clean environments (see ``tests/environments.py``)."""
    return Environments()
