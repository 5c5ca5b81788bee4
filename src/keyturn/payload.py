"""
Keys kept out of request bodies
===============================

The spec's handling rule: never put a key into a system prompt or session message. The
payload guard enforces it at the door: hand a :class:`PayloadGuard` to the ASGI, WSGI or
Django middleware, and a request under the API's prefix whose body holds a keyturn key is
refused with 400 ``key_in_payload`` before the app sees a byte of it. A real key found so
is recorded as leaked (the console and ``keyturn keys leaked`` show it, and the creator is
told where notices are set up) and, if you opt in, revoked. ``docs/payload-guard.md`` is
the guide. ::

    from keyturn.asgi import ApiKeyMiddleware
    from keyturn.payload import PayloadGuard

    app = ApiKeyMiddleware(app, authenticator=auth, payload_guard=PayloadGuard())

What it decides, in order:

-   Which requests: those the middleware accepted (a refused request's body is never read),
    over HTTP (WebSocket messages are not bodies and are not read), whose ``Content-Type``
    matches one of *content_types* (JSON by default: ``application/json`` and any
    ``application/*+json``), or that send none: most frameworks read such a body as JSON.
-   How much: at most *max_bytes* (1 MiB by default). A longer body is refused with 413
    ``payload_too_large`` -- at once when its ``Content-Length`` says so, else once that
    many bytes are read -- since what lies beyond could hold a key. Raise the bound for an
    API that takes larger bodies.
-   When: the whole body is read and scanned before the app is called, which then gets it
    as one message (ASGI) or a fresh ``wsgi.input`` (WSGI). So the app never receives a key's
    bytes, and a refusal is always a clean 400, never a response cut off half-way.
-   What is a key: ``rma_`` and 46 letters and digits whose checksum holds, written plainly
    or with JSON escapes (``\\u0072ma_...``), anywhere in the body, in every encoding a
    JSON parser reads it in: its bytes, UTF-16 or UTF-32 as its first bytes say, and its
    declared ``charset`` (``_core/scanner.py`` says exactly how it reads). A body the guard
    cannot read as the app may (a ``charset`` no decoder reads, two of them, a WSGI
    ``Content-Length`` that is not plain digits) is refused with 400 ``invalid_request``.
    Keys are refused whether or not they are real: a forged one looks the same to an
    agent, and the answer tells no one which keys exist.
-   Which are recorded: each distinct key found (at most eight per body) is looked up in
    the key store and its secret checked against the stored hash, as a request's key
    would be; only a real key with the right secret is recorded as leaked
    (``report_leak``, with the source ``request-body:<METHOD> <route>``: the guarded prefix,
    never the path its sender chose), and revoked with ``revoke=True``. A forgery of
    someone's key id marks nothing. A store that fails is logged; the 400 stands.
-   The refusal has the spec's error body, carries ``service-organization-id`` and
    ``service-tenant-id`` (the request reached its organization), reaches the audit hook
    and the ``keyturn`` log once, like the other refusals, and is charged to the sender's
    key, never to a key found in the body (whoever writes the body chooses those): the
    middleware decides the request with ``final=False``, and the guard records either its
    refusal or its acceptance. It never repeats the key: log lines name key ids.
"""

from __future__ import annotations

import copy
import io
import logging
import time
from collections.abc import Collection, Generator, Iterable
from fnmatch import fnmatchcase
from typing import Any, Final
from wsgiref.types import WSGIEnvironment

from keyturn._core.decision import AuthRequest, credential
from keyturn._core.leak import Finder, record_leak
from keyturn._core.model import Principal
from keyturn._core.scanner import BodyScanner
from keyturn._core.steps import (
    STORE,
    Step,
    WrongAnswer,
)
from keyturn._core.token import ParsedToken
from keyturn._run.capabilities import Caller
from keyturn._run.drive import Conduct, drive, drive_async
from keyturn._web import (
    ASGIScope,
    Body,
    Receive,
    read_asgi_body,
    read_django_body,
    read_wsgi_body,
)
from keyturn.activity import By, Channel
from keyturn.authenticator import Authenticator
from keyturn.errors import InvalidRequest, KeyInPayload, PayloadTooLarge, Reason, Refusal, loggable

__all__ = ["DEFAULT_CONTENT_TYPES", "DEFAULT_MAX_BYTES", "PayloadGuard"]

log: Final = logging.getLogger("keyturn")

