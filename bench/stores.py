"""Section 6: the warm path on keyturn's SQL stores: statements counted, time, real HTTP.

keyturn's SQLite and PostgreSQL stores keep an in-process replica of what the decision
reads, fed by the database's change feed (``docs/stores.md``): a warm request reads
nothing from the database; with ``replica=False`` it reads everything in one statement.
This section shows, in one run:

1. **Statements per warm request, counted by the drivers**: SQLite's trace callback on
   every connection the database holds (its pool and the change feed's), a psycopg
   connection class that counts ``execute`` for PostgreSQL (sync and async pools). Each
   Authenticator is warmed first (the key's first decision, the replica filled, the
   PostgreSQL listener in place); then ``count_requests`` warm requests are counted.
2. **In-process time**, each store ÷ the memory store, through both drivers
   (``authenticate()`` and ``authenticate_async()``), paired repetitions; with the
   Authenticator's defaults (``timeout=5``: a blocking store's miss goes to a watchdog
   thread, a replica's answer is taken in place).
3. **Instructions and system calls per warm request in process**, each store in a process
   of its own (``bench._store_count``): user-space instructions counted by callgrind, and
   the system calls of the requesting thread counted by strace, between two markers
   around *N* warm ``authenticate()`` calls; each store's instructions ÷ the memory
   store's. Counts do not depend on what else the machine runs; the system calls are the
   kernel's share, which callgrind does not see.
4. **Real HTTP** (uvicorn, uvloop, httptools, wrk): the bare app, keyturn on the memory
   store, on PostgreSQL (``AsyncPostgresDatabase``, and the sync ``PostgresDatabase``
   behind the same ASGI middleware; a scratch schema each) and on SQLite, each in a server
   process of its own, in paired rounds: each throughput ÷ the bare app's.
"""

from __future__ import annotations

import asyncio
import inspect
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bench._apps import MODELS
from bench._core import Batch, Report, Settings, Table, Target, paired, run_module, times, us
from bench._databases import postgres_schema, postgres_unavailable
from bench._world import memory_world, seed
from keyturn import Authenticator, AuthRequest, Principal
from keyturn._core.token import split

__all__ = ["async_batch", "counting_classes", "run", "sync_batch"]

NAME: Final = "stores"
TITLE: Final = "6. Stores: statements per warm request, time against the memory store, real HTTP"
GOAL_IN_PROCESS: Final = 1.2  # design, section 5: within 1.2x of the memory store's
GOAL_SQLITE: Final = 1.5  # ... and SQLite's warm path within 1.5x (its file is checked)
GOAL_HTTP: Final = 0.05  # within 5% of the memory store's throughput ratio

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


@dataclass
class Variant:
    """One store and driver: its Authenticator, its warm request, and how to count."""

    store: str  # "memory", "sqlite", "postgres"
    replica: bool
    sync: bool
    authenticator: Authenticator
    request: AuthRequest
    statements: Callable[[], list[str]] | None  # starts counting; None: no driver
    untrace: Callable[[], None] | None = None  # stops counting, where that costs time
    listening: Any = None  # the PostgreSQL database whose listener the replica needs

    @property
    def label(self) -> str:
        driver = "authenticate()" if self.sync else "authenticate_async()"
        if self.store == "memory":
            return f"memory: {driver}"
        return f"{self.store}, {'replica' if self.replica else 'replica=False'}: {driver}"

    @property
    def reference(self) -> str:
        return "memory: authenticate()" if self.sync else "memory: authenticate_async()"


def _warm(run: Run, variant: Variant) -> None:
    auth, request = variant.authenticator, variant.request
    outcome = auth.authenticate(request) if variant.sync else run(auth.authenticate_async(request))
    if not isinstance(outcome, Principal):
        raise RuntimeError(f"{variant.label}: the warm-up request was refused: {outcome!r}")
    if variant.listening is not None:  # the first lookup started the listener
        _wait_current(variant.listening)


