"""The server process of the real-HTTP section: ``python -m bench._server VARIANT [CPU]``.

Builds the benchmark world and the Starlette list-models app (bare, behind the same-work
floor middleware, or behind keyturn), pins itself to core *CPU* when given, binds a socket
on 127.0.0.1 to a free port, prints one JSON line -- the port and a valid
organization-scoped key -- and serves with uvicorn (httptools and uvloop, as in
production) until it receives SIGTERM. The parent reads the line, loads the server, reads
this process's CPU time from ``/proc``, and stops it by its PID.
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

__all__ = ["HTTP", "LOOP", "VARIANTS", "main"]

VARIANTS: Final = ("bare", "floor", "keyturn")
# The production stack: uvicorn's C-accelerated HTTP parser and event loop.
HTTP: Final = "httptools"
LOOP: Final = "uvloop"


def build(variant: str) -> tuple[Any, str]:
    w = world()
    if variant == "bare":
        app = starlette_app()
    elif variant == "floor":
        app = starlette_app(Middleware(SameWorkFloorASGI, keys=w.table, rule=w.rule))
    else:
        app = starlette_app(Middleware(ApiKeyMiddleware, authenticator=w.authenticator))
    return app, w.keys.organization


def main(argv: list[str]) -> None:
    if len(argv) not in (1, 2) or argv[0] not in VARIANTS:
        raise SystemExit(f"usage: python -m bench._server {{{'|'.join(VARIANTS)}}} [CPU]")
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
        lifespan="off",
        backlog=64,
        timeout_keep_alive=30,
        http=HTTP,
        loop=LOOP,
    )
    print(json.dumps({"port": sock.getsockname()[1], "token": token}), flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main(sys.argv[1:])
