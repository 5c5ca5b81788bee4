"""What a lifecycle notice says, and which notices are due: pure, no I/O.

:func:`due` reads each account's keys, the leaked keys and the record's events, and answers
the notices due about them (:class:`Due`); the :class:`~keyturn.notices.Notifier` claims
each in the store, then gives it its address as a :class:`Notice`, which names the key by
name and hint, never the secret.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import attrs

from keyturn._core.model import ApiKey, KeyInfo, Status
from keyturn.activity import Action, KeyEvent

REQUEST_BODY: Final = "request-body:"  # the place the payload guard records a leak at


class NoticeKind(enum.Enum):
    """Which notice; its value is what the store's claim and the record name."""

    EXPIRES_IN_14_DAYS = "expires_14d"
    EXPIRES_IN_7_DAYS = "expires_7d"
    EXPIRES_IN_1_DAY = "expires_1d"
    EXPIRED = "expired"
    INACTIVE = "inactive"
    LEAKED = "leaked"
    REVOKED = "revoked"  # by an operator, or automatically


# Nearest first: a key is told the nearest threshold it is within.
_THRESHOLDS: Final = (
    (timedelta(days=1), NoticeKind.EXPIRES_IN_1_DAY),
    (timedelta(days=7), NoticeKind.EXPIRES_IN_7_DAYS),
    (timedelta(days=14), NoticeKind.EXPIRES_IN_14_DAYS),
)
_SUBJECTS: Final = {
    NoticeKind.EXPIRES_IN_14_DAYS: "expires in 14 days",
    NoticeKind.EXPIRES_IN_7_DAYS: "expires in 7 days",
    NoticeKind.EXPIRES_IN_1_DAY: "expires within a day",
    NoticeKind.EXPIRED: "has expired",
    NoticeKind.INACTIVE: "no longer works: you lost access to its scope",
    NoticeKind.LEAKED: "was reported leaked",
    NoticeKind.REVOKED: "was revoked",
}
_ADVICE: Final = {
    NoticeKind.EXPIRES_IN_14_DAYS: "Rotate it in the console before then.",
    NoticeKind.EXPIRES_IN_7_DAYS: "Rotate it in the console before then.",
    NoticeKind.EXPIRES_IN_1_DAY: "Rotate it in the console now, or what uses it will stop.",
    NoticeKind.EXPIRED: "It no longer works: create a new key in the console if it is needed.",
    NoticeKind.INACTIVE: (
        "It works again if your role comes back; otherwise revoke it in the console."
    ),
    NoticeKind.LEAKED: "Anyone who saw it can use it: revoke it and create a new key.",
    NoticeKind.REVOKED: "It no longer works: create a new key in the console if it is needed.",
}


@attrs.frozen(kw_only=True)
class Notice:
    """One notice to one key's creator. It names the key by name and hint, never the secret."""

    kind: NoticeKind
    account_id: str
    address: str  # what address_of answered for the account
    key_id: str
    name: str
    hint: str
    expires_at: datetime
    console_url: str
    detail: str | None = None  # who revoked it and why; where it was seen

    @property
    def subject(self) -> str:
        return f"Your API key “{self.name}” ({self.hint}) {_SUBJECTS[self.kind]}"

    @property
    def text(self) -> str:
        """The notice as plain text, for an email body."""
        lines = [
            f"Your API key “{self.name}” ({self.hint}, id {self.key_id}) {_SUBJECTS[self.kind]}.",
            f"It expires at {self.expires_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC.",
        ]
        if self.detail:
            lines.append(f"Details: {self.detail}")
        lines += ["", _ADVICE[self.kind], f"Your keys: {self.console_url}"]
        return "\n".join(lines) + "\n"

    def as_json(self) -> dict[str, Any]:
        """The notice as a webhook body carries it."""
        return {
            "kind": self.kind.value,
            "to": self.address,
            "account_id": self.account_id,
            "key_id": self.key_id,
            "name": self.name,
            "hint": self.hint,
            "expires_at": self.expires_at.astimezone(UTC).isoformat(),
            "console_url": self.console_url,
            "detail": self.detail,
            "subject": self.subject,
            "text": self.text,
        }


@attrs.frozen(kw_only=True)
class Due:
    """A notice due about one key, before the address is known."""

    kind: NoticeKind
    account_id: str
    key_id: str
    name: str
    hint: str
    expires_at: datetime | None  # None: read from the store when sent
    detail: str | None = None

    @classmethod
    def of(cls, kind: NoticeKind, key: KeyInfo | ApiKey, account_id: str, **extra: Any) -> Due:
        return cls(
            kind=kind,
            account_id=account_id,
            key_id=key.key_id,
            name=key.name,
            hint=key.hint,
            expires_at=key.expires_at,
            **extra,
        )


def due(
    infos: Mapping[str, Sequence[KeyInfo]],
    leaked: Sequence[ApiKey],
    events: Sequence[KeyEvent],
    now: datetime,
    window: timedelta,
) -> list[Due]:
    """Which notices are due at *now*: from each account's keys (``KeyManager.list``), the
    leaked keys and the record's events since ``now - window``. Pure: the claims in the
    store decide which of them were sent before."""
    found: list[Due] = []
    for account_id, keys in infos.items():
        for info in keys:
            if info.status in (Status.ACTIVE, Status.INACTIVE):
                left = info.expires_at - now
                kind = next((k for within, k in _THRESHOLDS if left <= within), None)
                if kind is not None:
                    found.append(Due.of(kind, info, account_id))
            if info.status is Status.INACTIVE:
                found.append(Due.of(NoticeKind.INACTIVE, info, account_id))
            if info.status is Status.EXPIRED and info.expires_at > now - window:
                found.append(Due.of(NoticeKind.EXPIRED, info, account_id))
    for key in leaked:
        if key.leaked is not None and key.leaked.at > now - window:
            found.append(
                Due.of(NoticeKind.LEAKED, key, key.account_id, detail=_seen(key.leaked.url))
            )
    for event in events:
        by_other = event.action is Action.REVOKED and event.actor != event.account_id
        if by_other or event.action is Action.AUTO_REVOKED:
            why = f": {event.detail}" if event.detail else ""
            found.append(
                Due(
                    kind=NoticeKind.REVOKED,
                    account_id=event.account_id,
                    key_id=event.key_id,
                    name=event.name,
                    hint=event.hint,
                    expires_at=None,
                    detail=f"revoked by {event.actor}{why}",
                )
            )
    return found


def _seen(place: str) -> str:
    """Where a leaked key was seen, as its creator's notice says it: quoted (escaped, one
    line) and bounded. A request body by its method and the guard's route only: whoever
    sends a body chooses the rest of its path, and this mail is an official one."""
    if place.startswith(REQUEST_BODY):  # "request-body:POST /managed-agents/v1/"
        method, _, route = place.removeprefix(REQUEST_BODY).partition(" ")
        shown = f" ({method})" if method.isascii() and method.isupper() and len(method) <= 7 else ""
        return f"seen in the body of a request to {_quoted(route, 64)}{shown}"
    return f"seen at {_quoted(place, 200)}"


def _quoted(text: str, limit: int) -> str:
    """*text* in double quotes, escaped as JSON escapes it (ASCII: no line breaks of any
    kind), and cut at *limit* characters with an ellipsis."""
    if len(text) <= limit:
        return json.dumps(text)
    return json.dumps(text[:limit])[:-1] + '\u2026"'
