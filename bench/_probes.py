"""What the scale section counts inside a process, and where each count is read.

Every probe goes through a surface that outlives the internals around it, so that the
section can be kept working as they change; each is one small function here:

- **argon2 runs** and **CPU in hashing**: ``argon2.low_level.verify_secret`` and
  ``argon2.PasswordHasher.verify`` wrapped wherever a module holds them (a module that
  imported the function by name holds its own reference), timed with the calling thread's
  CPU clock (``time.thread_time_ns``), counted once for nested calls. The functions named
  in :data:`HASHERS` (a SHA-256 check: about a microsecond, less than two reads of that
  clock) are counted, and their CPU is the count times the cost of one call, measured in
  a loop of the same process.
- **whole-cache clears**: ``keyturn.stores._replica.Replica.reset`` (the replica emptied
  whole), and the ``clear`` of every class in :data:`CLEARS` that exists.
- **statements**: SQLite's ``set_trace_callback`` on every connection keyturn opens
  (``keyturn.stores.sqlite._open`` wrapped); PostgreSQL through a pool whose connection
  class counts ``execute`` (the listener's own connection is not in that pool). A
  *read-through* is a ``SELECT`` that reads ``keyturn_keys``; the feed's statements
  (``PRAGMA data_version``, ``keyturn_changes``) are counted apart.
- **memo hits**: ``Authenticator.memo.hits``; a request the memo did not answer was decided.
- **warming without argon2**: :func:`prewarm` puts tokens in the verified-token cache,
  when the Authenticator has one, exactly as their first verification would.
- **sizes**: the replica's and the memo's bounds, read from the objects.
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "Counts",
    "default_replica_size",
    "install",
    "memo_hits",
    "memo_size",
    "postgres_database",
    "prewarm",
    "replica_size",
]

# Hashing functions counted besides argon2's own, as (module, attribute), each with the
# arguments of one call for measuring its cost; missing ones are skipped.
HASHERS: Final = (("keyturn._core.hashing", "check_secret"),)
_SAMPLE_SECRET: Final = "a" * 28  # the length of a key's secret
_CALIBRATION_CALLS: Final = 20_000
# Classes whose clear() empties a cache whole, as (module, class); missing ones skipped.
CLEARS: Final = (("keyturn._core.hashing", "VerifiedTokenCache"),)


@dataclass
class Counts:
    """What the probes counted in this process since :func:`install` (or :meth:`zero`)."""

    argon2_runs: int = 0
    hashing_cpu_ns: int = 0  # argon2's, timed
    hash_checks: int = 0  # the HASHERS' calls
    ns_per_check: float = 0.0  # measured once, at install
    clears: int = 0
    read_throughs: int = 0
    feed_statements: int = 0
    other_statements: int = 0
    _calls: threading.local = field(default_factory=threading.local)  # nesting, per thread

    def zero(self) -> None:
        self.argon2_runs = self.hashing_cpu_ns = self.hash_checks = self.clears = 0
        self.read_throughs = self.feed_statements = self.other_statements = 0

    def statement(self, text: str) -> None:
        head = text.lstrip()[:200].upper()
        if head.startswith("--"):  # a trigger's statement, inside one already counted
            return
        if head.startswith("PRAGMA DATA_VERSION") or "KEYTURN_CHANGES" in head:
            self.feed_statements += 1
        elif head.startswith("SELECT") and "KEYTURN_KEYS" in text.upper():
            self.read_throughs += 1
        else:
            self.other_statements += 1

    def as_dict(self) -> dict[str, int]:
        return {
            "argon2_runs": self.argon2_runs,
            "hashing_cpu_ns": self.hashing_cpu_ns + round(self.hash_checks * self.ns_per_check),
            "hash_checks": self.hash_checks,
            "clears": self.clears,
            "read_throughs": self.read_throughs,
            "feed_statements": self.feed_statements,
            "other_statements": self.other_statements,
        }


def _optional(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _replace_everywhere(original: Callable[..., Any], wrapper: Callable[..., Any]) -> None:
    """Put *wrapper* wherever a keyturn or argon2 module holds *original* by name."""
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("keyturn", "argon2")):
            continue
        for attribute, value in list(vars(module).items()):
            if value is original:
                setattr(module, attribute, wrapper)


def _timed(counts: Counts, function: Callable[..., Any], argon2: bool) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if argon2:
            counts.argon2_runs += 1
        calls = counts._calls
        depth = getattr(calls, "depth", 0)
        calls.depth = depth + 1
        start = time.thread_time_ns() if depth == 0 else 0
        try:
            return function(*args, **kwargs)
        finally:
            calls.depth = depth
            if depth == 0:
                counts.hashing_cpu_ns += time.thread_time_ns() - start

    return wrapper


def _counted(counts: Counts, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        counts.hash_checks += 1
        return function(*args, **kwargs)

    return wrapper


def _cost_of(check: Callable[[str, str], object]) -> float:
    """CPU nanoseconds of one call of *check* on a SHA-256 hash and a key-sized secret."""
    from keyturn._core.hashing import hash_secret

    stored = hash_secret(_SAMPLE_SECRET)
    start = time.thread_time_ns()
    for _ in range(_CALIBRATION_CALLS):
        check(stored, _SAMPLE_SECRET)
    return (time.thread_time_ns() - start) / _CALIBRATION_CALLS


def install() -> Counts:
    """Install every probe in this process (once: a process of the section's own)."""
    import argon2
    import argon2.low_level

    import keyturn  # noqa: F401 - every keyturn module that holds argon2 is loaded
    import keyturn.stores.sqlite as sqlite_store
    from keyturn.stores import _replica

    counts = Counts()
    verify = argon2.low_level.verify_secret
    _replace_everywhere(verify, _timed(counts, verify, argon2=True))
    hasher_verify = argon2.PasswordHasher.verify
    argon2.PasswordHasher.verify = _timed(counts, hasher_verify, argon2=True)  # type: ignore[method-assign]
    for module, name in HASHERS:
        function = _optional(module, name)
        if function is not None:
            counts.ns_per_check = _cost_of(function)
            _replace_everywhere(function, _counted(counts, function))

    reset = _replica.Replica.reset

    def counted_reset(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts.clears += 1
        return reset(self, *args, **kwargs)

    _replica.Replica.reset = counted_reset  # type: ignore[method-assign]
    for module, name in CLEARS:
        cls = _optional(module, name)
        if cls is not None and hasattr(cls, "clear"):
            clear = cls.clear

            def counted_clear(self: Any, *args: Any, _clear: Any = clear, **kwargs: Any) -> Any:
                counts.clears += 1
                return _clear(self, *args, **kwargs)

            cls.clear = counted_clear

    opened = sqlite_store._open

    def traced_open(*args: Any, **kwargs: Any) -> Any:
        connection = opened(*args, **kwargs)
        connection.set_trace_callback(counts.statement)
        return connection

    sqlite_store._open = traced_open  # type: ignore[assignment]
    return counts


def postgres_database(url: str, counts: Counts) -> Any:
    """A ``PostgresDatabase`` (replica on) whose pool counts every statement it runs."""
    import psycopg
    from psycopg_pool import ConnectionPool

    from keyturn.stores.postgres import PostgresDatabase

    class Counting(psycopg.Connection[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            counts.statement(str(query))
            return super().execute(query, params, **kwargs)

    pool: ConnectionPool[Any] = ConnectionPool(
        url,
        connection_class=Counting,
        kwargs={"autocommit": True},
        min_size=1,
        max_size=4,
        timeout=10.0,
        open=True,
    )
    database = PostgresDatabase(pool=pool)
    database.bench_pool = pool  # closed by the caller, after the database
    return database


def memo_hits(authenticator: Any) -> int:
    """Requests the memo answered so far (each other request was decided)."""
    return int(authenticator.memo.hits)


def memo_size(authenticator: Any) -> int:
    return int(authenticator.memo.max_size)


def replica_size(database: Any) -> int:
    """Entries per table the replica keeps (its LRU bound)."""
    return int(database.replica.max_entries)


def default_replica_size() -> int:
    """The entries per table of a replica made with the defaults."""
    from keyturn.stores._replica import Replica

    return int(Replica().max_entries)


def prewarm(authenticator: Any, tokens: Iterable[str], secret_hash: str) -> int:
    """Put *tokens* (every one of *secret_hash*) in the verified-token cache, oldest
    first, as their first verifications would; how many (0 when there is no such cache)."""
    cache = getattr(authenticator, "cache", None)
    if cache is None or not hasattr(cache, "add") or not hasattr(cache, "digest"):
        return 0
    added = 0
    for token in tokens:
        cache.add(cache.digest(token), secret_hash)
        added += 1
    return added
