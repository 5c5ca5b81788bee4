"""The leak responder: which candidates of a report are keys, and what is done with each.

Its flow (:meth:`LeakResponder._flow`, steps driven by ``respond`` and ``respond_async``)
answers 405, 413, the report's refusal (``leaks/_report.py``), a failed step's 503, or a
label per candidate: a key when :func:`keyturn._core.decision.credential` finds it real,
recorded by :func:`keyturn._core.leak.record_leak` and handed to *on_leak*.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Generator, Mapping
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple, Protocol

import attrs

from keyturn._core import token as _token
from keyturn._core.decision import credential
from keyturn._core.leak import Finder, record_leak
from keyturn._core.model import ApiKey, Scope
from keyturn._core.steps import CALLBACK, STORE, NotifyLeak, Step, WrongAnswer
from keyturn._run.capabilities import Blocking, capabilities, is_coroutine_function
from keyturn._run.drive import Conduct, drive, drive_async
from keyturn.activity import By, Channel
from keyturn.errors import Reason, loggable
from keyturn.leaks._report import Candidate, PublicKeys, Signers, _Refusal, candidates, log

# Who records a true positive, in the record of key actions and the log.
_FINDER: Final = Finder(
    By(channel=Channel.LEAK_ENDPOINT, actor="secret scanning"), "reported leaked", log
)

MAX_URL: Final = 2048  # characters of a reported URL kept on the key
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")


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


def _json(status: int, value: object, *headers: tuple[str, str]) -> Response:
    body = json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    length = ("content-length", str(len(body)))
    return Response(status, [("content-type", "application/json"), length, *headers], body)


def error(status: int, code: str, message: str, *headers: tuple[str, str]) -> Response:
    """The spec's error body, as a response."""
    return _json(status, {"error": {"code": code, "message": message}}, *headers)


def _clean_url(url: str) -> str:
    """The reported URL as kept and shown: one line, bounded."""
    url = _CONTROL.sub("\ufffd", url)
    return url if len(url) <= MAX_URL else url[: MAX_URL - 1] + "\u2026"


class LeakResponder:
    """Answers a code host's secret-scanning reports against your key store.

    :param store: the key store (``db.keys``); an async store works with the ASGI endpoint.
    :param public_keys: key identifier -> PEM, or a callable returning the PEM (or ``None``)
        for an identifier. Supplied by you; see :func:`~keyturn.leaks.github_public_keys`.
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
        self._signers = Signers(public_keys)
        self.store = store
        self.on_leak = on_leak
        self.revoke = revoke
        self.max_body = max_body
        self.timeout = timeout
        self.clock = clock
        # Indexed by Step.via: STORE, and CALLBACK (the public keys and on_leak, in a
        # thread under the async driver: the user's code may block).
        callbacks = _Callbacks(self._signers.public_key, self._notify)
        self._callers = {STORE: can.caller(), CALLBACK: Blocking(callbacks, None, bounded=False)}
        self.is_async = can.is_async
        self._records_events = can.has("record_event")  # keyturn.activity
        # A failed step: 503, and the host sends the batch again. Each store answer within
        # the timeout (under the async driver); the user's callbacks unbounded.
        self._conduct = Conduct(fail=_failure, timeouts={STORE: timeout})

    def __repr__(self) -> str:
        return f"LeakResponder(store={self.store!r}, revoke={self.revoke})"

    # --- the flow ---------------------------------------------------------------------------

    def _flow(
        self, method: str, headers: Mapping[str, list[str]], body: bytes | None
    ) -> Generator[Step, Any, Response]:
        if method != "POST":
            return error(405, "method_not_allowed", "Send reports with POST.", ("allow", "POST"))
        if body is None:
            return error(413, "payload_too_large", f"The body exceeds {self.max_body} bytes.")
        try:
            yield from self._signers.verify(headers, body)
            batch = candidates(body)
        except _Refusal as refusal:
            return error(*refusal.args)
        answers = []
        for candidate in batch:
            real = yield from self._check(candidate)
            digest = hashlib.sha256(candidate.token.encode()).hexdigest()  # never the secret
            label = "true_positive" if real else "false_positive"
            answers.append({"token_hash": digest, "token_type": candidate.type, "label": label})
        return _json(200, answers)

    def _check(self, candidate: Candidate) -> Generator[Step, Any, bool]:
        parsed = _token.parse(candidate.token)
        if not isinstance(parsed, _token.ParsedToken):
            return False  # junk or a typo: no store lookup
        key = yield from credential(parsed.key_id, parsed.secret)  # as the decision checks
        if isinstance(key, Reason):
            return False  # no such id, or a real id with a wrong secret (or an unusable hash)
        now = self.clock()
        url = _clean_url(candidate.url)
        where = f"public at {loggable(url)}"
        first, revoked = yield from record_leak(
            key, url, where, now, _FINDER, revoke=self.revoke, events=self._records_events
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


# How a log line names whom a step asked: the store's reads and writes; others by their name.
_ASKED: Final = {method: f"store.{method}" for method in ("get_key", "report_leak", "revoke_key")}


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
    return error(503, "service_unavailable", "Try again later.", ("retry-after", "60"))
