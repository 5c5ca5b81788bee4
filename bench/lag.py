"""Section 6b: the replicas' lag and faults: a revoke seen by four instances; the feed cut.

**Revocation lag.** Four instances, each a process of its own with its own database object
(``PostgresDatabase``, or ``SQLiteDatabase`` on one file) and its own ``Authenticator``
(defaults), run a bounded request loop. Each sends its current key, over and over; when
the key is refused as revoked it records the instant (``time.monotonic_ns()``: Linux's
CLOCK_MONOTONIC, one clock for every process of the machine), sends it three more times
(any acceptance then is a *flip back*), and moves to the next key. This process waits until
every instance is on key *k*, then revokes it through a store object of its own
(``replica=False``) and records the instant the revoke returned, its commit acknowledged.
The lag of one instance is its first refusal minus that instant (the refusing request's
end, so the lag is never flattered). Three load levels: *saturated* (each instance sends
without pause: four busy processes, this one and the database on two cores), *paced*
(0.5 ms between requests), and *writes* (paced, while writer processes of their own change
other accounts' memberships at WRITES_PER_SECOND in all, each a change every listener
hears and applies). A lag is also an acceptance: every request of the key between the
revoke and the first refusal was let through, so the maximum lag bounds the latest
acceptance.

**SQLite, a commit seen.** One instance sending without pause, this process revoking its
keys one by one, with the WAL-index header mapped (a commit elsewhere is seen by the next
request) and without it (the feed asks ``PRAGMA data_version`` at most every
``CHECK_EVERY`` seconds). The bound: the latest start of a request accepted with the key,
from the commit (a request that began before the commit returned may be accepted; one
that began after must not be, beyond the bound); and the lag to the first refusal.

**Faults** (PostgreSQL, a private server this section starts with ``initdb`` and stops by its
PID; never the shared one). One Authenticator over a ``PostgresDatabase`` whose pool
counts every statement (a psycopg connection class), three threads sending requests
(one good key, three to be revoked, 1 ms apart). The listener's session is killed with
``pg_terminate_backend`` and a key revoked at once with plain SQL; then the server is
restarted (``pg_ctl restart -m fast``) and another key revoked as soon as it is back;
then a third in steady state. Counted: requests answered by the replica, by reading
through, or 503, in each phase; revoked keys accepted after the revoke returned (and
later than the lag goal: must be none); statements once the feed is back (must be none).
"""

from __future__ import annotations

import logging
import multiprocessing
import random
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from bench import _private_postgres
from bench._apps import MODELS
from bench._core import Report, Settings, Table, Target
from bench._databases import postgres_schema, postgres_unavailable
from bench._world import fake_keys, fake_records, fill_membership, key_ids, new_key
from keyturn import Authenticator, AuthRequest, Principal, Reason, Refusal

__all__ = ["run"]

NAME: Final = "lag"
TITLE: Final = (
    "6b. Replicas: revocation lag across four instances; the change feed killed, "
    "PostgreSQL restarted"
)
INSTANCES: Final = 4
GOAL_P99_MS: Final = 10.0  # design, D27: p99 <= 10 ms on loopback
GOAL_MAX_MS: Final = 50.0  # ... and max <= 50 ms, with writes elsewhere
WRITES_PER_SECOND: Final = 500
WRITERS: Final = 2  # processes sharing the writes: one round trip at a time each
PACED: Final = 0.0005  # seconds between two requests of a paced instance
FLIP_CHECKS: Final = 3  # requests sent again after the first refusal
SETUP_SECONDS: Final = 180.0  # bound on an instance's start (imports, a read per key)
STEP_SECONDS: Final = 10.0  # bound on waiting for every instance to reach the next key


def _request(token: str) -> AuthRequest:
    return AuthRequest(authorization=(f"Bearer {token}",), path=MODELS)


def _database(kind: str, where: str, *, replica: bool = True) -> Any:
    if kind == "postgres":
        from keyturn.stores.postgres import PostgresDatabase

        return PostgresDatabase(where, replica=replica)
    from keyturn.stores.sqlite import SQLiteDatabase

    return SQLiteDatabase(where, replica=replica)


