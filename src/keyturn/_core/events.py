"""What a key event is: the record's model (who did what to which key, through which
channel, when), the making of one, and its handing to the host's hook once recorded.
Public as :mod:`keyturn.activity`."""

from __future__ import annotations

import enum
import logging
import secrets
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final

import attrs

from keyturn._core.fork import renew_in_child
from keyturn._core.model import ApiKey

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


def auto_revoked(old: ApiKey, at: datetime, replacement_id: str) -> KeyEvent:
    """The event of *old*'s revoke at its replacement's first use (a store's ``mark_used``)."""
    return new_event(
        old,
        Action.AUTO_REVOKED,
        at,
        By(actor="keyturn (rotation)"),
        detail=f"its replacement, key {replacement_id}, was first used",
    )


EventHook = Callable[[KeyEvent], object]

log: Final = logging.getLogger("keyturn.activity")


def emit(hook: EventHook | None, event: KeyEvent) -> None:
    """Hand a recorded *event* to the store's hook; a failing hook is logged, nothing else."""
    if hook is None:
        return
    try:
        hook(event)
    except Exception:
        log.exception("the on_event hook failed on %s of key %s", event.action.value, event.key_id)