def _usage_written(run: Run, variants: list[Variant]) -> None:
    """Wait until every Authenticator's usage writes have landed (the warm-up's use and its
    counts; then none is due for a minute). Two share each SQLite file, and one's write
    landing while another's requests were counted made that one's replica read the change
    log, as it must after any commit: 1 request in 20. That is a write's cost, not a warm
    request's; the first wait here saw only one Authenticator's ``last_used_at``."""
    deadline = time.monotonic() + 30
    for authenticator in {id(v.authenticator): v.authenticator for v in variants}.values():
        usage = authenticator.usage
        if usage is None:
            continue
        run(usage.flush())  # an async store's writes run on the loop that started them
        while usage._queue.unfinished_tasks:  # a blocking store's, on the recorder's thread
            if time.monotonic() > deadline:
                raise RuntimeError(f"{authenticator!r}: its usage writes did not land in 30 s")
            time.sleep(0.01)
    for variant in variants:
        key_id, _ = split(variant.request.authorization[0].removeprefix("Bearer "))
        answer = variant.authenticator.store.get_key(key_id)
        key = run(answer) if inspect.isawaitable(answer) else answer
        if key is None or key.last_used_at is None:
            raise RuntimeError(f"{variant.label}: the warm-up's use was not written")


def _sqlite_statements(db: Any) -> Callable[[], list[str]]:
    """Trace every connection *db* holds (its pool and its feed's) into a fresh list."""

    def start() -> list[str]:
        statements: list[str] = []
        for connection in _sqlite_connections(db):
            connection.set_trace_callback(statements.append)
        return statements

    return start


def _sqlite_connections(db: Any) -> list[Any]:
    connections = list(db._idle)
    feed = getattr(db, "_feed", None)
    if feed is not None and feed._connection is not None:
        connections.append(feed._connection)
    return connections


def _stop_tracing(db: Any) -> None:
    for connection in _sqlite_connections(db):
        connection.set_trace_callback(None)


def counting_classes(executed: list[str]) -> tuple[Any, Any]:
    """A sync and an async psycopg connection class whose ``execute`` appends each
    statement to *executed*, for a pool's ``connection_class``."""
    import psycopg

    class Counting(psycopg.Connection[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            executed.append(str(query))
            return super().execute(query, params, **kwargs)

    class AsyncCounting(psycopg.AsyncConnection[Any]):
        async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            executed.append(str(query))
            return await super().execute(query, params, **kwargs)

    return Counting, AsyncCounting


def _wait_current(db: Any, seconds: float = 30.0) -> None:
    """Wait (bounded) until the PostgreSQL listener is in place and the replica current."""
    deadline = time.monotonic() + seconds
    while not (db.replica is not None and db.replica.current):
        if time.monotonic() > deadline:
            raise RuntimeError("the PostgreSQL listener did not connect within 30 s")
        time.sleep(0.01)


def _variants(
    stack: ExitStack, run_async: Run, settings: Settings, report: Report
) -> list[Variant]:
    variants: list[Variant] = []

    def authenticator(store: Any, membership: Any, **options: Any) -> Authenticator:
        made = Authenticator(store, membership, **options)
        stack.callback(made.close)
        return made

    def request(token: str) -> AuthRequest:
        return AuthRequest(authorization=(f"Bearer {token}",), path=MODELS)

    store, membership, keys = memory_world()
    memory = authenticator(store, membership)
    for sync in (True, False):
        variants.append(Variant("memory", False, sync, memory, request(keys.organization), None))

    from keyturn.stores.sqlite import SQLiteDatabase

    folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="keyturn-bench-"))
    path = Path(folder) / "bench.sqlite3"
    with SQLiteDatabase(path, replica=False) as seeding:
        token = seed(seeding.keys, seeding.membership, tenant_key=False).organization
    for replica in (True, False):
        db = stack.enter_context(SQLiteDatabase(path, replica=replica))
        stack.callback(_stop_tracing, db)
        auth = authenticator(db.keys, db.membership)
        for sync in (True, False):
            variants.append(
                Variant(
                    "sqlite",
                    replica,
                    sync,
                    auth,
                    request(token),
                    _sqlite_statements(db),
                    lambda db=db: _stop_tracing(db),
                )
            )

    skipped = postgres_unavailable(settings.postgres_dsn)
    report.facts["postgres_skipped"] = float(skipped is not None)
    if skipped is not None:
        report.notes.append(f"PostgreSQL skipped: {skipped}")
        return variants
    assert settings.postgres_dsn is not None
    from psycopg_pool import AsyncConnectionPool, ConnectionPool

    from keyturn.stores.postgres import AsyncPostgresDatabase, PostgresDatabase

    url = stack.enter_context(postgres_schema(settings.postgres_dsn))
    with PostgresDatabase(url, replica=False) as seeding:
        seeding.create_schema()
        token = seed(seeding.keys, seeding.membership, tenant_key=False).organization
    for replica in (True, False):
        executed: list[str] = []
        sync_class, async_class = counting_classes(executed)
        pool = ConnectionPool(
            url,
            connection_class=sync_class,
            kwargs={"autocommit": True},
            min_size=2,
            max_size=4,
            open=True,
        )
        stack.callback(pool.close)
        sync_db = PostgresDatabase(pool=pool, replica=replica)
        stack.callback(sync_db.close)
        apool = AsyncConnectionPool(
            url,
            connection_class=async_class,
            kwargs={"autocommit": True},
            min_size=2,
            max_size=4,
            open=False,
        )
        run_async(apool.open())
        stack.callback(lambda apool=apool: run_async(apool.close()))
        async_db = AsyncPostgresDatabase(pool=apool, replica=replica)
        stack.callback(lambda db=async_db: run_async(db.close()))

        def counted(executed: list[str] = executed) -> list[str]:
            executed.clear()
            return executed

        variants.append(
            Variant(
                "postgres",
                replica,
                True,
                authenticator(sync_db.keys, sync_db.membership),
                request(token),
                counted,
            )
        )
        variants.append(
            Variant(
                "postgres",
                replica,
                False,
                authenticator(async_db.keys, async_db.membership),
                request(token),
                counted,
            )
        )
        if replica:  # both share the process's replica and its one listener
            variants[-2].listening = variants[-1].listening = sync_db
    return variants


