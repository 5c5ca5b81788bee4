"""Section 6: the warm path through the Authenticator on each store keyturn ships.

A warm request reads the key record and the caller's role on every request (so a revoke or
a removed membership acts on the very next one): two reads. This section shows what those
cost on the memory, SQLite and PostgreSQL stores, through both drivers:

- ``authenticate()`` (the WSGI driver). With the default ``timeout=5`` a blocking store is
  called through a watchdog thread so the timeout can be enforced, unless it bounds its own
  calls (SQLite does); ``timeout=None`` calls it in the caller's thread.
- ``authenticate_async()`` (the ASGI driver): SQLite through one trip to a call thread per
  read (argon2 has threads of its own), PostgreSQL through its async pool on the event loop.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable, Coroutine
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Final

from bench._apps import MODELS
from bench._core import Batch, Report, Settings, Table, paired, times, us
from bench._databases import postgres_schema, postgres_unavailable
from bench._world import memory_world, seed
from keyturn import Authenticator, AuthRequest, Principal

__all__ = ["run", "sync_batch"]

NAME: Final = "stores"
TITLE: Final = "6. Store cost: warm path per request on memory, SQLite and PostgreSQL"

Run = Callable[[Coroutine[Any, Any, Any]], Any]


def sync_batch(authenticator: Authenticator, requests: list[AuthRequest]) -> Batch:
    """Authenticate n requests, cycling through *requests*."""
    count = len(requests)

    def batch(n: int) -> int:
        start = time.perf_counter_ns()
        for index in range(n):
            authenticator.authenticate(requests[index % count])
        return time.perf_counter_ns() - start

    return batch


def async_batch(run: Run, authenticator: Authenticator, requests: list[AuthRequest]) -> Batch:
    count = len(requests)

    async def many(n: int) -> int:
        start = time.perf_counter_ns()
        for index in range(n):
            await authenticator.authenticate_async(requests[index % count])
        return time.perf_counter_ns() - start

    def batch(n: int) -> int:
        elapsed: int = run(many(n))
        return elapsed

    return batch


def _warm(run: Run, authenticator: Authenticator, request: AuthRequest, sync: bool) -> None:
    outcome = (
        authenticator.authenticate(request)
        if sync
        else run(authenticator.authenticate_async(request))
    )
    if not isinstance(outcome, Principal):
        raise RuntimeError(f"the warm-up request was refused: {outcome!r}")


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    loop = asyncio.new_event_loop()
    run_async: Run = loop.run_until_complete
    variants: dict[str, tuple[Authenticator, AuthRequest, bool]] = {}
    postgres_skipped = postgres_unavailable(settings.postgres_dsn)
    with ExitStack() as stack:
        stack.callback(loop.close)

        def authenticator(store: Any, membership: Any, **options: Any) -> Authenticator:
            made = Authenticator(store, membership, **options)
            stack.callback(made.close)
            return made

        def request(token: str) -> AuthRequest:
            return AuthRequest(authorization=(f"Bearer {token}",), path=MODELS)

        store, membership, keys = memory_world()
        memory = authenticator(store, membership)
        variants["memory: authenticate()"] = (memory, request(keys.organization), True)
        variants["memory: authenticate_async()"] = (memory, request(keys.organization), False)

        from keyturn.stores.sqlite import SQLiteDatabase

        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="keyturn-bench-"))
        sqlite = stack.enter_context(SQLiteDatabase(Path(folder) / "bench.sqlite3"))
        sqlite.create_schema()
        token = seed(sqlite.keys, sqlite.membership, tenant_key=False).organization
        variants["sqlite: authenticate(), timeout=5 s (bounds itself)"] = (
            authenticator(sqlite.keys, sqlite.membership),
            request(token),
            True,
        )
        variants["sqlite: authenticate(), timeout=None (caller's thread)"] = (
            authenticator(sqlite.keys, sqlite.membership, timeout=None),
            request(token),
            True,
        )
        variants["sqlite: authenticate_async() (a thread per read)"] = (
            authenticator(sqlite.keys, sqlite.membership),
            request(token),
            False,
        )

        if postgres_skipped is None:
            assert settings.postgres_dsn is not None
            from keyturn.stores.postgres import AsyncPostgresDatabase, PostgresDatabase

            url = stack.enter_context(postgres_schema(settings.postgres_dsn))
            postgres = stack.enter_context(PostgresDatabase(url, min_size=2, max_size=4))
            postgres.create_schema()
            token = seed(postgres.keys, postgres.membership, tenant_key=False).organization
            variants["postgres: authenticate(), timeout=5 s (watchdog thread)"] = (
                authenticator(postgres.keys, postgres.membership),
                request(token),
                True,
            )
            variants["postgres: authenticate(), timeout=None (caller's thread)"] = (
                authenticator(postgres.keys, postgres.membership, timeout=None),
                request(token),
                True,
            )
            apostgres = AsyncPostgresDatabase(url, min_size=2, max_size=4)
            run_async(apostgres.open())
            stack.callback(lambda: run_async(apostgres.close()))
            variants["postgres: authenticate_async() (async pool)"] = (
                authenticator(apostgres.keys, apostgres.membership),
                request(token),
                False,
            )
        else:
            report.notes.append(f"PostgreSQL skipped: {postgres_skipped}")

        for auth, warm_request, sync in variants.values():
            _warm(run_async, auth, warm_request, sync)
        batches = {
            name: (
                sync_batch(auth, [warm_request])
                if sync
                else async_batch(run_async, auth, [warm_request])
            )
            for name, (auth, warm_request, sync) in variants.items()
        }
        sizes = {
            name: settings.batch if name.startswith("memory") else settings.slow_batch
            for name in variants
        }
        result = paired(batches, reps=settings.reps, n=sizes)

    table = Table(
        f"warm path per request (organization key: key read + role read), "
        f"{settings.reps} paired repetitions",
        ["store and driver", "min us/req", "median us/req", "/ memory (same driver)"],
    )
    for name in variants:
        reference = (
            "memory: authenticate()" if "authenticate()" in name else "memory: authenticate_async()"
        )
        versus = "-" if name == reference else times(result.ratio(name, reference))
        table.add(name, us(result.min(name)), us(result.median(name)), versus)
        report.facts[f"{name}.median_ns"] = result.median(name)
    report.tables.append(table)
    report.facts["postgres_skipped"] = float(postgres_skipped is not None)
    return report
