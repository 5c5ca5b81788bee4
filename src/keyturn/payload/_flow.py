"""What the payload guard decides of a body it read: its answer, and the leaks it records.

The answer (:func:`verdict`): a key in the body is 400 ``key_in_payload``, a body not read
as the app may read it 400 ``invalid_request``, one over the bound 413, each charged to the
sender's key. What is recorded (:class:`Recorder`): each key found that the decision's check
finds real, by :func:`keyturn._core.leak.record_leak`. ``keyturn.payload`` says each rule.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Mapping
from datetime import datetime
from typing import Any, Final

import attrs

from keyturn._core.decision import credential
from keyturn._core.leak import Finder, record_leak
from keyturn._core.model import Principal
from keyturn._core.scanner import BodyScanner
from keyturn._core.steps import Step, WrongAnswer
from keyturn._core.token import ParsedToken
from keyturn._run.capabilities import Caller
from keyturn._run.drive import Conduct, drive, drive_async
from keyturn._web import Body
from keyturn.activity import By, Channel
from keyturn.authenticator import Authenticator
from keyturn.errors import InvalidRequest, KeyInPayload, PayloadTooLarge, Reason, Refusal, loggable

log: Final = logging.getLogger("keyturn")

SOURCE_PREFIX: Final = "request-body:"  # the leak's recorded place: request-body:POST /path
# The methods a leak's recorded place names; any other is "OTHER".
_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "QUERY"})
_LENGTH: Final = "The Content-Length header is not a number of bytes: send its digits only."
_CHARSET: Final = "The charset of the request body is not one this API reads: send JSON in UTF-8."

# Who records a key found in a body, in the record of key actions and the log.
_FINDER: Final = Finder(
    By(channel=Channel.LIBRARY, actor="payload guard"), "found in a request body", log
)


def verdict(
    body: Body | None, content_type: str | None, principal: Principal, max_bytes: int
) -> tuple[list[ParsedToken], Refusal | None]:
    """The keys *body* holds, and its refusal (``None``: the app may have it), read in the
    encodings *content_type* says. *body* ``None``: its length is not a number of bytes."""
    if body is None:
        return [], _unreadable(_LENGTH, principal)
    if body.read:
        scanner = _scanner(content_type)
        if scanner is None:
            return [], _unreadable(_CHARSET, principal)
        scanner.feed(body.data, final=True)
        if scanner.keys:  # even in a body also too long: a key was there
            return scanner.keys, KeyInPayload(
                Reason.KEY_IN_PAYLOAD, key_id=principal.key_id, principal=principal
            )
        if scanner.unreadable:
            return [], _unreadable(_CHARSET, principal)
    # Not read: said to be too long, or no body the app may read (PEP 3333).
    if not body.over:
        return [], None
    return [], PayloadTooLarge(
        Reason.PAYLOAD_TOO_LARGE,
        f"The request body is longer than the {max_bytes} bytes this API reads: "
        "send a smaller one.",
        key_id=principal.key_id,
        principal=principal,
    )


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


@attrs.frozen
class Recorder:
    """Records the real keys of a refused body as leaked, asking the key store's caller."""

    callers: Mapping[int, Caller]  # by Step.via
    events: bool  # the store keeps the record of key actions
    revoke: bool
    route: str  # the prefix the middleware guards: where a leak is recorded

    def record(
        self, keys: list[ParsedToken], method: str, path: str, authenticator: Authenticator
    ) -> None:
        flow = self._leaks(keys, method, path, authenticator.clock())
        drive(flow, self.callers, _RECORDING, _deadline(authenticator))

    async def record_async(
        self, keys: list[ParsedToken], method: str, path: str, authenticator: Authenticator
    ) -> None:
        flow = self._leaks(keys, method, path, authenticator.clock())
        await drive_async(flow, self.callers, _RECORDING, _deadline(authenticator))

    def _leaks(
        self, keys: list[ParsedToken], method: str, path: str, now: datetime
    ) -> Generator[Step, Any, None]:
        # The place kept on the key, and named in its creator's notice: the method and the
        # guarded route, never the rest of the path (whoever sends the body chooses it, up
        # to 2,048 characters of it, to be read in an official mail).
        place = f"{SOURCE_PREFIX}{method if method in _METHODS else 'OTHER'} {self.route}"
        where = f"the body of {loggable(method, 20)} {loggable(path)}"  # for the log
        for parsed in keys:
            key = yield from credential(parsed.key_id, parsed.secret)  # as the decision checks
            if key is Reason.UNKNOWN_KEY:
                log.info("a key found in %s has no such id in the store", where)
            elif isinstance(key, Reason):  # a real id with another secret: a forgery
                log.info("a key found in %s is a forgery of key id %s", where, parsed.key_id)
            else:
                yield from record_leak(
                    key, place, where, now, _FINDER, revoke=self.revoke, events=self.events
                )


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
