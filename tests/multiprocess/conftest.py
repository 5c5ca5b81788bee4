"""The stores the multi-process suite runs over: one SQLite file, one PostgreSQL schema.

PostgreSQL follows the store tests' rule (``tests/stores/conftest.py``): without
``KEYTURN_TEST_POSTGRES_DSN`` it skips with the reason shown; with
``KEYTURN_REQUIRE_POSTGRES=1`` (as in CI) it fails instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from keyturn.stores import open_database
from tests.stores.conftest import make_postgres_schema, postgres_server

__all__ = ["make_postgres_schema", "postgres_server", "store_url"]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL with keyturn's tables in it and nothing else."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'keyturn.sqlite3'}"
    else:
        make: Callable[[], str] = request.getfixturevalue("make_postgres_schema")
        url = make()
    with open_database(url) as db:
        db.create_schema()
    return url
