"""Section 7: does the warm path stay flat as the key table grows, and what does the cache weigh?

Stores are filled fast: every fake key shares one secret, so one argon2 hash serves them
all and records are inserted pre-built (memory) or bulk-copied from one row (SQLite,
PostgreSQL). Each store's warm set -- the tokens cycled through while timing -- is made warm
by one real verification of its first token; the others are put in the verified-token
cache directly, exactly as their own first verification would (the bench checks that none
of them then runs argon2).

The cache's weight is measured with tracemalloc (bytes allocated and kept by the cache)
and as the growth of the process's resident memory, for ``cache_entries`` entries.
"""

from __future__ import annotations

import gc
import os
import secrets
import tempfile
import tracemalloc
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any, Final

from bench._apps import MODELS
from bench._core import Batch, Report, Settings, Table, paired, times, us
from bench._databases import (
    bulk_copy_postgres,
    bulk_copy_sqlite,
    postgres_schema,
    postgres_unavailable,
)
from bench._world import FakeKeys, fake_keys, fake_records, fill_membership, key_ids
from bench.stores import sync_batch
from keyturn import Authenticator, AuthRequest, Principal
from keyturn._hashing import VerifiedTokenCache
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership

__all__ = ["cache_weight", "run"]

NAME: Final = "scale"
TITLE: Final = "7. Scale: warm path vs number of keys; memory per verified-token cache entry"
FLAT: Final = 1.25  # the largest table may cost at most this much more than the smallest


def _warm_set(authenticator: Authenticator, fakes: FakeKeys, ids: list[str]) -> list[AuthRequest]:
    """Requests for *ids*, all warm: the first verified for real, the others cached."""
    requests = [
        AuthRequest(authorization=(f"Bearer {fakes.token(key_id)}",), path=MODELS) for key_id in ids
    ]
    runs = authenticator.verifier.runs
    first = authenticator.authenticate(requests[0])
    if not isinstance(first, Principal) or authenticator.verifier.runs != runs + 1:
        raise RuntimeError(f"the first fake key did not verify once: {first!r}")
    cache = authenticator.cache
    for key_id in ids[1:]:
        cache.add(cache.digest(fakes.token(key_id)), fakes.secret_hash)
    for request in requests:
        if not isinstance(authenticator.authenticate(request), Principal):
            raise RuntimeError("a fake key was refused")
    if authenticator.verifier.runs != runs + 1:
        raise RuntimeError("a cached fake key ran argon2")
    return requests


def _memory_store(fakes: FakeKeys, size: int, seed: int) -> tuple[MemoryKeyStore, list[str]]:
    store = MemoryKeyStore()
    ids = list(key_ids(size, seed))
    for record in fake_records(fakes, iter(ids)):
        store.add_key(record)
    return store, ids


def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _fake_hashes(count: int) -> list[str]:
    """Distinct strings shaped like the profile's encoded argon2id hashes (no argon2 run)."""
    return [
        f"$argon2id$v=19$m=8192,t=1,p=1${secrets.token_urlsafe(16)[:22]}$"
        f"{secrets.token_urlsafe(32)[:43]}"
        for _ in range(count)
    ]


def _copy(copy: Callable[[str, str, Sequence[str]], None], where: str, ids: list[str]) -> None:
    """Clone the first id's row (inserted through the store) under every other id."""
    copy(where, ids[0], ids[1:])


def _fill(cache: VerifiedTokenCache, tokens: Iterable[str], hashes: Iterable[str]) -> None:
    for token, secret_hash in zip(tokens, hashes, strict=True):
        cache.add(cache.digest(token), secret_hash)