DEFAULT_CONTENT_TYPES: Final = ("application/json", "application/*+json")
DEFAULT_MAX_BYTES: Final = 1 << 20
SOURCE_PREFIX: Final = "request-body:"  # the leak's recorded place: request-body:POST /path
# The methods a leak's recorded place names; any other is "OTHER".
_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "QUERY"})
_LENGTH: Final = "The Content-Length header is not a number of bytes: send its digits only."
_CHARSET: Final = "The charset of the request body is not one this API reads: send JSON in UTF-8."


# Who records a key found in a body, in the record of key actions and the log.
_FINDER: Final = Finder(
    By(channel=Channel.LIBRARY, actor="payload guard"), "found in a request body", log
)


class PayloadGuard:
    """Refuses request bodies that hold a keyturn key, and records the real ones as leaked.

    :param max_bytes: the longest body read; a longer one is refused with 413.
    :param content_types: the media types whose bodies are read; ``*`` matches any run of
        characters (``"application/*+json"``, ``"*"`` for every body). A request without
        ``Content-Type`` is always read.
    :param revoke: also revoke each real key found. Off by default: the spec lets only its
        creator revoke a key, and the request may be theirs.
    """

    def __init__(
        self,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        content_types: Collection[str] = DEFAULT_CONTENT_TYPES,
        revoke: bool = False,
    ) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes must be a positive number of bytes, got {max_bytes!r}")
        if isinstance(content_types, str) or not all(
            isinstance(kind, str) and kind.strip() for kind in content_types
        ):
            raise TypeError(
                "content_types must be a collection of media types such as "
                f"('application/json',), got {content_types!r}"
            )
        self.max_bytes = max_bytes
        self.content_types = tuple(kind.strip().lower() for kind in content_types)
        self.revoke = bool(revoke)
        self._exact = frozenset(kind for kind in self.content_types if "*" not in kind)
        self._patterns = tuple(kind for kind in self.content_types if "*" in kind)
        # Set by check(), on the copy a middleware keeps: who answers each step (Step.via),
        # and the route the middleware guards, which a leak's recorded place names.
        self._callers: dict[int, Caller] = {}
        self._records_events = False
        self._route = "/"

    def __repr__(self) -> str:
        return (
            f"PayloadGuard(max_bytes={self.max_bytes}, content_types={self.content_types!r}, "
            f"revoke={self.revoke})"
        )

    def check(self, authenticator: Authenticator, route: str = "/") -> PayloadGuard:
        """A copy of this guard bound to *authenticator*'s store, once the store
        can record leaks (said at startup, by the middleware). *route*: the prefix the
        middleware guards, the place a leak is recorded at."""
        can = authenticator.store_capabilities
        missing = can.missing(("get_key", "report_leak") + (("revoke_key",) if self.revoke else ()))
        if missing:
            raise TypeError(
                f"the payload guard records leaks in the key store, which lacks "
                f"{', '.join(missing)} (every store keyturn ships has them)"
            )
        bound = copy.copy(self)
        bound._callers = {STORE: can.caller()}
        bound._records_events = can.has("record_event")
        bound._route = route
        return bound

    def scans(self, content_type: str | None) -> bool:
        """Whether a body sent with *content_type* is read."""
        if content_type is None or not content_type.strip():
            return True  # most frameworks read a body without a type as JSON
        media = content_type.split(";", 1)[0].strip().lower()
        return media in self._exact or any(fnmatchcase(media, kind) for kind in self._patterns)

    # --- the edges: read a body, scan it, answer --------------------------------------------

    async def screen_asgi(
        self,
        scope: ASGIScope,
        receive: Receive,
        path: str,
        principal: Principal,
        authenticator: Authenticator,
        started: float | None = None,
    ) -> Receive | Refusal:
        """Read and scan an accepted HTTP request's body before the app is called. The
        request was decided with ``final=False``: its refusal is recorded here, or its
        acceptance (:meth:`Authenticator.admit`). *started*: when its decision began.

        :returns: the refusal, or the ``receive`` to call the app with: it hands the app the
            body that was read, as one message, then what the server sends next.
        """
        method = scope.get("method", "GET").upper()
        screened = await self._read_asgi(scope, receive, method, path, principal, authenticator)
        if isinstance(screened, Refusal):
            return authenticator.record(AuthRequest((), (), method, path), screened, started)
        authenticator.admit(method, path, principal, started)
        return screened

    async def _read_asgi(
        self,
        scope: ASGIScope,
        receive: Receive,
        method: str,
        path: str,
        principal: Principal,
        authenticator: Authenticator,
    ) -> Receive | Refusal:
        content_type = _content_type(scope.get("headers", ()))
        if not self.scans(content_type):
            return receive
        body, replayed = await read_asgi_body(scope, receive, self.max_bytes)
        if not body.read:  # said to be too long, before a byte was read
            return self._too_large(principal)
        scanner, refused = self._scan(body, content_type, principal)
        if refused is not None:
            # No frame of ours holds the body while the store is asked (tracebacks' locals).
            del body, replayed
            if scanner.keys:
                await self._record_async(scanner, method, path, authenticator)
            return refused
        return replayed

    def screen_wsgi(
        self,
        environ: WSGIEnvironment,
        path: str,
        principal: Principal,
        authenticator: Authenticator,
        started: float | None = None,
    ) -> Refusal | None:
        """Read and scan an accepted request's body before the app is called; the refusal,
        or ``None`` with ``wsgi.input`` replaced by the body that was read. Recorded as
        :meth:`screen_asgi` says.
        """
        method = environ.get("REQUEST_METHOD", "GET").upper()
        refused = self._read_wsgi(environ, method, path, principal, authenticator)
        if refused is not None:
            return authenticator.record(AuthRequest((), (), method, path), refused, started)
        authenticator.admit(method, path, principal, started)
        return None

    def _read_wsgi(
        self,
        environ: WSGIEnvironment,
        method: str,
        path: str,
        principal: Principal,
        authenticator: Authenticator,
    ) -> Refusal | None:
        content_type = environ.get("CONTENT_TYPE")
        if not self.scans(content_type):
            return None
        body = read_wsgi_body(environ, self.max_bytes)
        if body is None:
            return _unreadable(_LENGTH, principal)
        if not body.read:  # said to be too long, or no body the app may read (PEP 3333)
            return self._too_large(principal) if body.over else None
        scanner, refused = self._scan(body, content_type, principal)
        if refused is not None:
            del body  # no frame of ours holds the body while the store is asked
            if scanner.keys:
                self._record(scanner, method, path, authenticator)
            return refused
        environ["wsgi.input"] = io.BytesIO(body.data)  # the app reads what was scanned
        return None

    def screen_django(
        self,
        request: Any,
        path: str,
        principal: Principal,
        authenticator: Authenticator,
        started: float | None = None,
    ) -> Refusal | None:
        """Scan a Django request's ``request.body`` (read whole: Django's handlers hold it
        already) before the view runs; the refusal, or ``None``. Recorded as
        :meth:`screen_asgi` says."""
        method = (request.method or "GET").upper()
        scanner, refused = self._django_scan(request, principal)
        if refused is not None and scanner.keys:
            self._record(scanner, method, path, authenticator)
        return self._django_end(refused, method, path, principal, authenticator, started)

    async def screen_django_async(
        self,
        request: Any,
        path: str,
        principal: Principal,
        authenticator: Authenticator,
        started: float | None = None,
    ) -> Refusal | None:
        """:meth:`screen_django` for Django's async handler: the store awaited or on a thread."""
        method = (request.method or "GET").upper()
        scanner, refused = self._django_scan(request, principal)
        if refused is not None and scanner.keys:
            await self._record_async(scanner, method, path, authenticator)
        return self._django_end(refused, method, path, principal, authenticator, started)

    def _django_scan(
        self, request: Any, principal: Principal
    ) -> tuple[BodyScanner, Refusal | None]:
        content_type = request.META.get("CONTENT_TYPE")
        if not self.scans(content_type):
            return BodyScanner(), None
        body = read_django_body(request, self.max_bytes)
        if not body.read:  # said to be too long, before a byte was read
            return BodyScanner(), self._too_large(principal)
        return self._scan(body, content_type, principal)

    def _scan(
        self, body: Body, content_type: str | None, principal: Principal
    ) -> tuple[BodyScanner, Refusal | None]:
        """Scan what a reader read, in the encodings its *content_type* says."""
        scanner = _scanner(content_type)
        if scanner is None:
            return BodyScanner(), _unreadable(_CHARSET, principal)
        scanner.feed(body.data, final=True)
        return scanner, self._refusal(scanner, body.over, principal)

    @staticmethod
    def _django_end(
        refused: Refusal | None,
        method: str,
        path: str,
        principal: Principal,
        authenticator: Authenticator,
        started: float | None,
    ) -> Refusal | None:
        if refused is not None:
            return authenticator.record(AuthRequest((), (), method, path), refused, started)
        authenticator.admit(method, path, principal, started)
        return None

    def _refusal(self, scanner: BodyScanner, over: bool, principal: Principal) -> Refusal | None:
        """The answer to a scanned body. It is charged to the key that sent the request,
        never to a key found in the body: whoever writes a body chooses those."""
        if scanner.keys:  # said even when the body was also too long: a key was there
            return KeyInPayload(Reason.KEY_IN_PAYLOAD, key_id=principal.key_id, principal=principal)
        if scanner.unreadable:
            return _unreadable(_CHARSET, principal)
        if over:
            return self._too_large(principal)
        return None

    def _too_large(self, principal: Principal) -> Refusal:
        return PayloadTooLarge(
            Reason.PAYLOAD_TOO_LARGE,
            f"The request body is longer than the {self.max_bytes} bytes this API reads: "
            "send a smaller one.",
            key_id=principal.key_id,
            principal=principal,
        )

    # --- recording: a flow of questions, driven sync or async ----------------------------------

    def _source(self, method: str) -> str:
        """Where a key was found, as recorded on it and named in its creator's notice: the
        method and the route this guard matched, never the rest of the path (whoever sends
        the body chooses it, up to 2,048 characters of it, to be read in an official mail)."""
        shown = method if method in _METHODS else "OTHER"
        return f"{SOURCE_PREFIX}{shown} {self._route}"

    def _leaks(
        self, keys: list[ParsedToken], source: str, where: str, authenticator: Authenticator
    ) -> Generator[Step, Any, None]:
        """Record each real key of *keys* as leaked at *source* (and revoke it, if asked
        to); *where*: the request, for the log."""
        now = authenticator.clock()
        for parsed in keys:
            key = yield from credential(parsed.key_id, parsed.secret)  # as the decision checks
            if key is Reason.UNKNOWN_KEY:
                log.info("a key found in %s has no such id in the store", where)
            elif isinstance(key, Reason):  # a real id with another secret: a forgery
                log.info("a key found in %s is a forgery of key id %s", where, parsed.key_id)
            else:
                yield from record_leak(
                    key,
                    source,
                    where,
                    now,
                    _FINDER,
                    revoke=self.revoke,
                    events=self._records_events,
                )

    def _record(
        self, scanner: BodyScanner, method: str, path: str, authenticator: Authenticator
    ) -> None:
        flow = self._leaks(
            scanner.keys, self._source(method), _loggable(method, path), authenticator
        )
        drive(flow, self._callers, _RECORDING, _deadline(authenticator))

    async def _record_async(
        self, scanner: BodyScanner, method: str, path: str, authenticator: Authenticator
    ) -> None:
        flow = self._leaks(
            scanner.keys, self._source(method), _loggable(method, path), authenticator
        )
        await drive_async(flow, self._callers, _RECORDING, _deadline(authenticator))


