"""One store's warm requests in process, for callgrind or strace: ``python -m bench._store_count``.

``python -m bench._store_count STORE N [WHERE]`` builds an Authenticator (defaults) on the
memory store, a ``SQLiteDatabase`` (WHERE: the file) or a ``PostgresDatabase`` (WHERE: its
URL, a schema of its own), creates the world's organization key, warms it (its first use
written, the replica current, the PostgreSQL listener in place), and then runs *N* warm
``authenticate()`` calls between two calls of ``os.getppid()``. Under
``valgrind --tool=callgrind --dump-before=getppid`` the second part holds the *N* requests
and nothing else (user-space instructions); under ``strace -f`` the system calls between
the two ``getppid`` calls of the main thread are the *N* requests' own.

It prints one JSON line: the store, *N*, and whether every request was accepted.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from bench._apps import MODELS
from bench._world import memory_world, seed
from keyturn import Authenticator, AuthRequest, Principal

__all__ = ["main"]


def _database(store: str, where: str) -> Any:
    if store == "sqlite":
        from keyturn.stores.sqlite import SQLiteDatabase

        return SQLiteDatabase(where)
    from keyturn.stores.postgres import PostgresDatabase

    db = PostgresDatabase(where)
    db.create_schema()
    return db


def _quiet(auth: Authenticator, db: Any, request: AuthRequest) -> None:
    """Until the warm-up's use is written and heard, the listener (if any) in place."""
    deadline = time.monotonic() + 30
    while True:
        usage = auth.usage
        idle = usage is None or not usage._queue.unfinished_tasks
        current = db is None or db.changes() is not None
        if idle and current:
            break
        if time.monotonic() > deadline:
            raise SystemExit("the warm-up's writes or the listener did not settle in 30 s")
        time.sleep(0.01)
    for _ in range(3):  # the replica refilled after the writes' changes
        auth.authenticate(request)
    time.sleep(0.2)


def main(argv: list[str]) -> None:
    if len(argv) not in (2, 3):
        raise SystemExit("usage: python -m bench._store_count memory|sqlite|postgres N [WHERE]")
    store, n = argv[0], int(argv[1])
    db = None
    if store == "memory":
        keys, membership, tokens = memory_world()
    else:
        db = _database(store, argv[2])
        keys, membership = db.keys, db.membership
        tokens = seed(keys, membership, tenant_key=False)
    auth = Authenticator(keys, membership)
    request = AuthRequest(authorization=(f"Bearer {tokens.organization}",), path=MODELS)
    try:
        _quiet(auth, db, request)
        accepted = 0
        for _ in range(max(20, n // 4)):  # warm-up: caches, first allocations
            auth.authenticate(request)
        os.getppid()  # part 1 ends
        for _ in range(n):
            accepted += isinstance(auth.authenticate(request), Principal)
        os.getppid()  # part 2 (the n requests) ends
    finally:
        auth.close()
        if db is not None:
            db.close()
    print(json.dumps({"store": store, "n": n, "accepted": accepted == n}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
