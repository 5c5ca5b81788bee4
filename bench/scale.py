"""Section 7: the caches at scale, counted: writes elsewhere, 300k active keys, re-warming.

Nothing here is timed; every figure is a count, so it means the same on any machine.

**The world.** A population of keys on SQLite (a file) and on PostgreSQL (a scratch
schema): five keys per account, each scoped to its account's one organization, ten
accounts per organization, ten organizations per tenant (the first its default). Every key
shares one secret, so the table is filled by SQL in seconds; each key's ``first_used_at``
is set, so no use made here is a change the decision reads.

**Writes elsewhere.** :data:`INSTANCES` listening instances, each a process of its own with
its own database object and ``Authenticator`` (defaults, but no usage recording: its writes
change nothing the decision reads, and the re-warming counts them), send Zipf traffic (exponent
:data:`ZIPF`) over the 10% *active* keys, while a writer process of its own, through the
stores' public methods, creates keys for other accounts, changes active and inactive
accounts' roles, adds and removes organizations, and revokes keys out of the traffic and
(:data:`MIX`) a few in it. Requests and writes are paced by count, in lockstep, at the
ratio of :data:`RPS` requests per instance per second to the writes per second: write *j*
is made once every instance has sent ``(j + 1) * RPS / rate`` requests, and an instance's
request *n* waits for write ``n * rate // RPS - 1``. Counted per request: answered by the
memo (``memo.hits``), or decided; a decided request is the key's *first* decision in the
instance, a *refusal* (a revoked key), *touched* (a write that returned after its last
decision began changed its key, its account's memberships or its organization; on
PostgreSQL, also one that returned in the :data:`LAG_WINDOW` before, which the listener
may have heard late; instants on CLOCK_MONOTONIC, one clock for every process of the
machine) or *untouched*. The instances are warmed once (every active key decided once, its
token put in the verified-token cache as its first verification would); each write rate is
then a phase of the same instances: ``warmup`` uncounted requests, then ``requests``
counted.

**300k active keys.** One instance, Zipf traffic over every key of a population of
``big_keys``: the replica and the memo first filled with the keys an LRU of the replica's
size would hold (the hottest, coldest first), then argon2 runs, whole-cache clears, and
read-through statements against the misses of that LRU simulated on the same trace.

**Re-warming.** A fresh instance over the population of the write study sends each of
``rewarm_keys`` keys once: statements and CPU in hashing, within a time budget; when the
budget ends first the figures are projected linearly from the keys done (and say so).

What each probe wraps is in ``bench/_probes.py``. Every loop is bounded in count and in
time, and every process started here is stopped by its PID.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
import random
import sqlite3
import tempfile
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import attrs

from bench._apps import MODELS
from bench._core import Report, Settings, Table, Target
from bench._databases import postgres_schema, postgres_unavailable
from bench._world import FakeKeys, fake_keys, fake_records, key_ids
from keyturn._core import token as _token

__all__ = ["PROFILES", "Profile", "lru_misses", "run", "zipf_trace"]

NAME: Final = "scale"
TITLE: Final = (
    "7. Scale: the memo under writes elsewhere (4 listening instances); 300k active keys; "
    "re-warming an instance (counted)"
)
INSTANCES: Final = 4
RPS: Final = 1000  # requests per instance per second, against which write rates are set
ACTIVE: Final = 0.10  # the share of a population's keys in the traffic
ZIPF: Final = 1.0  # the traffic's Zipf exponent: the key of rank r is sent ~ 1 / r
KEYS_PER_ACCOUNT: Final = 5
ACCOUNTS_PER_ORGANIZATION: Final = 10
ORGANIZATIONS_PER_TENANT: Final = 10
LAG_WINDOW: Final = 0.050  # seconds: the design's maximum replica lag (D27)
# The writer's mix, in shares of its writes.
MIX: Final = (
    ("create", 0.40),  # a key for another account, never in the traffic
    ("role", 0.30),  # an account's role in its organization: any account, active or not
    ("organization", 0.08),  # an organization added to a tenant, or the last one removed
    ("revoke", 0.20),  # a key out of the traffic
    ("revoke active", 0.02),  # a key in the traffic
)
SETUP_SECONDS: Final = 600.0  # bound on an instance's start (imports, fill of the caches)
RUN_SECONDS: Final = 900.0  # bound on one run's lockstep loop
HIT_GOAL: Final = 0.95  # memo hit rate at 100 writes/s elsewhere, 10k active keys
HIT_GOAL_BUSY: Final = 0.90  # ... at 1,000 writes/s
REWARM_STATEMENTS: Final = 100_000  # re-warming 100k active keys: at most this many statements
REWARM_HASHING_S: Final = 1.0  # ... and this much CPU in hashing


@dataclass(frozen=True)
class Profile:
    """How much the section does; every loop is bounded by these numbers."""

    population: int  # keys of the write study (10% active)
    rates: tuple[int, ...]  # writes per second elsewhere, swept at *population*
    populations: tuple[int, ...]  # other populations, at *sweep_rate*
    sweep_rate: int
    requests: int  # measured requests per instance per run
    warmup: int  # Zipf requests per instance before measuring (after each active key once)
    big_keys: int  # the 300k-active-keys study's population, every key active
    big_stores: tuple[str, ...]  # the stores it runs on (the replica's code is shared)
    big_warmup: int
    big_requests: int
    rewarm_keys: int  # distinct keys sent once each to a fresh instance
    rewarm_seconds: float  # the re-warming's budget; past it the figures are projected


PROFILES: Final = {
    "full": Profile(
        population=100_000,
        rates=(0, 1, 10, 100, 1000),
        populations=(1_000, 10_000, 300_000),
        sweep_rate=100,
        requests=3_000,
        warmup=1_000,
        big_keys=300_000,
        big_stores=("sqlite",),
        big_warmup=10_000,
        big_requests=10_000,
        rewarm_keys=100_000,
        rewarm_seconds=30.0,
    ),
    "quick": Profile(
        population=10_000,
        rates=(0, 100, 1000),
        populations=(),
        sweep_rate=100,
        requests=1_000,
        warmup=300,
        big_keys=300_000,
        big_stores=("sqlite",),
        big_warmup=2_000,
        big_requests=2_000,
        rewarm_keys=100_000,
        rewarm_seconds=5.0,
    ),
    "smoke": Profile(
        population=1_000,
        rates=(0, 100),
        populations=(),
        sweep_rate=100,
        requests=200,
        warmup=50,
        big_keys=2_000,
        big_stores=("sqlite", "postgres"),
        big_warmup=200,
        big_requests=200,
        rewarm_keys=300,
        rewarm_seconds=5.0,
    ),
}


# --- the world ------------------------------------------------------------------------------


def _account(key: int) -> int:
    return key // KEYS_PER_ACCOUNT


def _organization(account: int) -> int:
    return account // ACCOUNTS_PER_ORGANIZATION


def _tenant(organization: int) -> int:
    return organization // ORGANIZATIONS_PER_TENANT


@dataclass(frozen=True)
class World:
    """A filled population: its key ids, in order, and the secret they share."""

    kind: str
    where: str
    ids: list[str]
    secret: str
    secret_hash: str

    def active(self) -> list[int]:
        """The active keys' indexes, in Zipf rank order (hottest first), reproducibly."""
        rng = random.Random(len(self.ids) * 7 + 1)
        return rng.sample(range(len(self.ids)), max(1, int(len(self.ids) * ACTIVE)))


