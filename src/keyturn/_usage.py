"""``last_used_at``: at most one write per key per interval, off the request's path.

The :class:`~keyturn.Authenticator` calls :meth:`UsageRecorder.seen` after every request
that passed. While the key's last write is recent -- nearly always -- that costs one dict
lookup and one float comparison. When a write is due, it goes:

- to one background thread, for a store that may block (SQLite, sync PostgreSQL);
- to a fire-and-forget task on the running loop, for an async store: one in flight per key
  and ``max_in_flight`` in all, so writes never take every pooled connection from requests;
- straight to the store, for one that says it never blocks (``nonblocking = True``).

Which of the three is read once, from the store's caller (``_calls.caller_for``), and each
write is the :class:`~keyturn._steps.MarkUsed` step asked through it.

The write is best effort: a failure is logged and forgotten, never raised into a request,
and the key is still considered written so a failing database is not asked again at once.
The store's ``mark_used`` never moves ``last_used_at`` backwards, so a late write is harmless.

Writes still queued when the process ends are not lost to a forgotten ``close()``: at
interpreter exit every recorder with a background thread writes its queue out (at most
five seconds each). Tasks on an event loop cannot run once the loop is gone: the ASGI
middleware waits for them when the server's lifespan shuts down, and otherwise
``Authenticator.aclose()`` does.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

from keyturn._calls import InPlace, caller_for
from keyturn._model import utc_now
from keyturn._steps import MarkUsed

__all__ = ["UsageRecorder"]

log: Final = logging.getLogger("keyturn")


_threaded: weakref.WeakSet[UsageRecorder] = weakref.WeakSet()  # recorders with a thread


@atexit.register
def _write_out_at_exit() -> None:
    """Write what is still queued: the background threads are daemons, killed at exit."""
    for recorder in list(_threaded):
        recorder.close()


class UsageRecorder:
    """Throttles and forwards ``store.mark_used(key_id, at)`` calls.

    :param store: any key store, sync or async.
    :param interval: seconds between two writes for the same key; 0 writes on every use.
    :param clock: the ``at`` of each write (the Authenticator passes its own clock).
    :param timer: a monotonic clock for the throttle.
    :param max_keys: keys remembered at most; forgetting one costs one early write at most.
    :param max_pending: writes queued for the background thread at most; more are dropped.
    :param max_in_flight: an async store's writes running at once at most; more are dropped.
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
    ) -> None:
        if interval < 0:
            raise ValueError(f"interval must be zero or positive seconds, got {interval!r}")
        self.store = store
        self.interval = interval
        self.clock = clock
        self.timer = timer
        self.max_keys = max_keys
        self._due: dict[str, float] = {}  # key id -> next write allowed; oldest first
        self._lock = threading.Lock()
        self._caller = caller_for(store, "mark_used")
        self._queue: queue.Queue[tuple[str, datetime] | None] = queue.Queue(max_pending)
        self._thread: threading.Thread | None = None
        self.max_in_flight = max_in_flight
        self._tasks: dict[str, asyncio.Task[None]] = {}  # key id -> its write, until done
        self._closed = False

    def __repr__(self) -> str:
        return f"UsageRecorder(store={self.store!r}, interval={self.interval!r})"

    def seen(self, key_id: str) -> None:
        """The key was just used: write ``last_used_at`` if its interval has passed."""
        now = self.timer()
        if now < self._due.get(key_id, now):
            return
        with self._lock:
            if now < self._due.get(key_id, now):  # another thread wrote it meanwhile
                return
            # Re-inserting keeps the dict ordered by due time, so the first entry is the
            # one to forget when it is full.
            self._due.pop(key_id, None)
            self._due[key_id] = now + self.interval
            if len(self._due) > self.max_keys:
                del self._due[next(iter(self._due))]
        self._write(key_id, self.clock())

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (waiting at most *timeout* seconds), then stop the thread."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            try:
                self._queue.put(None, timeout=timeout)
            except queue.Full:  # the store is stuck: leave the daemon thread behind
                return
            thread.join(timeout)

    async def flush(self, timeout: float = 5.0) -> None:
        """Wait, at most *timeout* seconds, for the writes an async store is still running."""
        if self._tasks:
            await asyncio.wait(set(self._tasks.values()), timeout=timeout)

    # --- the three ways to write -----------------------------------------------------------

    def _write(self, key_id: str, at: datetime) -> None:
        if self._caller.is_async:
            if key_id in self._tasks or len(self._tasks) >= self.max_in_flight:
                return  # a write of this key is running, or enough are: best effort
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop to run it on: nothing sensible to do
                return
            task = loop.create_task(self._mark_async(key_id, at))
            self._tasks[key_id] = task
            task.add_done_callback(lambda _: self._tasks.pop(key_id, None))
        elif isinstance(self._caller, InPlace):  # it never blocks
            self._mark(key_id, at)
        else:
            self._enqueue(key_id, at)

    def _mark(self, key_id: str, at: datetime) -> None:
        try:
            self._caller.call(MarkUsed(key_id, at), None)
        except Exception as exc:
            log.warning("could not record the use of key %s: %s", key_id, type(exc).__name__)

    async def _mark_async(self, key_id: str, at: datetime) -> None:
        try:
            await self._caller.call_async(MarkUsed(key_id, at), None)
        except Exception as exc:
            log.warning("could not record the use of key %s: %s", key_id, type(exc).__name__)

    def _enqueue(self, key_id: str, at: datetime) -> None:
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
            self._queue.put_nowait((key_id, at))
        except queue.Full:
            log.warning("dropped a last_used_at write: %d are already queued", self._queue.maxsize)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            self._mark(*item)