def _deadline(authenticator: Authenticator) -> float | None:
    """The store's answers to one recording are due within the authenticator's timeout."""
    timeout = authenticator.timeout
    return None if timeout is None else time.monotonic() + timeout


def _failed(step: Step, exc: Exception) -> None:
    # The type and our own message only: the exception's frames hold the key's secret.
    detail = f" ({exc})" if isinstance(exc, WrongAnswer) else ""
    log.error(
        "recording a key found in a request body failed at %s: %s%s",
        step.method,
        type(exc).__name__,
        detail,
    )


# A failed step: the refusal stands, the leak is not recorded (said in the log).
_RECORDING: Final[Conduct[None]] = Conduct(fail=_failed)


def _loggable(method: str, path: str) -> str:
    """The request a key was found in, as a log line names it."""
    return f"the body of {loggable(method, 20)} {loggable(path)}"


def _scanner(content_type: str | None) -> BodyScanner | None:
    """A scanner for a body of *content_type*, reading its ``charset`` too; ``None`` when
    that names no text encoding, or when the type names two charsets (parsers differ on
    which one counts)."""
    charsets = {
        value.strip().strip('"').strip().lower()
        for name, _, value in (part.partition("=") for part in (content_type or "").split(";")[1:])
        if name.strip().lower() == "charset"
    } - {""}
    if len(charsets) > 1:
        return None
    try:
        return BodyScanner(charsets.pop() if charsets else None)
    except LookupError:
        return None


def _unreadable(message: str, principal: Principal) -> Refusal:
    return InvalidRequest(
        Reason.UNREADABLE_BODY, message, key_id=principal.key_id, principal=principal
    )


def _content_type(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The first ``Content-Type`` of a scope's header lines."""
    for name, value in headers:
        if len(name) == 12 and name.lower() == b"content-type":
            return value.decode("latin-1")
    return None