def _database(kind: str, where: str, *, replica: bool) -> Any:
    if kind == "postgres":
        from keyturn.stores.postgres import PostgresDatabase

        return PostgresDatabase(where, replica=replica)
    from keyturn.stores.sqlite import SQLiteDatabase

    return SQLiteDatabase(where, replica=replica)


# Every key cloned from one inserted through the store, under its own id, account and
# organization; first_used_at set, so no use made here is a change.
_CLONED: Final = "secret_hash, hint, name, created_at, expires_at, revoked_at, last_used_at"
_KEY_COLUMNS: Final = f"key_id, account_id, tenant_id, organization_id, first_used_at, {_CLONED}"


def _rows(population: int) -> tuple[list[tuple[str, str, bool]], list[tuple[str, str, str]]]:
    accounts = max(1, math.ceil(population / KEYS_PER_ACCOUNT))
    organizations = _organization(accounts - 1) + 1
    orgs = [
        (f"o{o}", f"t{_tenant(o)}", o % ORGANIZATIONS_PER_TENANT == 0) for o in range(organizations)
    ]
    orgs.sort(key=lambda row: not row[2])  # a tenant's default first (a trigger checks)
    members = [
        (f"a{a}", f"o{_organization(a)}", "admin" if a % 2 else "member") for a in range(accounts)
    ]
    return orgs, members


def _key_params(ids: Sequence[str]) -> Iterator[tuple[str, str, str, str]]:
    for index, key_id in enumerate(ids):
        organization = _organization(_account(index))
        yield key_id, f"a{_account(index)}", f"t{_tenant(organization)}", f"o{organization}"


