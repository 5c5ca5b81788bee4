"""Reading the whole record of events a page at a time: none lost or repeated where a page
ends among events of one instant.

It is one flow of :class:`~keyturn._core.steps.EventsSince` steps: the managers drive it
(``_events_since``), and :func:`keyturn.activity.each_event_since` answers it from a store.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from datetime import datetime
from typing import Final

from keyturn._core.events import KeyEvent
from keyturn._core.steps import EventsSince

__all__ = ["PAGE", "events_since"]

PAGE: Final = 1000  # events read at once


def events_since(
    since: datetime | None, write: Callable[[KeyEvent], object], page: int = PAGE
) -> Generator[EventsSince, Sequence[KeyEvent], int]:
    """Hand every event from *since* on to *write*, oldest first; the number handed over."""
    written = 0
    at_edge: set[str] = set()  # ids already written at the instant the next page starts
    while True:  # bounded: each round writes at least one event, or ends, or grows the page
        events = yield EventsSince(since, page)
        fresh = [event for event in events if event.event_id not in at_edge]
        for event in fresh:
            write(event)
        written += len(fresh)
        if len(events) < page:
            return written
        if not fresh:  # a whole page at one instant: read a larger one
            page *= 2
            continue
        since = events[-1].at
        at_edge = {event.event_id for event in events if event.at == since}
