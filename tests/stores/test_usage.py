"""The usage recorder: last_used_at written at most once per key per interval, never in the way."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyturn import Authenticator, Reason
from keyturn._run.usage import UsageRecorder
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from keyturn.usage import ACCEPTED

AT = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


class Timer:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class InlineSpy:
    """A store that says it never blocks: written to on the caller's thread."""

    nonblocking = True

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, datetime, str]] = []
        self.fail = fail

    def mark_used(self, key_id: str, at: datetime) -> None:
        self.calls.append((key_id, at, threading.current_thread().name))
        if self.fail:
            raise ConnectionError("database is down")


class ThreadSpy(InlineSpy):
    """A store that may block: written to from the recorder's thread."""

    nonblocking = False

    def __init__(self, fail: bool = False, gate: threading.Event | None = None) -> None:
        super().__init__(fail)
        self.gate = gate

    def mark_used(self, key_id: str, at: datetime) -> None:
        if self.gate is not None:
            self.gate.wait(5)
        super().mark_used(key_id, at)


class AsyncSpy:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def mark_used(self, key_id: str, at: datetime) -> None:
        await asyncio.sleep(0)
        self.calls.append(key_id)


def recorder(store: Any, **options: Any) -> tuple[UsageRecorder, Timer]:
    timer = Timer()
    return UsageRecorder(store, interval=60, clock=lambda: AT, timer=timer, **options), timer


def test_one_write_per_key_per_interval() -> None:
    """Uses within the interval write nothing; the first use after it writes again."""
    store = InlineSpy()
    usage, timer = recorder(store)
    for _ in range(3):
        usage.seen("k1")
        timer.now += 10
    assert [call[0] for call in store.calls] == ["k1"]
    timer.now += 31  # 61 s after the first write
    usage.seen("k1")
    assert [call[0] for call in store.calls] == ["k1", "k1"]


def test_each_key_has_its_own_interval() -> None:
    """A write for one key does not hold back the first write of another."""
    store = InlineSpy()
    usage, _ = recorder(store)
    for key_id in ("k1", "k2", "k1", "k3", "k2"):
        usage.seen(key_id)
    assert [call[0] for call in store.calls] == ["k1", "k2", "k3"]
    assert {call[1] for call in store.calls} == {AT}


def test_a_blocking_store_is_written_from_a_background_thread() -> None:
    """For a store that may block, the write happens on the recorder's thread; close flushes."""
    store = ThreadSpy()
    usage, _ = recorder(store)
    usage.seen("k1")
    usage.seen("k2")
    usage.close()
    assert [(key, thread) for key, _, thread in store.calls] == [
        ("k1", "keyturn-usage"),
        ("k2", "keyturn-usage"),
    ]


def test_an_async_store_is_written_by_a_task() -> None:
    """For an async store, seen() returns at once and a task on the loop does the write."""
    store = AsyncSpy()
    usage, _ = recorder(store)

    async def scenario() -> None:
        usage.seen("k1")
        assert store.calls == []  # not awaited on the request's path
        for _ in range(10):
            await asyncio.sleep(0)
        assert store.calls == ["k1"]

    asyncio.run(scenario())


def test_failures_are_logged_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    """A failing store is logged by key id and type only, and is not retried at once."""
    store = InlineSpy(fail=True)
    usage, _ = recorder(store)
    with caplog.at_level(logging.WARNING, logger="keyturn"):
        usage.seen("k1")
        usage.seen("k1")
    assert len(store.calls) == 1
    assert "k1" in caplog.text and "ConnectionError" in caplog.text


def test_memory_is_bounded() -> None:
    """At most max_keys keys are remembered; the one due soonest is forgotten first."""
    store = InlineSpy()
    usage, timer = recorder(store, max_keys=3)
    for number in range(10):
        usage.seen(f"k{number}")
        timer.now += 1
    written = len(store.calls)
    for number in (7, 8, 9):  # remembered: within their interval, no second write
        usage.seen(f"k{number}")
    assert len(store.calls) == written
    usage.seen("k6")  # forgotten: written again, early
    assert len(store.calls) == written + 1


def test_a_full_queue_drops_writes(caplog: pytest.LogCaptureFixture) -> None:
    """When the background queue is full, more writes are dropped with a warning, not blocked."""
    gate = threading.Event()
    store = ThreadSpy(gate=gate)
    usage, _ = recorder(store, max_pending=1)
    with caplog.at_level(logging.WARNING, logger="keyturn"):
        for number in range(5):  # one in the thread, one queued, three dropped
            usage.seen(f"k{number}")
    gate.set()
    usage.close()
    assert 1 <= len(store.calls) <= 2
    assert "dropped 1 last_used_at writes" in caplog.text


