"""Shared by the adversarial tests: the secret canary, the target under attack, hostile doubles.

Header lines are written as latin-1 text: each character is one byte on the wire, which is
also exactly what a WSGI server puts into the environ. So ``"\\xc3\\xa9"`` is "é" sent as
UTF-8, and ``"\\xe9"`` the same letter sent as one latin-1 byte.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import attrs

from keyturn import ApiKey
from keyturn._core import token as _token
from keyturn._web import SERVICE_HEADER_NAMES
from tests.web.web_support import MODELS, Client, Reply
from tests.world import World

Lines = Sequence[tuple[str, str]]  # header lines as (name, value), latin-1 text

SECRET = slice(len(_token.PREFIX) + _token.ID_LENGTH, _token.TOKEN_LENGTH - _token.CHECKSUM_LENGTH)
_ALNUM_RUN = re.compile(rf"[A-Za-z0-9]{{{_token.SECRET_LENGTH},}}")
# The middleware's own header text: a request fragment found in it is no reflection.
_OWN_TEXT = 'Bearer realm="agents-api", error="invalid_token" application/json'
FRAGMENT = 8
HANG_LIMIT = 10.0  # no double ever holds a caller longer than this
WORKERS = 32  # threads standing in for a WSGI server's


# --- the canary ---------------------------------------------------------------------------


class Canary:
    """The secrets of every key the suite makes, and every text that left the library."""

    def __init__(self) -> None:
        self.secrets: set[str] = set()
        self.texts: list[tuple[str, str]] = []  # (where it was seen, the text)

    def secret(self, key: str) -> None:
        """Watch for *key*: its 28-character secret, and so the full key that holds it."""
        self.secrets.add(key[SECRET])

    def saw(self, where: str, text: str) -> None:
        if text:
            self.texts.append((where, text))

    def observe(self, *objects: object) -> None:
        """Record the repr and str of each object."""
        for obj in objects:
            name = type(obj).__name__
            self.saw(f"repr of {name}", repr(obj))
            self.saw(f"str of {name}", str(obj))

    def leaks(self, since: int = 0) -> list[str]:
        """Where a watched secret appeared, among the texts seen from index *since* on."""
        width = _token.SECRET_LENGTH
        found = []
        for where, text in self.texts[since:]:
            for run in _ALNUM_RUN.findall(text):  # a secret is a run of letters and digits
                if any(run[i : i + width] in self.secrets for i in range(len(run) - width + 1)):
                    found.append(where)
                    break
        return found


# --- the outcomes ---

CODES = {400: "invalid_request", 401: "unauthorized", 404: "not_found", 503: "service_unavailable"}
UNAUTHORIZED = {
    "error": {
        "code": "unauthorized",
        "message": "A valid API key is required: send it as 'Authorization: Bearer <key>'.",
    }
}


def assert_refused(reply: Reply, status: int, world: World) -> None:
    """The middleware's own refusal: status, JSON body, no service headers, no app call."""
    assert reply.status == status
    assert reply.json()["error"]["code"] == CODES[status]
    assert reply.values("content-type") == ["application/json"]
    assert reply.values("service-organization-id") == []
    assert world.calls == []
    if status == 401:
        assert reply.json() == UNAUTHORIZED
        assert len(reply.values("www-authenticate")) == 1
    else:
        assert reply.values("www-authenticate") == []


def assert_accepted(reply: Reply, organization: str, world: World) -> None:
    assert reply.status == 200
    assert reply.values("service-organization-id") == [organization]
    assert len(world.calls) == 1


# --- the target ---------------------------------------------------------------------------


def wire(lines: Lines) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in lines]


def fragments(lines: Lines) -> set[str]:
    """Pieces of the request's header values that must not come back in a response header."""
    pieces = set()
    for _, value in lines:
        value = value.strip()
        if len(value) < FRAGMENT:
            if len(value) >= 4:
                pieces.add(value)
            continue
        pieces.update(value[i : i + FRAGMENT] for i in range(len(value) - FRAGMENT + 1))
    return {piece for piece in pieces if piece not in _OWN_TEXT}


