"""keyturn.client: ApiKeyAuth against a real keyturn-protected app under uvicorn on 127.0.0.1,
with httpx's sync and async clients."""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse
from starlette.routing import Route

from keyturn import Authenticator, CreatedKey, KeyManager, Lifetime, Scope
from keyturn.asgi import ApiKeyMiddleware, principal
from keyturn.client import ApiKeyAuth, InvalidCredentials, KeyExpiryWarning
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from tests.servers.loopback import serve_uvicorn
from tests.world import mistype

WHOAMI = "/managed-agents/v1/whoami"


def stated_in(delta: timedelta) -> Callable[[], str]:
    """A header value made when the response is: *delta* from then, to the second."""
    return lambda: (datetime.now(UTC) + delta).strftime("%Y-%m-%dT%H:%M:%SZ")


# Outside the prefix, what an app sets passes untouched: a server that is not keyturn.
STATED: dict[str, Callable[[], str]] = {
    "/other/days": stated_in(timedelta(days=3)),
    "/other/hours": stated_in(timedelta(hours=5, minutes=30)),
    "/other/offset": lambda: stated_in(timedelta(days=3))()[:-1] + "+02:00",  # said in UTC
    "/other/garbage": lambda: "next tuesday",
    "/other/naive": lambda: stated_in(timedelta(days=3))()[:-1],
}
SAID = {
    "/other/days": "expires in 3 days, at ",
    "/other/hours": "expires in 5 hours, at ",
    "/other/offset": "expires in 3 days, at ",
}


@attrs.frozen
class Live:
    base_url: str
    week: CreatedKey  # tenant-scoped, 7 days: inside the default 14-day warning
    month: CreatedKey  # organization-scoped, 30 days: outside it


async def whoami(request: Request) -> JSONResponse:
    caller = principal(request)
    return JSONResponse(
        {
            "account": caller.account_id,
            "organization": caller.organization_id,
            "sent_organization": request.headers.get("x-organization-id"),
        }
    )


async def other(request: Request) -> JSONResponse:
    return JSONResponse({}, headers={"service-key-expires-at": STATED[request.url.path]()})


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_organization("org_lab", tenant_id="acme")
    membership.add_member("alice", "org_main", role="admin")
    membership.add_member("alice", "org_lab", role="member")
    manager = KeyManager(store, membership)
    week = manager.create("alice", name="CI", scope=Scope.tenant("acme"), expiry=Lifetime.DAYS_7)
    month = manager.create("alice", name="sync", organization="org_lab", expiry=Lifetime.DAYS_30)
    routes = [Route(WHOAMI, whoami), *(Route(path, other) for path in STATED)]
    with Authenticator(store, membership) as authenticator:
        app = ApiKeyMiddleware(
            Starlette(routes=routes), authenticator=authenticator, expiry_header=True
        )
        for port in serve_uvicorn(app):
            yield Live(f"http://127.0.0.1:{port}", week, month)


def expiry_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, KeyExpiryWarning)]


def calls_sync(live: Live, auth: ApiKeyAuth, path: str = WHOAMI, n: int = 3) -> list[Any]:
    with httpx.Client(base_url=live.base_url, auth=auth, timeout=10) as client:
        return [client.get(path) for _ in range(n)]


def calls_async(live: Live, auth: ApiKeyAuth, path: str = WHOAMI, n: int = 3) -> list[Any]:
    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=live.base_url, auth=auth, timeout=10) as client:
            return [await client.get(path) for _ in range(n)]

    return asyncio.run(run())


CALLS = pytest.mark.parametrize("calls", [calls_sync, calls_async], ids=["sync", "async"])


@CALLS
def test_sends_the_key_and_the_organization(live: Live, calls: Any) -> None:
    """A tenant key with its organization reaches the app as its caller; without the
    organization the service answers 400, and the client sent no header of its own."""
    with_organization = ApiKeyAuth(live.week.secret, organization="org_lab", warn_within=None)
    without = ApiKeyAuth(live.week.secret, warn_within=None)

    (ok,) = calls(live, with_organization, n=1)
    (refused,) = calls(live, without, n=1)

    assert ok.status_code == 200
    assert ok.json() == {
        "account": "alice",
        "organization": "org_lab",
        "sent_organization": "org_lab",
    }
    assert ok.headers["service-organization-id"] == "org_lab"
    assert refused.status_code == 400
    assert "x-organization-id" in refused.json()["error"]["message"]