def test_a_queue_that_stays_full_warns_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    """Dropped writes are logged once, then counted until a minute has passed on the timer."""
    gate = threading.Event()
    store = ThreadSpy(gate=gate)
    usage, timer = recorder(store, max_pending=1)
    with caplog.at_level(logging.WARNING, logger="keyturn"):
        for number in range(50):  # one in the thread (or not yet), one queued: the rest dropped
            usage.seen(f"k{number}")
        timer.now += 60
        usage.seen("late")
    gate.set()
    usage.close()
    warnings = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    dropped = 51 - len(store.calls)  # every write made that never reached the store
    assert [w.split(" last_used_at")[0] for w in warnings] == [
        "dropped 1",
        f"dropped {dropped - 1}",
    ]


def test_a_negative_interval_is_refused() -> None:
    """The interval is zero or more seconds."""
    with pytest.raises(ValueError, match="interval"):
        UsageRecorder(InlineSpy(), interval=-1)


def test_the_authenticator_can_turn_usage_off() -> None:
    """usage_interval=None records nothing; a store without mark_used is simply not written."""

    class ReadOnly:
        def get_key(self, key_id: str) -> None:
            return None

    off = Authenticator(MemoryKeyStore(), MemoryMembership(), usage_interval=None)
    read_only = Authenticator(ReadOnly(), MemoryMembership())
    on = Authenticator(MemoryKeyStore(), MemoryMembership(), usage_interval=5)
    try:
        assert off.usage is None
        assert read_only.usage is None
        assert on.usage is not None
        assert on.usage.interval == 5
    finally:
        for auth in (off, read_only, on):
            auth.close()


# --- the daily counts -------------------------------------------------------------------------


class Counting(InlineSpy):
    """A store that never blocks and keeps counts: every count_usage call, as made."""

    def __init__(self) -> None:
        super().__init__()
        self.counted: list[tuple[date, dict[tuple[str, str], int]]] = []

    def count_usage(self, day: date, counts: Mapping[tuple[str, str], int]) -> None:
        self.counted.append((day, dict(counts)))

    def totals(self) -> Counter[tuple[str, date, str]]:
        summed: Counter[tuple[str, date, str]] = Counter()
        for day, counts in self.counted:
            for (key_id, outcome), n in counts.items():
                summed[key_id, day, outcome] += n
        return summed


class MovingClock:
    """The wall clock and the monotonic timer of a recorder, moved together."""

    def __init__(self) -> None:
        self.at = AT
        self.timer = Timer()

    def __call__(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)
        self.timer.now += seconds


def counting(store: Any, **options: Any) -> tuple[UsageRecorder, MovingClock]:
    clock = MovingClock()
    return UsageRecorder(store, interval=60, clock=clock, timer=clock.timer, **options), clock


def test_counts_go_with_the_key_s_next_write() -> None:
    """Uses within the interval are counted in the process, and written with the next use
    after it: no store call per request."""
    store = Counting()
    usage, clock = counting(store)
    for _ in range(4):
        usage.seen("k1")
        clock.advance(10)
    assert store.counted == [(AT.date(), {("k1", ACCEPTED): 1})]
    clock.advance(30)
    usage.seen("k1")
    assert store.counted[1:] == [(AT.date(), {("k1", ACCEPTED): 4})]
    assert len(store.calls) == 2  # last_used_at, with each of the two writes


def test_refusals_naming_a_key_are_counted_by_reason() -> None:
    """A refusal of a key the store holds is counted by its reason, throttled like a use;
    one naming an id the store does not hold is not counted, and no refusal sets
    last_used_at."""
    store = Counting()
    usage, _ = counting(store)
    usage.refused("k1", Reason.REVOKED)
    usage.refused("k1", Reason.REVOKED)
    usage.refused("k1", Reason.ORG_NOT_FOUND)
    usage.refused("ghost", Reason.UNKNOWN_KEY)
    usage.close()
    assert store.totals() == {
        ("k1", AT.date(), "revoked"): 2,
        ("k1", AT.date(), "org_not_found"): 1,
    }
    assert store.calls == []


