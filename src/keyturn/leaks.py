"""
Leaked keys answered
====================

A secret-scanning endpoint for a code host's partner program (GitHub's is the reference;
``docs/leaks.md`` is the guide): the host POSTs the candidates it found in public, signed;
this module decides which are real keys, records the leak on each, and hands it to your
code. The code host sends no API key, so the endpoint lives outside ``/managed-agents/v1/``.
The ``leaks`` extra brings ``cryptography`` for the signature::

    responder = LeakResponder(db.keys, public_keys={identifier: pem}, on_leak=tell_creator)
    app = WSGILeakEndpoint(app, responder=responder)   # or ASGILeakEndpoint

What it decides, in order:

-   Not a ``POST``: 405. A body over *max_body* bytes (1 MiB by default): 413.
-   The signature over the raw body, before anything else is read: missing or unreadable
    ``Github-Public-Key-Identifier`` / ``Github-Public-Key-Signature`` headers get 401, an
    unknown key or a signature that does not verify (ECDSA P-256, SHA-256) 403.
-   A body that is not a JSON array of candidates (string ``token``, ``type``, ``url``; a
    string or absent ``source``), JSON nested deeper than Python's stack included: 400,
    all or nothing.
-   Each candidate as the authenticator checks a key: shape and checksum (junk never reaches
    the store), key id in the store, secret against the stored hash (one SHA-256; a legacy
    argon2id hash as the authenticator verifies one, once per process). A real id with a
    wrong secret is a false positive. The answer is
    ``200``, one ``{"token_hash", "token_type", "label"}`` per candidate in order: a hash,
    never the secret.
-   A true positive, whatever the key's state, is recorded on the key (``KeyInfo.leaked``:
    the first report's URL and time) and handed to *on_leak* as a :class:`LeakReport`. The
    key is revoked only with ``revoke=True``: the spec lets only its creator revoke it. A
    store that keeps the record of key actions (:mod:`keyturn.activity`) gets the report,
    and the revoke, as events of the leak endpoint.
-   A store that fails, times out or answers the wrong type, or a public-key callable that
    fails: 503, and the host sends the batch again. A failing *on_leak* is logged; the
    answer stands.

The public keys are yours to supply, never fetched here: a mapping of key identifier to PEM
(see :func:`github_public_keys`), or a callable returning the PEM for an identifier, or
``None``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import re
from collections.abc import Callable, Generator, Iterable, Mapping
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, ClassVar, Final, Generic, NamedTuple, Protocol, TypeGuard, TypeVar

import attrs

try:
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "keyturn.leaks needs the cryptography library: pip install 'keyturn[leaks]'"
    ) from exc

from keyturn._core import token as _token
from keyturn._core.decision import credential
from keyturn._core.leak import Finder, record_leak
from keyturn._core.model import ApiKey, Scope
from keyturn._core.steps import CALLBACK, STORE, NotifyLeak, PublicKeyOf, Step, WrongAnswer
from keyturn._run.capabilities import Blocking, capabilities, is_coroutine_function
from keyturn._run.drive import Conduct, drive, drive_async
from keyturn._web import (
    DEFAULT_PREFIX,
    ASGIApp,
    ASGIScope,
    Paths,
    Receive,
    Send,
    asgi_path,
    lifespan,
    read_asgi_body,
    read_wsgi_body,
    wsgi_path,
)
from keyturn.activity import By, Channel
from keyturn.errors import Reason, loggable

__all__ = [
    "DEFAULT_PATH",
    "KEY_ID_HEADER",
    "SIGNATURE_HEADER",
    "ASGILeakEndpoint",
    "AsyncLeakStore",
    "LeakReport",
    "LeakResponder",
    "LeakStore",
    "Response",
    "WSGILeakEndpoint",
    "github_public_keys",
]

log: Final = logging.getLogger("keyturn.leaks")
# Who records a true positive, in the record of key actions and the log.
_FINDER: Final = Finder(
    By(channel=Channel.LEAK_ENDPOINT, actor="secret scanning"), "reported leaked", log
)

DEFAULT_PATH: Final = "/keyturn/secret-scanning"
KEY_ID_HEADER: Final = "github-public-key-identifier"
SIGNATURE_HEADER: Final = "github-public-key-signature"
MAX_URL: Final = 2048  # characters of a reported URL kept on the key
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SURROGATE: Final = re.compile("[\ud800-\udfff]")  # JSON escapes can spell lone ones

PublicKeys = Mapping[str, str | bytes] | Callable[[str], str | bytes | None]


class LeakStore(Protocol):
    """What the responder needs of a key store; every store keyturn ships has it."""

    def get_key(self, key_id: str) -> ApiKey | None: ...
    def report_leak(self, key_id: str, url: str, at: datetime) -> bool: ...
    def revoke_key(self, key_id: str, at: datetime) -> bool: ...


class AsyncLeakStore(Protocol):
    """The async twin of :class:`LeakStore` (``AsyncPostgresDatabase.keys``)."""

    async def get_key(self, key_id: str) -> ApiKey | None: ...
    async def report_leak(self, key_id: str, url: str, at: datetime) -> bool: ...
    async def revoke_key(self, key_id: str, at: datetime) -> bool: ...


@attrs.frozen(kw_only=True)
class LeakReport:
    """A real key found in public, for *on_leak*: whose key, where, and what was done.

    It holds the key's hint, never its secret.
    """

    key_id: str
    account_id: str  # the creator: tell them to revoke the key and make a new one
    name: str
    hint: str
    scope: Scope
    url: str  # where it was seen
    source: str | None  # what the code host scanned: "content", "commit", ... (if said)
    token_type: str
    reported_at: datetime
    first: bool  # the key's first leak report (later ones are not recorded again)
    revoked: bool  # revoked by this report (only with revoke=True)


class Response(NamedTuple):
    """What the endpoint answers: an HTTP status, headers and the body bytes."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


