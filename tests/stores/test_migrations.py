"""Existing databases upgrade to the schema that keeps the invariants (version 4)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from keyturn import KeyAlreadyReplaced
from keyturn.stores import _schema, _sql
from keyturn.stores.sqlite import SQLiteDatabase
from tests.stores.test_contract import NOW, make_key

SQLITE = _schema.Dialect(
    "TEXT", "", None, _schema.SQLITE_CHANGE_FEED, "?", _schema.SQLITE_EVERY_WRITE_HEARD
)
POSTGRES = _schema.Dialect(
    "timestamptz", "", None, _schema.POSTGRES_CHANGE_FEED, "%s", _schema.POSTGRES_EVERY_WRITE_HEARD
)


def version_3(connection: Any, dialect: _schema.Dialect) -> None:
    """The schema as version 3 left it, holding what version 3 let in: two live
    replacements of one key, and a tenant without a default organization."""
    connection.execute(_schema.CREATE_VERSION_TABLE)
    for version in (1, 2, 3):
        for statement in _schema.migration(version, dialect):
            connection.execute(statement)
        connection.execute(f"INSERT INTO keyturn_schema_version VALUES ({version})")  # noqa: S608
    insert = _sql.Statements.with_placeholder(dialect.placeholder).add_key
    text = dialect.placeholder == "?"

    def instant(at: Any) -> Any:
        return None if at is None else (at.isoformat(timespec="microseconds") if text else at)

    for key in (
        make_key("OldKey000001"),
        make_key("Replacement1", replaces="OldKey000001", created_at=NOW),
        make_key("Replacement2", replaces="OldKey000001", created_at=NOW.replace(hour=13)),
    ):
        connection.execute(insert, _sql.key_params(key, instant))
    connection.execute(
        "INSERT INTO keyturn_organizations (id, tenant_id) "
        "VALUES ('org_b', 'initech'), ('org_a', 'initech')"
    )


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def upgraded(
    request: pytest.FixtureRequest, sqlite_path: Path
) -> Iterator[tuple[Any, Callable[[str], list[tuple[Any, ...]]]]]:
    """A version 3 database holding the old anomalies, opened (and so upgraded) by keyturn."""
    if request.param == "sqlite":
        import sqlite3

        raw = sqlite3.connect(sqlite_path, isolation_level=None)
        version_3(raw, SQLITE)
        raw.close()
        db: Any = SQLiteDatabase(sqlite_path)
        db.create_schema()

        def query(sql: str) -> list[tuple[Any, ...]]:
            with db.connection() as connection:
                return list(connection.execute(sql).fetchall())

    else:
        import psycopg

        from keyturn.stores.postgres import PostgresDatabase

        url = request.getfixturevalue("make_postgres_schema")()
        with psycopg.connect(url, autocommit=True) as raw:
            version_3(raw, POSTGRES)
        db = PostgresDatabase(url)
        db.create_schema()

        def query(sql: str) -> list[tuple[Any, ...]]:
            with db.connection() as connection:
                return list(connection.execute(sql).fetchall())

    try:
        yield db, query
    finally:
        db.close()


def test_the_newest_live_replacement_stays_and_the_others_stand_alone(
    upgraded: tuple[Any, Callable[[str], list[tuple[Any, ...]]]],
) -> None:
    """Version 4 keeps the newest of several live replacements as the replacement; the
    others keep working as keys of their own; and a third is refused from then on."""
    db, query = upgraded
    assert db.schema_version() == _schema.SCHEMA_VERSION
    rows = query("SELECT key_id, replaces, revoked_at FROM keyturn_keys ORDER BY key_id")
    assert rows == [
        ("OldKey000001", None, None),
        ("Replacement1", None, None),
        ("Replacement2", "OldKey000001", None),
    ]
    with pytest.raises(KeyAlreadyReplaced):
        db.keys.add_key(make_key("Replacement3", replaces="OldKey000001"))


def test_a_tenant_without_a_default_gets_its_first_organization_as_default(
    upgraded: tuple[Any, Callable[[str], list[tuple[Any, ...]]]],
) -> None:
    """A tenant left without a default organization by version 3 gets its first one (by
    id), so that ``x-organization-id: default`` finds it."""
    db, _ = upgraded
    default = db.membership.get_default_organization("initech")
    assert default is not None and default.id == "org_a"