def _count(run_async: Run, variants: list[Variant], n: int, report: Report) -> Table:
    table = Table(
        f"statements per warm request, counted by the driver over {n} warm requests each",
        ["store and driver", "statements", "per request", "of them SELECT", "what they are"],
    )
    _usage_written(run_async, variants)
    for variant in variants:
        if variant.statements is None:
            continue
        _warm(run_async, variant)  # the replica refilled, the feed has read every write
        statements = variant.statements()
        auth, request = variant.authenticator, variant.request
        for _ in range(n):
            outcome = (
                auth.authenticate(request)
                if variant.sync
                else run_async(auth.authenticate_async(request))
            )
            if not isinstance(outcome, Principal):
                raise RuntimeError(f"{variant.label}: a warm request was refused: {outcome!r}")
        counted = list(statements)
        if variant.untrace is not None:
            variant.untrace()
        selects = [s for s in counted if s.lstrip().upper().startswith("SELECT")]
        kinds = sorted({" ".join(s.split()[:3])[:40] for s in counted})
        table.add(
            variant.label,
            len(counted),
            f"{len(counted) / n:g}",
            f"{len(selects) / n:g}",
            "; ".join(kinds) or "-",
        )
        report.facts[f"{variant.label}.statements_per_request"] = len(counted) / n
        report.facts[f"{variant.label}.selects_per_request"] = len(selects) / n
    return table


def _time(run_async: Run, variants: list[Variant], settings: Settings, report: Report) -> Table:
    by_label = {variant.label: variant for variant in variants}
    batches = {
        label: (
            sync_batch(v.authenticator, [v.request])
            if v.sync
            else async_batch(run_async, v.authenticator, [v.request])
        )
        for label, v in by_label.items()
    }
    sizes = {
        label: settings.batch if v.replica or v.store == "memory" else settings.slow_batch
        for label, v in by_label.items()
    }
    result = paired(batches, reps=settings.reps, n=sizes)
    table = Table(
        f"warm request in process (organization key), {settings.reps} paired repetitions",
        ["store and driver", "min us/req", "median us/req", "/ memory (same driver)"],
    )
    for label, variant in by_label.items():
        versus = "-"
        if label != variant.reference:
            value = result.ratio(label, variant.reference)
            versus = times(value)
            report.facts[f"{label}.over_memory"] = value
            if variant.replica:
                goal = GOAL_SQLITE if variant.store == "sqlite" else GOAL_IN_PROCESS
                report.targets.append(
                    Target(f"Warm request / memory store, {label}", value, "<=", goal)
                )
        table.add(label, us(result.min(label)), us(result.median(label)), versus)
        report.facts[f"{label}.median_ns"] = result.median(label)
    return table


# --- instructions and system calls, in process ------------------------------------------


