"""The instrument: settings, paired timing, tables, bars and the report of one section.

Every figure is taken in one run of one process, with *paired* repetitions: each repetition
runs every variant back to back, in an order that rotates from one repetition to the next,
so a noisy neighbour slows all variants of that repetition alike. Ratios are computed per
repetition and the median of those ratios is reported, together with the min and median of
the absolute figures. The garbage collector stays on inside every timed loop, as it is in
production: switching it off would favour the variants that allocate most.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

__all__ = [
    "FULL",
    "QUICK",
    "SMOKE",
    "Bar",
    "Batch",
    "Paired",
    "Report",
    "Settings",
    "Table",
    "Target",
    "machine",
    "paired",
    "ratio",
    "run_batch",
    "run_module",
    "target_table",
    "us",
]

POSTGRES_ENV: Final = "KEYTURN_TEST_POSTGRES_DSN"


@dataclass(frozen=True)
class Settings:
    """How much work each section does. Every loop is bounded by these numbers."""

    label: str
    reps: int  # paired repetitions of the in-process sections
    batch: int  # requests per variant per repetition (in-process, warm)
    slow_batch: int  # requests per repetition that reach a database (or decide afresh)
    cold_keys: int  # distinct fresh keys timed on their first request
    concurrency: int  # simultaneous first requests with one new key
    http_rounds: int  # paired rounds of the real-HTTP section
    http_requests: int  # requests per variant per round, at most
    http_seconds: float  # seconds per variant per round, at most
    http_clients: int  # concurrent keep-alive connections
    count_requests: int = 1000  # warm requests per variant under callgrind
    count_variants: tuple[str, ...] | None = None  # None: every variant
    revokes: int = 200  # keys revoked one by one in each revocation-lag run
    limit_seconds: float = 60.0  # the rate limit accuracy run's length
    limit_window: int = 10  # its limit's window, seconds
    limit_quota: int = 1000  # its limit L per window (per key and per account)
    postgres_dsn: str | None = None

    def with_postgres(self, dsn: str | None) -> Settings:
        return replace(self, postgres_dsn=dsn or None)


FULL: Final = Settings(
    label="full",
    reps=21,
    batch=2000,
    slow_batch=200,
    cold_keys=15,
    concurrency=50,
    http_rounds=6,
    http_requests=40_000,
    http_seconds=4.0,
    http_clients=32,
)
QUICK: Final = Settings(
    label="quick",
    reps=7,
    batch=500,
    slow_batch=50,
    cold_keys=5,
    concurrency=50,
    http_rounds=2,
    http_requests=5000,
    http_seconds=1.0,
    http_clients=16,
    count_requests=300,
    revokes=40,
    limit_seconds=12.0,
    limit_window=4,
    limit_quota=400,
)
# For the smoke test: every code path once, tiny counts, no meaningful timing.
SMOKE: Final = Settings(
    label="smoke",
    reps=2,
    batch=20,
    slow_batch=4,
    cold_keys=2,
    concurrency=20,
    http_rounds=1,
    http_requests=30,
    http_seconds=2.0,
    http_clients=2,
    count_requests=20,
    count_variants=("starlette.keyturn",),
    revokes=3,
    limit_seconds=4.0,
    limit_window=2,
    limit_quota=100,
)


# --- timing ---------------------------------------------------------------------------------

Batch = Callable[[int], int]
"""Runs *n* requests and returns the nanoseconds they took (timed inside, setup excluded)."""


def run_batch(batch: Batch, n: int) -> float:
    """Nanoseconds per request of one batch; the garbage collector stays on while it runs.

    The young generations are collected before the batch (outside its timing), so every
    batch starts from the same collector state.
    """
    gc.collect(1)  # the young generations only: a full collection per batch is slow
    return batch(n) / n


@dataclass
class Paired:
    """Per-repetition figures (nanoseconds per request) of variants timed together."""

    samples: dict[str, list[float]]

    def min(self, name: str) -> float:
        return min(self.samples[name])

    def median(self, name: str) -> float:
        return statistics.median(self.samples[name])

    def overheads(self, name: str, base: str) -> list[float]:
        """Per repetition: how much longer *name* took than *base*, in nanoseconds."""
        return [a - b for a, b in zip(self.samples[name], self.samples[base], strict=True)]

    def overhead(self, name: str, base: str) -> float:
        return statistics.median(self.overheads(name, base))

    def ratio(self, name: str, other: str, base: str | None = None) -> float:
        """Median over repetitions of ``name / other`` (of their overheads over *base*)."""
        if base is None:
            return ratio(self.samples[name], self.samples[other])
        return ratio(self.overheads(name, base), self.overheads(other, base))


def ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """The median of the per-repetition ratios (a repetition dividing by <= 0 counts as inf)."""
    values = [
        n / d if d > 0 else float("inf") for n, d in zip(numerators, denominators, strict=True)
    ]
    return statistics.median(values)


def paired(
    variants: Mapping[str, Batch],
    *,
    reps: int,
    n: int | Mapping[str, int],
    warmup: int | None = None,
) -> Paired:
    """Time every variant in each of *reps* repetitions, in rotating order."""
    names = list(variants)
    sizes = {name: n if isinstance(n, int) else n[name] for name in names}
    for name in names:  # warm-up: caches, lazy imports, the first allocation of everything
        run_batch(variants[name], warmup if warmup is not None else max(1, sizes[name] // 4))
    samples: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        gc.collect()
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(run_batch(variants[name], sizes[name]))
    return Paired(samples)


def timed(fn: Callable[[], object]) -> tuple[object, int]:
    """Call *fn* once; its result and the nanoseconds it took."""
    start = time.perf_counter_ns()
    result = fn()
    return result, time.perf_counter_ns() - start


# --- reporting ------------------------------------------------------------------------------


def us(ns: float, digits: int = 2) -> str:
    """Nanoseconds as microseconds, for a table cell."""
    if ns != ns or ns in (float("inf"), float("-inf")):  # NaN or infinite
        return "n/a"
    return f"{ns / 1000:.{digits}f}"


def times(value: float) -> str:
    if value != value or value in (float("inf"), float("-inf")):
        return "n/a"
    return f"{value:.2f}x"


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(cell) for cell in cells])

    def render(self) -> str:
        widths = [len(column) for column in self.columns]
        for row in self.rows:
            widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=True)]

        def line(cells: Iterable[str]) -> str:
            parts = [
                cell.ljust(width) if index == 0 else cell.rjust(width)
                for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
            ]
            return "  ".join(parts).rstrip()

        rule = "  ".join("-" * width for width in widths)
        body = [line(self.columns), rule, *(line(row) for row in self.rows)]
        return "\n".join([self.title, *body])


@dataclass(frozen=True)
class Bar:
    """A performance bar of the design (section 5): what was measured against the target."""

    name: str
    measured: str
    target: str
    passed: bool

    def render(self) -> str:
        verdict = "PASS" if self.passed else "MISS"
        return f"[{verdict}] {self.name}: {self.measured} (bar: {self.target})"


@dataclass(frozen=True)
class Target:
    """One row of the headline table: a ratio measured in this run, against its target.

    *sense* is ``"<="`` or ``"<"`` (lower is better) or ``">="`` (higher is better); a *goal*
    of ``None`` means the row has no target and is there for information.
    """

    name: str
    value: float
    sense: str
    goal: float | None = None
    detail: str = ""

    def distance(self) -> str:
        goal = self.goal
        if goal is None or self.value != self.value:
            return "(info)"
        met = {"<=": self.value <= goal, "<": self.value < goal, ">=": self.value >= goal}
        if met[self.sense]:
            return "met"
        if self.sense != ">=":
            return f"{self.value / goal:.2f}x above"
        return f"{goal / self.value:.2f}x below" if self.value > 0 else "n/a"

    def cells(self) -> list[str]:
        target = "-" if self.goal is None else f"{self.sense} {self.goal:.2f}x"
        return [self.name, times(self.value), target, self.distance(), self.detail]


TARGET_COLUMNS: Final = ["row", "measured", "target", "distance", "detail"]


def target_table(title: str, targets: Iterable[Target]) -> Table:
    table = Table(title, list(TARGET_COLUMNS))
    for target in targets:
        table.rows.append(target.cells())
    return table


@dataclass
class Report:
    """What one section found: tables to print, bars, counted facts, notes."""

    name: str
    title: str
    tables: list[Table] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    facts: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def bar(self, name: str, measured: str, target: str, passed: bool) -> None:
        self.bars.append(Bar(name, measured, target, passed))

    def render(self) -> str:
        parts = [table.render() for table in self.tables]
        if self.targets:
            parts.append(target_table("against the targets", self.targets).render())
        if self.bars:
            parts.append("\n".join(bar.render() for bar in self.bars))
        if self.notes:
            parts.append("\n".join(f"note: {note}" for note in self.notes))
        return "\n\n".join(parts)


def machine() -> str:
    """The machine in one line: CPU model, cores, Python; no paths, no host name."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for text in cpuinfo:
                if text.startswith("model name"):
                    model = text.partition(":")[2].strip()
                    break
    except OSError:
        model = platform.processor() or model
    return (
        f"{model}, {os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()} on {sys.platform}"
    )


ROOT: Final = Path(__file__).resolve().parents[1]


def run_module(
    python: str,
    module: str,
    *args: str,
    before: Sequence[str] = (),
    timeout: float = 900.0,
) -> dict[str, Any]:
    """Run ``python -m module args`` from the project root (behind *before*, e.g. valgrind).

    This is how a benchmark runs a part in a process of its own (under valgrind, say): the
    module imports this same ``bench`` package. Returns the one JSON line it printed last.
    """
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # two runs execute the same instructions
    done = subprocess.run(  # noqa: S603 - our own interpreter and module
        [*before, python, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace")[-1500:]
        raise RuntimeError(f"{python} -m {module} {' '.join(args)} failed: {tail}")
    said: dict[str, Any] = json.loads(done.stdout.decode("utf-8").strip().splitlines()[-1])
    return said
