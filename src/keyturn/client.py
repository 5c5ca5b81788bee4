"""
Client helper
=============

An ``httpx.Auth`` for code that calls the agents API with a personal key: it sends the key
as ``Authorization: Bearer`` and, when given, the ``x-organization-id`` header, and it warns
once when the service says the key expires soon. ::

    import httpx
    from keyturn.client import ApiKeyAuth

    auth = ApiKeyAuth(os.environ["AGENTS_API_KEY"], organization="default")
    with httpx.Client(base_url="https://agents.example.com/managed-agents/v1/", auth=auth) as api:
        models = api.get("models").json()["items"]

How it behaves:

1. The key is checked when the auth is made (shape and checksum, surrounding whitespace
   dropped), so a truncated or mistyped key fails at start-up with
   :class:`InvalidCredentials`, not with a 401 on the first call. The error says what is
   wrong and never repeats the key; no frame of this module holds the key when it raises.
2. The key is shown nowhere: ``repr`` and ``str`` show its hint (``rma_…Xy12``), and it is
   kept only as the header value it becomes.
3. The expiry warning reads the ``service-key-expires-at`` response header (the service
   turns it on: ``expiry_header=True``). When fewer than *warn_within* are left, it logs one
   WARNING on the ``keyturn.client`` logger and issues one :class:`KeyExpiryWarning`,
   once per ``ApiKeyAuth``. A missing or unreadable header is no reason to warn, nor to
   fail a request.
4. A 429 (rate limited) or 503 (unavailable) answer that says ``Retry-After`` is sent
   again after that wait, at most *retries* times (default 2), when the wait is at most
   *max_wait* seconds (default 60) and the request's body can be sent again (not a
   stream). Otherwise the answer is the caller's. The sync client sleeps; the async one
   awaits, never blocking its event loop.
"""

from __future__ import annotations

import email.utils
import logging
import threading
import time
import warnings
from collections.abc import AsyncGenerator, Generator
from datetime import UTC, datetime, timedelta
from typing import Final

try:
    import httpx
except ImportError as exc:
    raise ImportError("keyturn.client needs httpx: pip install 'keyturn[client]'") from exc

from keyturn._core import token as _token
from keyturn._core.fork import renew_in_child
from keyturn.errors import InvalidCredentials, KeyExpiryWarning, Reason

__all__ = ["ApiKeyAuth", "InvalidCredentials", "KeyExpiryWarning"]

log: Final = logging.getLogger("keyturn.client")

EXPIRES_AT_HEADER: Final = "service-key-expires-at"
_ORGANIZATION_HEADER: Final = "x-organization-id"
_ASCII_WHITESPACE: Final = " \t\r\n\f\v"
_RETRIED_STATUSES: Final = frozenset({429, 503})


def _bearer(key: object) -> tuple[str, str] | str:
    """The header value and hint of *key*, or what is wrong with it (never the key itself)."""
    if not isinstance(key, str):
        return f"the key must be a str, not {type(key).__name__}"
    parsed = _token.parse(key.strip(_ASCII_WHITESPACE))
    if isinstance(parsed, _token.ParsedToken):
        return f"Bearer {parsed.token}", parsed.hint
    if parsed is Reason.BAD_CHECKSUM:
        return "the key's checksum does not match: it was mistyped or cut; copy it again"
    return (
        f"not a keyturn key: one is {_token.PREFIX!r} and "
        f"{_token.TOKEN_LENGTH - len(_token.PREFIX)} letters and digits"
    )


def _setting(organization: object, warn_within: object) -> str | None:
    """What is wrong with the organization or the warning threshold, or ``None``."""
    if organization is not None and not (
        isinstance(organization, str)
        and organization
        and organization.isascii()
        and organization.isprintable()
        and organization == organization.strip()
    ):
        return (
            "organization must be an organization id or 'default' (visible ASCII characters, "
            "no spaces around it), or None"
        )
    if warn_within is not None and not isinstance(warn_within, timedelta):
        return "warn_within must be a timedelta, or None never to warn"
    return None


