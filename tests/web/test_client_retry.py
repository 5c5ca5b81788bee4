"""keyturn.client: ApiKeyAuth sends a request again after a 429 or 503 that says
Retry-After, within its bounds; against a real server under uvicorn on 127.0.0.1, with
httpx's sync and async clients. Requests are counted at the server, never timed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from keyturn import KeyManager, Scope
from keyturn.client import ApiKeyAuth, InvalidCredentials
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from tests.servers.loopback import serve_uvicorn


class Script:
    """What the server answers, request by request, and what it saw."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, str | None]] = []
        self.seen: list[tuple[str, str | None, bytes]] = []


SCRIPT = Script()


async def endpoint(request: Request) -> Response:
    body = await request.body()
    SCRIPT.seen.append((request.method, request.headers.get("authorization"), body))
    status, retry_after = SCRIPT.answers.pop(0) if SCRIPT.answers else (200, None)
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return JSONResponse({"status": status}, status_code=status, headers=headers)


APP = Starlette(routes=[Route("/managed-agents/v1/thing", endpoint, methods=["GET", "POST"])])


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    for port in serve_uvicorn(APP):
        yield f"http://127.0.0.1:{port}/managed-agents/v1/"


@pytest.fixture
def script() -> Script:
    SCRIPT.answers.clear()
    SCRIPT.seen.clear()
    return SCRIPT


@pytest.fixture(scope="module")
def key() -> str:
    membership = MemoryMembership()
    membership.add_organization("org_a", tenant_id="acme", default=True)
    membership.add_member("alice", "org_a", role="admin")
    manager = KeyManager(MemoryKeyStore(), membership)
    return manager.create("alice", name="ci", scope=Scope.tenant("acme")).secret


def test_a_429_with_retry_after_is_sent_again(base_url: str, script: Script, key: str) -> None:
    """A 429 that says Retry-After: 1 is followed, after the wait, by the same request with
    the key; the caller gets the second answer, the first in its history."""
    script.answers[:] = [(429, "1")]
    with httpx.Client(base_url=base_url, auth=ApiKeyAuth(key, warn_within=None)) as api:
        reply = api.post("thing", json={"a": 1})

    assert reply.status_code == 200
    assert [r.status_code for r in reply.history] == [429]
    assert [(m, a, b) for m, a, b in script.seen] == [("POST", f"Bearer {key}", b'{"a":1}')] * 2


def test_retries_are_bounded(base_url: str, script: Script, key: str) -> None:
    """503s with Retry-After: 0 are sent again *retries* times, then the last is returned."""
    script.answers[:] = [(503, "0")] * 5
    with httpx.Client(base_url=base_url, auth=ApiKeyAuth(key, warn_within=None)) as api:
        reply = api.get("thing")

    assert reply.status_code == 503
    assert len(script.seen) == 3  # the request and its two retries


@pytest.mark.parametrize(
    ("answer", "retries", "max_wait"),
    [
        ((429, None), 2, 60.0),  # no Retry-After: nothing to go by
        ((429, "120"), 2, 60.0),  # longer than max_wait: the caller's to decide
        ((429, "soon"), 2, 60.0),  # unreadable
        ((500, "0"), 2, 60.0),  # not a 429 or 503
        ((429, "0"), 0, 60.0),  # retries=0
    ],
)
def test_no_retry_outside_the_bounds(
    base_url: str,
    script: Script,
    key: str,
    answer: tuple[int, str | None],
    retries: int,
    max_wait: float,
) -> None:
    """Each of these answers is returned as it is, after one request."""
    script.answers[:] = [answer]
    auth = ApiKeyAuth(key, warn_within=None, retries=retries, max_wait=max_wait)
    with httpx.Client(base_url=base_url, auth=auth) as api:
        reply = api.get("thing")

    assert reply.status_code == answer[0]
    assert len(script.seen) == 1


def test_an_http_date_is_read(base_url: str, script: Script, key: str) -> None:
    """Retry-After as an HTTP date in the past means: send again now."""
    past = format_datetime(datetime.now(UTC) - timedelta(seconds=5), usegmt=True)
    script.answers[:] = [(429, past)]
    with httpx.Client(base_url=base_url, auth=ApiKeyAuth(key, warn_within=None)) as api:
        assert api.get("thing").status_code == 200
    assert len(script.seen) == 2


def test_a_streamed_body_is_sent_once(base_url: str, script: Script, key: str) -> None:
    """A body that is a stream cannot be sent twice: the 429 is the caller's."""
    script.answers[:] = [(429, "0")]

    def chunks() -> Iterator[bytes]:
        yield b"one"

    with httpx.Client(base_url=base_url, auth=ApiKeyAuth(key, warn_within=None)) as api:
        reply = api.post("thing", content=chunks())

    assert reply.status_code == 429
    assert len(script.seen) == 1


def test_the_async_client_waits_without_blocking(base_url: str, script: Script, key: str) -> None:
    """The async client retries too, and its event loop runs other work while it waits."""
    script.answers[:] = [(429, "1")]
    ticks = 0

    async def ticker(stop: asyncio.Event) -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.05)

    async def main() -> int:
        stop = asyncio.Event()
        task = asyncio.create_task(ticker(stop))
        auth = ApiKeyAuth(key, warn_within=None)
        async with httpx.AsyncClient(base_url=base_url, auth=auth) as api:
            reply = await api.get("thing")
        stop.set()
        await task
        return reply.status_code

    assert asyncio.run(main()) == 200
    assert len(script.seen) == 2
    assert ticks > 2  # the loop ran while the client waited a second


@pytest.mark.parametrize(
    ("retries", "max_wait"), [(-1, 60.0), (11, 60.0), (True, 60.0), (2, -1.0), (2, "60")]
)
def test_bad_retry_settings_are_refused(key: str, retries: object, max_wait: object) -> None:
    """Retry settings that cannot work fail when the auth is made."""
    with pytest.raises(InvalidCredentials):
        ApiKeyAuth(key, retries=retries, max_wait=max_wait)  # type: ignore[arg-type]
