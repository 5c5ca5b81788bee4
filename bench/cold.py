"""Section 4: a key's first request in a process, alone and in a crowd.

A key's secret is stored as its SHA-256 (D2): the first request with a key costs one store
read and one hash, and runs no argon2; nothing is cached, nothing waits on a pool. A key
made before SHA-256 holds an argon2id hash: its first request runs argon2 once and replaces
the hash, its next ones none, and concurrent first requests with it share that one run
(through the ASGI middleware, ``asyncio.gather``, and the WSGI middleware, threads). Argon2
runs are counted (``keyturn._core.hashing.legacy_verifications``), not inferred from times.
"""

from __future__ import annotations

import asyncio
import hashlib
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from starlette.middleware import Middleware

from bench._apps import (
    MODELS,
    Reply,
    asgi_call,
    flask_app,
    http_scope,
    starlette_app,
    wsgi_call,
    wsgi_environ,
)
from bench._core import Report, Settings, Table, us
from bench._world import legacy_key, memory_world, new_key
from keyturn import Authenticator, AuthRequest, Principal
from keyturn._core import hashing as _hashing
from keyturn._core import token as _token
from keyturn.asgi import ApiKeyMiddleware
from keyturn.wsgi import ApiKeyMiddleware as WSGIApiKeyMiddleware

__all__ = ["run"]

NAME: Final = "cold"
TITLE: Final = "4. Cold path: a key's first request, alone and with concurrent first requests"


def _sha256_ns(samples: int) -> list[int]:
    """Nanoseconds of one bare SHA-256 of a secret (what a request's check costs)."""
    secret = _token.generate().secret.encode("ascii")
    durations = []
    for _ in range(samples):
        start = time.perf_counter_ns()
        hashlib.sha256(secret).hexdigest()
        durations.append(time.perf_counter_ns() - start)
    return durations


