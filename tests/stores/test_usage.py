"""The usage recorder: last_used_at written at most once per key per interval, never in the way."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from keyturn import Authenticator
from keyturn._usage import UsageRecorder
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership

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
    assert "dropped" in caplog.text


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
