"""Four processes hammer one account on a shared engine (Redis, PostgreSQL): counted.

Each process is another instance: its own limiter, its own connection, leasing slices of
``floor(slack x quota / instances)``. Every decision is recorded with the instant it was
made for, and the run is then replayed against the sliding window counter itself:

- admitted: in every window, and at every admitted request's instant, the count never
  passes ``quota x 1.05`` (leases only hold back: it never passes the quota);
- refused: no request is refused while the account's count stood below ``0.95 x quota``
  (the slack the slices leave unspent: ``instances x slice <= slack x quota``). A process
  has one request in flight at a time, so a count read at an instant may miss one request
  per process: the replay allows for that.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from collections import Counter
from typing import Any

import pytest

from keyturn.ratelimits import Rate, RateEngine, RateLimiter, RateLimits
from keyturn.ratelimits._counts import weight_at
from tests.ratelimits.conftest import principal

QUOTA = 100
WINDOW = 2
INSTANCES = 4
WINDOWS = 3


def hammer(kind: str, target: str, prefix: str, start: float, key: str) -> list[tuple[float, bool]]:
    """One instance: admit requests as fast as it can from *start* for WINDOWS windows."""
    engine: RateEngine
    if kind == "redis":
        from keyturn.ratelimits.redis import RedisEngine

        engine = RedisEngine(target, prefix=prefix, deadline=5.0)
    else:
        from keyturn.ratelimits.postgres import PostgresEngine

        engine = PostgresEngine(target, deadline=5.0)
    limiter = RateLimiter(
        RateLimits(key=Rate(10 * QUOTA, WINDOW), account=Rate(QUOTA, WINDOW)),
        engine=engine,
        instances=INSTANCES,
    )
    who = principal(key=key)
    while time.time() < start:  # bounded by the start the parent chose
        time.sleep(0.005)
    end = start + WINDOWS * WINDOW
    decisions = []
    for _ in range(100_000):  # bounded
        now = time.time()
        if now >= end:
            break
        decisions.append((now, limiter.admit(who, now).allowed))
        time.sleep(0.0005)
    engine.close()
    if limiter.stats.faults:  # a fault fails open: the run would not measure the limiter
        raise RuntimeError(f"the engine failed {limiter.stats.faults} times")
    return decisions


def replay(decisions: list[tuple[float, bool]]) -> dict[str, Any]:
    """Count what the run did, against the sliding window counter of the admitted requests."""
    admitted: Counter[int] = Counter()
    over = under = refused = 0
    worst_admitted = 0.0
    for now, allowed in sorted(decisions):
        index = int(now // WINDOW)
        count = admitted[index - 1] * weight_at(now, WINDOW, index) + admitted[index]
        if allowed:
            admitted[index] += 1
            worst_admitted = max(worst_admitted, count + 1)
            if count + 1 > QUOTA * 1.05:
                over += 1
        else:
            refused += 1
            if count + INSTANCES < QUOTA * 0.95:  # one request in flight per process
                under += 1
    return {
        "admitted": dict(admitted),
        "over": over,
        "under": under,
        "refused": refused,
        "worst": worst_admitted,
    }


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ],
)
def test_four_processes_on_one_account(kind: str, request: pytest.FixtureRequest) -> None:
    """Admitted <= 1.05 x quota in every window; no refusal below 0.95 x quota."""
    if kind == "redis":
        target, prefix = (
            request.getfixturevalue("redis_server"),
            request.getfixturevalue("redis_prefix"),
        )
    else:
        target, prefix = request.getfixturevalue("postgres_schema_url"), ""
        from keyturn.ratelimits.postgres import PostgresEngine

        PostgresEngine(target).close()  # nothing to make yet: the first lease makes the table
    start = (math.floor(time.time() / WINDOW) + 3) * WINDOW  # aligned, after the processes start
    context = multiprocessing.get_context("spawn")
    with context.Pool(INSTANCES) as pool:
        runs = pool.starmap(
            hammer, [(kind, target, prefix, start, f"key{n % 2}") for n in range(INSTANCES)]
        )
    decisions = [decision for run in runs for decision in run]
    counted = replay(decisions)

    windows = range(int(start // WINDOW), int(start // WINDOW) + WINDOWS)
    assert counted["refused"] > 0  # it did hammer past the quota
    assert all(counted["admitted"].get(index, 0) <= QUOTA * 1.05 for index in windows), counted
    assert counted["over"] == 0, counted
    assert counted["under"] == 0, counted
    assert len(decisions) > WINDOWS * QUOTA  # more asked than any window holds


def test_the_replay_counts_what_it_should() -> None:
    """The replay flags an admission past the bound and a refusal well below it."""
    early = [(WINDOW * 10 + 0.001 * n, True) for n in range(QUOTA + 30)]
    assert replay(early)["over"] == 30 - int(QUOTA * 0.05)
    assert replay([(WINDOW * 10.0, False)])["under"] == 1
