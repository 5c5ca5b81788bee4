"""What an engine answers, and the arithmetic every engine shares.

An engine keeps, per subject and aligned window, a count of the requests leased; a lease
adds what fits ``floor(quota - previous x weight + ROUNDING) - used`` and says what it
took (:class:`Grant`). The limiter (``_limiter.py``) decides with it; the engines
(``inprocess.py``, ``redis.py``, ``postgres.py``) only count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

import attrs

__all__ = ["ROUNDING", "Grant", "RateEngine", "weight_at"]


@attrs.frozen
class Grant:
    """An engine's answer to a lease: *granted* requests taken (0 when there is no room),
    the window's count after it (*used*), and the previous window's count (*previous*)."""

    granted: int
    used: int
    previous: int


class RateEngine(Protocol):
    """Where the counts live: one process's memory, Redis or PostgreSQL.

    ``lease`` first takes *returned* (what a lease of window ``index - 1`` left unspent)
    off the previous window's count, then adds at most *want* to the count of *subject* in
    window *index* (of *window* seconds), as much as fits ``floor(quota - previous x
    weight) - used``, and answers what it took. It is atomic across every process sharing
    the engine, and raises (any exception) rather than wait past the engine's deadline.
    """

    shared: bool  # other processes take from the same counts

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
    ) -> Grant: ...

    def read(self, windows: Sequence[tuple[str, int]]) -> list[tuple[int, int]]:
        """For each ``(subject, index)``, the count of window *index* and of the window
        before it, as a lease would see them; takes nothing, writes nothing (the console's
        view). One round trip for them all on a shared engine."""
        ...

    def close(self) -> None: ...


# Counts times weights are rounded as if this much larger: 0.1 x 60 is not 6 in binary.
ROUNDING: Final = 1e-9


def weight_at(now: float, window: int, index: int) -> float:
    """The previous window's weight at *now* in window *index*: 1 at its start, 0 at its end."""
    return ((index + 1) * window - now) / window
