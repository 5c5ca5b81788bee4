"""Key stores and membership providers that ship with keyturn.

- :mod:`keyturn.stores.memory`: dicts in the process; tests, examples, demos.
- :mod:`keyturn.stores.sqlite`: one file, nothing to start; the embedded default.
- :mod:`keyturn.stores.postgres`: a shared database for many app instances, sync and async.

A store URL picks one: :func:`open_database` is what the ``keyturn`` command uses, and apps
may use it too. Each is a :class:`~keyturn.protocols.Database` (``.keys``, ``.membership``,
``create_schema()``, ``schema_version()``, ``close()``). Importing this package imports no
database driver.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final
from urllib.parse import unquote

from keyturn.errors import InvalidStoreURL

if TYPE_CHECKING:
    from keyturn.stores.postgres import PostgresDatabase
    from keyturn.stores.sqlite import SQLiteDatabase

__all__ = ["open_database", "redact_url"]

_SQLITE = "sqlite:///"
_POSTGRES = ("postgresql://", "postgres://")


def open_database(url: str, *, connect_first: bool = False) -> SQLiteDatabase | PostgresDatabase:
    """Open the database named by *url*: ``sqlite:///path`` or ``postgresql://...``.

    :param connect_first: for PostgreSQL, connect once before the pool opens, so that a
        server that refuses or is not reached (within 5 seconds, unless the URL's
        ``connect_timeout`` says) fails here, rather than the pool retrying it in the
        background, logging each failure; what a command wants, unlike an app that may
        start before its database.
    :raises InvalidStoreURL: the URL names no supported store, or a PostgreSQL URL holds
        an ``@`` that is not percent-encoded.
    :raises StoreUnreachable: with *connect_first*, the server could not be reached, or
        libpq could not read the URL (the reason never holds the password).
    :raises ImportError: the store's extra is not installed.
    """
    if url.startswith(_SQLITE):
        from keyturn.stores.sqlite import SQLiteDatabase

        return SQLiteDatabase(url.removeprefix(_SQLITE))
    if url.startswith(_POSTGRES):
        if url.partition("?")[0].count("@") > 1:
            # libpq would take the password's "@" for the host's start, and quote what
            # follows it (part of the password) in its errors and the pool's logs.
            raise InvalidStoreURL(
                f"the store URL {redact_url(url)} holds more than one '@': percent-encode "
                "an '@' in the user name or password as %40"
            )
        from keyturn.stores.postgres import PostgresDatabase, reach  # says which extra it needs

        if connect_first:
            reach(url)
        return PostgresDatabase(url)
    if url.startswith("sqlite:"):
        raise InvalidStoreURL(
            f"a SQLite store URL has three slashes before a relative path, four before an "
            f"absolute one: sqlite:///keyturn.sqlite3 or sqlite:////var/lib/keyturn.sqlite3, "
            f"got {url!r}"
        )
    scheme = url.partition(":")[0]
    raise InvalidStoreURL(
        f"unsupported store URL scheme {scheme!r}: use sqlite:///path/to/file.sqlite3 "
        "or postgresql://user@host:port/database"
    )


# --- printing a store URL -------------------------------------------------------------------

_SECRET_KEYWORDS: Final = frozenset({"password", "sslpassword"})
_HIDDEN: Final = "***"
# One `name=value` of a URL's query: its names may be percent-encoded.
_QUERY_PARAM: Final = re.compile(r"(?P<before>[?&])(?P<name>[^=&?]*)=(?P<value>[^&]*)")
# One `keyword = value` of a libpq key/value string: a quoted value keeps \' and \\ escapes.
_KEYWORD_VALUE: Final = re.compile(
    r"(?P<keyword>\w+)(?P<equals>\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'?|(?:\\.|[^\s\\])+\\?)",
    re.DOTALL,
)


def redact_url(url: str) -> str:
    """*url* with every credential libpq accepts replaced by ``***``, fit to print.

    Covers ``user:password@`` in a URL, ``password`` and ``sslpassword`` in a URL's query
    (percent-encoded names too) or in a ``keyword=value`` connection string (quoted or not),
    and a connection string nested in ``dbname``. A URL without credentials is unchanged.
    """
    scheme, separator, rest = url.partition("://")
    if separator and "=" not in scheme and " " not in scheme:
        userinfo, at, host = rest.rpartition("@")  # the last @: a password may hold one
        if at and ":" in userinfo:
            rest = f"{userinfo.partition(':')[0]}:{_HIDDEN}@{host}"
        return f"{scheme}://{_QUERY_PARAM.sub(_redact_param, rest)}"
    return _KEYWORD_VALUE.sub(_redact_keyword, url)


def _redact_param(match: re.Match[str]) -> str:
    if _is_secret(unquote(match["name"])):
        return f"{match['before']}{match['name']}={_HIDDEN}"
    return match.group()


def _redact_keyword(match: re.Match[str]) -> str:
    keyword, value = match["keyword"], match["value"]
    if _is_secret(keyword):
        value = _HIDDEN
    elif keyword == "dbname":  # libpq expands a dbname that is itself a connection string
        plain = value[1:-1] if value.startswith("'") else value
        plain = re.sub(r"\\(.)", r"\1", plain, flags=re.DOTALL)
        redacted = redact_url(plain)
        if redacted != plain:
            value = "'" + redacted.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return f"{keyword}{match['equals']}{value}"


def _is_secret(keyword: str) -> bool:
    return keyword.strip().lower() in _SECRET_KEYWORDS
