"""The record of every key action: who did what to which key, through which channel, when.

Every create, rotate and revoke (by the creator, by an operator, or automatically when a
rotation's new key is first used), every leak report and every notice sent is one
:class:`KeyEvent` in the key store (keyturn's stores keep them in ``keyturn_events``). keyturn
only appends to the record; revoking a key keeps its events. The console's Activity page
shows the signed-in account the events of its own keys, ``keyturn audit export`` writes
them as JSON lines, and a hook given to the store (``on_event``) sees each one as it is
recorded::

    manager.revoke("alice", key_id, by=By.console("alice", client_address="203.0.113.7",
                                                  user_agent="Mozilla/5.0 ..."))
    manager.activity("alice")      # the account's own keys' events, newest first

Who acted is a :class:`By`: the console and the ``keyturn`` command fill it in; a call
from your own code that names none is recorded as the account acting through the library.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from keyturn._core.events import (
    Action,
    By,
    Channel,
    EventHook,
    KeyEvent,
    emit,
    new_event,
)
from keyturn._core.paging import PAGE, events_since
from keyturn._core.steps import STORE
from keyturn._run.capabilities import capabilities
from keyturn._run.drive import Conduct, drive
from keyturn.errors import ActivityNotKept

__all__ = [
    "Action",
    "ActivityNotKept",
    "By",
    "Channel",
    "EventHook",
    "KeyEvent",
    "as_json",
    "each_event_since",
    "emit",
    "json_line",
    "new_event",
]


def as_json(event: KeyEvent) -> dict[str, Any]:
    """*event* as one JSON object, for a SIEM: instants in ISO 8601 UTC."""
    return {
        "event_id": event.event_id,
        "at": event.at.astimezone(UTC).isoformat(),
        "key_id": event.key_id,
        "account_id": event.account_id,
        "hint": event.hint,
        "name": event.name,
        "action": event.action.value,
        "actor": event.actor,
        "channel": event.channel.value,
        "client_address": event.client_address,
        "user_agent": event.user_agent,
        "detail": event.detail,
    }


def json_line(event: KeyEvent) -> str:
    """*event* as one line of JSON (UTF-8 text, no newline inside)."""
    return json.dumps(as_json(event), ensure_ascii=False, separators=(",", ":"))


def each_event_since(
    store: Any, since: datetime | None, write: Callable[[KeyEvent], object], page: int = PAGE
) -> int:
    """Hand every event from *since* on to *write*, oldest first, reading the store's
    ``events_since`` a page at a time (none lost or repeated where a page ends among events
    of one instant); the number handed over."""
    flow = events_since(since, write, page)  # the managers' paging (_core/paging.py)
    return drive(flow, {STORE: capabilities(store).caller()}, Conduct(), None)
