"""Delivering a notice: by email (:class:`SMTPDelivery`) or as a signed POST
(:class:`WebhookDelivery`), which its receiver checks with :func:`verify_webhook`.

A delivery is any function of a :class:`~keyturn.notices.Notice` that raises if it could
not deliver it; these two raise :class:`DeliveryFailed`, and never show a password, a
secret or a token of a webhook's URL.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import json
import re
import smtplib
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from email.message import EmailMessage
from typing import Any, Final

from keyturn.errors import DeliveryFailed, WebhookRejected
from keyturn.notices._compose import Notice

TIMESTAMP_HEADER: Final = "keyturn-timestamp"
SIGNATURE_HEADER: Final = "keyturn-signature"
REPLAY_WINDOW: Final = 300  # seconds: a webhook older or newer than this is refused
_SECONDS: Final = re.compile(r"[0-9]{1,12}", re.ASCII)  # Unix seconds, until the year 33658


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