def _fill(kind: str, where: str, population: int, fakes: FakeKeys) -> list[str]:
    """The population's tables; the key ids, in order."""
    ids = list(key_ids(population, seed=population))
    template = next(key_ids(1, seed=-1))
    with _database(kind, where, replica=False) as db:
        db.create_schema()
        db.keys.add_key(next(fake_records(fakes, iter([template]))))
    orgs, members = _rows(population)
    keys = list(_key_params(ids))
    if kind == "sqlite":
        connection = sqlite3.connect(where, timeout=30)
        try:
            with connection:
                connection.executemany(
                    "INSERT INTO keyturn_organizations (id, tenant_id, is_default) "
                    "VALUES (?, ?, ?)",
                    orgs,
                )
                connection.executemany(
                    "INSERT INTO keyturn_memberships (account_id, organization_id, role) "
                    "VALUES (?, ?, ?)",
                    members,
                )
                connection.executemany(
                    f"INSERT INTO keyturn_keys ({_KEY_COLUMNS}) "  # noqa: S608 - constants only
                    f"SELECT ?, ?, ?, ?, created_at, {_CLONED} FROM keyturn_keys WHERE key_id = ?",
                    ((*row, template) for row in keys),
                )
        finally:
            connection.close()
        return ids
    import psycopg

    with psycopg.connect(where, autocommit=True) as connection:
        for default in (True, False):
            chosen = [row for row in orgs if row[2] is default]
            connection.execute(
                "INSERT INTO keyturn_organizations (id, tenant_id, is_default) "
                "SELECT * FROM unnest(%s::text[], %s::text[], %s::boolean[])",
                tuple(list(column) for column in zip(*chosen, strict=True))
                if chosen
                else ([], [], []),
            )
        connection.execute(
            "INSERT INTO keyturn_memberships (account_id, organization_id, role) "
            "SELECT * FROM unnest(%s::text[], %s::text[], %s::text[])",
            tuple(list(column) for column in zip(*members, strict=True)),
        )
        connection.execute(
            f"INSERT INTO keyturn_keys ({_KEY_COLUMNS}) "  # noqa: S608 - constants only
            f"SELECT u.id, u.account, u.tenant, u.org, t.created_at, "
            f"{', '.join('t.' + c for c in _CLONED.split(', '))} "
            "FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[]) "
            "AS u(id, account, tenant, org) "
            "CROSS JOIN (SELECT * FROM keyturn_keys WHERE key_id = %s) AS t",
            (*(list(column) for column in zip(*keys, strict=True)), template),
        )
        connection.execute("ANALYZE")
    return ids


@contextmanager
def _worlds(settings: Settings, kind: str) -> Iterator[Any]:
    """Make (and at the end drop) filled populations of one store, one per size."""
    made: dict[int, World] = {}
    fakes = fake_keys()
    with ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="keyturn-bench-"))

        def world(population: int) -> World:
            if population not in made:
                if kind == "postgres":
                    assert settings.postgres_dsn is not None
                    where = stack.enter_context(postgres_schema(settings.postgres_dsn))
                else:
                    where = str(Path(folder) / f"scale-{population}.sqlite3")
                ids = _fill(kind, where, population, fakes)
                made[population] = World(kind, where, ids, fakes.secret, fakes.secret_hash)
            return made[population]

        yield world


# --- traffic, writes and the LRU they are compared with -------------------------------------


def zipf_trace(keys: int, count: int, seed: int) -> list[int]:
    """*count* ranks in ``range(keys)``, rank *r* drawn with weight ``1 / (r + 1) ** ZIPF``."""
    weights = itertools.accumulate(1.0 / (rank + 1) ** ZIPF for rank in range(keys))
    return random.Random(seed).choices(range(keys), cum_weights=list(weights), k=count)


def lru_misses(trace: Sequence[int], size: int, measured_from: int) -> int:
    """Misses of an LRU of *size* entries run on *trace*, counted from *measured_from*."""
    recent: OrderedDict[int, None] = OrderedDict()
    misses = 0
    for position, item in enumerate(trace):
        if item in recent:
            recent.move_to_end(item)
            continue
        if position >= measured_from:
            misses += 1
        recent[item] = None
        if len(recent) > size:
            recent.popitem(last=False)
    return misses


Write = tuple[str, str]  # (what, whose id): the writer's j-th write


def _plan(world: World, active: list[int], writes: int, seed: int) -> list[Write]:
    rng = random.Random(seed)
    in_traffic = set(active)
    population = len(world.ids)
    accounts = max(1, math.ceil(population / KEYS_PER_ACCOUNT))
    kinds = [kind for kind, _ in MIX]
    shares = [share for _, share in MIX]
    plan: list[Write] = []
    added: list[str] = []
    revoked: set[int] = set()
    for j in range(writes):
        kind = rng.choices(kinds, shares)[0]
        if kind == "create":
            plan.append(("create", f"w{seed}.{j}"))
        elif kind == "role":
            plan.append(("role", f"a{rng.randrange(accounts)}"))
        elif kind == "organization":
            if added and rng.random() < 0.5:
                plan.append(("remove organization", added.pop()))
            else:
                added.append(f"wo{seed}.{j}")
                plan.append(("add organization", added[-1]))
        else:
            for _ in range(100):  # a key not revoked yet, in the traffic or out of it
                index = rng.choice(active) if kind == "revoke active" else rng.randrange(population)
                if index not in revoked and (kind == "revoke active") == (index in in_traffic):
                    revoked.add(index)
                    plan.append(("revoke", world.ids[index]))
                    break
            else:
                plan.append(("create", f"w{seed}.{j}"))
    return plan


def _touches(write: Write, world: World) -> tuple[str, str]:
    """What a write touches, as the instances index it: (key | account | organization, id)."""
    what, whose = write
    if what == "role":
        return ("account", whose)
    if what.endswith("organization"):
        return ("organization", whose)
    return ("key", whose)