def _until(condition: Callable[[], bool], seconds: float) -> bool:
    """Poll *condition*, at most *seconds*; whether it came true."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)
    return True


def _instance(
    kind: str,
    where: str,
    tokens: list[str],
    pause: float,
    index: int,
    positions: Any,
    ready: Any,
    results: Any,
    seconds: float,
    header: bool = True,
) -> None:
    """One instance (a process of its own): warm every key, then the bounded loop.
    Without *header*, a SQLite feed cannot map the WAL-index header, and asks the file in
    time instead (``CHECK_EVERY``)."""
    if not header:
        from keyturn.stores import sqlite

        sqlite._map_header = lambda connection, path: None
    db = _database(kind, where)
    auth = Authenticator(db.keys, db.membership)
    requests = [_request(token) for token in tokens]
    refused_at = [0] * len(tokens)
    accepted_from = [0] * len(tokens)  # when the last request of each key accepted began
    other: list[str] = []
    flips = sent = 0
    try:
        for request in requests:  # each key's first, decided request, before any timing
            outcome = auth.authenticate(request)
            if not isinstance(outcome, Principal):
                raise RuntimeError(f"instance {index}: a warm-up request was refused: {outcome}")
        if kind == "postgres" and not _until(lambda: bool(db.replica.current), 30):
            raise RuntimeError(f"instance {index}: the listener did not connect")
        for request in requests:  # now from (into) a current replica
            auth.authenticate(request)
        ready[index] = 1
        deadline = time.monotonic() + seconds
        k = 0
        while k < len(requests) and time.monotonic() < deadline:
            positions[index] = k
            began = time.monotonic_ns()
            outcome = auth.authenticate(requests[k])
            sent += 1
            if isinstance(outcome, Principal):
                accepted_from[k] = began
                if pause:
                    time.sleep(pause)
                continue
            refused_at[k] = time.monotonic_ns()
            assert isinstance(outcome, Refusal)
            if outcome.reason is not Reason.REVOKED:
                other.append(str(outcome.reason))
            for _ in range(FLIP_CHECKS):
                flips += isinstance(auth.authenticate(requests[k]), Principal)
                sent += 1
            k += 1
        positions[index] = len(requests)
    finally:
        results.put(
            {
                "index": index,
                "refused_at": refused_at,
                "accepted_from": accepted_from,
                "sent": sent,
                "flips": flips,
                "other": other,
            }
        )
        auth.close()
        db.close()


def _writer(kind: str, where: str, index: int, stop: Any, written: Any) -> None:
    """Other accounts' memberships changed at its share of WRITES_PER_SECOND until *stop*
    (a process of its own): every one a change each listener hears and applies."""
    db = _database(kind, where, replica=False)
    rate = WRITES_PER_SECOND / WRITERS
    try:
        start, n = time.monotonic(), 0
        while not stop.is_set() and time.monotonic() - start < 3600:
            role = "member" if n % 2 else "admin"
            db.membership.add_member(f"writer{index}.{n % 100}", "org_main", role=role)
            n += 1
            written[index] = n
            ahead = start + n / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
    finally:
        db.close()


def _quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile *q* of *values*."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def _lag_run(
    kind: str,
    where: str,
    n: int,
    pause: float,
    writes: bool,
    instances: int = INSTANCES,
    header: bool = True,
) -> dict[str, Any]:
    """Revoke *n* keys one by one under *instances* instances (with a writer elsewhere, if
    *writes*; SQLite without the WAL-index header, unless *header*); the lags and what
    went wrong."""
    with _database(kind, where, replica=False) as db:
        if kind == "postgres":
            db.create_schema()
        if not db.membership.organizations():
            fill_membership(db.membership)
        fakes = fake_keys()
        ids = list(key_ids(n, seed=random.randrange(1 << 30)))
        for record in fake_records(fakes, iter(ids)):
            db.keys.add_key(record)
        tokens = [fakes.token(key_id) for key_id in ids]
        context = multiprocessing.get_context("spawn")
        positions = context.RawArray("i", [-1] * instances)
        ready = context.RawArray("i", instances)
        results = context.Queue()
        seconds = SETUP_SECONDS + n * STEP_SECONDS
        processes = [
            context.Process(
                target=_instance,
                args=(
                    kind,
                    where,
                    tokens,
                    pause,
                    index,
                    positions,
                    ready,
                    results,
                    seconds,
                    header,
                ),
                daemon=True,
            )
            for index in range(instances)
        ]
        stop_writing, written = context.Event(), context.RawArray("q", WRITERS)
        if writes:
            processes += [
                context.Process(
                    target=_writer, args=(kind, where, index, stop_writing, written), daemon=True
                )
                for index in range(WRITERS)
            ]
        commits: list[tuple[int, int]] = []
        said: list[dict[str, Any]] = []
        writing = (0.0, 0)
        try:
            for process in processes:
                process.start()
            started = _until(
                lambda: all(ready) or any(p.exitcode is not None for p in processes),
                SETUP_SECONDS,
            )
            if not (started and all(ready)):
                raise RuntimeError(f"{kind}: the instances did not start")
            rng = random.Random(n)
            writing = (time.monotonic(), sum(written))
            for k, key_id in enumerate(ids):
                if not _until(lambda k=k: all(p >= k for p in positions), STEP_SECONDS):
                    break
                time.sleep(rng.uniform(0.001, 0.003))  # the instances mid-loop
                before = time.monotonic_ns()
                db.keys.revoke_key(key_id, datetime.now(UTC))
                commits.append((before, time.monotonic_ns()))
            writing = (time.monotonic() - writing[0], sum(written) - writing[1])
            stop_writing.set()
            for _ in range(instances):
                said.append(results.get(timeout=60))
        finally:
            stop_writing.set()
            for process in processes:
                if process.pid is None:  # never started
                    continue
                process.join(30)
                if process.is_alive():  # stopped by its PID
                    process.terminate()
                    process.join(10)
    lags, bounds = [], []  # from the commit acknowledged; from the revoke sent
    stale = []  # the last accepted request's start, from the commit acknowledged
    for instance in said:
        for k, (sent, acknowledged) in enumerate(commits):
            if instance["refused_at"][k]:
                lags.append((instance["refused_at"][k] - acknowledged) / 1e6)
                bounds.append((instance["refused_at"][k] - sent) / 1e6)
            if instance["accepted_from"][k]:
                stale.append((instance["accepted_from"][k] - acknowledged) / 1e6)
    missing = len(commits) * instances - len(lags)
    return {
        "revokes": len(commits),
        "lags": lags,
        "bounds": bounds,
        "stale": stale,
        "missing": missing,
        "flips": sum(instance["flips"] for instance in said),
        "other": sum(len(instance["other"]) for instance in said),
        "sent": sum(instance["sent"] for instance in said),
        "round_trip_ms": _quantile([(b - a) / 1e6 for a, b in commits], 0.5),
        "writes_per_second": writing[1] / writing[0] if writing[0] else 0.0,
    }


def _lags(settings: Settings, report: Report) -> Table:
    table = Table(
        f"revocation lag to each of {INSTANCES} instances' first refusal, "
        f"{settings.revokes} keys revoked one by one: from the commit (the revoke call "
        "returned), and from the revoke sent (an upper bound)",
        [
            "store, load",
            "lags",
            "p50 ms",
            "p99 ms",
            "max ms",
            "min ms",
            "sent: p50",
            "p99",
            "max",
            "flips back",
            "not refused",
            "requests",
            "revoke call ms (p50)",
            "writes/s elsewhere",
        ],
    )
    loads = ("saturated", "paced", "writes")
    runs: list[tuple[str, str]] = [("sqlite", load) for load in loads]
    skipped = postgres_unavailable(settings.postgres_dsn)
    if skipped is None:
        runs = [*(("postgres", load) for load in loads), *runs]
    else:
        report.notes.append(f"PostgreSQL skipped: {skipped}")
    report.facts["postgres_skipped"] = float(skipped is not None)
    for kind, load in runs:
        pause = 0.0 if load == "saturated" else PACED
        with tempfile.TemporaryDirectory(prefix="keyturn-bench-") as folder:
            if kind == "postgres":
                assert settings.postgres_dsn is not None
                with postgres_schema(settings.postgres_dsn) as url:
                    got = _lag_run(kind, url, settings.revokes, pause, load == "writes")
            else:
                path = str(Path(folder) / "lag.sqlite3")
                got = _lag_run(kind, path, settings.revokes, pause, load == "writes")
        lags = got["lags"]
        name = f"{kind}, {load}"
        p50, p99, worst = _quantile(lags, 0.5), _quantile(lags, 0.99), max(lags, default=0.0)
        table.add(
            name,
            len(lags),
            f"{p50:.2f}",
            f"{p99:.2f}",
            f"{worst:.2f}",
            f"{min(lags, default=0.0):.2f}",
            f"{_quantile(got['bounds'], 0.5):.2f}",
            f"{_quantile(got['bounds'], 0.99):.2f}",
            f"{max(got['bounds'], default=0.0):.2f}",
            got["flips"],
            got["missing"] + got["other"],
            got["sent"],
            f"{got['round_trip_ms']:.2f}",
            f"{got['writes_per_second']:.0f}",
        )
        report.facts.update(
            {
                f"{name}.p50_ms": p50,
                f"{name}.p99_ms": p99,
                f"{name}.max_ms": worst,
                f"{name}.sent_p99_ms": _quantile(got["bounds"], 0.99),
                f"{name}.flips": got["flips"],
                f"{name}.not_refused": got["missing"] + got["other"],
                f"{name}.revokes": got["revokes"],
                f"{name}.writes_per_second": got["writes_per_second"],
            }
        )
        if load == "writes":
            report.targets.append(
                Target(
                    f"Revocation lag max / {GOAL_MAX_MS:g} ms, {name} "
                    f"({got['writes_per_second']:.0f}/s)",
                    worst / GOAL_MAX_MS,
                    "<=",
                    1.0,
                    f"{INSTANCES} listening instances; no acceptance later than the max",
                )
            )
        report.targets.append(
            Target(
                f"Revocation lag p99 / {GOAL_P99_MS:g} ms, {name}",
                p99 / GOAL_P99_MS,
                "<=",
                1.0,
                f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {worst:.2f} ms",
            )
        )
        report.bar(
            f"revocation, {name}: every instance refused every revoked key, none flipped back",
            f"{got['missing'] + got['other']} not refused, {got['flips']} flips",
            "0 and 0",
            got["missing"] + got["other"] == 0 and got["flips"] == 0,
        )
    return table


# --- SQLite: how soon another process's commit is seen --------------------------------------

GOAL_SEEN_MS: Final = 1.0  # another process's commit seen within 1 ms


def _visibility(settings: Settings, report: Report) -> Table:
    """One SQLite instance sending without pause while this process revokes its keys one
    by one, with the WAL-index header mapped (the feed's way) and without it (``PRAGMA
    data_version`` at most every ``CHECK_EVERY``). The bound is the latest start of an
    accepted request of the key, from the revoke's commit: what a client could still get
    through after the commit. The lag to the first refusal adds the time the instance
    waited for a core (two cores, shared)."""
    from keyturn.stores.sqlite import CHECK_EVERY

    table = Table(
        f"SQLite: another process's commit seen, one instance sending without pause, "
        f"{settings.revokes} keys revoked one by one: the last accepted request's start, "
        "and the first refusal's end, from each commit",
        [
            "feed",
            "revokes",
            "accepted after the commit",
            "latest start accepted: max ms",
            "first refusal: p50 ms",
            "p99 ms",
            "max ms",
            "flips back",
            "not refused",
            "requests",
        ],
    )
    for header in (True, False):
        name = (
            "sqlite, header mapped"
            if header
            else f"sqlite, no header (PRAGMA every {CHECK_EVERY * 1000:g} ms)"
        )
        with tempfile.TemporaryDirectory(prefix="keyturn-bench-") as folder:
            path = str(Path(folder) / "seen.sqlite3")
            got = _lag_run("sqlite", path, settings.revokes, 0.0, False, 1, header)
        lags, stale = got["lags"], got["stale"]
        after = [ms for ms in stale if ms > 0]
        latest = max(stale, default=0.0)
        p50, p99, worst = _quantile(lags, 0.5), _quantile(lags, 0.99), max(lags, default=0.0)
        table.add(
            name,
            got["revokes"],
            len(after),
            f"{latest:.3f}",
            f"{p50:.3f}",
            f"{p99:.3f}",
            f"{worst:.3f}",
            got["flips"],
            got["missing"] + got["other"],
            got["sent"],
        )
        report.facts.update(
            {
                f"{name}.accepted_after_commit": len(after),
                f"{name}.latest_accepted_ms": latest,
                f"{name}.p50_ms": p50,
                f"{name}.p99_ms": p99,
                f"{name}.max_ms": worst,
            }
        )
        report.targets.append(
            Target(
                f"Commit elsewhere seen: latest accepted start / {GOAL_SEEN_MS:g} ms, {name}",
                max(latest, 0.0) / GOAL_SEEN_MS,
                "<=",
                1.0,
                f"{len(after)} of {got['revokes']} revokes let a later request through; "
                f"first refusal p50 {p50:.3f}, p99 {p99:.3f}, max {worst:.3f} ms",
            )
        )
        report.bar(
            f"commit seen, {name}: every revoked key refused, none flipped back",
            f"{got['missing'] + got['other']} not refused, {got['flips']} flips",
            "0 and 0",
            got["missing"] + got["other"] == 0 and got["flips"] == 0,
        )
    return table


# --- faults ---------------------------------------------------------------------------------

FAULT_THREADS: Final = 3
FAULT_REQUESTS: Final = 100_000  # per thread, at most: the load loop's bound
PHASES: Final = ("steady", "listener killed", "restarted", "after")


def _faults(report: Report) -> list[Table]:
    import psycopg
    from psycopg_pool import ConnectionPool

    from bench.stores import counting_classes
    from keyturn.stores.postgres import PostgresDatabase

    executed: list[str] = []
    counting, _ = counting_classes(executed)
    answers: list[tuple[int, int, int, str, bool]] = []  # start, end, key, outcome, current
    marks: dict[str, int] = {}
    statements: dict[str, int] = {}
    revoked: dict[int, int] = {}  # key -> when the revoke returned
    stop = threading.Event()
    with _private_postgres.private_postgres() as server:
        pool = ConnectionPool(
            server.url,
            connection_class=counting,
            kwargs={"autocommit": True},
            timeout=1.0,
            open=True,
        )
        db = PostgresDatabase(pool=pool)
        auth = Authenticator(db.keys, db.membership)
        threads: list[threading.Thread] = []
        try:
            db.create_schema()
            fill_membership(db.membership)
            tokens = [new_key(db.keys, db.membership) for _ in range(4)]  # 0 good, 1-3 doomed
            requests = [_request(token) for token in tokens]
            ids = []
            for request in requests:
                outcome = auth.authenticate(request)
                assert isinstance(outcome, Principal), outcome
                ids.append(outcome.key_id)
            if not _until(lambda: bool(db.replica.current), 30):
                raise RuntimeError("the listener did not connect")
            for request in requests:
                auth.authenticate(request)

            def load(offset: int) -> None:
                for index in range(FAULT_REQUESTS):
                    if stop.is_set():
                        return
                    key = (index + offset) % len(requests)
                    current = bool(db.replica.current)
                    start = time.monotonic_ns()
                    outcome = auth.authenticate(requests[key])
                    end = time.monotonic_ns()
                    kind = (
                        "ok"
                        if isinstance(outcome, Principal)
                        else f"{outcome.status} {outcome.reason.value}"
                    )
                    answers.append((start, end, key, kind, current))
                    time.sleep(0.001)

            def mark(name: str) -> None:
                marks[name] = time.monotonic_ns()
                statements[name] = len(executed)

            def revoke(key: int) -> None:
                with psycopg.connect(server.url, autocommit=True) as raw:
                    raw.execute(
                        "UPDATE keyturn_keys SET revoked_at = now() WHERE key_id = %s",
                        (ids[key],),
                    )
                revoked[key] = time.monotonic_ns()

            threads = [
                threading.Thread(target=load, args=(offset,)) for offset in range(FAULT_THREADS)
            ]
            for thread in threads:
                thread.start()
            time.sleep(0.2)
            mark("steady")
            time.sleep(0.5)
            mark("listener killed")
            killed = db._listener.backend_pid
            with psycopg.connect(server.url, autocommit=True) as raw:
                raw.execute("SELECT pg_terminate_backend(%s)", (killed,))
            revoke(1)
            if not _until(
                lambda: db._listener.backend_pid not in (None, killed) and db.replica.current,
                30,
            ):
                raise RuntimeError("the listener did not come back")
            mark("listener killed.back")
            time.sleep(0.5)
            mark("restarted")
            server.restart()
            revoke(2)
            if not _until(lambda: bool(db.replica.current), 30):
                raise RuntimeError("the listener did not come back after the restart")
            mark("restarted.back")
            time.sleep(0.5)
            revoke(3)
            time.sleep(0.3)
            mark("after")
            time.sleep(0.5)
            mark("after.back")
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
            auth.close()
            db.close()
            pool.close()
    ends = {
        "steady": "listener killed",
        "listener killed": "listener killed.back",
        "restarted": "restarted.back",
        "after": "after.back",
    }
    phases = Table(
        f"the change feed's faults, {FAULT_THREADS} threads sending requests 1 ms apart "
        "(a private PostgreSQL server): requests by phase",
        [
            "phase",
            "ms",
            "requests",
            "200 from the replica",
            "200 read through",
            "503",
            "401 revoked",
            "other",
            "statements",
        ],
    )
    for phase in PHASES:
        begin, end = marks[phase], marks[ends[phase]]
        inside = [a for a in answers if begin <= a[0] < end]
        ok_replica = sum(1 for a in inside if a[3] == "ok" and a[4])
        ok_through = sum(1 for a in inside if a[3] == "ok" and not a[4])
        unavailable = sum(1 for a in inside if a[3].startswith("503"))
        revoked_401 = sum(1 for a in inside if a[3] == "401 revoked" and a[2] != 0)
        other = len(inside) - ok_replica - ok_through - unavailable - revoked_401
        count = statements[ends[phase]] - statements[phase]
        phases.add(
            phase,
            f"{(end - begin) / 1e6:.0f}",
            len(inside),
            ok_replica,
            ok_through,
            unavailable,
            revoked_401,
            other,
            count,
        )
        report.facts[f"faults.{phase}.requests"] = len(inside)
        report.facts[f"faults.{phase}.ok_read_through"] = ok_through
        report.facts[f"faults.{phase}.unavailable"] = unavailable
        report.facts[f"faults.{phase}.other"] = other
        report.facts[f"faults.{phase}.statements"] = count
    keys = Table(
        "revoked keys: requests that started after the revoke returned and were accepted",
        ["key revoked", "accepted after", f"of them later than {GOAL_P99_MS:g} ms", "latest ms"],
    )
    late_total = 0
    for key, when in ((1, "listener killed"), (2, "server restarted"), (3, "steady state")):
        accepted = [
            (a[0] - revoked[key]) / 1e6
            for a in answers
            if a[2] == key and a[0] > revoked[key] and a[3] == "ok"
        ]
        late = sum(1 for ms in accepted if ms > GOAL_P99_MS)
        late_total += late
        keys.add(f"{when}", len(accepted), late, f"{max(accepted):.2f}" if accepted else "-")
    report.facts["faults.revoked_accepted_late"] = late_total
    after = report.facts["faults.after.statements"]
    report.bar(
        "faults: no revoked key accepted later than the lag goal",
        f"{late_total} accepted",
        "0",
        late_total == 0,
    )
    report.bar(
        "faults: the warm path reads nothing once the feed is back, without a restart",
        f"{after:g} statements in {report.facts['faults.after.requests']:g} requests",
        "0",
        after == 0,
    )
    other = sum(report.facts[f"faults.{phase}.other"] for phase in PHASES)
    report.bar(
        "faults: every request 200, 503 or (revoked key) 401: never a 401 for the good key",
        f"{other:g} other answers",
        "0",
        other == 0,
    )
    return [phases, keys]


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    report.tables.append(_lags(settings, report))
    report.tables.append(_visibility(settings, report))
    if report.facts["postgres_skipped"]:
        return report
    reason = _private_postgres.unavailable()
    if reason is not None:
        report.notes.append(f"faults skipped: {reason}")
        return report
    # The outage's expected log lines (the feed down, each request that failed) are muted:
    # the tables count those requests.
    muted = [logging.getLogger(name) for name in ("keyturn", "psycopg.pool")]
    levels = [logger.level for logger in muted]
    for logger in muted:
        logger.setLevel(logging.CRITICAL)
    try:
        report.tables.extend(_faults(report))
    finally:
        for logger, level in zip(muted, levels, strict=True):
            logger.setLevel(level)
    return report
