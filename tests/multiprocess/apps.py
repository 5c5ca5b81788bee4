"""The example apps as the multi-process suite's servers load them, over one shared store.

``tests.multiprocess.apps:asgi`` is the Starlette example and ``:wsgi`` the Flask example,
each over the store named by ``KEYTURN_STORE_URL`` (SQLite or PostgreSQL, sync).
``:async_asgi`` is the Starlette example over ``AsyncPostgresDatabase`` when the store is
PostgreSQL (opened in the server's event loop at startup, closed after its shutdown), and
``:asgi`` otherwise. Every response of these, refusals included, names the process that
answered in ``x-worker-pid``, so the suite knows that every worker served. ``:console`` is
the key console at ``/console/`` over the same store, its signed-in account read from the
``account`` cookie, as a host's sign-in would read it. Each app is built on first access,
so a worker builds only the one it serves, with a database of its own. ``:preloaded_wsgi``
is ``:wsgi`` for a server that loads the app before it forks (gunicorn ``--preload``): the
parent builds it and checks it once, as a host's start-up check would, with the tenant key
named by ``KEYTURN_WARM_UP_KEY`` in its default organization, so its workers inherit an
Authenticator that has already run.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from keyturn import Authenticator
from keyturn.stores import open_database
from tests.web.web_support import load_example

if TYPE_CHECKING:
    from keyturn.stores.postgres import AsyncPostgresDatabase, PostgresDatabase
    from keyturn.stores.sqlite import SQLiteDatabase

STORE_URL = "KEYTURN_STORE_URL"
WARM_UP_KEY = "KEYTURN_WARM_UP_KEY"
POOL_SIZE = 3  # connections per worker at most: the suite's servers share one PostgreSQL
WORKER_HEADER = "x-worker-pid"


def _url() -> str:
    return os.environ[STORE_URL]


def _postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def _database() -> SQLiteDatabase | PostgresDatabase:
    url = _url()
    if not _postgres(url):
        return open_database(url)
    from keyturn.stores.postgres import PostgresDatabase

    return PostgresDatabase(url, max_size=POOL_SIZE)


def _asgi_with_pid(app: Any) -> Any:
    async def with_pid(scope: Any, receive: Any, send: Any) -> None:
        async def send_with_pid(message: Any) -> None:
            if message["type"] == "http.response.start":
                pid = str(os.getpid()).encode()
                message["headers"] = [*message.get("headers", ()), (WORKER_HEADER.encode(), pid)]
            await send(message)

        await app(scope, receive, send_with_pid)

    return with_pid


def _asgi() -> Any:
    db = _database()
    app = load_example("starlette_app").create_app(Authenticator(db.keys, db.membership))
    return _asgi_with_pid(app)


class _OpenedInLoop:
    """Opens an async database when the server's lifespan starts, closes it after its end."""

    def __init__(self, app: Any, database: AsyncPostgresDatabase) -> None:
        self.app = app
        self.database = database

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            async with self.database:
                await self.app(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def _async_asgi() -> Any:
    url = _url()
    if not _postgres(url):
        return _asgi()
    from keyturn.stores.postgres import AsyncPostgresDatabase

    adb = AsyncPostgresDatabase(url, max_size=POOL_SIZE)
    app = load_example("starlette_app").create_app(Authenticator(adb.keys, adb.membership))
    return _OpenedInLoop(_asgi_with_pid(app), adb)


def _console() -> Any:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from keyturn import KeyManager
    from keyturn.console import Console

    db = _database()
    console = Console(
        KeyManager(db.keys, db.membership),
        signed_in=lambda request: request.cookies.get("account"),
        sign_in_url="/sign-in",
    )
    return Starlette(routes=[Mount("/console", app=console.asgi())])


def _wsgi() -> Any:
    db = _database()
    app = load_example("flask_app").create_app(Authenticator(db.keys, db.membership))

    def with_pid(environ: Any, start_response: Any) -> Any:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            return start_response(status, [*headers, (WORKER_HEADER, str(os.getpid()))], exc_info)

        return app(environ, start)

    return with_pid


def _preloaded_wsgi() -> Any:
    from werkzeug.test import Client

    app = _wsgi()
    headers = {"Authorization": f"Bearer {os.environ[WARM_UP_KEY]}", "x-organization-id": "default"}
    response = Client(app).get("/managed-agents/v1/models", headers=headers)
    if response.status_code != 200:
        raise RuntimeError(f"the start-up check got {response.status_code}")
    return app


_BUILDERS = {
    "asgi": _asgi,
    "async_asgi": _async_asgi,
    "console": _console,
    "preloaded_wsgi": _preloaded_wsgi,
    "wsgi": _wsgi,
}
_BUILT: dict[str, Any] = {}


def make_async_asgi() -> Any:
    """``:async_asgi``, for servers that call a factory (hypercorn: ``make_async_asgi()``)."""
    return __getattr__("async_asgi")


def __getattr__(name: str) -> Any:
    if name not in _BUILDERS:
        raise AttributeError(name)
    if name not in _BUILT:
        _BUILT[name] = _BUILDERS[name]()
    return _BUILT[name]