def github_public_keys(document: str | bytes) -> dict[str, str]:
    """Identifier -> PEM from GitHub's published secret-scanning public keys document.

    The document is ``{"public_keys": [{"key_identifier": ..., "key": ..., ...}]}``; fetch
    and refresh it yourself (keyturn makes no outgoing requests).

    :raises ValueError: the document does not have that shape.
    """
    try:
        entries = json.loads(document)["public_keys"]
        keys = {entry["key_identifier"]: entry["key"] for entry in entries}
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(
            "not a public keys document: expected {'public_keys': [{'key_identifier', 'key'}]}"
        ) from exc
    if not all(isinstance(value, str) for pair in keys.items() for value in pair):
        raise ValueError("key_identifier and key must be strings")
    return keys


def _load(pem: str | bytes) -> ec.EllipticCurvePublicKey:
    key = serialization.load_pem_public_key(pem.encode("ascii") if isinstance(pem, str) else pem)
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise ValueError("a secret-scanning public key must be an ECDSA P-256 key")
    return key


# --- the flow decides: a generator of steps, like keyturn._core.decision ---------------------


_Flow = Generator[Step, Any, Response]


class _Refusal(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        self.response = _error(status, code, message)


def _json(status: int, value: object, *headers: tuple[str, str]) -> Response:
    body = json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    length = ("content-length", str(len(body)))
    return Response(status, [("content-type", "application/json"), length, *headers], body)


def _error(status: int, code: str, message: str, *headers: tuple[str, str]) -> Response:
    return _json(status, {"error": {"code": code, "message": message}}, *headers)


class _Candidate(NamedTuple):
    token: str
    type: str
    url: str
    source: str | None


def _candidates(body: bytes) -> list[_Candidate]:
    try:
        batch = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _Refusal(400, "invalid_request", "The body is not JSON.") from exc
    except RecursionError as exc:  # deeper than Python's stack: no batch of candidates is
        raise _Refusal(
            400, "invalid_request", "The body nests JSON too deeply: send an array of candidates."
        ) from exc
    if not isinstance(batch, list):
        raise _Refusal(400, "invalid_request", "The body must be a JSON array of candidates.")
    candidates = []
    for index, item in enumerate(batch):
        fields = item if isinstance(item, dict) else {}
        token, kind, url, source = (fields.get(n) for n in ("token", "type", "url", "source"))
        if not (_text(token) and _text(kind) and _text(url) and (source is None or _text(source))):
            raise _Refusal(
                400,
                "invalid_request",
                f"Candidate {index} must be an object with string token, type and url.",
            )
        candidates.append(_Candidate(token, kind, url, source))
    return candidates


def _text(value: object) -> TypeGuard[str]:
    """A JSON string that is also valid Unicode."""
    return isinstance(value, str) and not _SURROGATE.search(value)


def _clean_url(url: str) -> str:
    """The reported URL as kept and shown: one line, bounded."""
    url = _CONTROL.sub("\ufffd", url)
    return url if len(url) <= MAX_URL else url[: MAX_URL - 1] + "\u2026"


class LeakResponder:
    """Answers a code host's secret-scanning reports against your key store.

    :param store: the key store (``db.keys``); an async store works with the ASGI endpoint.
    :param public_keys: key identifier -> PEM, or a callable returning the PEM (or ``None``)
        for an identifier. Supplied by you; see :func:`github_public_keys`.
    :param on_leak: called with a :class:`LeakReport` for each real key found; tell the
        creator. Its failures are logged and never change the answer.
    :param revoke: also revoke each real key found. Off by default: the spec lets only the
        creator revoke a key.
    :param max_body: the largest body read, in bytes; a larger one gets 413.
    :param timeout: seconds an async driver waits for one store answer before 503.
    :param clock: returns the current UTC time; injectable for tests.
    """

    def __init__(
        self,
        store: LeakStore | AsyncLeakStore,
        *,
        public_keys: PublicKeys,
        on_leak: Callable[[LeakReport], object] | None = None,
        revoke: bool = False,
        max_body: int = 1 << 20,
        timeout: float = 5.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        can = capabilities(store)
        missing = can.missing(("get_key", "report_leak", "revoke_key"))
        if missing:
            raise TypeError(f"store must be a key store with {', '.join(missing)} (db.keys)")
        if is_coroutine_function(on_leak):
            raise TypeError("on_leak must be a plain function; it runs in a worker thread")
        self._loaded = isinstance(public_keys, Mapping)
        if isinstance(public_keys, Mapping):
            # Loaded now: a bad key is a startup error, not a 503 on the first report.
            loaded = {identifier: _load(pem) for identifier, pem in public_keys.items()}
            self._public_key: Callable[[str], Any] = loaded.get
        elif callable(public_keys):
            self._public_key = public_keys
        else:
            raise TypeError("public_keys must be a mapping of identifier to PEM, or a callable")
        self.store = store
        self.on_leak = on_leak
        self.revoke = revoke
        self.max_body = max_body
        self.timeout = timeout
        self.clock = clock
        # Indexed by Step.via: STORE, and CALLBACK (this object's public_key and notify, in a
        # thread under the async driver: the user's code may block).
        self._callers = {
            STORE: can.caller(),
            CALLBACK: Blocking(_Callbacks(self._public_key, self._notify), None, bounded=False),
        }
        self.is_async = can.is_async
        self._records_events = can.has("record_event")  # keyturn.activity
        # A failed step: 503, and the host sends the batch again. Each store answer within
        # the timeout (under the async driver); the user's callbacks unbounded.
        self._conduct = Conduct(fail=_failure, timeouts={STORE: timeout})

    def __repr__(self) -> str:
        return f"LeakResponder(store={self.store!r}, revoke={self.revoke})"

    # --- the flow ---------------------------------------------------------------------------

    def _flow(self, method: str, headers: Mapping[str, list[str]], body: bytes | None) -> _Flow:
        if method != "POST":
            return _error(405, "method_not_allowed", "Send reports with POST.", ("allow", "POST"))
        if body is None:
            return _error(413, "payload_too_large", f"The body exceeds {self.max_body} bytes.")
        try:
            yield from self._verify_signature(headers, body)
            candidates = _candidates(body)
        except _Refusal as refusal:
            return refusal.response
        answers = []
        for candidate in candidates:
            real = yield from self._check(candidate)
            answers.append(
                {
                    "token_hash": hashlib.sha256(candidate.token.encode()).hexdigest(),
                    "token_type": candidate.type,
                    "label": "true_positive" if real else "false_positive",
                }
            )
        return _json(200, answers)

    def _verify_signature(
        self, headers: Mapping[str, list[str]], body: bytes
    ) -> Generator[Step, Any, None]:
        identifiers = headers.get(KEY_ID_HEADER, [])
        signatures = headers.get(SIGNATURE_HEADER, [])
        if len(identifiers) != 1 or len(signatures) != 1 or not identifiers[0]:
            raise _Refusal(
                401, "unauthorized", "Sign the body: send one key identifier and one signature."
            )
        try:
            signature = base64.b64decode(signatures[0], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _Refusal(401, "unauthorized", "The signature is not base64.") from exc
        identifier = identifiers[0]
        if self._loaded:
            key = self._public_key(identifier)
        else:
            pem = yield PublicKeyOf(identifier)
            try:
                key = None if pem is None else _load(pem)
            except (ValueError, TypeError, UnsupportedAlgorithm):
                log.error(
                    "public_keys gave an unusable key for identifier %s", loggable(identifier, 100)
                )
                raise _Refusal(503, "service_unavailable", "Try again later.") from None
        if key is None:
            log.warning(
                "secret-scanning report signed by unknown key %s", loggable(identifier, 100)
            )
            raise _Refusal(403, "forbidden", "Unknown signing key.")
        try:
            key.verify(signature, body, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature as exc:
            log.warning(
                "secret-scanning report with a bad signature (key %s)", loggable(identifier, 100)
            )
            raise _Refusal(403, "forbidden", "The signature does not verify.") from exc

    def _check(self, candidate: _Candidate) -> Generator[Step, Any, bool]:
        parsed = _token.parse(candidate.token)
        if not isinstance(parsed, _token.ParsedToken):
            return False  # junk or a typo: no store lookup
        key = yield from credential(parsed.key_id, parsed.secret)  # as the decision checks
        if isinstance(key, Reason):
            return False  # no such id, or a real id with a wrong secret (or an unusable hash)
        now = self.clock()
        url = _clean_url(candidate.url)
        first, revoked = yield from record_leak(
            key,
            url,
            f"public at {loggable(url)}",
            now,
            _FINDER,
            revoke=self.revoke,
            events=self._records_events,  # the record of key actions
        )
        if self.on_leak is not None:
            report = LeakReport(
                key_id=key.key_id,
                account_id=key.account_id,
                name=key.name,
                hint=key.hint,
                scope=key.scope,
                url=url,
                source=candidate.source,
                token_type=candidate.type,
                reported_at=now,
                first=first,
                revoked=revoked,
            )
            yield NotifyLeak(report)
        return True

    def _notify(self, report: LeakReport) -> None:
        assert self.on_leak is not None
        try:
            self.on_leak(report)
        except Exception:
            log.exception("the on_leak hook failed; the leak is recorded and answered")

    # --- the drivers: send each answer until the flow returns its response --------------------

    def respond(
        self, method: str, headers: Mapping[str, list[str]], body: bytes | None
    ) -> Response:
        """Answer one report, calling the store in this thread.

        *headers* maps lower-case names to every value sent; *body* is ``None`` when it
        was longer than *max_body*.
        """
        if self.is_async:
            raise TypeError("this responder has an async store: use respond_async()")
        return drive(self._flow(method, headers, body), self._callers, self._conduct, None)

    async def respond_async(
        self, method: str, headers: Mapping[str, list[str]], body: bytes | None
    ) -> Response:
        """:meth:`respond` without blocking the event loop (sync stores in threads)."""
        flow = self._flow(method, headers, body)
        return await drive_async(flow, self._callers, self._conduct, None)


class _Callbacks(NamedTuple):
    """What answers the CALLBACK steps: the responder's public keys and its on_leak."""

    public_key: Callable[[str], Any]
    notify: Callable[[LeakReport], None]


# How a log line names whom a step asked.
_ASKED: Final = {
    "get_key": "store.get_key",
    "report_leak": "store.report_leak",
    "revoke_key": "store.revoke_key",
    "public_keys": "public_keys",
}


def _failure(step: Step, exc: Exception) -> Response:
    if isinstance(exc, TimeoutError):
        log.warning("the key store timed out answering a secret-scanning report")
    else:
        log.error(
            "answering a secret-scanning report failed: %s",
            f"{_ASKED.get(exc.method, exc.method)} answered a {exc.answered}"
            if isinstance(exc, WrongAnswer)
            else type(exc).__name__,
        )
    return _error(503, "service_unavailable", "Try again later.", ("retry-after", "60"))


# --- the web edges -----------------------------------------------------------------------------


def _header_lists(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    headers: dict[str, list[str]] = {}
    for name, value in pairs:
        headers.setdefault(name.lower(), []).append(value)
    return headers


_NOT_FOUND: Final = _error(404, "not_found", "Not found.")

App = TypeVar("App")
WSGIApp = Callable[..., Iterable[bytes]]


class _Endpoint(Generic[App]):
    _sync: ClassVar[bool] = False  # the endpoint drives the responder with respond()

    def __init__(
        self,
        app: App | None = None,
        *,
        responder: LeakResponder,
        path: str = DEFAULT_PATH,
        api_prefix: str = DEFAULT_PREFIX,
    ) -> None:
        if self._sync and responder.is_async:
            raise TypeError("an async store needs the ASGI endpoint (ASGILeakEndpoint)")
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/', got {path!r}")
        if Paths(api_prefix, ()).read("", path) is not None:  # guarded, or unreadable there
            raise ValueError(
                f"the secret-scanning endpoint must not sit under {api_prefix}: the code host "
                "sends no API key, so the API key middleware would refuse every report"
            )
        self.app = app
        self.responder = responder
        self.path = path


class ASGILeakEndpoint(_Endpoint[ASGIApp]):
    """Serves the responder at *path*; everything else goes to *app* (or gets 404 without one).

    :raises ValueError: *path* is under the API's prefix (*api_prefix*).
    """

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and asgi_path(scope) == self.path:
            headers = _header_lists(
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in scope["headers"]
            )
            found, _ = await read_asgi_body(scope, receive, self.responder.max_body)
            body = None if found.over else found.data  # None: 413
            response = await self.responder.respond_async(scope["method"], headers, body)
        elif self.app is not None:
            await self.app(scope, receive, send)
            return
        elif scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        elif scope["type"] == "http":
            response = _NOT_FOUND
        else:
            return  # a WebSocket with nothing to serve it is refused by the server
        raw = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in response.headers]
        await send({"type": "http.response.start", "status": response.status, "headers": raw})
        await send({"type": "http.response.body", "body": response.body})


class WSGILeakEndpoint(_Endpoint[WSGIApp]):
    """The WSGI twin of :class:`ASGILeakEndpoint`; an async store needs that one."""

    _sync = True

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        if wsgi_path(environ)[1] != self.path:
            if self.app is not None:
                return self.app(environ, start_response)
            response = _NOT_FOUND
        else:
            headers = _header_lists(
                (name[5:].replace("_", "-"), value)
                for name, value in environ.items()
                if name.startswith("HTTP_")
            )
            found = read_wsgi_body(environ, self.responder.max_body)
            # None: 413; a CONTENT_LENGTH that is not digits is read as no body
            body = b"" if found is None else None if found.over else found.data
            response = self.responder.respond(environ.get("REQUEST_METHOD", "GET"), headers, body)
        start_response(f"{response.status} {HTTPStatus(response.status).phrase}", response.headers)
        return [response.body]