class Target:
    """One adapter under attack: every reply goes to the canary and is checked for request
    text reflected into a response header (response splitting).
    """

    def __init__(self, client: Client, world: World, canary: Canary) -> None:
        self.client = client
        self.world = world
        self.canary = canary

    @property
    def adapter(self) -> str:
        return self.client.adapter

    def send(
        self, lines: Lines = (), path: str = MODELS, *, method: str = "GET", body_size: int = 0
    ) -> Reply:
        reply = self.client.raw(path, wire(lines), method=method, body_size=body_size)
        return self.seen(lines, reply)

    async def send_async(self, lines: Lines = (), path: str = MODELS) -> Reply:
        reply = await self.client.exchange(path, wire(lines))  # type: ignore[attr-defined]
        return self.seen(lines, reply)

    def send_many(self, requests: Sequence[Lines], path: str = MODELS) -> list[Reply]:
        """Send all at once: as tasks on one event loop (ASGI) or from threads (WSGI)."""
        if self.adapter == "asgi":

            async def all_at_once() -> list[Reply]:
                return list(await asyncio.gather(*(self.send_async(r, path) for r in requests)))

            return asyncio.run(all_at_once())
        with ThreadPoolExecutor(WORKERS) as pool:
            return list(pool.map(lambda lines: self.send(lines, path), requests))

    def race(
        self, slow: Lines, fast: Lines, *, path: str = MODELS, head_start: float = 0.05
    ) -> tuple[list[str], Reply, Reply]:
        """Send *slow*, then *fast* once *slow* is under way; say which finished first.

        ASGI: both on one event loop, so *fast* can only finish first if *slow* never
        blocks the loop. WSGI: each on its own thread, as a threaded server runs them.
        """
        order: list[str] = []
        if self.adapter == "asgi":

            async def both() -> tuple[Reply, Reply]:
                async def one(tag: str, lines: Lines) -> Reply:
                    reply = await self.send_async(lines, path)
                    order.append(tag)
                    return reply

                first = asyncio.create_task(one("slow", slow))
                await asyncio.sleep(head_start)
                second = await one("fast", fast)
                return await first, second

            slow_reply, fast_reply = asyncio.run(both())
            return order, slow_reply, fast_reply
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(self.send, slow, path)
            pending.add_done_callback(lambda _: order.append("slow"))
            time.sleep(head_start)
            fast_reply = self.send(fast, path)
            order.append("fast")
            return order, pending.result(HANG_LIMIT), fast_reply

    def meanwhile(self, lines: Lines, ready: threading.Event, action: Callable[[], None]) -> Reply:
        """Send *lines*; once *ready* is set (the request is under way), run *action* on the
        side, as another request of the same server would; then wait for the reply.
        """
        if self.adapter == "asgi":

            async def interleaved() -> Reply:
                request = asyncio.create_task(self.send_async(lines))
                deadline = time.monotonic() + HANG_LIMIT
                while not ready.is_set() and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
                action()
                return await request

            return asyncio.run(interleaved())
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(self.send, lines)
            ready.wait(HANG_LIMIT)
            action()
            return pending.result(HANG_LIMIT)

    def seen(self, lines: Lines, reply: Reply) -> Reply:
        self.canary.saw(f"{self.adapter} reply body", reply.body.decode("latin-1"))
        self.canary.saw(f"{self.adapter} reply headers", repr(reply.headers))
        pieces = fragments(lines)
        for name, value in reply.headers:
            if name in SERVICE_HEADER_NAMES:
                assert value in self.canonical_ids(), f"{name} is not a canonical id"
                continue
            reflected = [piece for piece in pieces if piece in value]
            assert not reflected, f"response header {name} carries request text {reflected[0]!r}"
        return reply

    def canonical_ids(self) -> set[str]:
        organizations = self.world.membership.organizations()
        return {o.id for o in organizations} | {o.tenant_id for o in organizations}