def syscalls(where: str, n: int, *args: str) -> dict[str, float]:
    """System calls per request of the requesting thread of ``bench._store_count`` *args*
    (*n* requests), by name: those between its two ``getppid`` markers, under strace."""
    trace = Path(where) / "strace.out"
    said = run_module(
        sys.executable, "bench._store_count", *args, before=["strace", "-f", "-o", str(trace)]
    )
    if not said.get("accepted"):
        raise RuntimeError(f"bench._store_count {' '.join(args)} said {said}")
    lines = trace.read_text().splitlines()
    marks = [index for index, line in enumerate(lines) if " getppid()" in line]
    if len(marks) != 2:
        raise RuntimeError(f"strace saw {len(marks)} getppid calls, not 2")
    start, end = marks
    thread = lines[start].split()[0]
    counted: dict[str, float] = {}
    for line in lines[start + 1 : end]:
        pid, _, call = line.partition(" ")
        call = call.lstrip()
        if pid != thread or call.startswith(("<...", "+++")):
            continue
        name = call.split("(", 1)[0]
        counted[name] = counted.get(name, 0) + 1
    return {name: round(count / n, 3) for name, count in counted.items()}


def _counted(settings: Settings, report: Report, postgres_url: str | None) -> Table:
    from bench.instructions import callgrind, valgrind_missing

    n = settings.count_requests
    table = Table(
        f"instructions (callgrind) and system calls (strace) per warm authenticate() in "
        f"process, {n} requests per store, a process each",
        ["store", "instructions/req", "/ memory store's", "system calls/req", "which"],
    )
    missing = valgrind_missing() or (None if shutil.which("strace") else "strace is missing")
    if missing is not None:
        report.notes.append(f"instructions and system calls skipped: {missing}")
        return table
    with tempfile.TemporaryDirectory(prefix="keyturn-bench-") as folder:
        stores: dict[str, tuple[str, ...]] = {
            "memory": ("memory", str(n)),
            "sqlite": ("sqlite", str(n), str(Path(folder) / "count.sqlite3")),
        }
        if postgres_url is not None:
            stores["postgres"] = ("postgres", str(n), postgres_url)
        counts: dict[str, float] = {}
        for store, args in stores.items():
            if store == "sqlite":
                for suffix in ("", "-wal", "-shm"):  # a fresh file for each run
                    Path(args[2] + suffix).unlink(missing_ok=True)
            said, parts = callgrind("bench._store_count", *args)
            if not said.get("accepted") or sorted(parts) != [1, 2, 3]:
                raise RuntimeError(f"callgrind run of {store} said {said}, parts {sorted(parts)}")
            counts[store] = parts[2] / n
            if store == "sqlite":
                for suffix in ("", "-wal", "-shm"):
                    Path(args[2] + suffix).unlink(missing_ok=True)
            calls = syscalls(folder, n, *args)
            ratio = counts[store] / counts["memory"]
            table.add(
                store,
                f"{counts[store]:,.0f}",
                "-" if store == "memory" else times(ratio),
                f"{sum(calls.values()):g}",
                ", ".join(f"{name} {count:g}" for name, count in sorted(calls.items())) or "-",
            )
            report.facts[f"count.{store}.instructions"] = counts[store]
            report.facts[f"count.{store}.syscalls_per_request"] = sum(calls.values())
            if store != "memory":
                report.facts[f"count.{store}.over_memory"] = ratio
                goal = GOAL_SQLITE if store == "sqlite" else GOAL_IN_PROCESS
                report.targets.append(
                    Target(
                        f"Warm request / memory store, instructions, {store}",
                        ratio,
                        "<=",
                        goal,
                        f"{counts[store]:,.0f} vs {counts['memory']:,.0f} instr; "
                        f"{sum(calls.values()):g} system calls/req",
                    )
                )
    return table


# --- real HTTP ------------------------------------------------------------------------------


