"""SQLite and PostgreSQL for the benchmarks: scratch databases, and fast bulk inserts.

PostgreSQL is used only when a DSN is given (``--postgres-dsn`` or
``KEYTURN_TEST_POSTGRES_DSN``) and the server answers; the benchmarks work in a schema of
their own, dropped at the end, so they never touch anyone else's tables.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Final

__all__ = [
    "COLUMNS",
    "bulk_copy_postgres",
    "bulk_copy_sqlite",
    "postgres_schema",
    "postgres_unavailable",
]

# The key table's columns (docs/stores.md); the bulk copies clone one row under new ids.
COLUMNS: Final = (
    "key_id, secret_hash, hint, name, account_id, tenant_id, organization_id, "
    "created_at, expires_at, revoked_at, last_used_at"
)
_CLONED: Final = COLUMNS.removeprefix("key_id, ")


def postgres_unavailable(dsn: str | None) -> str | None:
    """Why PostgreSQL cannot be used for the benchmarks, or ``None`` when it can."""
    if not dsn:
        return "no DSN: pass --postgres-dsn or set KEYTURN_TEST_POSTGRES_DSN"
    if not dsn.startswith(("postgresql://", "postgres://")):
        return "the DSN is not a postgresql:// URL"
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install 'keyturn[postgres]')"
    try:
        with psycopg.connect(dsn, connect_timeout=5) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"cannot reach the server: {type(exc).__name__}"
    return None


def _with_search_path(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"


@contextmanager
def postgres_schema(dsn: str) -> Iterator[str]:
    """A fresh, empty schema on the server; yields a URL whose connections work in it."""
    import psycopg

    schema = f"keyturn_bench_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    try:
        yield _with_search_path(dsn, schema)
    finally:
        with psycopg.connect(dsn, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA {schema} CASCADE")


def bulk_copy_sqlite(path: str, template_id: str, key_ids: Sequence[str]) -> None:
    """Insert a copy of key *template_id* under each of *key_ids*, in one transaction."""
    connection = sqlite3.connect(path, timeout=30)
    try:
        with connection:
            connection.executemany(
                f"INSERT INTO keyturn_keys ({COLUMNS}) "  # noqa: S608 - constants only
                f"SELECT ?, {_CLONED} FROM keyturn_keys WHERE key_id = ?",
                ((key_id, template_id) for key_id in key_ids),
            )
    finally:
        connection.close()


def bulk_copy_postgres(url: str, template_id: str, key_ids: Sequence[str]) -> None:
    """The same on PostgreSQL, in one statement over an array of ids; then ANALYZE."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            f"INSERT INTO keyturn_keys ({COLUMNS}) "  # noqa: S608 - constants only
            f"SELECT u.id, {_CLONED} FROM unnest(%s::text[]) AS u(id) "
            "CROSS JOIN (SELECT * FROM keyturn_keys WHERE key_id = %s) AS t",
            (list(key_ids), template_id),
        )
        connection.execute("ANALYZE keyturn_keys")
