"""Section 4: a key's first request in a process, alone and in a crowd.

The first request with a key runs argon2 once; the next ones hit the verified-token cache.
Concurrent first requests with the same new key share that one run (single flight), both
through the ASGI middleware (``asyncio.gather``) and through the WSGI middleware (threads).
Argon2 runs are counted, not inferred from times.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from typing import Final

from argon2.low_level import Type, verify_secret
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
from bench._world import memory_world, new_key
from keyturn import Authenticator, AuthRequest, Principal, _token
from keyturn._hashing import KEY_PROFILE, hash_secret
from keyturn.asgi import ApiKeyMiddleware
from keyturn.wsgi import ApiKeyMiddleware as WSGIApiKeyMiddleware

__all__ = ["run"]

NAME: Final = "cold"
TITLE: Final = "4. Cold path: a key's first request, alone and with concurrent first requests"


def _argon2_ns(samples: int) -> list[int]:
    """Nanoseconds of one bare argon2id verification with the key profile."""
    secret = _token.generate().secret.encode("ascii")
    encoded = hash_secret(secret.decode("ascii")).encode("ascii")
    durations = []
    for _ in range(samples):
        start = time.perf_counter_ns()
        verify_secret(encoded, secret, Type.ID)
        durations.append(time.perf_counter_ns() - start)
    return durations


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    store, membership, _keys = memory_world()
    authenticator = Authenticator(store, membership)
    asgi = starlette_app(Middleware(ApiKeyMiddleware, authenticator=authenticator))
    wsgi = WSGIApiKeyMiddleware(flask_app().wsgi_app, authenticator=authenticator)
    verifier = authenticator.verifier
    loop = asyncio.new_event_loop()
    first_direct: list[int] = []
    first_asgi: list[int] = []
    second_direct: list[int] = []
    runs_first: list[int] = []
    runs_second: list[int] = []
    try:
        for _ in range(settings.cold_keys):
            # Through the Authenticator: the first request, then the second (warm).
            request = AuthRequest(
                authorization=(f"Bearer {new_key(store, membership)}",), path=MODELS
            )
            for durations, runs in ((first_direct, runs_first), (second_direct, runs_second)):
                before = verifier.runs
                start = time.perf_counter_ns()
                outcome = authenticator.authenticate(request)
                durations.append(time.perf_counter_ns() - start)
                runs.append(verifier.runs - before)
                if not isinstance(outcome, Principal):
                    raise RuntimeError(f"a fresh key was refused: {outcome!r}")
            # Through the ASGI middleware: the first request of another fresh key.
            scope = http_scope([("authorization", f"Bearer {new_key(store, membership)}")])
            before = verifier.runs
            start = time.perf_counter_ns()
            reply = loop.run_until_complete(asgi_call(asgi, scope))
            first_asgi.append(time.perf_counter_ns() - start)
            runs_first.append(verifier.runs - before)
            if reply.status != 200:
                raise RuntimeError(f"a fresh key was refused: {reply.status}")

        # N concurrent first requests with one new key, through ASGI: one argon2 run.
        scope = http_scope([("authorization", f"Bearer {new_key(store, membership)}")])
        n = settings.concurrency

        async def crowd() -> list[Reply]:
            return list(await asyncio.gather(*(asgi_call(asgi, scope) for _ in range(n))))

        before = verifier.runs
        start = time.perf_counter_ns()
        replies = loop.run_until_complete(crowd())
        asgi_crowd_ns = time.perf_counter_ns() - start
        asgi_crowd_runs = verifier.runs - before
        asgi_ok = sum(reply.status == 200 for reply in replies)

        # ... and through WSGI, from N threads released together.
        environ = wsgi_environ({"Authorization": f"Bearer {new_key(store, membership)}"})
        barrier = threading.Barrier(n)
        statuses: list[int] = []
        lock = threading.Lock()

        def one() -> None:
            barrier.wait(timeout=30)
            status = wsgi_call(wsgi, environ).status
            with lock:
                statuses.append(status)

        threads = [threading.Thread(target=one) for _ in range(n)]
        before = verifier.runs
        start = time.perf_counter_ns()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        wsgi_crowd_ns = time.perf_counter_ns() - start
        wsgi_crowd_runs = verifier.runs - before
        wsgi_ok = statuses.count(200)
        if any(thread.is_alive() for thread in threads):
            raise RuntimeError("a WSGI thread did not finish within 60 s")
    finally:
        loop.close()
        authenticator.close()
    argon2 = _argon2_ns(max(3, settings.cold_keys))

    table = Table(
        f"first request of a fresh key ({settings.cold_keys} keys each way)",
        ["request", "min us", "median us", "argon2 runs (each)"],
    )
    table.add(
        "bare argon2id verify (m=8 MiB, t=1, p=1)",
        us(min(argon2), 0),
        us(statistics.median(argon2), 0),
        "-",
    )
    table.add(
        "authenticator: first request",
        us(min(first_direct), 0),
        us(statistics.median(first_direct), 0),
        "1" if set(runs_first) == {1} else str(sorted(set(runs_first))),
    )
    table.add(
        "authenticator: second request (warm)",
        us(min(second_direct), 1),
        us(statistics.median(second_direct), 1),
        "0" if set(runs_second) == {0} else str(sorted(set(runs_second))),
    )
    table.add(
        "asgi: first request", us(min(first_asgi), 0), us(statistics.median(first_asgi), 0), "1"
    )
    report.tables.append(table)
    crowd_table = Table(
        f"{n} concurrent first requests with one new key",
        ["way in", "answered 200", "argon2 runs", "wall time us"],
    )
    crowd_table.add("asgi: asyncio.gather", f"{asgi_ok}/{n}", asgi_crowd_runs, us(asgi_crowd_ns, 0))
    crowd_table.add("wsgi: threads", f"{wsgi_ok}/{n}", wsgi_crowd_runs, us(wsgi_crowd_ns, 0))
    report.tables.append(crowd_table)

    report.facts["first.argon2_runs_max"] = max(runs_first)
    report.facts["first.argon2_runs_min"] = min(runs_first)
    report.facts["second.argon2_runs_max"] = max(runs_second)
    report.facts["crowd.asgi_argon2_runs"] = asgi_crowd_runs
    report.facts["crowd.wsgi_argon2_runs"] = wsgi_crowd_runs
    report.facts["crowd.asgi_ok"] = asgi_ok
    report.facts["crowd.wsgi_ok"] = wsgi_ok
    report.facts["crowd.size"] = n
    report.facts["argon2.median_ns"] = statistics.median(argon2)
    report.bar(
        "cold path: exactly one argon2 verification per new key",
        f"{min(runs_first)}..{max(runs_first)} per first request, {max(runs_second)} on the second",
        "1, then 0",
        set(runs_first) == {1} and set(runs_second) == {0},
    )
    report.bar(
        f"{n} concurrent first requests share one verification",
        f"ASGI {asgi_crowd_runs}, WSGI {wsgi_crowd_runs}",
        "1 each, all 200",
        asgi_crowd_runs == 1 and wsgi_crowd_runs == 1 and asgi_ok == n and wsgi_ok == n,
    )
    report.notes.append(
        f"argon2 profile: {KEY_PROFILE.type.name.lower()}, m={KEY_PROFILE.memory_cost} KiB, "
        f"t={KEY_PROFILE.time_cost}, p={KEY_PROFILE.parallelism}"
    )
    return report