@CALLS
def test_warns_once_when_the_key_expires_soon(
    live: Live, calls: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A 7-day key under the default 14 days: one KeyExpiryWarning and one log line over
    three calls, naming the hint and the instant, never the key."""
    auth = ApiKeyAuth(live.week.secret, organization="default")

    with warnings.catch_warnings(record=True) as record, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        replies = calls(live, auth)
    said = expiry_warnings(record)
    logged = [r.getMessage() for r in caplog.records if r.name == "keyturn.client"]

    assert [reply.status_code for reply in replies] == [200, 200, 200]
    stated = replies[0].headers["service-key-expires-at"]
    assert len(said) == 1
    assert logged == said
    assert live.week.info.hint in said[0]
    assert stated in said[0]
    assert "in 7 days" in said[0]
    assert live.week.secret not in said[0]


@CALLS
def test_no_warning_outside_the_threshold(live: Live, calls: Any) -> None:
    """A 30-day key warns under a 31-day threshold, not under the default 14 days."""
    quiet = ApiKeyAuth(live.month.secret)
    wary = ApiKeyAuth(live.month.secret, warn_within=timedelta(days=31))

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        quiet_replies = calls(live, quiet)
        quiet_said = expiry_warnings(record)
        calls(live, wary)
        wary_said = expiry_warnings(record)

    assert [reply.status_code for reply in quiet_replies] == [200, 200, 200]
    assert "service-key-expires-at" in quiet_replies[0].headers
    assert quiet_said == []
    assert len(wary_said) == 1


@pytest.mark.parametrize("path", sorted(STATED))
def test_reads_only_an_aware_instant(live: Live, path: str) -> None:
    """From any server: a near instant warns, in words and in UTC; text that is no instant,
    or one without a zone, neither warns nor fails the request."""
    auth = ApiKeyAuth(live.month.secret)

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        (reply,) = calls_sync(live, auth, path, n=1)
    said = expiry_warnings(record)

    assert reply.status_code == 200
    if path not in SAID:
        assert said == []
        return
    (message,) = said
    assert SAID[path] in message
    instant = datetime.fromisoformat(reply.headers["service-key-expires-at"])
    assert message.split(" at ")[1].startswith(instant.astimezone(UTC).isoformat()[:19] + "Z:")


def test_warning_can_be_an_error(live: Live) -> None:
    """Under a filter that raises, the first call raises KeyExpiryWarning; the next calls
    go through: once is once."""
    auth = ApiKeyAuth(live.week.secret, organization="default")

    with warnings.catch_warnings():
        warnings.simplefilter("error", KeyExpiryWarning)
        with pytest.raises(KeyExpiryWarning):
            calls_sync(live, auth, n=1)
        replies = calls_sync(live, auth, n=2)

    assert [reply.status_code for reply in replies] == [200, 200]


def test_key_is_never_shown(live: Live) -> None:
    """repr and str show the hint; the request's headers hide the key in their repr."""
    # As read from a file, with spaces and a newline around it.
    auth = ApiKeyAuth(f"  {live.week.secret}\n", organization="default", warn_within=None)
    with httpx.Client(base_url=live.base_url, auth=auth, timeout=10) as client:
        reply = client.get(WHOAMI)

    assert reply.status_code == 200
    assert repr(auth) == f"ApiKeyAuth(key={live.week.info.hint!r}, organization='default')"
    assert str(auth) == repr(auth)
    assert live.week.secret not in repr(reply.request.headers)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda key: ApiKeyAuth(mistype(key)), "checksum does not match"),
        (lambda key: ApiKeyAuth(key[:-1]), "not a keyturn key"),
        (lambda key: ApiKeyAuth(f"Bearer {key}"), "not a keyturn key"),
        (lambda key: ApiKeyAuth(key.encode()), "must be a str"),
        (lambda key: ApiKeyAuth(key, organization="org\r\nx-evil: 1"), "organization"),
        (lambda key: ApiKeyAuth(key, organization=""), "organization"),
        (lambda key: ApiKeyAuth(key, warn_within=14), "warn_within"),  # type: ignore[arg-type]
    ],
    ids=["mistyped", "cut", "with scheme", "bytes", "header injection", "empty org", "days"],
)
def test_bad_input_is_a_typed_error_without_the_key(live: Live, make: Any, says: str) -> None:
    """Each mistake is an InvalidCredentials that says what to fix, holds no part of the
    key's secret, and leaves no frame of keyturn.client holding the key."""
    key = live.week.secret
    secret_part = key[22:44]  # part of the secret, also in the mistyped key

    with pytest.raises(InvalidCredentials, match=says) as raised:
        make(key)

    assert isinstance(raised.value, ValueError)
    assert secret_part not in str(raised.value)
    client_frames = [
        frame
        for frame, _ in _walk(raised.tb)
        if frame.f_code.co_filename.endswith(("keyturn/client.py", "keyturn\\client.py"))
    ]
    assert client_frames
    for frame in client_frames:
        shown = " ".join(f"{name}={value!r}" for name, value in frame.f_locals.items())
        assert secret_part not in shown, frame.f_code.co_name


def _walk(tb: Any) -> Iterator[tuple[Any, int]]:
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def test_a_redirect_to_another_origin_does_not_carry_the_key(live: Live) -> None:
    """Followed to another server (another port is another origin), the request arrives
    without Authorization: httpx drops it, and the auth does not set it again."""

    async def landing(request: Request) -> JSONResponse:
        return JSONResponse({"authorization": "authorization" in request.headers})

    for port in serve_uvicorn(Starlette(routes=[Route("/landing", landing)])):
        target = f"http://127.0.0.1:{port}/landing"

        async def away(request: Request, target: str = target) -> RedirectResponse:
            return RedirectResponse(target, status_code=307)

        for first_port in serve_uvicorn(Starlette(routes=[Route("/go", away)])):
            auth = ApiKeyAuth(live.month.secret, warn_within=None)
            with httpx.Client(auth=auth, follow_redirects=True, timeout=10) as client:
                reply = client.get(f"http://127.0.0.1:{first_port}/go")

    assert [r.status_code for r in reply.history] == [307]
    assert reply.history[0].request.headers["authorization"].startswith("Bearer ")
    assert reply.json() == {"authorization": False}
