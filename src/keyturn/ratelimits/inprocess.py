"""The default engine: the counts in this process's memory, exact for one process.

Each subject keeps its last two windows' counts; a lease is a few integer operations under
a lock. Nothing is shared with other processes: several instances each limit on their own
(use :mod:`keyturn.ratelimits.redis` or :mod:`keyturn.ratelimits.postgres` to share).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

from keyturn._core.fork import renew_in_child
from keyturn.ratelimits._counts import ROUNDING, Grant

__all__ = ["InProcessEngine"]


class InProcessEngine:
    """Counts in memory: ``{subject: [window index, count, previous count]}``."""

    shared = False

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        renew_in_child(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"InProcessEngine(subjects={len(self._counts)})"

    def lease(
        self,
        subject: str,
        *,
        quota: int,
        window: int,
        index: int,
        weight: float,
        want: int,
        returned: int = 0,
    ) -> Grant:
        """Take up to *want* from the subject's room in window *index*."""
        with self._lock:
            counts = self._counts.get(subject)
            if counts is None or counts[0] < index - 1:
                counts = [index, 0, 0]
            elif counts[0] == index - 1:
                counts = [index, 0, max(0, counts[1] - returned)]
            elif counts[0] > index:  # a caller behind the others: its window is over
                return Grant(0, counts[1], counts[2])
            elif returned:
                counts[2] = max(0, counts[2] - returned)
            self._counts[subject] = counts
            room = math.floor(quota - counts[2] * weight + ROUNDING) - counts[1]
            granted = max(0, min(want, room))
            counts[1] += granted
            return Grant(granted, counts[1], counts[2])

    def read(self, windows: Sequence[tuple[str, int]]) -> list[tuple[int, int]]:
        """Each subject's count in window *index* and the one before, as a lease sees them."""
        with self._lock:
            return [self._read(subject, index) for subject, index in windows]

    def _read(self, subject: str, index: int) -> tuple[int, int]:
        counts = self._counts.get(subject)
        if counts is None or counts[0] < index - 1:
            return (0, 0)
        if counts[0] == index - 1:
            return (0, counts[1])
        return (counts[1], counts[2])

    def close(self) -> None:
        """Forget every count."""
        with self._lock:
            self._counts.clear()