class ApiKeyAuth(httpx.Auth):
    """Send a personal API key, and the organization when given; warn once before it expires.

    :param key: the key, ``rma_...`` (from a secret store or the environment).
    :param organization: the ``x-organization-id`` to send: an organization id or
        ``"default"``. A tenant-scoped key needs it; an organization-scoped key may send
        its own organization, or nothing.
    :param warn_within: warn when the key expires sooner than this (default 14 days);
        ``None`` never warns.
    :param retries: how many times a 429 or 503 with ``Retry-After`` is sent again after
        the wait it names (default 2; 0 never retries).
    :param max_wait: the longest ``Retry-After`` waited for, in seconds (default 60): a
        longer one is returned to the caller at once.
    :raises InvalidCredentials: the key is not a well-formed keyturn key, or the
        organization is not something a header can carry.
    """

    requires_request_body = False
    requires_response_body = False

    def __init__(
        self,
        key: str,
        *,
        organization: str | None = None,
        warn_within: timedelta | None = timedelta(days=14),
        retries: int = 2,
        max_wait: float = 60.0,
    ) -> None:
        bearer = _bearer(key)
        del key  # no frame of ours holds the key while it raises
        if isinstance(bearer, str):  # what is wrong with the key, without the key
            raise InvalidCredentials(bearer)
        problem = _setting(organization, warn_within) or _retry_setting(retries, max_wait)
        if problem is not None:
            del bearer
            raise InvalidCredentials(problem)
        self._authorization, self.hint = bearer
        self.organization = organization
        self.warn_within = warn_within
        self.retries = retries
        self.max_wait = max_wait
        self._warned = False
        self._lock = threading.Lock()  # one warning, also with threads sharing the auth
        renew_in_child(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork

    def __repr__(self) -> str:
        # getattr: an error tracker may show an instance whose __init__ refused its input
        hint, organization = getattr(self, "hint", None), getattr(self, "organization", None)
        return f"ApiKeyAuth(key={hint!r}, organization={organization!r})"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        # What httpx runs where the sync and async flows below are not used: no retries.
        self._prepare(request)
        response = yield request
        self._received(response)

    def sync_auth_flow(
        self, request: httpx.Request
    ) -> Generator[httpx.Request, httpx.Response, None]:
        flow = self._attempts(request)
        step = next(flow)
        while True:
            answer = None
            if isinstance(step, float):
                time.sleep(step)
            else:
                answer = yield step
            try:
                step = flow.send(answer)
            except StopIteration:
                return

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        import anyio  # httpx's own dependency: asyncio or trio, as the client runs

        flow = self._attempts(request)
        step = next(flow)
        while True:
            answer = None
            if isinstance(step, float):
                await anyio.sleep(step)
            else:
                answer = yield step
            try:
                step = flow.send(answer)
            except StopIteration:
                return

    def _attempts(
        self, request: httpx.Request
    ) -> Generator[httpx.Request | float, httpx.Response | None, None]:
        """Yields the request to send (and is sent its response), or a wait in seconds."""
        for attempt in range(self.retries + 1):
            self._prepare(request)
            response = yield request
            if response is None:  # pragma: no cover -- the drivers always answer
                return
            self._received(response)
            wait = _retry_after(response) if response.status_code in _RETRIED_STATUSES else None
            if (
                wait is None
                or wait > self.max_wait
                or attempt == self.retries
                or not isinstance(request.stream, httpx.ByteStream)  # a stream is sent once
            ):
                return
            log.info(
                "the service answered %d: sending again in %g s (%d of %d)",
                response.status_code,
                wait,
                attempt + 1,
                self.retries,
            )
            yield wait

    def _prepare(self, request: httpx.Request) -> None:
        request.headers["Authorization"] = self._authorization
        if self.organization is not None:
            request.headers[_ORGANIZATION_HEADER] = self.organization

    def _received(self, response: httpx.Response) -> None:
        if not self._warned and self.warn_within is not None:
            self._check_expiry(response.headers.get(EXPIRES_AT_HEADER))

    def _check_expiry(self, stated: str | None) -> None:
        expires_at = _instant(stated)
        if expires_at is None or self.warn_within is None:
            return
        left = expires_at - datetime.now(UTC)
        if left >= self.warn_within:
            return
        with self._lock:
            if self._warned:
                return
            self._warned = True  # before warning: a warnings filter may turn it into an error
        at = expires_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # ours, not the header's
        message = (
            f"the API key {self.hint} expires {_in(left)}, at {at}: create its "
            "replacement in the console, deploy it, then revoke this key"
        )
        log.warning("%s", message)
        warnings.warn(message, KeyExpiryWarning, stacklevel=2)


def _retry_setting(retries: object, max_wait: object) -> str | None:
    """What is wrong with the retry settings, or ``None``."""
    if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= 10:
        return "retries must be a whole number from 0 to 10"
    if not isinstance(max_wait, int | float) or isinstance(max_wait, bool) or max_wait < 0:
        return "max_wait must be a number of seconds >= 0"
    return None


def _retry_after(response: httpx.Response) -> float | None:
    """The wait a ``Retry-After`` field names, in seconds: delay-seconds or an HTTP date;
    ``None`` when it is missing or unreadable."""
    text = response.headers.get("Retry-After", "").strip()
    if text.isdigit() and text.isascii():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _instant(text: str | None) -> datetime | None:
    """An aware instant from the header's RFC 3339 text, or ``None`` if it is not one."""
    if not text:
        return None
    try:
        instant = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return instant if instant.tzinfo is not None else None


def _in(left: timedelta) -> str:
    """How soon, in words: "in 6 days", "in 5 hours", "in an hour", "within the hour"."""
    if left >= timedelta(days=2):
        return f"in {round(left / timedelta(days=1))} days"  # a 7-day key: "in 7 days"
    hours = int(left.total_seconds() // 3600)
    if hours >= 2:
        return f"in {hours} hours"
    if hours == 1:
        return "in an hour"
    return "within the hour" if left > timedelta(0) else "now"
