"""Opening the store a ``keyturn`` command works on, from ``--store``, the environment or
the default; a store that is missing, unreachable or not initialized is refused in one line.

No store password is ever printed: a URL is shown through
:func:`~keyturn.stores.redact_url`, and a ``key=value`` connection string, which may hold
one, is refused without being echoed.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from typing import TYPE_CHECKING, Final

from keyturn.cli._output import PROG, CommandError
from keyturn.errors import InvalidStoreURL, StoreUnreachable
from keyturn.stores import open_database, redact_url

if TYPE_CHECKING:
    from keyturn.protocols import Database

ENVIRONMENT_VARIABLE: Final = "KEYTURN_STORE_URL"
DEFAULT_STORE_URL: Final = "sqlite:///keyturn.sqlite3"
_SQLITE: Final = "sqlite:///"


def store_url(store: str | None) -> str:
    """The store's URL: *store* (``--store``), else the environment's, else the default."""
    return store or os.environ.get(ENVIRONMENT_VARIABLE) or DEFAULT_STORE_URL


def open_store(url: str, *, init: bool) -> Database:
    """The store at *url*; unless *init*, one that ``db init`` prepared (none is created)."""
    if "://" not in url and not url.startswith("sqlite:"):
        if "=" in url:  # a libpq key=value string: never echoed, it may hold a password
            raise CommandError(
                "the store is a URL, not a key=value connection string: write it as "
                "postgresql://USER@HOST:PORT/DBNAME (the password in $PGPASSWORD or ~/.pgpass)",
                2,
            )
        raise CommandError(
            f"the store is a URL, not a file name: for a SQLite file, sqlite:///{url}", 2
        )
    if url.startswith(_SQLITE):  # SQLite creates a missing file: a typo must not
        path = os.path.abspath(url.removeprefix(_SQLITE))
        folder = os.path.dirname(path)
        if init and not os.path.isdir(folder):
            raise CommandError(f"cannot create {path}: there is no directory {folder}", 2)
        if not init and not os.path.exists(path):
            raise CommandError(
                f"there is no store at {path} (from {url}): check --store or "
                f"${ENVIRONMENT_VARIABLE}, or create it with '{PROG.get()} db init'"
            )
    try:
        # A server that refuses is said at once, not retried by the pool until its timeout.
        db = open_database(url, connect_first=True)
    except (InvalidStoreURL, ImportError) as exc:  # no such store, or its extra is missing
        raise CommandError(str(exc), 2) from None
    except StoreUnreachable as exc:
        raise CommandError(f"cannot connect to the store {redact_url(url)}: {exc.reason}") from None
    try:  # SchemaTooNew goes to main() like any KeyturnError
        if not init and db.schema_version() <= 0:
            raise CommandError(
                f"the store {redact_url(url)} has no keyturn tables in the first schema of "
                f"its search_path: run '{PROG.get()} db init'"
            )
    except BaseException:
        db.close()
        raise
    return db


def driver_errors() -> tuple[type[Exception], ...]:
    """The database drivers' errors: the store failed (disk, lock, permissions, server)."""
    psycopg = sys.modules.get("psycopg")  # imported only if a PostgreSQL store was opened
    return (sqlite3.Error,) if psycopg is None else (sqlite3.Error, psycopg.Error)