def _write(db: Any, write: Write, fakes: FakeKeys, tenants: int) -> None:
    what, whose = write
    now = datetime.now(UTC)
    if what == "create":
        new_id = "".join(random.Random(whose).choices(_token.ALPHABET, k=_token.ID_LENGTH))
        record = next(fake_records(fakes, iter([new_id])))
        db.keys.add_key(attrs.evolve(record, account_id=f"w{whose}"))
    elif what == "role":
        organization = _organization(int(whose[1:]))
        db.membership.add_member(whose, f"o{organization}", role=f"r{time.monotonic_ns()}")
    elif what == "add organization":
        tenant = random.Random(whose).randrange(tenants)
        db.membership.add_organization(whose, tenant_id=f"t{tenant}")
    elif what == "remove organization":
        db.membership.remove_organization(whose)
    else:
        db.keys.revoke_key(whose, now)


# --- the processes --------------------------------------------------------------------------

_NEVER: Final = -(1 << 62)  # the instant of a write that never came


def _spin(condition: Any, deadline: float, what: str) -> None:
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.00005)


def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _open(kind: str, where: str, counts: Any) -> Any:
    from bench import _probes

    if kind == "postgres":
        db = _probes.postgres_database(where, counts)
        with db.connection():  # the first connection lent starts the listener
            pass
        _spin(lambda: bool(db.replica.current), time.monotonic() + 30, "the listener")
        return db
    return _database(kind, where, replica=True)


def _close(auth: Any, db: Any) -> None:
    """Stop an instance: its Authenticator, then its database (and a pool of ours)."""
    import logging

    # Usage writes still queued when the database closes fail, and say so: expected here.
    logging.getLogger("keyturn").setLevel(logging.CRITICAL)
    if auth is not None:
        auth.close()
    if db is not None:
        db.close()
        pool = getattr(db, "bench_pool", None)
        if pool is not None:
            pool.close()


