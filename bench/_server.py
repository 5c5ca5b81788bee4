"""The server process of the real-HTTP sections: ``python -m bench._server VARIANT [CPU]``.

Builds the benchmark world and the Starlette list-models app (bare, behind the same-work
floor middleware, or behind keyturn), pins itself to core *CPU* when given, binds a socket
on 127.0.0.1 to a free port, prints one JSON line -- the port and a valid
organization-scoped key -- and serves with uvicorn (httptools and uvloop, as in
production) until it receives SIGTERM. The parent reads the line, loads the server, reads
this process's CPU time from ``/proc``, and stops it by its PID.

The store variants (section 6) serve keyturn on the database named by
``$KEYTURN_BENCH_STORE``: ``keyturn-postgres`` on an ``AsyncPostgresDatabase`` (a URL whose
schema is empty: it is created and seeded here; the pool opens on the server's lifespan
start-up), ``keyturn-postgres-sync`` on a ``PostgresDatabase`` (the same URL form; the
middleware answers from its replica in place and sends a miss to a thread),
``keyturn-sqlite`` on a ``SQLiteDatabase`` (a path: a new file).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any, Final

import uvicorn
from starlette.middleware import Middleware

from bench._apps import SameWorkFloorASGI, starlette_app
from bench._variants import world
from keyturn.asgi import ApiKeyMiddleware

__all__ = ["HTTP", "LOOP", "STORE_ENV", "STORE_VARIANTS", "VARIANTS", "main"]

VARIANTS: Final = ("bare", "floor", "keyturn")
STORE_VARIANTS: Final = ("keyturn-postgres", "keyturn-postgres-sync", "keyturn-sqlite")
STORE_ENV: Final = "KEYTURN_BENCH_STORE"
# The production stack: uvicorn's C-accelerated HTTP parser and event loop.
HTTP: Final = "httptools"
LOOP: Final = "uvloop"


class _OpenedOnStartup:
    """Opens an async database on the lifespan's start-up and closes it on shutdown."""

    def __init__(self, app: Any, database: Any) -> None:
        self.app = app
        self.database = database

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.database.open()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.database.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def build_store(variant: str, where: str) -> tuple[Any, str]:
    """keyturn in front of the app, on the database *where* names; the app and a key."""
    from bench._world import seed
    from keyturn import Authenticator

    if variant.startswith("keyturn-postgres"):
        from keyturn.stores.postgres import AsyncPostgresDatabase, PostgresDatabase

        with PostgresDatabase(where, replica=False) as seeding:
            seeding.create_schema()
            token = seed(seeding.keys, seeding.membership, tenant_key=False).organization
        sync = variant == "keyturn-postgres-sync"
        database: Any = PostgresDatabase(where) if sync else AsyncPostgresDatabase(where)
    else:
        from keyturn.stores.sqlite import SQLiteDatabase

        database = SQLiteDatabase(where)
        token = seed(database.keys, database.membership, tenant_key=False).organization
    authenticator = Authenticator(database.keys, database.membership)
    app = starlette_app(Middleware(ApiKeyMiddleware, authenticator=authenticator))
    if variant == "keyturn-postgres":
        app = _OpenedOnStartup(app, database)
    return app, token


def build(variant: str) -> tuple[Any, str]:
    if variant in STORE_VARIANTS:
        return build_store(variant, os.environ[STORE_ENV])
    w = world()
    if variant == "bare":
        app = starlette_app()
    elif variant == "floor":
        app = starlette_app(Middleware(SameWorkFloorASGI, keys=w.table, rule=w.rule))
    else:
        app = starlette_app(Middleware(ApiKeyMiddleware, authenticator=w.authenticator))
    return app, w.keys.organization


def main(argv: list[str]) -> None:
    known = (*VARIANTS, *STORE_VARIANTS)
    if len(argv) not in (1, 2) or argv[0] not in known:
        raise SystemExit(f"usage: python -m bench._server {{{'|'.join(known)}}} [CPU]")
    if len(argv) == 2:
        os.sched_setaffinity(0, {int(argv[1])})
    app, token = build(argv[0])
    # proto=IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when
    # the listening socket says TCP; without it each response waits on a delayed ACK (40 ms).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on" if argv[0] == "keyturn-postgres" else "off",
        backlog=64,
        timeout_keep_alive=30,
        http=HTTP,
        loop=LOOP,
    )
    print(json.dumps({"port": sock.getsockname()[1], "token": token}), flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main(sys.argv[1:])