def _runs() -> int:
    return _hashing.legacy_verifications


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    store, membership, _keys = memory_world()
    authenticator = Authenticator(store, membership)
    asgi = starlette_app(Middleware(ApiKeyMiddleware, authenticator=authenticator))
    wsgi = WSGIApiKeyMiddleware(flask_app().wsgi_app, authenticator=authenticator)
    loop = asyncio.new_event_loop()
    timed: dict[str, list[int]] = {}
    runs: dict[str, list[int]] = {}

    def decide(name: str, token: str) -> None:
        request = AuthRequest(authorization=(f"Bearer {token}",), path=MODELS)
        before = _runs()
        start = time.perf_counter_ns()
        outcome = authenticator.authenticate(request)
        timed.setdefault(name, []).append(time.perf_counter_ns() - start)
        runs.setdefault(name, []).append(_runs() - before)
        if not isinstance(outcome, Principal):
            raise RuntimeError(f"a key was refused: {outcome!r}")

    crowds: dict[str, tuple[int, int, int]] = {}  # way in -> (answered 200, runs, wall ns)
    n = settings.concurrency
    try:
        for _ in range(settings.cold_keys):
            for kind, make in (("fresh", new_key), ("legacy", legacy_key)):
                token = make(store, membership)
                decide(f"{kind}: first request", token)
                decide(f"{kind}: second request", token)
            # Through the ASGI middleware: the first request of another fresh key.
            scope = http_scope([("authorization", f"Bearer {new_key(store, membership)}")])
            before = _runs()
            start = time.perf_counter_ns()
            reply = loop.run_until_complete(asgi_call(asgi, scope))
            timed.setdefault("asgi: fresh key, first request", []).append(
                time.perf_counter_ns() - start
            )
            runs.setdefault("asgi: fresh key, first request", []).append(_runs() - before)
            if reply.status != 200:
                raise RuntimeError(f"a fresh key was refused: {reply.status}")

        # N concurrent first requests with one legacy key, through ASGI: one argon2 run.
        scope = http_scope([("authorization", f"Bearer {legacy_key(store, membership)}")])

        async def crowd() -> list[Reply]:
            return list(await asyncio.gather(*(asgi_call(asgi, scope) for _ in range(n))))

        before = _runs()
        start = time.perf_counter_ns()
        replies = loop.run_until_complete(crowd())
        wall = time.perf_counter_ns() - start
        crowds["asgi: asyncio.gather"] = (
            sum(reply.status == 200 for reply in replies),
            _runs() - before,
            wall,
        )

        # ... and through WSGI, from N threads released together.
        environ = wsgi_environ({"Authorization": f"Bearer {legacy_key(store, membership)}"})
        barrier = threading.Barrier(n)
        statuses: list[int] = []
        lock = threading.Lock()

        def one() -> None:
            barrier.wait(timeout=30)
            status = wsgi_call(wsgi, environ).status
            with lock:
                statuses.append(status)

        threads = [threading.Thread(target=one) for _ in range(n)]
        before = _runs()
        start = time.perf_counter_ns()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        crowds["wsgi: threads"] = (
            statuses.count(200),
            _runs() - before,
            time.perf_counter_ns() - start,
        )
        if any(thread.is_alive() for thread in threads):
            raise RuntimeError("a WSGI thread did not finish within 60 s")
    finally:
        loop.close()
        authenticator.close()
    sha256 = _sha256_ns(max(3, settings.cold_keys))

    def each(name: str) -> str:
        seen = sorted(set(runs[name]))
        return str(seen[0]) if len(seen) == 1 else str(seen)

    table = Table(
        f"first request of a key ({settings.cold_keys} keys each way)",
        ["request", "min us", "median us", "argon2 runs (each)"],
    )
    table.add("bare SHA-256 of a secret", us(min(sha256), 2), us(statistics.median(sha256), 2), "-")
    for name in timed:
        table.add(name, us(min(timed[name]), 1), us(statistics.median(timed[name]), 1), each(name))
    report.tables.append(table)
    crowd_table = Table(
        f"{n} concurrent first requests with one legacy (argon2id) key",
        ["way in", "answered 200", "argon2 runs", "wall time us"],
    )
    for way, (ok, ran, ns) in crowds.items():
        crowd_table.add(way, f"{ok}/{n}", ran, us(ns, 0))
    report.tables.append(crowd_table)

    facts: dict[str, Any] = report.facts
    counted: Callable[[str], list[int]] = runs.__getitem__
    facts["fresh.first.argon2_runs_max"] = max(counted("fresh: first request"))
    facts["fresh.second.argon2_runs_max"] = max(counted("fresh: second request"))
    facts["legacy.first.argon2_runs_min"] = min(counted("legacy: first request"))
    facts["legacy.first.argon2_runs_max"] = max(counted("legacy: first request"))
    facts["legacy.second.argon2_runs_max"] = max(counted("legacy: second request"))
    facts["crowd.asgi_argon2_runs"] = crowds["asgi: asyncio.gather"][1]
    facts["crowd.wsgi_argon2_runs"] = crowds["wsgi: threads"][1]
    facts["crowd.asgi_ok"] = crowds["asgi: asyncio.gather"][0]
    facts["crowd.wsgi_ok"] = crowds["wsgi: threads"][0]
    facts["crowd.size"] = n
    facts["sha256.median_ns"] = statistics.median(sha256)
    fresh = set(counted("fresh: first request")) | set(counted("asgi: fresh key, first request"))
    report.bar(
        "cold path: one read and one SHA-256, no argon2",
        f"{max(fresh)} argon2 runs on a fresh key's first request",
        "0",
        fresh == {0},
    )
    legacy_first, legacy_second = (
        counted("legacy: first request"),
        counted("legacy: second request"),
    )
    report.bar(
        "a legacy argon2id key: argon2 once, then its hash replaced",
        f"{min(legacy_first)}..{max(legacy_first)} on its first request, "
        f"{max(legacy_second)} on the second",
        "1, then 0",
        set(legacy_first) == {1} and set(legacy_second) == {0},
    )
    asgi_ok, asgi_runs, _ = crowds["asgi: asyncio.gather"]
    wsgi_ok, wsgi_runs, _ = crowds["wsgi: threads"]
    report.bar(
        f"{n} concurrent first requests with one legacy key share one argon2 run",
        f"ASGI {asgi_runs}, WSGI {wsgi_runs}",
        "1 each, all 200",
        asgi_runs == 1 and wsgi_runs == 1 and asgi_ok == n and wsgi_ok == n,
    )
    return report