def cache_weight(fakes: FakeKeys, entries: int) -> tuple[float, float]:
    """Bytes per entry of a full verified-token cache: (tracemalloc, resident memory)."""
    tokens = [fakes.token(key_id) for key_id in key_ids(entries, seed=7)]
    hashes = _fake_hashes(entries)
    # Resident memory first, on a heap that has not yet held a cache this size.
    gc.collect()
    rss_before = _rss_bytes()
    measured = VerifiedTokenCache(max_size=entries)
    _fill(measured, tokens, hashes)
    gc.collect()
    rss_bytes = _rss_bytes() - rss_before
    if len(measured) != entries:
        raise RuntimeError(f"the cache holds {len(measured)} entries, not {entries}")
    del measured
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        traced = VerifiedTokenCache(max_size=entries)
        _fill(traced, tokens, hashes)
        gc.collect()
        traced_bytes = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return traced_bytes / entries, rss_bytes / entries


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    fakes = fake_keys()
    postgres_skipped = postgres_unavailable(settings.postgres_dsn)
    batches: dict[str, Batch] = {}
    sizes: dict[str, int] = {}
    groups: list[list[str]] = []
    with ExitStack() as stack:

        def authenticator(store: Any, membership: Any, **options: Any) -> Authenticator:
            made = Authenticator(store, membership, **options)
            stack.callback(made.close)
            return made

        # Memory: the sizes of the settings, all alive at once so they can be paired.
        group = []
        for size in settings.scale_sizes:
            store, ids = _memory_store(fakes, size, seed=size)
            membership = MemoryMembership()
            fill_membership(membership)
            auth = authenticator(store, membership)
            warm = _warm_set(auth, fakes, ids[: min(settings.warm_tokens, size)])
            name = f"memory: {size:,} keys ({len(warm)} warm tokens)"
            batches[name] = sync_batch(auth, warm)
            sizes[name] = settings.batch
            group.append(name)
        groups.append(group)

        # SQLite and PostgreSQL: 10 keys against sql_keys keys, called in the caller's thread
        # (timeout=None) so that only the store's own cost is compared.
        from keyturn.stores.sqlite import SQLiteDatabase

        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="keyturn-bench-"))
        tables: list[tuple[str, int, Any, Callable[[list[str]], None]]] = []
        for size in (10, settings.sql_keys):
            path = str(Path(folder) / f"scale-{size}.sqlite3")
            sqlite = stack.enter_context(SQLiteDatabase(path))
            sqlite.create_schema()
            tables.append(("sqlite", size, sqlite, partial(_copy, bulk_copy_sqlite, path)))
        if postgres_skipped is None:
            assert settings.postgres_dsn is not None
            from keyturn.stores.postgres import PostgresDatabase

            for size in (10, settings.sql_keys):
                url = stack.enter_context(postgres_schema(settings.postgres_dsn))
                postgres = stack.enter_context(PostgresDatabase(url, min_size=2, max_size=4))
                postgres.create_schema()
                tables.append(("postgres", size, postgres, partial(_copy, bulk_copy_postgres, url)))
        else:
            report.notes.append(f"PostgreSQL skipped: {postgres_skipped}")
        by_kind: dict[str, list[str]] = {}
        for kind, size, db, bulk in tables:
            fill_membership(db.membership)
            ids = list(key_ids(size, seed=size + 1))
            db.keys.add_key(next(fake_records(fakes, iter(ids[:1]))))  # through the store
            bulk(ids)
            auth = authenticator(db.keys, db.membership, timeout=None)
            warm = _warm_set(auth, fakes, ids[: min(settings.warm_tokens, size)])
            name = f"{kind}: {size:,} keys ({len(warm)} warm tokens)"
            batches[name] = sync_batch(auth, warm)
            sizes[name] = settings.slow_batch
            by_kind.setdefault(kind, []).append(name)
        groups.extend(by_kind.values())

        result = paired(batches, reps=settings.reps, n=sizes)

    table = Table(
        f"warm path per request through authenticate(), cycling through the warm tokens; "
        f"{settings.reps} paired repetitions",
        ["store", "min us/req", "median us/req", "/ smallest (median ratio)"],
    )
    for group in groups:
        smallest, largest = group[0], group[-1]
        for name in group:
            versus = "-" if name == smallest else times(result.ratio(name, smallest))
            table.add(name, us(result.min(name)), us(result.median(name)), versus)
        growth = result.ratio(largest, smallest)
        kind = largest.split(":")[0]
        report.facts[f"{kind}.largest_over_smallest"] = growth
        report.bar(
            f"scale, {kind}: warm path flat from {smallest.split(' (')[0].split(': ')[1]} "
            f"to {largest.split(' (')[0].split(': ')[1]}",
            times(growth),
            f"<= {FLAT:.2f}x",
            growth <= FLAT,
        )
    report.tables.append(table)

    traced, resident = cache_weight(fakes, settings.cache_entries)
    weight = Table(
        f"verified-token cache: {settings.cache_entries:,} entries",
        ["measure", "bytes per entry", f"total for {settings.cache_entries:,}"],
    )
    weight.add(
        "tracemalloc (allocated and kept)",
        f"{traced:.0f}",
        f"{traced * settings.cache_entries / 2**20:.1f} MiB",
    )
    weight.add(
        "resident memory growth",
        f"{resident:.0f}",
        f"{resident * settings.cache_entries / 2**20:.1f} MiB",
    )
    report.tables.append(weight)
    report.facts["cache.traced_bytes_per_entry"] = traced
    report.facts["cache.resident_bytes_per_entry"] = resident
    report.notes.append(
        "the memory store's records are pre-built ApiKey objects sharing one argon2 hash; the "
        "SQL tables are bulk-copied from one row inserted through the store"
    )
    return report
