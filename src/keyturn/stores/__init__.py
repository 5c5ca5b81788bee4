"""Key stores and membership providers that ship with keyturn.

- :mod:`keyturn.stores.memory`: dicts in the process; tests, examples, demos.
- :mod:`keyturn.stores.sqlite`: one file, nothing to start; the embedded default.
- :mod:`keyturn.stores.postgres`: a shared database for many app instances, sync and async.

A store URL picks one: :func:`open_database` is what the ``keyturn`` command uses, and apps
may use it too::

    db = open_database("sqlite:///keyturn.sqlite3")  # sqlite:////abs/path: absolute
    db = open_database("postgresql://app@127.0.0.1:5432/app")
    auth = Authenticator(db.keys, db.membership)

Each is a :class:`~keyturn.protocols.Database`: ``.keys`` (a
:class:`~keyturn.protocols.KeyStore`), ``.membership`` (a
:class:`~keyturn.protocols.WritableMembership`), ``create_schema()``, ``schema_version()``
and ``close()``. Importing this package imports no database driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from keyturn.stores.postgres import PostgresDatabase
    from keyturn.stores.sqlite import SQLiteDatabase

__all__ = ["open_database"]

_SQLITE = "sqlite:///"
_POSTGRES = ("postgresql://", "postgres://")


def open_database(url: str) -> SQLiteDatabase | PostgresDatabase:
    """Open the database named by *url*: ``sqlite:///path`` or ``postgresql://...``.

    :raises ValueError: the URL names no supported store.
    """
    if url.startswith(_SQLITE):
        from keyturn.stores.sqlite import SQLiteDatabase

        return SQLiteDatabase(url.removeprefix(_SQLITE))
    if url.startswith(_POSTGRES):
        try:
            from keyturn.stores.postgres import PostgresDatabase
        except ImportError as exc:
            raise ValueError(
                "a postgresql:// store needs psycopg: pip install 'keyturn[postgres]'"
            ) from exc
        return PostgresDatabase(url)
    if url.startswith("sqlite:"):
        raise ValueError(
            f"a SQLite store URL has three slashes before a relative path, four before an "
            f"absolute one: sqlite:///keyturn.sqlite3 or sqlite:////var/lib/keyturn.sqlite3, "
            f"got {url!r}"
        )
    scheme = url.partition(":")[0] if ":" in url else url
    raise ValueError(
        f"unsupported store URL scheme {scheme!r}: use sqlite:///path/to/file.sqlite3 "
        "or postgresql://user@host:port/database"
    )
