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

import enum
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

import attrs

from keyturn._fork import renew_in_child
from keyturn._model import ApiKey
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

log: Final = logging.getLogger("keyturn.activity")

MAX_TEXT: Final = 500  # characters of a user agent, reason or detail kept


class Action(enum.Enum):
    """What happened to the key."""

    CREATED = "created"
    ROTATED = "rotated"  # the key was created as the replacement of another (detail: which)
    REVOKED = "revoked"  # by its creator, or by an operator (the actor says which)
    AUTO_REVOKED = "auto_revoked"  # at its replacement's first use, or on a leak report
    LEAK_REPORTED = "leak_reported"  # detail: where it was seen
    NOTICE_SENT = "notice_sent"  # detail: which notice (see keyturn.notices)


class Channel(enum.Enum):
    """Through what the action came."""

    CONSOLE = "console"
    CLI = "cli"
    LEAK_ENDPOINT = "leak_endpoint"
    LIBRARY = "library"


def _clip(text: str | None) -> str | None:
    if text is None:
        return None
    text = "".join(c if c.isprintable() else "\ufffd" for c in str(text))
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "\u2026"


@attrs.frozen(kw_only=True)
class By:
    """Who acts, through which channel; for the console, from which client.

    *actor* ``None`` means the account the operation acts for (the signed-in user).
    """

    channel: Channel = Channel.LIBRARY
    actor: str | None = attrs.field(default=None, converter=_clip)
    client_address: str | None = attrs.field(default=None, converter=_clip)
    user_agent: str | None = attrs.field(default=None, converter=_clip)
    reason: str | None = attrs.field(default=None, converter=_clip)

    @classmethod
    def console(cls, account_id: str, *, client_address: str | None, user_agent: str | None) -> By:
        """The signed-in user, in the console."""
        return cls(
            channel=Channel.CONSOLE,
            actor=account_id,
            client_address=client_address,
            user_agent=user_agent,
        )

    @classmethod
    def operator(cls, name: str, *, reason: str) -> By:
        """An operator, with the ``keyturn`` command, and why."""
        return cls(channel=Channel.CLI, actor=f"operator {name}", reason=reason)


LIBRARY: Final = By()


class _Ids:
    """Event ids that sort after every id this process made before: events recorded at one
    instant (a clock that stands still) list in the order they happened."""

    def __init__(self) -> None:
        self._last_ns = 0
        self._after_fork()
        renew_in_child(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork

    def __call__(self) -> str:
        with self._lock:
            self._last_ns = ns = max(time.time_ns(), self._last_ns + 1)
        return f"{ns:016x}{secrets.token_hex(4)}"


_event_id: Final = _Ids()


@attrs.frozen(kw_only=True)
class KeyEvent:
    """One action on one key, as recorded. It names the key by id, hint and name: never
    the secret. *account_id* is the key's creator, whose Activity page shows it."""

    event_id: str
    at: datetime
    key_id: str
    account_id: str
    hint: str
    name: str
    action: Action
    actor: str
    channel: Channel
    client_address: str | None = None
    user_agent: str | None = None
    detail: str | None = None


def new_event(
    key: ApiKey, action: Action, at: datetime, by: By = LIBRARY, *, detail: str | None = None
) -> KeyEvent:
    """The event of *action* on *key* at *at*, done *by* someone (the creator by default)."""
    return KeyEvent(
        event_id=_event_id(),
        at=at.astimezone(UTC),
        key_id=key.key_id,
        account_id=key.account_id,
        hint=key.hint,
        name=key.name,
        action=action,
        actor=by.actor or key.account_id,
        channel=by.channel,
        client_address=by.client_address,
        user_agent=by.user_agent,
        detail=_clip(detail if detail is not None else by.reason),
    )


EventHook = Callable[[KeyEvent], object]


def emit(hook: EventHook | None, event: KeyEvent) -> None:
    """Hand a recorded *event* to the store's hook; a failing hook is logged, nothing else."""
    if hook is None:
        return
    try:
        hook(event)
    except Exception:
        log.exception("the on_event hook failed on %s of key %s", event.action.value, event.key_id)


def auto_revoked(old: ApiKey, at: datetime, replacement_id: str) -> KeyEvent:
    """The event of *old*'s revoke at its replacement's first use (a store's ``mark_used``)."""
    return new_event(
        old,
        Action.AUTO_REVOKED,
        at,
        By(actor="keyturn (rotation)"),
        detail=f"its replacement, key {replacement_id}, was first used",
    )


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


PAGE: Final = 1000  # events read at once by each_event_since


def each_event_since(
    store: Any, since: datetime | None, write: Callable[[KeyEvent], object], page: int = PAGE
) -> int:
    """Hand every event from *since* on to *write*, oldest first, reading the store's
    ``events_since`` a page at a time (none lost or repeated where a page ends among events
    of one instant); the number handed over."""
    written = 0
    at_edge: set[str] = set()  # ids already written at the instant the next page starts
    while True:  # bounded: each round writes at least one event, or ends, or grows the page
        events = store.events_since(since, page)
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