# --- keys -----------------------------------------------------------------------------------


def key_of(key_id: str, secret: str) -> str:
    """A well-formed key string (right checksum) for any id and secret."""
    body = _token.PREFIX + key_id + secret
    return body + _token._checksum(body)


def split(key: str) -> tuple[str, str]:
    """The key id and secret of a key string."""
    return key[len(_token.PREFIX) : SECRET.start], key[SECRET]


def random_secret() -> str:
    return "".join(secrets.choice(_token.ALPHABET) for _ in range(_token.SECRET_LENGTH))


def bearer(key: str, *more: tuple[str, str]) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}"), *more]


# --- hostile doubles ------------------------------------------------------------------------


class Gate:
    """Holds callers until opened, and never longer than HANG_LIMIT seconds."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self.waiting = 0

    def wait(self) -> None:
        self.waiting += 1
        self._open.wait(HANG_LIMIT)

    async def wait_async(self) -> None:
        self.waiting += 1
        deadline = time.monotonic() + HANG_LIMIT
        while not self._open.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def open(self) -> None:
        self._open.set()

    @contextmanager
    def released_at_end(self) -> Iterator[None]:
        """Open the gate when the block ends, so that no call stays stuck after the test."""
        try:
            yield
        finally:
            self.open()


class SpyStore:
    """The world's key store behind a spy: counts reads, and fails or hangs when told to.

    ``nonblocking=False`` makes the Authenticator treat it as a store that may block, so
    its calls run in threads, bounded by the timeout.
    """

    def __init__(self, inner: Any, *, nonblocking: bool = True) -> None:
        self.inner = inner
        self.nonblocking = nonblocking
        self.reads = 0
        self.failing = False
        self.hanging: set[str] = set()  # key ids whose reads hang at the gate
        self.gate = Gate()
        self.hashes: dict[str, str] = {}  # key id -> the stored hash to hand out instead
        self._lock = threading.Lock()

    def get_key(self, key_id: str) -> ApiKey | None:
        with self._lock:
            self.reads += 1
        if self.failing:
            raise ConnectionError("key store unreachable")
        if key_id in self.hanging:
            self.gate.wait()
        key: ApiKey | None = self.inner.get_key(key_id)
        if key is not None and key_id in self.hashes:
            key = attrs.evolve(key, secret_hash=self.hashes[key_id])
        return key


class AsyncHangingStore:
    """An async key store whose reads of some ids never answer (until released)."""

    def __init__(self, inner: Any, *hanging: str) -> None:
        self.inner = inner
        self.hanging = set(hanging)
        self.gate = Gate()

    async def get_key(self, key_id: str) -> ApiKey | None:
        if key_id in self.hanging:
            await self.gate.wait_async()
        return self.inner.get_key(key_id)  # type: ignore[no-any-return]


class SpyMembership:
    """The world's membership provider behind a spy: any method can fail or hang."""

    METHODS = ("get_organization", "get_default_organization", "get_role", "reaches_tenant")

    def __init__(self, inner: Any, *, nonblocking: bool = True) -> None:
        self.inner = inner
        self.nonblocking = nonblocking
        self.failing: set[str] = set()
        self.hanging: set[str] = set()
        self.gate = Gate()

    def _ask(self, method: str, *args: str) -> Any:
        if method in self.failing:
            raise ConnectionError("membership provider unreachable")
        if method in self.hanging:
            self.gate.wait()
        return getattr(self.inner, method)(*args)

    def get_organization(self, organization_id: str) -> Any:
        return self._ask("get_organization", organization_id)

    def get_default_organization(self, tenant_id: str) -> Any:
        return self._ask("get_default_organization", tenant_id)

    def get_role(self, account_id: str, organization_id: str) -> Any:
        return self._ask("get_role", account_id, organization_id)

    def reaches_tenant(self, account_id: str, tenant_id: str) -> Any:
        return self._ask("reaches_tenant", account_id, tenant_id)
