"""Lifecycle notices: tell a key's creator before it breaks, and when something happens to it.

Every key expires within a year, so every integration breaks unless someone is told. A
:class:`Notifier` run (``keyturn notify`` from cron or a systemd timer, or
:meth:`Notifier.run` from your code) tells each key's creator, once per key and notice:

- the key expires within 14 days, 7 days, 1 day (only the nearest of these is sent: a run
  that first sees a key 5 days before its expiry sends the 7-day notice, not the 14-day);
- it expired; it became Inactive (the creator no longer reaches its scope);
- it was reported leaked (:mod:`keyturn.leaks`);
- it was revoked by an operator (``keyturn keys revoke``) or automatically, at its
  replacement's first use or on a leak report.

Notices concern what happened within *window* (30 days) before the run, so a first run on
an old store does not mail about last year. Who the creator is to mail is your knowledge:
*address_of* maps an account id to an address (or ``None``: no notice, tried again next
run). *deliver* sends one :class:`Notice` and raises if it could not; two are ready:
:class:`SMTPDelivery` (email) and :class:`WebhookDelivery` (a signed POST, checked by the
receiver with :func:`verify_webhook`). A notice names the key by name and hint, never the
secret, and links to your console.

Once, even with several instances: before delivering, the run claims the notice in the
store (``claim_notice``: an insert that only one of any number of concurrent runs wins,
by the table's primary key). A delivery that fails gives the claim back
(``release_notice``), so the next run sends it; a process killed between the claim and
the delivery loses that one notice (at most once, never twice). Each notice sent is
recorded as a ``notice_sent`` event (:mod:`keyturn.activity`).

The store must keep the record (keyturn's own do); a host store without it gets
:class:`~keyturn.activity.ActivityNotKept` when a notifier is built. This module decides
which notices are due (:func:`due`): the rest is plain calls.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import hmac
import http.client
import json
import logging
import re
import smtplib
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from typing import Any, Final

import attrs

from keyturn._model import ApiKey, KeyInfo, Status
from keyturn.activity import LIBRARY, Action, By, KeyEvent, each_event_since, new_event, require
from keyturn.errors import KeyturnError
from keyturn.manager import KeyManager

__all__ = [
    "REPLAY_WINDOW",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "DeliveryFailed",
    "Due",
    "Notice",
    "NoticeKind",
    "Notifier",
    "RunReport",
    "SMTPDelivery",
    "WebhookDelivery",
    "WebhookRejected",
    "due",
    "verify_webhook",
]

log: Final = logging.getLogger("keyturn.notices")

TIMESTAMP_HEADER: Final = "keyturn-timestamp"
SIGNATURE_HEADER: Final = "keyturn-signature"
REPLAY_WINDOW: Final = 300  # seconds: a webhook older or newer than this is refused
REQUEST_BODY: Final = "request-body:"  # the place the payload guard records a leak at
_SECONDS: Final = re.compile(r"[0-9]{1,12}", re.ASCII)  # Unix seconds, until the year 33658


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


@attrs.frozen(kw_only=True)
class RunReport:
    """What one run did: notices sent, already sent (by this run's peers too), failed
    (given back, to be sent by a later run), and left for want of an address."""

    sent: int = 0
    already_sent: int = 0
    failed: int = 0
    no_address: int = 0


class DeliveryFailed(KeyturnError, ConnectionError):
    """A notice could not be delivered; the notifier gives its claim back."""


class Notifier:
    """Sends the lifecycle notices due now, once each (see the module's documentation).

    :param manager: the :class:`~keyturn.KeyManager` over your store (which must keep the
        record, as keyturn's stores do) and membership: it derives each key's status.
    :param deliver: sends one :class:`Notice`, raising if it could not
        (:class:`SMTPDelivery`, :class:`WebhookDelivery`, or your own).
    :param address_of: the creator's address for an account id, or ``None``.
    :param console_url: where the creator manages keys; every notice links to it.
    :param window: how far back the run looks for what happened (default 30 days).
    :param by: who sends, for the record (the library by default; ``keyturn notify`` says
        the CLI).
    :raises ActivityNotKept: the store keeps no record of key actions and notices.
    """

    def __init__(
        self,
        manager: KeyManager,
        *,
        deliver: Callable[[Notice], object],
        address_of: Callable[[str], str | None],
        console_url: str,
        window: timedelta = timedelta(days=30),
        by: By = LIBRARY,
    ) -> None:
        if not isinstance(manager, KeyManager):
            raise TypeError(
                f"manager must be a keyturn.KeyManager (a sync one), got {type(manager).__name__}"
            )
        require(manager.store, "a Notifier")
        for name in ("unrevoked_keys", "claim_notice", "release_notice", "leaked_keys"):
            if not hasattr(manager.store, name):
                require(object(), f"a Notifier (the store has no {name})")
        if not callable(deliver) or not callable(address_of):
            raise TypeError("deliver and address_of must be functions")
        if not isinstance(console_url, str) or not console_url.startswith(("https://", "http://")):
            raise ValueError(f"console_url must be the console's http(s) URL, got {console_url!r}")
        self.manager = manager
        self.store: Any = manager.store
        self.deliver = deliver
        self.address_of = address_of
        self.console_url = console_url
        self.window = window
        self.by = by

    def __repr__(self) -> str:
        return f"Notifier(store={self.store!r}, console_url={self.console_url!r})"

    def run(self) -> RunReport:
        """Send every notice due now that no run sent before; what was done."""
        now = self.manager.clock().astimezone(UTC)
        since = now - self.window
        accounts = sorted({key.account_id for key in self.store.unrevoked_keys(since)})
        infos = {account: self.manager.list(account) for account in accounts}
        events: list[KeyEvent] = []
        each_event_since(self.store, since, events.append)
        counts = {"sent": 0, "already_sent": 0, "failed": 0, "no_address": 0}
        for notice in due(infos, self.store.leaked_keys(), events, now, self.window):
            counts[self._send(notice, now)] += 1
        return RunReport(**counts)

    def _send(self, due_notice: Due, now: datetime) -> str:
        """Claim, deliver and record one notice; which count it adds to."""
        kind, key_id = due_notice.kind, due_notice.key_id
        address = self.address_of(due_notice.account_id)
        if not address:
            return "no_address"
        stored = self.store.get_key(key_id)
        if stored is None:  # gone from the host's store: nothing to name
            return "no_address"
        if not self.store.claim_notice(key_id, kind.value, now):
            return "already_sent"
        notice = Notice(
            kind=kind,
            account_id=due_notice.account_id,
            address=address,
            key_id=key_id,
            name=due_notice.name,
            hint=due_notice.hint,
            expires_at=stored.expires_at,
            console_url=self.console_url,
            detail=due_notice.detail,
        )
        try:
            self.deliver(notice)
        except Exception as exc:
            self.store.release_notice(key_id, kind.value)  # the next run tries again
            log.warning("could not deliver the %s notice of key %s: %s", kind.value, key_id, exc)
            return "failed"
        try:
            event = new_event(stored, Action.NOTICE_SENT, now, self.by, detail=kind.value)
            self.store.record_event(event)
        except Exception:
            log.exception("could not record the %s notice of key %s", kind.value, key_id)
        return "sent"


# --- deliveries ---------------------------------------------------------------------------------


class SMTPDelivery:
    """Sends a notice as a plain-text email over SMTP.

    :param host: the mail server.
    :param port: its port (25, or 587 with *starttls*).
    :param sender: the ``From`` address.
    :param starttls: upgrade the connection with STARTTLS before sending.
    :param username: log in as this user (with *password*), after STARTTLS.
    :param timeout: seconds for the connection and each command.
    """

    def __init__(
        self,
        host: str,
        port: int = 25,
        *,
        sender: str,
        starttls: bool = False,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.host = host
        self.port = port
        self.sender = sender
        self.starttls = starttls
        self.username = username
        self._password = password
        self.timeout = timeout

    def __repr__(self) -> str:  # never the password
        return f"SMTPDelivery({self.host!r}, {self.port}, sender={self.sender!r})"

    def __call__(self, notice: Notice) -> None:
        message = EmailMessage()
        message["From"] = self.sender
        message["To"] = notice.address
        message["Subject"] = notice.subject
        message["X-Keyturn-Notice"] = notice.kind.value
        message.set_content(notice.text)
        try:
            with smtplib.SMTP(self.host, self.port, timeout=self.timeout) as smtp:
                if self.starttls:
                    smtp.starttls()
                if self.username is not None:
                    smtp.login(self.username, self._password or "")
                smtp.send_message(message)
        except (OSError, smtplib.SMTPException) as exc:
            raise DeliveryFailed(f"SMTP {self.host}:{self.port}: {exc}") from exc


class WebhookDelivery:
    """POSTs a notice as JSON to *url*, signed: ``keyturn-timestamp`` (Unix seconds) and
    ``keyturn-signature: v1=<hex HMAC-SHA256 of "<timestamp>." + body under secret>``.
    Receivers check it with :func:`verify_webhook`. Any answer but 2xx is a failure, a
    redirect too (a client that follows one re-sends a POST as an empty GET). Logs and the
    repr show the URL's scheme and host only: a webhook URL may hold a token.

    :param url: the receiver (``https://`` in production).
    :param secret: the key shared with the receiver, at least 16 bytes.
    :param timeout: seconds for the whole request, connection to answer: a receiver that
        sends its answer a byte at a time is cut off then, and the run goes on.
    :param clock: Unix time, for the timestamp.
    """

    def __init__(
        self,
        url: str,
        *,
        secret: bytes,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not url.startswith(("https://", "http://")):
            raise ValueError(f"url must be an http(s) URL, got {url!r}")
        if not isinstance(secret, bytes) or len(secret) < 16:
            raise ValueError("secret must be at least 16 bytes")
        self.url = url
        self._secret = secret
        self.timeout = timeout
        self.clock = clock

    def __repr__(self) -> str:  # never the secret, nor a token in the URL's path
        return f"WebhookDelivery({self._shown!r})"

    @property
    def _shown(self) -> str:
        parts = urllib.parse.urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/…"

    def __call__(self, notice: Notice) -> None:
        body = json.dumps(notice.as_json(), ensure_ascii=False).encode()
        timestamp = str(int(self.clock()))
        request = urllib.request.Request(  # noqa: S310 - the scheme is checked above
            self.url,
            data=body,
            method="POST",
            headers={
                "content-type": "application/json",
                TIMESTAMP_HEADER: timestamp,
                SIGNATURE_HEADER: f"v1={sign(self._secret, timestamp, body)}",
            },
        )
        deadline = _Deadline(self.timeout)
        opener = urllib.request.build_opener(
            _NoRedirect, _HTTPHandler(deadline), _HTTPSHandler(deadline)
        )
        try:
            with deadline, opener.open(request, timeout=self.timeout) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            raise DeliveryFailed(f"webhook {self._shown} answered {exc.code}") from None
        except (OSError, http.client.HTTPException) as exc:
            if deadline.expired:
                raise DeliveryFailed(
                    f"webhook {self._shown}: no answer within {self.timeout}s"
                ) from None
            reason = getattr(exc, "reason", None) or type(exc).__name__
            raise DeliveryFailed(f"webhook {self._shown}: {reason}") from None
        if not 200 <= status < 300:
            raise DeliveryFailed(f"webhook {self._shown} answered {status}")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer like any other: not 2xx, so the delivery failed."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Deadline:
    """One delivery's deadline. A socket's timeout bounds each read, and a receiver that
    sends a byte now and then never trips it: at the deadline, every socket of the
    delivery is shut down, which ends a read blocked on it at once."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._timer.cancel()

    def watch(self, sock: socket.socket) -> socket.socket:
        """*sock* is shut down at the deadline (at once, if it passed)."""
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)
        return sock

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    # OSError: closed already, or detached by a TLS wrap (the wrapper is watched too)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _HTTPConnection(http.client.HTTPConnection):
    """A connection whose socket a :class:`_Deadline` watches once it is connected."""

    def __init__(self, *args: Any, deadline: _Deadline | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def connect(self) -> None:
        super().connect()
        if self._deadline is not None:
            self._deadline.watch(self.sock)


class _HTTPSConnection(http.client.HTTPSConnection, _HTTPConnection):
    """The TCP socket is watched when it connects, the TLS one once it shook hands (in
    between, each read of the handshake is bounded by the socket's timeout)."""

    def __init__(self, *args: Any, deadline: _Deadline | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def connect(self) -> None:
        super().connect()
        if self._deadline is not None:
            self._deadline.watch(self.sock)


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPConnection, req, deadline=self._deadline)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(context=self._tls)
        self._deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPSConnection, req, context=self._tls, deadline=self._deadline)


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``timestamp + "." + body`` under *secret*."""
    return hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


class WebhookRejected(KeyturnError, ValueError):
    """A webhook's signature or timestamp does not check out; the message says which."""


def verify_webhook(
    secret: bytes,
    *,
    timestamp: str | None,
    signature: str | None,
    body: bytes,
    now: float | None = None,
    window: int = REPLAY_WINDOW,
) -> dict[str, Any]:
    """Check a notice webhook as received and return its JSON body.

    Give the raw body and the ``keyturn-timestamp`` and ``keyturn-signature`` headers. The
    timestamp must lie within *window* seconds of *now* (replays later than that are
    refused; remember the ids of what you processed to refuse replays within it).

    :raises WebhookRejected: a header is missing, the timestamp is outside the window, or
        the signature does not match.
    """
    if not timestamp or not signature:
        raise WebhookRejected(f"send both {TIMESTAMP_HEADER} and {SIGNATURE_HEADER}")
    # ASCII digits, as many as Unix seconds have: str.isdigit() takes "²" and Arabic digits, and
    # int() of thousands of digits raises, or overflows a float.
    if not _SECONDS.fullmatch(timestamp):
        raise WebhookRejected(f"{TIMESTAMP_HEADER} must be Unix seconds")
    current = time.time() if now is None else now
    if abs(current - int(timestamp)) > window:
        raise WebhookRejected(f"{TIMESTAMP_HEADER} is more than {window} seconds away: a replay?")
    expected = f"v1={sign(secret, timestamp, body)}"
    given = signature.strip().encode("utf-8", "replace")  # a lone surrogate matches nothing
    if not hmac.compare_digest(expected.encode(), given):
        raise WebhookRejected(f"{SIGNATURE_HEADER} does not match the body")
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting too deep
        raise WebhookRejected("the body is not JSON") from exc
    if not isinstance(parsed, dict):
        raise WebhookRejected("the body is not a JSON object")
    return parsed