def _http(
    settings: Settings, report: Report, postgres_urls: tuple[str, str] | None, folder: str
) -> Table:
    from bench._server import STORE_ENV
    from bench.real_http import cores, generator, measure

    server_cpu, load_cpu = cores()
    runs: dict[str, tuple[str, dict[str, str]]] = {
        "bare": ("bare", {}),
        "keyturn, memory store": ("keyturn", {}),
        "keyturn, SQLite": ("keyturn-sqlite", {STORE_ENV: str(Path(folder) / "http.sqlite3")}),
    }
    if postgres_urls is not None:  # a schema each: each server seeds its own
        runs["keyturn, PostgreSQL"] = ("keyturn-postgres", {STORE_ENV: postgres_urls[0]})
        runs["keyturn, PostgreSQL (sync store)"] = (
            "keyturn-postgres-sync",
            {STORE_ENV: postgres_urls[1]},
        )
    labels = list(runs)
    samples = measure(runs, settings, server_cpu, load_cpu)

    def median(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    def over_bare(label: str) -> float:
        pairs = zip(samples[label], samples["bare"], strict=True)
        return median([a.throughput / b.throughput for a, b in pairs if b.throughput])

    table = Table(
        f"real HTTP: uvicorn (httptools, uvloop) + Starlette, {settings.http_rounds} paired "
        f"rounds of {settings.http_seconds:g} s, {settings.http_clients} connections, "
        f"load from {generator()}",
        [
            "server",
            "requests",
            "failed",
            "req/s (median)",
            "server CPU us/req (median)",
            "server CPU busy",
            "extra CPU us/req (paired)",
            "throughput / bare",
            "/ memory store's ratio",
        ],
    )

    def extra_cpu(label: str) -> float:
        pairs = zip(samples[label], samples["bare"], strict=True)
        return median([a.cpu_per_request_ns - b.cpu_per_request_ns for a, b in pairs])

    memory_ratio = over_bare("keyturn, memory store")
    for label in labels:
        loads = samples[label]
        ratio = over_bare(label) if label != "bare" else 1.0
        versus = "-"
        if label not in ("bare", "keyturn, memory store"):
            versus = times(ratio / memory_ratio)
            report.facts[f"http.{label}.over_memory_ratio"] = ratio / memory_ratio
        table.add(
            label,
            sum(x.requests for x in loads),
            sum(x.failed for x in loads),
            f"{median([x.throughput for x in loads]):.0f}",
            f"{median([x.cpu_per_request_ns for x in loads]) / 1000:.1f}",
            f"{median([x.cpu_ns / x.elapsed_ns for x in loads if x.elapsed_ns]):.0%}",
            "-" if label == "bare" else f"+{extra_cpu(label) / 1000:.1f}",
            times(ratio),
            versus,
        )
        report.facts[f"http.{label}.over_bare"] = ratio
        if label != "bare":
            report.facts[f"http.{label}.extra_cpu_ns"] = extra_cpu(label)
    report.facts["http.failed"] = sum(x.failed for loads in samples.values() for x in loads)
    if "keyturn, PostgreSQL" in samples:
        value = report.facts["http.keyturn, PostgreSQL.over_memory_ratio"]
        report.targets.append(
            Target(
                "Real HTTP throughput / bare, PostgreSQL store / memory store's",
                value,
                ">=",
                1 - GOAL_HTTP,
                f"{report.facts['http.keyturn, PostgreSQL.over_bare']:.2f}x vs "
                f"{memory_ratio:.2f}x of bare",
            )
        )
        memory_cpu = report.facts["http.keyturn, memory store.extra_cpu_ns"]
        postgres_cpu = report.facts["http.keyturn, PostgreSQL.extra_cpu_ns"]
        report.targets.append(
            Target(
                "Extra server CPU per request, PostgreSQL store / memory store's",
                postgres_cpu / memory_cpu if memory_cpu > 0 else float("inf"),
                "<=",
                None,
                f"+{postgres_cpu / 1000:.1f} us vs +{memory_cpu / 1000:.1f} us over bare",
            )
        )
    return table


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    loop = asyncio.new_event_loop()
    run_async: Run = loop.run_until_complete
    with ExitStack() as stack:
        stack.callback(loop.close)
        variants = _variants(stack, run_async, settings, report)
        for variant in variants:
            _warm(run_async, variant)
        report.tables.append(_count(run_async, variants, settings.count_requests, report))
        report.tables.append(_time(run_async, variants, settings, report))
    with ExitStack() as stack:
        url = None
        if report.facts["postgres_skipped"] == 0:
            assert settings.postgres_dsn is not None
            url = stack.enter_context(postgres_schema(settings.postgres_dsn))
        report.tables.append(_counted(settings, report, url))
    with ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="keyturn-bench-"))
        urls = None
        if report.facts["postgres_skipped"] == 0:
            dsn = settings.postgres_dsn
            assert dsn is not None
            urls = (
                stack.enter_context(postgres_schema(dsn)),
                stack.enter_context(postgres_schema(dsn)),
            )
        report.tables.append(_http(settings, report, urls, folder))
    report.notes.append(
        "SQLite's replica compares the WAL-index header of the -shm file, mapped in memory, "
        "with the one last seen: no statement, no system call; PostgreSQL's listener is a "
        "connection of its own, not counted (LISTEN once, then it only receives "
        "notifications); its replica asks the listener's socket whether a notice waits "
        "(one ioctl per request)"
    )
    return report
