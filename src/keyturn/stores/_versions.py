"""When each thing the decision reads last changed, as far as this process has heard.

Rules of this file (keep them):

1. A change is numbered: :attr:`Versions.seq` counts the changes heard, and
   :attr:`Versions.last` says, for each name a change touched (``(kind, id)``: a key, an
   account's memberships, an organization, a tenant's default), the number of its last
   change. A name not in :attr:`~Versions.last` last changed at or before
   :attr:`Versions.floor`.
2. Bounded: :attr:`~Versions.last` keeps the names changed most recently; the oldest goes
   first, and the floor rises to its number *before* it goes, so a reader never finds a
   name missing with a floor below its last change.
3. A reset (the feed may have missed changes: a restored file, a listener reconnected)
   raises the floor past every number given so far: whatever was read before it no longer
   holds.
4. Everything a change or reset writes is in place before :attr:`~Versions.seq` moves. So
   whoever reads ``seq`` first and then :attr:`~Versions.last` and the floor sees every
   change that ``seq`` counts: "nothing read since *ticket* changed" is then "each name's
   last change, or the floor read after finding it missing, is at most *ticket*"
   (:meth:`Versions.unchanged`), and it holds up to the ``seq`` read first.

The memo (``_run/memo.py``) keeps each answer with the ``seq`` read before the decision read
anything and the names it read; the replica (``_replica.py``) keeps what a read-through
found the same way.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Final

__all__ = ["MAX_NAMES", "Name", "Versions"]

Name = tuple[str, str]  # (kind, id): the kinds of _sql.py's change feed
# Names remembered: at 1,000 changes a second, an answer unused for 100 s is decided
# afresh on its next request (an answer in use has its ticket renewed as it is checked).
MAX_NAMES: Final = 100_000


class Versions:
    """The change numbers of one feed: a store's, or a database's replica's."""

    def __init__(self, size: int = MAX_NAMES) -> None:
        self.size = size
        self.seq = 0  # changes and resets heard
        self.floor = 0  # the last change of every name not in self.last is at most this
        self.last: OrderedDict[Name, int] = OrderedDict()  # oldest change first
        self.resets = 0  # resets heard: the benchmark reads it
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Versions(seq={self.seq}, floor={self.floor}, names={len(self.last)})"

    def moved(self, names: Iterable[Name]) -> None:
        """One change, touching *names*."""
        with self._lock:
            seq = self.seq + 1
            last = self.last
            for name in names:
                last[name] = seq
                last.move_to_end(name)
            while len(last) > self.size:
                oldest, number = next(iter(last.items()))
                self.floor = number  # first (rule 2); oldest first, so it only rises
                del last[oldest]
            self.seq = seq  # last (rule 4)

    def reset(self) -> None:
        """Everything may have changed (rule 3)."""
        with self._lock:
            seq = self.seq + 1
            self.floor = seq
            self.last = OrderedDict()
            self.resets += 1
            self.seq = seq  # last (rule 4)

    def renew_lock(self) -> None:
        """In a forked child: another thread of the parent may have held the lock."""
        self._lock = threading.Lock()

    def unchanged(self, names: Iterable[Name], ticket: int) -> bool:
        """Whether none of *names* changed after *ticket*, by what was heard so far."""
        last = self.last
        for name in names:
            number = last.get(name)
            if number is None:  # the floor read after the miss: it rose before any eviction
                number = self.floor
            if number > ticket:
                return False
        return True
