"""Section: rate limits on the request path (D33), counted.

1. **Instructions**: a warm request through keyturn's ASGI middleware with a limit per key
   and per account configured (in process, admitted from the process's lease) over the
   same request without one, the whole request counted by callgrind (``bench._count``).
2. **Round trips** to a shared engine (Redis, PostgreSQL) per request at steady state:
   requests through the middleware in process, four instances assumed (the slices they
   take), the engine's leases counted after the first one of each policy.
3. **Accuracy**: two uvicorn servers of two workers each (four processes, one limiter
   each) on loopback, over one SQLite file, sharing one engine; four client processes
   hammer one key (and so one account) for the run's seconds. Every decision is logged by
   its worker with the instant the limiter decided for, and the run is replayed against
   the sliding window counter: admitted per window (<= 1.05 L), and refusals while the
   count stood below 0.95 L (false 429s, none expected). Every server is stopped by its
   process id, and its workers with it.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any, Final

from bench._core import Report, Settings, Table, Target
from bench._databases import postgres_schema, postgres_unavailable

__all__ = ["run"]

NAME: Final = "ratelimits"
TITLE: Final = "Rate limits: instructions with a limit, round trips, accuracy across processes"
ROOT: Final = Path(__file__).resolve().parents[1]
REDIS_ENV: Final = "KEYTURN_TEST_REDIS_URL"
REDIS_DEFAULT: Final = "redis://127.0.0.1:6379/0"
INSTANCES: Final = 4  # worker processes sharing the engine in the accuracy run
CLIENTS: Final = 4  # client processes, one request in flight each


# --- 1. instructions ---------------------------------------------------------------------


def _instructions(report: Report, settings: Settings) -> None:
    from bench.instructions import count, valgrind_missing

    missing = valgrind_missing()
    names = ("starlette.keyturn", "starlette.keyturn-limited", "starlette.bare")
    counted = settings.count_variants
    if missing is None and counted is not None and not set(names) <= set(counted):
        missing = "these settings count other variants only"
    if missing is not None:
        report.notes.append(f"instructions skipped: {missing}")
        return
    n = settings.count_requests
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        plain, limited, bare = pool.map(lambda name: count(name, n), names)
    table = Table(
        f"instructions per warm ASGI request, {n} requests, one valgrind run each",
        ["variant", "instructions/req"],
    )
    table.add("starlette: bare", f"{bare:,.0f}")
    table.add("starlette: keyturn", f"{plain:,.0f}")
    table.add("starlette: keyturn, limit per key and account", f"{limited:,.0f}")
    report.tables.append(table)
    report.facts["limited/plain"] = limited / plain
    report.targets.append(
        Target(
            "warm ASGI request with a limit / without, instructions, whole request",
            limited / plain,
            "<=",
            1.15,
            f"{limited:,.0f} vs {plain:,.0f} instr",
        )
    )


# --- 2. round trips ----------------------------------------------------------------------


def _round_trips_one(engine: Any, quota: int, n: int) -> tuple[int, int]:
    """Leases (round trips) over *n* warm requests after the first, for a limit of *quota*
    per hour per key and per account, four instances assumed."""
    import asyncio

    from starlette.middleware import Middleware

    from bench._apps import asgi_batch, http_scope, starlette_app
    from bench._world import memory_world
    from keyturn import Authenticator
    from keyturn.asgi import ApiKeyMiddleware
    from keyturn.ratelimits import Rate, RateLimiter, RateLimits

    store, membership, keys = memory_world()
    limits = RateLimits(key=Rate(quota, 3600), account=Rate(quota, 3600))
    limiter = RateLimiter(limits, engine=engine, instances=INSTANCES)
    with Authenticator(store, membership, rate_limiter=limiter) as authenticator:
        app = starlette_app(Middleware(ApiKeyMiddleware, authenticator=authenticator))
        scope = http_scope([("authorization", f"Bearer {keys.organization}")])
        loop = asyncio.new_event_loop()
        try:
            batch = asgi_batch(loop.run_until_complete, app, scope)
            batch(1)  # the cold request, and each policy's first lease
            before = limiter.stats.leases
            batch(n)
        finally:
            loop.close()
    if limiter.stats.faults or limiter.stats.refused:
        raise RuntimeError(f"the round-trip run was not clean: {limiter.stats}")
    return limiter.stats.leases - before, n


def _round_trips(report: Report, settings: Settings) -> None:
    table = Table(
        "round trips to the shared engine per request at steady state (counted), two "
        "policies (key, account), four instances",
        ["engine", "quota per policy", "slice", "requests", "round trips", "per request"],
    )
    n = max(200, settings.batch * 2)
    engines: list[tuple[str, Any]] = []
    with ExitStack() as stack:
        redis_url = os.environ.get(REDIS_ENV, REDIS_DEFAULT)
        why_redis = _redis_unavailable(redis_url)
        if why_redis is None:
            from keyturn.ratelimits.redis import RedisEngine

            prefix = f"keyturn-bench:{os.getpid()}:{secrets.token_hex(4)}:"
            engines.append(("redis", lambda: RedisEngine(redis_url, prefix=prefix)))
            stack.callback(_redis_clean, redis_url, prefix)
        else:
            report.notes.append(f"Redis skipped: {why_redis}")
        why_postgres = postgres_unavailable(settings.postgres_dsn)
        if why_postgres is None and settings.postgres_dsn:
            from keyturn.ratelimits.postgres import PostgresEngine

            url = stack.enter_context(postgres_schema(settings.postgres_dsn))
            engines.append(("postgres", lambda: PostgresEngine(url)))
        else:
            report.notes.append(f"PostgreSQL skipped: {why_postgres}")
        worst = 0.0
        for name, make in engines:
            # The documented bound: 0.05 holds while q >= 400 x policies x instances.
            for quota in (400 * 2 * INSTANCES, 100 * n):
                engine = make()
                try:
                    trips, requests = _round_trips_one(engine, quota, min(n, quota // 2))
                finally:
                    engine.close()
                slice_ = max(1, math.floor(0.05 * quota / INSTANCES))
                per = trips / requests
                worst = max(worst, per)
                table.add(
                    name, f"{quota:,}", str(slice_), f"{requests:,}", str(trips), f"{per:.4f}"
                )
                report.facts[f"round_trips.{name}.{quota}"] = per
    if table.rows:
        report.tables.append(table)
        report.targets.append(
            Target(
                "round trips to the shared engine per request, steady state (worst row)",
                worst,
                "<=",
                0.05,
                "counted",
            )
        )


def _redis_unavailable(url: str) -> str | None:
    try:
        import redis
    except ImportError:
        return "redis-py is not installed (pip install 'keyturn[redis]')"
    try:
        with redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2) as client:
            client.ping()
    except redis.RedisError as exc:
        return f"cannot reach {url}: {type(exc).__name__}"
    return None


def _redis_clean(url: str, prefix: str) -> None:
    import redis

    with redis.Redis.from_url(url, socket_timeout=5) as client:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)


# --- 3. accuracy ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Uvicorn:
    """``uvicorn bench._limited_app:app --workers 2`` on a loopback port, stopped by PID."""

    def __init__(self, env: dict[str, str], workers: int) -> None:
        self.port = _free_port()
        self.mark = f"KEYTURN_BENCH_LIMIT_LOG={env['KEYTURN_BENCH_LIMIT_LOG']}".encode()
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 -- closed by stop()
        self.process = subprocess.Popen(  # noqa: S603 -- our interpreter, our module
            [
                sys.executable,
                "-m",
                "uvicorn",
                "bench._limited_app:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                str(workers),
                "--log-level",
                "warning",
                "--no-access-log",
                "--lifespan",
                "off",
            ],
            cwd=ROOT,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )

    def wait_ready(self, token: str, deadline: float) -> None:
        import http.client

        while time.monotonic() < deadline:  # bounded
            if self.process.poll() is not None:
                break
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                connection.request("GET", "/healthz")
                connection.getresponse().read()
                connection.close()
                return
            except OSError:
                time.sleep(0.1)
        self.log.seek(0)
        tail = self.log.read().decode("utf-8", "replace")[-1500:]
        raise RuntimeError(f"the limited server did not start: {tail}")

    def workers(self) -> list[int]:
        pid = self.process.pid
        try:
            with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as children:
                return [int(child) for child in children.read().split()]
        except OSError:
            return []

    def stop(self) -> None:
        """SIGTERM to the server by its PID (it stops its workers); any worker left then
        gets SIGKILL by its own PID."""
        workers = self.workers()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        for pid in workers:
            if self._ours(pid):  # still this server's worker, not a reused process id
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.log.close()

    def _ours(self, pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                return self.mark in environ.read().split(b"\0")
        except OSError:
            return False


def _hammer(port: int, token: str, start: float, end: float) -> Counter[int]:
    """One client: keep-alive requests to one server from *start* until *end*."""
    import http.client

    statuses: Counter[int] = Counter()
    headers = {"authorization": f"Bearer {token}"}
    while time.time() < start:  # bounded by the start the parent chose
        time.sleep(0.005)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(5_000_000):  # bounded
        if time.time() >= end:
            break
        connection.request("GET", "/managed-agents/v1/models", headers=headers)
        reply = connection.getresponse()
        reply.read()
        statuses[reply.status] += 1
    connection.close()
    return statuses


def replay(
    decisions: list[tuple[float, int]], quota: int, window: int, in_flight: int
) -> dict[str, Any]:
    """The run against the sliding window counter of its admitted requests: admitted per
    window, admissions past 1.05 x quota, refusals below 0.95 x quota (false 429s), with
    *in_flight* requests a count read at an instant may miss."""
    from keyturn.ratelimits._counts import weight_at

    admitted: Counter[int] = Counter()
    over = under = refused = 0
    for now, status in sorted(decisions):
        index = int(now // window)
        count = admitted[index - 1] * weight_at(now, window, index) + admitted[index]
        if status == 200:
            admitted[index] += 1
            if count + 1 > quota * 1.05:
                over += 1
        elif status == 429:
            refused += 1
            if count + in_flight < quota * 0.95:
                under += 1
    return {"admitted": dict(admitted), "over": over, "under": under, "refused": refused}


def _accuracy_one(
    engine: str, url: str, prefix: str, seconds: float, quota: int, window: int
) -> dict[str, Any]:
    from bench._world import seed
    from keyturn.stores.sqlite import SQLiteDatabase

    with tempfile.TemporaryDirectory(prefix="bench-limits-") as scratch:
        store = os.path.join(scratch, "keys.sqlite3")
        with SQLiteDatabase(store) as database:
            token = seed(database.keys, database.membership, tenant_key=False).organization
        logs = os.path.join(scratch, "decisions")
        os.mkdir(logs)
        env = {
            "KEYTURN_BENCH_LIMIT_STORE": store,
            "KEYTURN_BENCH_LIMIT_ENGINE": engine,
            "KEYTURN_BENCH_LIMIT_URL": url,
            "KEYTURN_BENCH_LIMIT_PREFIX": prefix,
            "KEYTURN_BENCH_LIMIT_QUOTA": str(quota),
            "KEYTURN_BENCH_LIMIT_WINDOW": str(window),
            "KEYTURN_BENCH_LIMIT_INSTANCES": str(INSTANCES),
            "KEYTURN_BENCH_LIMIT_LOG": logs,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        servers: list[_Uvicorn] = []
        try:
            for _ in range(2):
                servers.append(_Uvicorn(env, INSTANCES // 2))
            for server in servers:
                server.wait_ready(token, time.monotonic() + 60)
            # Aligned on a window, after the clients have started.
            start = (math.floor(time.time() / window) + 2) * window
            end = start + seconds
            context = multiprocessing.get_context("spawn")
            with context.Pool(CLIENTS) as pool:
                runs = pool.starmap(
                    _hammer,
                    [(servers[n % 2].port, token, start, end) for n in range(CLIENTS)],
                )
        finally:
            for server in servers:
                server.stop()
        decisions: list[tuple[float, int]] = []
        for name in os.listdir(logs):
            with open(os.path.join(logs, name), encoding="ascii") as log:
                for line in log:
                    stamp, status = line.split()
                    decisions.append((float(stamp), int(status)))
    statuses: Counter[int] = Counter()
    for run in runs:
        statuses.update(run)
    counted = replay(decisions, quota, window, CLIENTS)
    first, last = int(start // window), int(end // window)
    whole = [counted["admitted"].get(index, 0) for index in range(first, last)]
    counted.update(
        statuses=dict(statuses),
        windows=whole,
        requests=sum(statuses.values()),
    )
    return counted


def _accuracy(report: Report, settings: Settings) -> None:
    seconds = settings.limit_seconds
    window = settings.limit_window
    quota = settings.limit_quota
    table = Table(
        f"accuracy: {INSTANCES} worker processes (2 uvicorn servers x 2 workers), {CLIENTS} "
        f"clients, one key and its account, L = {quota} per {window} s, {seconds:.0f} s",
        [
            "engine",
            "requests",
            "200",
            "429",
            "admitted per whole window",
            "max / L",
            "over 1.05 L",
            "false 429s",
        ],
    )
    jobs: list[tuple[str, str, str]] = []
    with ExitStack() as stack:
        redis_url = os.environ.get(REDIS_ENV, REDIS_DEFAULT)
        if _redis_unavailable(redis_url) is None:
            prefix = f"keyturn-bench:{os.getpid()}:{secrets.token_hex(4)}:"
            stack.callback(_redis_clean, redis_url, prefix)
            jobs.append(("redis", redis_url, prefix))
        if settings.postgres_dsn and postgres_unavailable(settings.postgres_dsn) is None:
            url = stack.enter_context(postgres_schema(settings.postgres_dsn))
            jobs.append(("postgres", url, ""))
        worst = 0.0
        for engine, url, prefix in jobs:
            counted = _accuracy_one(engine, url, prefix, seconds, quota, window)
            windows = counted["windows"]
            peak = max(windows, default=0) / quota
            worst = max(worst, peak)
            table.add(
                engine,
                f"{counted['requests']:,}",
                f"{counted['statuses'].get(200, 0):,}",
                f"{counted['statuses'].get(429, 0):,}",
                " ".join(str(n) for n in windows),
                f"{peak:.3f}",
                str(counted["over"]),
                str(counted["under"]),
            )
            report.facts[f"accuracy.{engine}.peak"] = peak
            report.facts[f"accuracy.{engine}.over"] = counted["over"]
            report.facts[f"accuracy.{engine}.false_429"] = counted["under"]
            report.facts[f"accuracy.{engine}.refused"] = counted["refused"]
            report.bar(
                f"accuracy on {engine}: no false 429 below 0.95 L",
                f"{counted['under']} of {counted['refused']} refusals",
                "0",
                counted["under"] == 0,
            )
    if table.rows:
        report.tables.append(table)
        report.targets.append(
            Target(
                "admitted per window / L, worst window (accuracy run)", worst, "<=", 1.05, "counted"
            )
        )
    else:
        report.notes.append("accuracy skipped: neither Redis nor PostgreSQL is reachable")


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    _instructions(report, settings)
    _round_trips(report, settings)
    if not _has_uvicorn():
        report.notes.append("accuracy skipped: uvicorn is not installed")
    else:
        _accuracy(report, settings)
    if not report.tables:
        report.tables.append(Table("rate limits", ["part"], [["(skipped)"]]))
    return report


def _has_uvicorn() -> bool:
    try:
        import uvicorn  # noqa: F401
    except ImportError:
        return False
    return True