def _instance(job: dict[str, Any], index: int, shared: dict[str, Any], results: Any) -> None:
    """One listening instance (a process of its own): warm, then one bounded request loop
    per phase, each started by the parent."""
    from bench import _probes
    from keyturn import Authenticator, AuthRequest, Principal

    counts = _probes.install()
    db = auth = None
    phase = -1
    try:
        kind, world = job["kind"], job["world"]
        db = _open(kind, world.where, counts)
        # Usage recording off: its writes change nothing the decision reads (they are
        # counted in the re-warming).
        auth = Authenticator(db.keys, db.membership, usage_interval=None)
        fakes = FakeKeys(secret_hash=world.secret_hash, secret=world.secret)
        slots: list[int] = job["slots"]  # key indexes, by rank
        requests = [
            AuthRequest(authorization=(f"Bearer {fakes.token(world.ids[i])}",), path=MODELS)
            for i in slots
        ]
        # The verified-token cache, coldest key first (so the hottest are kept longest).
        _probes.prewarm(
            auth, (fakes.token(world.ids[i]) for i in reversed(slots)), world.secret_hash
        )
        rss = _rss_bytes()
        for rank in job["prime"]:  # the replica and the memo, before any write
            auth.authenticate(requests[rank])
        primed_bytes = _rss_bytes() - rss  # what the replica and the memo keep for them
        keys = [world.ids[i] for i in slots]
        accounts = [f"a{_account(i)}" for i in slots]
        organizations = [f"o{_organization(_account(i))}" for i in slots]
        # What -> when the last write that touched it returned; rank -> when its last
        # decision began (monotonic ns: one clock for every process of the machine).
        last: dict[tuple[str, str], int] = {}
        decided_at = dict.fromkeys(job["prime"], 0)
        progress, written, commits = shared["progress"], shared["written"], shared["commits"]
        shared["ready"][index] = 1
        for phase, spec in enumerate(job["phases"]):
            _spin(
                lambda p=phase: shared["phase"].value == p,
                time.monotonic() + RUN_SECONDS,
                "a phase",
            )
            trace: list[int] = spec["trace"]
            warmup: int = spec["warmup"]
            for rank in trace[:warmup]:  # no write comes before every instance is past this
                auth.authenticate(requests[rank])
                decided_at.setdefault(rank, 0)
            k: int = spec["per_write"]  # requests per write; 0: no writer
            plan: list[tuple[str, str]] = spec["touches"]
            window: int = spec["window"]
            seen = hits = first = touched = untouched = refused = 0
            counts.zero()
            hits_before = _probes.memo_hits(auth)
            cpu, started = time.process_time(), time.monotonic()
            deadline = started + RUN_SECONDS
            measured = trace[warmup:]
            for n, rank in enumerate(measured):
                if k:
                    block = n // k
                    if written.value < block:
                        _spin(lambda b=block: written.value >= b, deadline, "the writer")
                    done = written.value
                    for j in range(seen, done):
                        last[plan[j]] = commits[j]
                    seen = done
                began = time.monotonic_ns()
                before = _probes.memo_hits(auth)
                outcome = auth.authenticate(requests[rank])
                hit = _probes.memo_hits(auth) != before
                if hit:
                    hits += 1
                elif not isinstance(outcome, Principal):
                    refused += 1
                elif rank not in decided_at:
                    first += 1
                else:
                    since = decided_at[rank] - window
                    if (
                        last.get(("key", keys[rank]), _NEVER) >= since
                        or last.get(("account", accounts[rank]), _NEVER) >= since
                        or last.get(("organization", organizations[rank]), _NEVER) >= since
                    ):
                        touched += 1
                    else:
                        untouched += 1
                if not hit:
                    decided_at[rank] = began
                progress[index] = n + 1
            results.put(
                {
                    "index": index,
                    "phase": phase,
                    "requests": len(measured),
                    "hits": hits,
                    "memo_hits": _probes.memo_hits(auth) - hits_before,
                    "first": first,
                    "touched": touched,
                    "untouched": untouched,
                    "refused": refused,
                    "cpu_s": time.process_time() - cpu,
                    "wall_s": time.monotonic() - started,
                    "replica_size": _probes.replica_size(db),
                    "primed": len(job["prime"]),
                    "primed_bytes": primed_bytes,
                    **counts.as_dict(),
                }
            )
    except Exception as exc:  # said to the parent, which raises it
        results.put({"index": index, "phase": phase, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        _close(auth, db)


def _writer(job: dict[str, Any], shared: dict[str, Any], results: Any) -> None:
    """The writes elsewhere (a process of its own), in lockstep with the instances."""
    db = None
    phase = -1
    try:
        world: World = job["world"]
        db = _database(job["kind"], world.where, replica=False)
        fakes = FakeKeys(secret_hash=world.secret_hash, secret=world.secret)
        tenants = _tenant(_organization(_account(len(world.ids) - 1))) + 1
        progress, written, commits = shared["progress"], shared["written"], shared["commits"]
        for phase, spec in enumerate(job["phases"]):
            _spin(
                lambda p=phase: shared["phase"].value == p,
                time.monotonic() + RUN_SECONDS,
                "a phase",
            )
            k, plan = spec["per_write"], spec["plan"]
            deadline = time.monotonic() + RUN_SECONDS
            for j, write in enumerate(plan):
                target = (j + 1) * k
                _spin(lambda t=target: min(progress) >= t, deadline, "the instances")
                _write(db, write, fakes, tenants)
                commits[j] = time.monotonic_ns()  # the write returned: committed
                written.value = j + 1
            results.put({"index": "writer", "phase": phase, "writes": len(plan)})
    except Exception as exc:
        results.put({"index": "writer", "phase": phase, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        if db is not None:
            db.close()


def _run_processes(
    jobs: list[dict[str, Any]], writer: dict[str, Any] | None
) -> list[list[dict[str, Any]]]:
    """Start the instances of *jobs* (and the writer), wait until each is warm, run their
    phases one after the other, and collect what each said in each; every process is
    stopped by its PID."""
    context = multiprocessing.get_context("spawn")
    phases = len(jobs[0]["phases"])
    most = max([len(spec["plan"]) for spec in writer["phases"]] if writer else [0])
    shared = {
        "ready": context.RawArray("i", len(jobs)),
        "progress": context.RawArray("q", len(jobs)),
        "written": context.RawValue("q", 0),
        "commits": context.RawArray("q", max(1, most)),
        "phase": context.RawValue("i", -1),
    }
    results = context.Queue()
    processes = [
        context.Process(target=_instance, args=(job, index, shared, results), daemon=True)
        for index, job in enumerate(jobs)
    ]
    if writer is not None:
        processes.append(
            context.Process(target=_writer, args=(writer, shared, results), daemon=True)
        )
    said: list[list[dict[str, Any]]] = []
    try:
        for process in processes:
            process.start()
        deadline = time.monotonic() + SETUP_SECONDS
        while not all(shared["ready"]):
            if time.monotonic() > deadline or any(p.exitcode is not None for p in processes):
                break
            time.sleep(0.01)
        for phase in range(phases):
            for index in range(len(jobs)):
                shared["progress"][index] = 0
            shared["written"].value = 0
            shared["phase"].value = phase
            got = [results.get(timeout=SETUP_SECONDS + RUN_SECONDS) for _ in processes]
            errors = [f"{one['index']}: {one['error']}" for one in got if "error" in one]
            if errors:
                raise RuntimeError("; ".join(errors))
            said.append(got)
    finally:
        shared["phase"].value = phases  # past the last: every loop ends
        for process in processes:
            if process.pid is None:
                continue
            process.join(30)
            if process.is_alive():  # stopped by its PID
                process.terminate()
                process.join(10)
    return said


# --- the three studies ----------------------------------------------------------------------

_SUMMED: Final = (
    *("requests", "hits", "first", "touched", "untouched", "refused"),
    *("read_throughs", "argon2_runs", "clears", "cpu_s"),
)


def _writes_runs(
    world: World, rates: Sequence[int], profile: Profile, seed: int
) -> list[dict[str, Any]]:
    """The write rates, one phase each, over one set of warm instances."""
    active = world.active()
    phases, plans = [], []
    for number, rate in enumerate(rates):
        per_write = RPS // rate if rate else 0
        writes = profile.requests // per_write if per_write else 0
        plan = _plan(world, active, writes, seed * 100 + number)
        plans.append({"per_write": per_write, "plan": plan})
        phases.append(
            {
                "per_write": per_write,
                "touches": [_touches(write, world) for write in plan],
                "window": int(LAG_WINDOW * 1e9) if world.kind == "postgres" else 0,
                "warmup": profile.warmup,
            }
        )
    jobs = []
    for index in range(INSTANCES):
        jobs.append(
            {
                "kind": world.kind,
                "world": world,
                "slots": active,
                "prime": list(range(len(active))),
                "phases": [
                    {
                        **phase,
                        "trace": zipf_trace(
                            len(active),
                            profile.warmup + profile.requests,
                            seed * 1000 + number * 10 + index,
                        ),
                    }
                    for number, phase in enumerate(phases)
                ],
            }
        )
    writer = {"kind": world.kind, "world": world, "phases": plans}
    runs = []
    for plan, got in zip(plans, _run_processes(jobs, writer), strict=True):
        instances = [one for one in got if one["index"] != "writer"]
        total = {name: sum(one[name] for one in instances) for name in _SUMMED}
        total["writes"] = len(plan["plan"])
        total["active"] = len(active)
        runs.append(total)
    return runs


def _big_run(world: World, profile: Profile, seed: int) -> dict[str, Any]:
    """One instance, every key active: the replica filled with the hottest keys it holds
    (coldest first, as an LRU would end up), then Zipf warm-up and counted requests."""
    from bench import _probes

    slots = list(range(len(world.ids)))
    random.Random(seed).shuffle(slots)
    size = _probes.default_replica_size()
    prime = list(reversed(range(min(size, len(slots)))))
    trace = zipf_trace(len(slots), profile.big_warmup + profile.big_requests, seed)
    job = {
        "kind": world.kind,
        "world": world,
        "slots": slots,
        "prime": prime,
        "phases": [
            {
                "per_write": 0,
                "touches": [],
                "window": 0,
                "warmup": profile.big_warmup,
                "trace": trace,
            }
        ],
    }
    ((said,),) = _run_processes([job], None)
    said["lru_misses"] = lru_misses(prime + trace, size, len(prime) + profile.big_warmup)
    said["distinct"] = len(set(trace[profile.big_warmup :]))
    return said


def _rewarm_run(world: World, profile: Profile, seed: int) -> dict[str, Any]:
    """A fresh instance sends each of ``rewarm_keys`` keys once, within the budget."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    keys = min(profile.rewarm_keys, len(world.ids))
    job = {"kind": world.kind, "world": world, "keys": keys, "seed": seed}
    process = context.Process(
        target=_rewarm, args=(job, profile.rewarm_seconds, results), daemon=True
    )
    try:
        process.start()
        said: dict[str, Any] = results.get(timeout=SETUP_SECONDS + profile.rewarm_seconds)
    finally:
        process.join(30)
        if process.is_alive():  # stopped by its PID
            process.terminate()
            process.join(10)
    if "error" in said:
        raise RuntimeError(f"re-warming: {said['error']}")
    return said


def _rewarm(job: dict[str, Any], budget: float, results: Any) -> None:
    """A fresh instance (defaults: usage recorded), each key once; its usage writes are
    flushed (``close()``, at most five seconds) before the statements are read."""
    from bench import _probes
    from keyturn import Authenticator, AuthRequest, Principal

    counts = _probes.install()
    said: dict[str, Any] = {}
    db = auth = None
    try:
        world: World = job["world"]
        fakes = FakeKeys(secret_hash=world.secret_hash, secret=world.secret)
        order = random.Random(job["seed"]).sample(range(len(world.ids)), job["keys"])
        tokens = [fakes.token(world.ids[i]) for i in order]
        counts.zero()
        cpu, started = time.process_time(), time.monotonic()
        db = _open(job["kind"], world.where, counts)
        auth = Authenticator(db.keys, db.membership)
        deadline = started + budget
        done = accepted = 0
        for token in tokens:
            if time.monotonic() > deadline:
                break
            request = AuthRequest(authorization=(f"Bearer {token}",), path=MODELS)
            accepted += isinstance(auth.authenticate(request), Principal)
            done += 1
        wall = time.monotonic() - started
        auth.close()  # the usage writes queued, written (bounded)
        said.update(
            keys=job["keys"],
            done=done,
            accepted=accepted,
            cpu_s=time.process_time() - cpu,
            wall_s=wall,
            **counts.as_dict(),
        )
    except Exception as exc:
        said["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        results.put(said)
        _close(auth, db)


# --- the report -----------------------------------------------------------------------------


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "n/a"


def _per(part: float, whole: float, digits: int = 1) -> str:
    return f"{part / whole:,.{digits}f}" if whole else "-"


def _writes_table(report: Report, runs: list[tuple[str, int, int, dict[str, Any]]]) -> Table:
    table = Table(
        f"the memo under writes elsewhere: {INSTANCES} listening instances, Zipf traffic over "
        f"{ACTIVE:.0%} active keys, {RPS:,} requests per instance per second of writes "
        "(lockstep); re-decisions per write and per instance",
        [
            "store",
            "keys",
            "active",
            "writes/s",
            "writes",
            "requests",
            "memo hit rate",
            "first",
            "refused",
            "touched / write",
            "untouched / write",
            "read-throughs / req",
            "argon2",
            "clears",
        ],
    )
    for kind, population, rate, got in runs:
        decided = got["requests"] - got["hits"]
        hit_rate = got["hits"] / got["requests"] if got["requests"] else float("nan")
        per_write = got["writes"] * INSTANCES
        table.add(
            kind,
            f"{population:,}",
            f"{got['active']:,}",
            rate,
            got["writes"],
            f"{got['requests']:,}",
            _pct(got["hits"], got["requests"]),
            got["first"],
            got["refused"],
            _per(got["touched"], per_write),
            _per(got["untouched"], per_write),
            _per(got["read_throughs"], got["requests"], 4),
            got["argon2_runs"],
            got["clears"],
        )
        name = f"{kind}.{population}.{rate}"
        report.facts.update(
            {
                f"{name}.hit_rate": hit_rate,
                f"{name}.requests": got["requests"],
                f"{name}.decided": decided,
                f"{name}.writes": got["writes"],
                f"{name}.first": got["first"],
                f"{name}.refused": got["refused"],
                f"{name}.touched": got["touched"],
                f"{name}.untouched": got["untouched"],
                f"{name}.untouched_per_write": got["untouched"] / per_write if per_write else 0,
                f"{name}.clears": got["clears"],
            }
        )
        active = f"{got['active']:,} active keys"
        if rate in (100, 1000):
            goal = HIT_GOAL if rate == 100 else HIT_GOAL_BUSY
            report.targets.append(
                Target(
                    f"Memo hit rate / {goal:.0%}, {kind}, {active}, {rate:,} writes/s elsewhere",
                    hit_rate / goal,
                    ">=",
                    1.0,
                    f"hit rate {_pct(got['hits'], got['requests'])}; "
                    f"{_per(got['untouched'], per_write)} untouched re-decisions per write",
                )
            )
        if rate:
            report.bar(
                f"scale, {kind}, {active}, {rate:,} writes/s: a write re-decides only requests "
                "of what it touched",
                f"{_per(got['untouched'], per_write)} untouched re-decisions per write per "
                f"instance ({got['untouched']:,} in all)",
                "0",
                got["untouched"] == 0,
            )
    return table


def _big_table(report: Report, runs: list[tuple[str, dict[str, Any]]], profile: Profile) -> Table:
    table = Table(
        f"{profile.big_keys:,} active keys, one instance, Zipf traffic: {profile.big_warmup:,} "
        f"requests of warm-up, then {profile.big_requests:,} counted",
        [
            "store",
            "distinct keys",
            "memo hit rate",
            "argon2 runs",
            "/ request",
            "whole-cache clears",
            "read-throughs / req",
            "LRU of the replica's size: misses / req",
            "read-through / LRU",
            "resident bytes per key kept",
        ],
    )
    for kind, got in runs:
        requests = got["requests"]
        through = got["read_throughs"] / requests
        lru = got["lru_misses"] / requests
        ratio = through / lru if lru else (0.0 if through == 0 else float("inf"))
        table.add(
            kind,
            f"{got['distinct']:,}",
            _pct(got["memo_hits"], requests),
            f"{got['argon2_runs']:,}",
            _pct(got["argon2_runs"], requests),
            got["clears"],
            f"{through:.2%}",
            f"{lru:.2%} ({got['replica_size']:,})",
            f"{ratio:.2f}x",
            _per(got["primed_bytes"], got["primed"], 0),
        )
        name = f"big.{kind}"
        report.facts.update(
            {
                f"{name}.requests": requests,
                f"{name}.argon2_runs": got["argon2_runs"],
                f"{name}.clears": got["clears"],
                f"{name}.read_through_rate": through,
                f"{name}.lru_miss_rate": lru,
                f"{name}.bytes_per_key": got["primed_bytes"] / max(1, got["primed"]),
            }
        )
        keys = f"{profile.big_keys:,} active keys"
        report.bar(
            f"scale, {kind}, {keys}: no argon2 run",
            f"{got['argon2_runs']:,} runs in {requests:,} requests",
            "0",
            got["argon2_runs"] == 0,
        )
        report.bar(
            f"scale, {kind}, {keys}: no whole-cache clear",
            f"{got['clears']} clears",
            "0",
            got["clears"] == 0,
        )
        report.targets.append(
            Target(
                f"Read-through rate / LRU miss rate, {kind}, {keys}",
                ratio,
                "<=",
                1.0,
                f"read-through {through:.2%} of requests, "
                f"LRU of {got['replica_size']:,}: {lru:.2%}",
            )
        )
    return table


def _rewarm_table(
    report: Report, runs: list[tuple[str, dict[str, Any]]], profile: Profile
) -> Table:
    table = Table(
        f"re-warming a fresh instance: each of {profile.rewarm_keys:,} keys sent once "
        f"(budget {profile.rewarm_seconds:g} s; past it, projected from the keys done)",
        [
            "store",
            "keys done",
            "seconds",
            "statements",
            "read-throughs",
            "feed",
            "other (usage writes, set-up)",
            f"statements for {profile.rewarm_keys:,}",
            "argon2 runs",
            "CPU in hashing s",
            f"hashing for {profile.rewarm_keys:,} s",
            "process CPU s",
        ],
    )
    for kind, got in runs:
        done, keys = got["done"], got["keys"]
        statements = got["read_throughs"] + got["other_statements"] + got["feed_statements"]
        scale = keys / done if done else float("inf")
        projected = statements * scale
        hashing = got["hashing_cpu_ns"] / 1e9
        hashing_all = hashing * scale
        mark = "" if done == keys else " (projected)"
        table.add(
            kind,
            f"{done:,}",
            f"{got['wall_s']:.1f}",
            f"{statements:,}",
            f"{got['read_throughs']:,}",
            f"{got['feed_statements']:,}",
            f"{got['other_statements']:,}",
            f"{projected:,.0f}{mark}",
            f"{got['argon2_runs']:,}",
            f"{hashing:.2f}",
            f"{hashing_all:.1f}{mark}",
            f"{got['cpu_s']:.1f}",
        )
        name = f"rewarm.{kind}"
        report.facts.update(
            {
                f"{name}.done": done,
                f"{name}.accepted": got["accepted"],
                f"{name}.statements": statements,
                f"{name}.read_throughs": got["read_throughs"],
                f"{name}.statements_projected": projected,
                f"{name}.hashing_s_projected": hashing_all,
            }
        )
        # The goals are for 100k keys: a statement per key, 1 s of hashing per 100k.
        statement_goal = REWARM_STATEMENTS * keys / 100_000
        hashing_goal = REWARM_HASHING_S * keys / 100_000
        report.targets.append(
            Target(
                f"Re-warming {keys:,} keys: statements / {statement_goal:,.0f}, {kind}",
                projected / statement_goal,
                "<=",
                1.0,
                f"{projected:,.0f} statements{mark}",
            )
        )
        report.targets.append(
            Target(
                f"Re-warming {keys:,} keys: CPU in hashing / {hashing_goal:g} s, {kind}",
                hashing_all / hashing_goal,
                "<=",
                1.0,
                f"{hashing_all:.1f} s{mark}; {got['argon2_runs']:,} argon2 runs in {done:,} keys",
            )
        )
    return table


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    profile = PROFILES.get(settings.label, PROFILES["full"])
    kinds = ["sqlite"]
    skipped = postgres_unavailable(settings.postgres_dsn)
    if skipped is None:
        kinds.insert(0, "postgres")
    else:
        report.notes.append(f"PostgreSQL skipped: {skipped}")
    report.facts["postgres_skipped"] = float(skipped is not None)
    writes: list[tuple[str, int, int, dict[str, Any]]] = []
    big: list[tuple[str, dict[str, Any]]] = []
    rewarm: list[tuple[str, dict[str, Any]]] = []
    took: list[str] = []
    for kind in kinds:
        with _worlds(settings, kind) as world:
            began = time.monotonic()
            main = world(profile.population)
            runs = _writes_runs(main, profile.rates, profile, seed=1)
            writes.extend(
                (kind, profile.population, rate, got)
                for rate, got in zip(profile.rates, runs, strict=True)
            )
            took.append(f"{kind} writes {time.monotonic() - began:.0f} s")
            began = time.monotonic()
            rewarm.append((kind, _rewarm_run(main, profile, seed=3)))
            took.append(f"{kind} re-warming {time.monotonic() - began:.0f} s")
            began = time.monotonic()
            for population in profile.populations:
                (got,) = _writes_runs(world(population), (profile.sweep_rate,), profile, seed=7)
                writes.append((kind, population, profile.sweep_rate, got))
            took.append(f"{kind} populations {time.monotonic() - began:.0f} s")
            if kind in profile.big_stores:
                began = time.monotonic()
                big.append((kind, _big_run(world(profile.big_keys), profile, seed=5)))
                took.append(f"{kind} {profile.big_keys:,} keys {time.monotonic() - began:.0f} s")
    report.tables.append(_writes_table(report, writes))
    if big:
        report.tables.append(_big_table(report, big, profile))
    report.tables.append(_rewarm_table(report, rewarm, profile))
    report.notes.append(
        f"rates are ratios, paced by count: {RPS:,} requests per instance per second of "
        "writes, in lockstep with the writer (not wall time); each rate is a phase of the "
        f"same four warm instances, each phase after {profile.warmup:,} uncounted requests "
        "per instance; on PostgreSQL a decided request counts as touched also by a write "
        f"that returned in the {LAG_WINDOW * 1000:g} ms (the lag bound) before its last "
        "decision"
    )
    report.notes.append(
        "warm-path time against the memory store is in sections 0 (instructions) and 6 "
        "(stores): not repeated here"
    )
    report.notes.append("seconds: " + ", ".join(took))
    return report