def test_counts_stay_in_their_utc_day() -> None:
    """Counts made before midnight are written as that day's, by the first write after it,
    whichever key makes it; uses after midnight count for the new day."""
    store = Counting()
    usage, clock = counting(store)
    clock.advance(12 * 3600 - 30)  # 23:59:30
    usage.seen("k1")
    usage.seen("k1")
    usage.seen("k2")
    usage.seen("k2")
    clock.advance(40)  # 00:00:10, within k1's interval
    usage.seen("k1")
    usage.close()
    today, tomorrow = AT.date(), AT.date() + timedelta(days=1)
    assert store.totals() == {
        ("k1", today, ACCEPTED): 2,
        ("k2", today, ACCEPTED): 2,
        ("k1", tomorrow, ACCEPTED): 1,
    }


def test_close_writes_every_count_left() -> None:
    """Counts that no later write took are written by close(), for a blocking store too."""
    store = Counting()
    store.nonblocking = False
    usage, _ = counting(store)
    for key_id in ("k1", "k1", "k2", "k1"):
        usage.seen(key_id)
    usage.close()
    assert store.totals() == {("k1", AT.date(), ACCEPTED): 3, ("k2", AT.date(), ACCEPTED): 1}


def test_threads_counting_one_key_lose_nothing() -> None:
    """Eight threads counting the same keys at once: every request is counted exactly once."""
    store = Counting()
    usage, _ = counting(store)
    per_thread = 5000

    def work() -> None:
        for number in range(per_thread):
            usage.seen(f"k{number % 3}")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    usage.close()
    assert sum(store.totals().values()) == 8 * per_thread


class AsyncCounting:
    """An async store whose writes take a few turns of the loop."""

    def __init__(self) -> None:
        self.store = Counting()

    async def mark_used(self, key_id: str, at: datetime) -> None:
        await asyncio.sleep(0)
        self.store.mark_used(key_id, at)

    async def count_usage(self, day: date, counts: Mapping[tuple[str, str], int]) -> None:
        for _ in range(3):
            await asyncio.sleep(0)
        self.store.count_usage(day, counts)


def test_an_async_store_gets_back_counts_its_busy_key_could_not_take() -> None:
    """While a key's write is in flight, a due write of it is skipped, its counts kept for
    the next; flush() writes what is left, so every request is counted."""
    store = AsyncCounting()
    usage, _ = counting(store, max_in_flight=1)
    usage.interval = 0

    async def scenario() -> None:
        for _ in range(5):
            usage.seen("k1")  # the first starts a write; the others find it in flight
            usage.seen("k2")
        await usage.flush()

    asyncio.run(scenario())
    usage.close()
    assert store.store.totals() == {("k1", AT.date(), ACCEPTED): 5, ("k2", AT.date(), ACCEPTED): 5}


def test_a_store_without_count_usage_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """A host store with mark_used and no count_usage: counts are not kept, and the log
    says so when the recorder starts, not per request."""
    with caplog.at_level(logging.INFO, logger="keyturn"):
        usage, _ = recorder(InlineSpy())
        for _ in range(3):
            usage.seen("k1")
            usage.refused("k1", Reason.REVOKED)
    said = [r for r in caplog.records if "count_usage" in r.getMessage()]
    assert len(said) == 1
    assert "InlineSpy" in said[0].getMessage()


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["k1", "k2", "k3"]),
        st.sampled_from([ACCEPTED, "revoked", "org_not_found", "unknown_key"]),
        st.sampled_from([0, 1, 59, 61, 3600, 20000]),
    ),
    max_size=60,
)


@given(events=EVENTS, interval=st.sampled_from([0, 60, 3600]))
@settings(max_examples=200, deadline=None)
def test_every_count_lands_once_in_its_day(
    events: list[tuple[str, str, int]], interval: int
) -> None:
    """Whatever the order of uses, refusals and pauses (across midnights too), the counts
    written add up to the requests made, each in the UTC day it was made in."""
    store = Counting()
    usage, clock = counting(store)
    usage.interval = interval
    expected: Counter[tuple[str, date, str]] = Counter()
    for key_id, outcome, pause in events:
        clock.advance(pause)
        if outcome == ACCEPTED:
            usage.seen(key_id)
        else:
            usage.refused(key_id, Reason(outcome))
        if outcome != "unknown_key":
            expected[key_id, clock.at.date(), outcome] += 1
    usage.close()
    assert store.totals() == expected


def test_an_async_store_without_counts_closes_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """Closing the recorder of an async store that keeps no counts warns of nothing lost."""
    usage, _ = recorder(AsyncSpy())

    async def scenario() -> None:
        usage.seen("k1")
        usage.seen("k1")
        await usage.flush()

    asyncio.run(scenario())
    with caplog.at_level(logging.WARNING, logger="keyturn"):
        usage.close()
    assert caplog.records == []
