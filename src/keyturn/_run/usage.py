"""``last_used_at`` and the daily counts: one write per key per interval, off the request's path.

The :class:`~keyturn.Authenticator` calls :meth:`UsageRecorder.seen` after every request
that passed, and :meth:`UsageRecorder.refused` after every refusal that names a key. While
the key's last write is recent -- nearly always -- ``seen`` costs one dict lookup, one
float comparison and one dict increment: the request is counted in the process. When a
write is due, it carries ``last_used_at`` and everything counted for the key since its last
write (:meth:`count_usage`, added to what other processes counted), and it goes:

- to one background thread, for a store that may block (SQLite, sync PostgreSQL);
- to a fire-and-forget task on the running loop, for an async store: one in flight per key
  and ``max_in_flight`` in all, so writes never take every pooled connection from requests;
- straight to the store, for one that says it never blocks (``nonblocking = True``).

Which of the three is read once, from what the store can do (``_run/capabilities.py``),
and each write is a short flow of steps (:class:`~keyturn._core.steps.MarkUsed`, then
:class:`~keyturn._core.steps.CountUsage`) run by the drivers of ``_run/drive.py``.

The write is best effort: a failure is logged and forgotten, never raised into a request,
and the key is still considered written so a failing database is not asked again at once.
The store's ``mark_used`` never moves ``last_used_at`` backwards, so a late write is harmless.
A write that cannot go now (its key's task still running, a full queue) gives its counts
back, to go with the next one.

Counts are per UTC day. Every key's next write is due by the end of the day at the latest,
and the first write after midnight first sends everything counted before it, as that day's.
A store without ``count_usage`` keeps no counts (said once, in the log, at start).

Writes and counts still held when the process ends are not lost to a forgotten ``close()``:
at interpreter exit every recorder with a background thread writes them out (at most
five seconds each). Tasks on an event loop cannot run once the loop is gone: the ASGI
middleware flushes them when the server's lifespan shuts down, and otherwise
``Authenticator.aclose()`` does. A process killed outright loses what it counted since
each key's last write: at most one interval's requests per key.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import math
import queue
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Generator
from datetime import UTC, date, datetime, timedelta
from datetime import time as midnight
from typing import Any, Final

from keyturn._core.fork import renew_in_child
from keyturn._core.model import utc_now
from keyturn._core.steps import STORE, CountUsage, MarkUsed, Step
from keyturn._run.capabilities import Capabilities, InPlace, capabilities
from keyturn._run.drive import Conduct, drive, drive_async
from keyturn.errors import Reason
from keyturn.usage import ACCEPTED

__all__ = ["UsageRecorder"]

log: Final = logging.getLogger("keyturn")
_WARN_EVERY: Final = 60.0  # seconds between warnings of dropped writes


_threaded: weakref.WeakSet[UsageRecorder] = weakref.WeakSet()  # recorders with a thread


@atexit.register
def _write_out_at_exit() -> None:
    """Write what is still queued: the background threads are daemons, killed at exit."""
    for recorder in list(_threaded):
        recorder.close()


Counts = dict[tuple[str, str], int]  # (key id, outcome) -> requests
# One write: the key whose last_used_at to set (None: counts only), when, and the counts
# to add to the day.
_Write = tuple[str | None, datetime, date, Counts]


def _failed(step: Step, exc: Exception) -> None:
    # A write's counts are one key's (named by either step), or a batch's (up to five named).
    if isinstance(step, MarkUsed):
        named = step.key_id
    else:
        assert isinstance(step, CountUsage)
        named = ", ".join(sorted({key for key, _ in step.counts})[:5])
    log.warning("could not record the use of key %s: %s", named, type(exc).__name__)


# A write that fails is logged and forgotten, never raised into a request.
_BEST_EFFORT: Final[Conduct[None]] = Conduct(fail=_failed)


class UsageRecorder:
    """Throttles and forwards ``store.mark_used(key_id, at)`` and ``store.count_usage``.

    :param store: any key store, sync or async.
    :param interval: seconds between two writes for the same key; 0 writes on every use.
    :param clock: the ``at`` of each write, and the day of the counts (the Authenticator
        passes its own clock).
    :param timer: a monotonic clock for the throttle.
    :param max_keys: keys remembered at most; forgetting one costs one early write at most.
    :param max_pending: writes queued for the background thread at most; more wait for
        the key's next write (their ``last_used_at`` is dropped, their counts kept).
    :param max_in_flight: an async store's writes running at once at most; likewise.
    :param store_capabilities: what *store* can do, when its owner read it already.
    """

    def __init__(
        self,
        store: Any,
        *,
        interval: float = 60.0,
        clock: Callable[[], datetime] = utc_now,
        timer: Callable[[], float] = time.monotonic,
        max_keys: int = 100_000,
        max_pending: int = 10_000,
        max_in_flight: int = 4,
        store_capabilities: Capabilities | None = None,
    ) -> None:
        if interval < 0:
            raise ValueError(f"interval must be zero or positive seconds, got {interval!r}")
        self.store = store
        self.interval = interval
        self.clock = clock
        self.timer = timer
        self.max_keys = max_keys
        can = store_capabilities or capabilities(store)
        self.counting = can.has("count_usage")
        if not self.counting:
            log.info(
                "the key store %s has no count_usage(): requests per key and day are not "
                "counted (see keyturn.UsageStore)",
                type(store).__name__,
            )
        self._due: dict[str, float] = {}  # key id -> next write allowed; oldest first
        self._refusal_due: dict[str, float] = {}  # the same, for a key's refusals alone
        # Counted since each key's last write. The warm path adds to _accepted without the
        # lock: CPython does not switch threads within `d[k] += 1` on a str key (eight
        # threads count exactly in tests/stores/test_usage.py).
        self._accepted: defaultdict[str, int] = defaultdict(int)
        self._refused: dict[str, dict[str, int]] = {}  # key id -> reason -> n; under _lock
        self._lock = threading.Lock()
        self._day, self._day_ends = self._today(timer())
        self._callers = {STORE: can.caller()}
        self._async = can.is_async
        self._inline = isinstance(self._callers[STORE], InPlace)  # it never blocks
        self._queue: queue.Queue[_Write | None] = queue.Queue(max_pending)
        self._thread: threading.Thread | None = None
        self.max_in_flight = max_in_flight
        self._tasks: dict[str, asyncio.Task[None]] = {}  # key id -> its write, until done
        self._batches: set[asyncio.Task[None]] = set()  # every key's counts at once
        self._closed = False
        # Writes dropped since the last warning, and when the next may be logged: a queue
        # that stays full says so once a minute, not once a request.
        self._dropped = 0
        self._warn_after = -math.inf
        renew_in_child(self)

    def _after_fork(self) -> None:
        # The writer thread, its queue and the parent's tasks stay with the parent, which
        # also writes what it counted: a child starts its own, from zero.
        self._lock = threading.Lock()
        self._queue = queue.Queue(self._queue.maxsize)
        self._thread = None
        _threaded.discard(self)
        self._tasks, self._batches = {}, set()
        self._accepted, self._refused = defaultdict(int), {}

    def __repr__(self) -> str:
        return f"UsageRecorder(store={self.store!r}, interval={self.interval!r})"

    def seen(self, key_id: str) -> None:
        """The key was just used: count it, and write if its interval has passed."""
        now = self.timer()
        if now < self._due.get(key_id, now):
            self._accepted[key_id] += 1
            return
        self._record(key_id, ACCEPTED, now)

    def refused(self, key_id: str, reason: Reason) -> None:
        """A request with the key was refused for *reason*: count it, unless the store
        holds no such key (then there is nothing to count it against)."""
        if reason is Reason.UNKNOWN_KEY or not self.counting:
            return
        self._record(key_id, reason.value, self.timer())

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued and counted (waiting at most *timeout* seconds), then stop
        the thread. An async store's counts need :meth:`flush` first, on its loop."""
        with self._lock:
            self._closed = True
            thread = self._thread
            day, counts = self._day, self._take_all()
        if not self.counting:
            counts = {}
        if counts and self._async:
            log.warning("%d request counts were not written: call aclose()", sum(counts.values()))
        elif counts and thread is None:
            self._apply(None, self.clock(), day, counts)
        elif counts:
            try:
                self._queue.put((None, self.clock(), day, counts), timeout=timeout)
            except queue.Full:
                return
        if thread is not None:
            try:
                self._queue.put(None, timeout=timeout)
            except queue.Full:  # the store is stuck: leave the daemon thread behind
                return
            thread.join(timeout)

    async def flush(self, timeout: float = 5.0) -> None:
        """Write an async store's counts, and wait at most *timeout* seconds for its writes."""
        if self._async:
            with self._lock:
                day, counts = self._day, self._take_all()
            if counts:
                self._batch(day, counts)
        running = {*self._tasks.values(), *self._batches}
        if running:
            await asyncio.wait(running, timeout=timeout)

    # --- counting ----------------------------------------------------------------------------

    def _record(self, key_id: str, outcome: str, now: float) -> None:
        """Count one request; write the key's use and counts if its write is due."""
        due = self._due if outcome == ACCEPTED else self._refusal_due
        with self._lock:
            rolled = self._roll(now) if now >= self._day_ends else None
            if outcome == ACCEPTED:
                self._accepted[key_id] += 1
            else:
                reasons = self._refused.setdefault(key_id, {})
                reasons[outcome] = reasons.get(outcome, 0) + 1
            if now < due.get(key_id, now):  # another thread wrote it meanwhile
                write = None
            else:
                # Re-inserting keeps the dict ordered by due time, so the first entry is the
                # one to forget when it is full. Due by the day's end: counts stay in their day.
                due.pop(key_id, None)
                due[key_id] = min(now + self.interval, self._day_ends)
                if len(due) > self.max_keys:
                    del due[next(iter(due))]
                write = self._take(key_id)
            day = self._day
        if rolled is not None:
            self._batch(*rolled)
        if write is not None:
            self._write(key_id, outcome == ACCEPTED, day, write)

    def _take(self, key_id: str) -> Counts:
        """What was counted for the key since its last write, taken out (under the lock)."""
        counts = {(key_id, ACCEPTED): self._accepted.pop(key_id, 0)}
        for reason, n in self._refused.pop(key_id, {}).items():
            counts[key_id, reason] = n
        return {entry: n for entry, n in counts.items() if n}

    def _take_all(self) -> Counts:
        """Everything counted and not yet written, taken out (under the lock)."""
        accepted, self._accepted = self._accepted, defaultdict(int)
        refused, self._refused = self._refused, {}
        counts = {(key_id, ACCEPTED): n for key_id, n in accepted.items() if n}
        for key_id, reasons in refused.items():
            counts.update(((key_id, reason), n) for reason, n in reasons.items())
        return counts

    def _give_back(self, day: date, counts: Counts) -> None:
        """Counts whose write could not go now: they go with the key's next write."""
        with self._lock:
            if day != self._day:  # written by the day's end, or lost: never a wrong day
                log.warning("dropped %d request counts of %s", sum(counts.values()), day)
                return
            for (key_id, outcome), n in counts.items():
                if outcome == ACCEPTED:
                    self._accepted[key_id] += n
                else:
                    reasons = self._refused.setdefault(key_id, {})
                    reasons[outcome] = reasons.get(outcome, 0) + n

    def _today(self, now: float) -> tuple[date, float]:
        """The clock's UTC day, and when it ends on the timer."""
        at = self.clock().astimezone(UTC)
        ends = datetime.combine(at.date() + timedelta(days=1), midnight(), UTC)
        return at.date(), now + (ends - at).total_seconds()

    def _roll(self, now: float) -> tuple[date, Counts] | None:
        """A new day began: everything counted so far is the old day's (under the lock)."""
        day, counts = self._day, self._take_all()
        self._day, self._day_ends = self._today(now)
        return (day, counts) if counts else None

    # --- the three ways to write -----------------------------------------------------------

    def _write(self, key_id: str, used: bool, day: date, counts: Counts) -> None:
        """Write the key's use (when *used*) and its *counts*, one of the three ways."""
        at, marked = self.clock(), key_id if used else None
        if self._async:
            if key_id in self._tasks or len(self._tasks) >= self.max_in_flight:
                self._give_back(day, counts)  # best effort for last_used_at, never the counts
                return
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop to run it on: keep the counts for a later one
                self._give_back(day, counts)
                return
            task = loop.create_task(self._apply_async(marked, at, day, counts))
            self._tasks[key_id] = task
            task.add_done_callback(lambda _: self._tasks.pop(key_id, None))
        elif self._inline:
            self._apply(marked, at, day, counts)
        else:
            self._enqueue((marked, at, day, counts))

    def _batch(self, day: date, counts: Counts) -> None:
        """Write every key's counts of *day* at once: at the day's end, and at shutdown."""
        if not self.counting:
            return
        if self._async:
            try:
                task = asyncio.get_running_loop().create_task(
                    self._apply_async(None, self.clock(), day, counts)
                )
            except RuntimeError:
                self._give_back(day, counts)
                return
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)
        elif self._inline:
            self._apply(None, self.clock(), day, counts)
        else:
            self._enqueue((None, self.clock(), day, counts))

    def _writes(
        self, key_id: str | None, at: datetime, day: date, counts: Counts
    ) -> Generator[Step, Any, None]:
        """One write: the key's use (unless *key_id* is ``None``), then its counts."""
        if key_id is not None:
            yield MarkUsed(key_id, at)
        if counts and self.counting:
            yield CountUsage(day, counts)

    def _apply(self, key_id: str | None, at: datetime, day: date, counts: Counts) -> None:
        drive(self._writes(key_id, at, day, counts), self._callers, _BEST_EFFORT, None)

    async def _apply_async(
        self, key_id: str | None, at: datetime, day: date, counts: Counts
    ) -> None:
        flow = self._writes(key_id, at, day, counts)
        await drive_async(flow, self._callers, _BEST_EFFORT, None)

    def _enqueue(self, write: _Write) -> None:
        with self._lock:
            if self._closed:
                return
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name="keyturn-usage", daemon=True
                )
                self._thread.start()
                _threaded.add(self)
        try:
            self._queue.put_nowait(write)
        except queue.Full:
            self._give_back(write[2], write[3])
            with self._lock:
                self._dropped += 1
                now = self.timer()
                if now < self._warn_after:
                    return
                dropped, self._dropped, self._warn_after = self._dropped, 0, now + _WARN_EVERY
            log.warning(
                "dropped %d last_used_at writes: %d are already queued (their counts are kept)",
                dropped,
                self._queue.maxsize,
            )

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            self._apply(*item)
            self._queue.task_done()  # the bench waits for every write handed over to land
