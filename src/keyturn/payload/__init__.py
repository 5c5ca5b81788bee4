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

What the guard decides, in order:

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

Here are the guard's adapters to ASGI, WSGI and Django; a body's answer and what is
recorded of it are decided in ``payload/_flow.py``.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Collection, Iterable
from fnmatch import fnmatchcase
from typing import Any, Final
from wsgiref.types import WSGIEnvironment

from keyturn._core.decision import AuthRequest
from keyturn._core.model import Principal
from keyturn._core.steps import STORE
from keyturn._core.token import ParsedToken
from keyturn._web import ASGIScope, Receive, read_asgi_body, read_django_body, read_wsgi_body
from keyturn.authenticator import Authenticator
from keyturn.errors import Refusal
from keyturn.payload._flow import Recorder, verdict

__all__ = ["DEFAULT_CONTENT_TYPES", "DEFAULT_MAX_BYTES", "PayloadGuard"]

DEFAULT_CONTENT_TYPES: Final = ("application/json", "application/*+json")
DEFAULT_MAX_BYTES: Final = 1 << 20


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
        # Bound by check(), on the copy a middleware keeps, to its store and route.
        self._recorder = Recorder({}, events=False, revoke=self.revoke, route="/")

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
        events = can.has("record_event")  # the record of key actions
        bound._recorder = Recorder({STORE: can.caller()}, events, self.revoke, route)
        return bound

    def scans(self, content_type: str | None) -> bool:
        """Whether a body sent with *content_type* is read."""
        if content_type is None or not content_type.strip():
            return True  # most frameworks read a body without a type as JSON
        media = content_type.split(";", 1)[0].strip().lower()
        return media in self._exact or any(fnmatchcase(media, kind) for kind in self._patterns)

    # --- the edges: read a body, have it judged, record its keys, settle the request -----
    # Each reader returns before a key is recorded: no frame holds the body meanwhile.

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
        keys, screened = await self._read_asgi(scope, receive, principal)
        if keys:
            await self._recorder.record_async(keys, method, path, authenticator)
        refused = screened if isinstance(screened, Refusal) else None
        return _settle(refused, method, path, principal, authenticator, started) or screened

    async def _read_asgi(
        self, scope: ASGIScope, receive: Receive, principal: Principal
    ) -> tuple[list[ParsedToken], Receive | Refusal]:
        content_type = _content_type(scope.get("headers", ()))
        if not self.scans(content_type):
            return [], receive
        body, replayed = await read_asgi_body(scope, receive, self.max_bytes)
        keys, refused = verdict(body, content_type, principal, self.max_bytes)
        return keys, replayed if refused is None else refused

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
        keys, refused = self._read_wsgi(environ, principal)
        if keys:
            self._recorder.record(keys, method, path, authenticator)
        return _settle(refused, method, path, principal, authenticator, started)

    def _read_wsgi(
        self, environ: WSGIEnvironment, principal: Principal
    ) -> tuple[list[ParsedToken], Refusal | None]:
        content_type = environ.get("CONTENT_TYPE")
        if not self.scans(content_type):
            return [], None
        body = read_wsgi_body(environ, self.max_bytes)
        keys, refused = verdict(body, content_type, principal, self.max_bytes)
        if refused is None and body is not None and body.read:
            environ["wsgi.input"] = io.BytesIO(body.data)  # the app reads what was scanned
        return keys, refused

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
        keys, refused = self._read_django(request, principal)
        if keys:
            self._recorder.record(keys, method, path, authenticator)
        return _settle(refused, method, path, principal, authenticator, started)

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
        keys, refused = self._read_django(request, principal)
        if keys:
            await self._recorder.record_async(keys, method, path, authenticator)
        return _settle(refused, method, path, principal, authenticator, started)

    def _read_django(
        self, request: Any, principal: Principal
    ) -> tuple[list[ParsedToken], Refusal | None]:
        content_type = request.META.get("CONTENT_TYPE")
        if not self.scans(content_type):
            return [], None
        return verdict(
            read_django_body(request, self.max_bytes), content_type, principal, self.max_bytes
        )


def _settle(
    refused: Refusal | None,
    method: str,
    path: str,
    principal: Principal,
    authenticator: Authenticator,
    started: float | None,
) -> Refusal | None:
    """Record a request decided with ``final=False``: its refusal, or its acceptance."""
    if refused is not None:
        return authenticator.record(AuthRequest((), (), method, path), refused, started)
    authenticator.admit(method, path, principal, started)
    return None


def _content_type(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The first ``Content-Type`` of a scope's header lines."""
    for name, value in headers:
        if len(name) == 12 and name.lower() == b"content-type":
            return value.decode("latin-1")
    return None
