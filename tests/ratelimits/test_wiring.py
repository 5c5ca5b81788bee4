"""The limiter in the request path: ``Authenticator(rate_limiter=...)`` behind every middleware.

Real frameworks (FastAPI over Starlette, Flask over Werkzeug, Django's test clients), real
stores (SQLite, PostgreSQL, their replicas on), real engines (an in-process one, Redis on a
closed loopback port for the faults). Requests are counted, never timed: the limiter's
clock is fixed at the start of a window, so every header below is exact.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, WebSocket
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from keyturn import (
    AuditEvent,
    Authenticator,
    AuthRequest,
    CreatedKey,
    KeyManager,
    Principal,
    RateLimited,
    Reason,
    Scope,
    ServiceUnavailable,
)
from keyturn.asgi import ApiKeyMiddleware
from keyturn.fastapi import Caller
from keyturn.ratelimits import FaultPolicy, Rate, RateLimiter, RateLimits
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership

MODELS = "/managed-agents/v1/models"
SOCKET = "/managed-agents/v1/stream"
NOW = 1_800_000_000.0  # the start of a minute and of an hour
LIMITS = RateLimits(key=Rate(3, 60), account=Rate(5, 60))
POLICY = '"key";q=3;w=60, "account";q=5;w=60'
BODY_429 = {
    "error": {
        "code": "rate_limited",
        "message": (
            "Too many requests for this key or its account: retry after the seconds in Retry-After."
        ),
    }
}


def limiter(limits: RateLimits = LIMITS, **options: Any) -> RateLimiter:
    return RateLimiter(limits, clock=lambda: NOW, **options)


def seeded() -> tuple[MemoryKeyStore, MemoryMembership, CreatedKey, CreatedKey]:
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    manager = KeyManager(store, membership)
    one = manager.create("alice", name="one", scope=Scope.tenant("acme"))
    two = manager.create("alice", name="two", scope=Scope.tenant("acme"))
    return store, membership, one, two


def bearer(key: CreatedKey) -> dict[str, str]:
    return {"authorization": f"Bearer {key.secret}", "x-organization-id": "default"}


# --- FastAPI over Starlette ------------------------------------------------------------------


class FastWorld:
    def __init__(self, authenticator: Authenticator, one: CreatedKey, two: CreatedKey) -> None:
        self.authenticator = authenticator
        self.one, self.two = one, two
        self.reached = Counter[str]()
        app = FastAPI()

        @app.get(MODELS)
        async def models(caller: Caller) -> dict[str, str]:
            self.reached["http"] += 1
            return {"account": caller.account_id}

        @app.websocket(SOCKET)
        async def stream(websocket: WebSocket) -> None:
            self.reached["websocket"] += 1
            await websocket.accept()
            await websocket.send_text("hello")
            await websocket.close()

        app.add_middleware(ApiKeyMiddleware, authenticator=authenticator)
        self.client = TestClient(app)


@pytest.fixture
def fast() -> Iterator[FastWorld]:
    store, membership, one, two = seeded()
    with Authenticator(store, membership, rate_limiter=limiter()) as authenticator:
        world = FastWorld(authenticator, one, two)
        with world.client:
            yield world


def test_fastapi_headers_on_every_accepted_response_and_an_exact_429(fast: FastWorld) -> None:
    """Three for the key (its quota), then 429 with the spec's JSON error, Retry-After and
    both RateLimit fields; the app is never reached by a refused request."""
    replies = [fast.client.get(MODELS, headers=bearer(fast.one)) for _ in range(4)]

    assert [reply.status_code for reply in replies] == [200, 200, 200, 429]
    assert [reply.headers["ratelimit"] for reply in replies[:3]] == [
        '"key";r=2;t=60, "account";r=4;t=60',
        '"key";r=1;t=60, "account";r=3;t=60',
        '"key";r=0;t=60, "account";r=2;t=60',
    ]
    assert all(reply.headers["ratelimit-policy"] == POLICY for reply in replies)
    assert all(reply.headers["service-organization-id"] == "org_main" for reply in replies)
    refused = replies[3]
    assert refused.json() == BODY_429
    assert refused.headers["content-type"] == "application/json"
    # Room is back when the window's 3 weigh 2 in the next one: 20 s into it.
    assert refused.headers["retry-after"] == "80"
    assert refused.headers["ratelimit"] == '"key";r=0;t=80'
    assert refused.headers["service-tenant-id"] == "acme"
    assert "www-authenticate" not in refused.headers
    assert fast.reached["http"] == 3


def test_fastapi_account_pool_covers_every_key(fast: FastWorld) -> None:
    """A second key buys no quota: the account's pool of 5 has 2 left after the first
    key's 3, and the key's refusal took nothing from it."""
    first = [fast.client.get(MODELS, headers=bearer(fast.one)).status_code for _ in range(4)]
    second = [fast.client.get(MODELS, headers=bearer(fast.two)) for _ in range(3)]

    assert first == [200, 200, 200, 429]
    assert [reply.status_code for reply in second] == [200, 200, 429]
    assert second[2].headers["ratelimit"] == '"key";r=1;t=60, "account";r=0;t=72'
    assert second[2].json()["error"]["code"] == "rate_limited"


def test_websocket_handshakes_count_and_are_refused_before_accept(fast: FastWorld) -> None:
    """Each handshake takes one from the quota; the fourth is answered 429 over the
    handshake (the denial response extension), and the app never sees it."""
    for _ in range(3):
        with fast.client.websocket_connect(SOCKET, headers=bearer(fast.one)) as ws:
            assert ws.receive_text() == "hello"
    with (
        pytest.raises(WebSocketDenialResponse) as denied,
        fast.client.websocket_connect(SOCKET, headers=bearer(fast.one)),
    ):
        pass  # pragma: no cover -- refused before accept

    assert denied.value.status_code == 429
    assert denied.value.json() == BODY_429
    assert denied.value.headers["retry-after"] == "80"
    assert fast.reached["websocket"] == 3
    # An HTTP request of the same key is refused too: the handshakes spent its quota.
    assert fast.client.get(MODELS, headers=bearer(fast.one)).status_code == 429


def test_websocket_without_the_extension_is_closed_before_accept() -> None:
    """A server without the denial response extension: close 1008, never an accept."""
    store, membership, one, _ = seeded()
    reached = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["type"])
        await send({"type": "websocket.accept"})

    with Authenticator(
        store, membership, rate_limiter=limiter(RateLimits(key=Rate(1, 60)))
    ) as authenticator:
        middleware = ApiKeyMiddleware(app, authenticator=authenticator)
        answers: list[list[dict[str, Any]]] = []
        for _ in range(2):
            sent: list[dict[str, Any]] = []

            async def receive() -> dict[str, Any]:
                return {"type": "websocket.connect"}  # pragma: no cover

            async def send(message: Any, sent: list[dict[str, Any]] = sent) -> None:
                sent.append(message)

            scope = {
                "type": "websocket",
                "path": SOCKET,
                "headers": [
                    (b"authorization", f"Bearer {one.secret}".encode()),
                    (b"x-organization-id", b"default"),
                ],
            }
            asyncio.run(middleware(scope, receive, send))
            answers.append(sent)

    assert answers[0][0]["type"] == "websocket.accept"
    assert (b"ratelimit", b'"key";r=0;t=60') in answers[0][0]["headers"]
    assert answers[1] == [{"type": "websocket.close", "code": 1008}]
    assert reached == ["websocket"]


# --- Flask over Werkzeug ----------------------------------------------------------------------


def test_flask_headers_on_200_and_an_exact_429() -> None:
    from flask import Flask

    from keyturn.wsgi import ApiKeyMiddleware as WsgiMiddleware
    from keyturn.wsgi import principal

    store, membership, one, _ = seeded()
    app = Flask(__name__)
    reached = []

    @app.get(MODELS)
    def models() -> dict[str, str]:
        reached.append(1)
        from flask import request

        return {"account": principal(request).account_id}

    with Authenticator(store, membership, rate_limiter=limiter()) as authenticator:
        app.wsgi_app = WsgiMiddleware(app.wsgi_app, authenticator=authenticator)  # type: ignore[method-assign]
        client = app.test_client()
        replies = [client.get(MODELS, headers=bearer(one)) for _ in range(4)]

    assert [reply.status_code for reply in replies] == [200, 200, 200, 429]
    assert replies[0].headers["RateLimit-Policy"] == POLICY
    assert replies[0].headers["RateLimit"] == '"key";r=2;t=60, "account";r=4;t=60'
    assert replies[0].get_json() == {"account": "alice"}
    refused = replies[3]
    assert json.loads(refused.data) == BODY_429
    assert refused.headers["Retry-After"] == "80"
    assert refused.headers["RateLimit"] == '"key";r=0;t=80'
    assert refused.headers["RateLimit-Policy"] == POLICY
    assert refused.headers["Content-Length"] == str(len(refused.data))
    assert len(reached) == 3


# --- Django ----------------------------------------------------------------------------------


def test_django_sync_and_async_headers_and_429() -> None:
    from django.test import AsyncClient, Client, override_settings

    from tests import django_project  # noqa: F401  (configures Django for this process)

    store, membership, one, two = seeded()
    with (
        Authenticator(store, membership, rate_limiter=limiter()) as authenticator,
        override_settings(
            ROOT_URLCONF="tests.frameworks.test_django",
            MIDDLEWARE=["keyturn.django.ApiKeyMiddleware"],
            KEYTURN={"AUTHENTICATOR": authenticator},
        ),
    ):
        path = "/managed-agents/v1/whoami"
        sync = [Client().get(path, headers=bearer(one)) for _ in range(4)]

        async def hammer() -> list[Any]:
            client = AsyncClient()
            return [await client.get(path, headers=bearer(two)) for _ in range(3)]

        asynced = asyncio.run(hammer())

    assert [reply.status_code for reply in sync] == [200, 200, 200, 429]
    assert sync[0]["RateLimit"] == '"key";r=2;t=60, "account";r=4;t=60'
    assert sync[0]["RateLimit-Policy"] == POLICY
    assert json.loads(sync[3].content) == BODY_429
    assert sync[3]["Retry-After"] == "80"
    # The second key under the async handler: the account's pool had 2 left.
    assert [reply.status_code for reply in asynced] == [200, 200, 429]
    assert asynced[1]["RateLimit"] == '"key";r=1;t=60, "account";r=0;t=60'
    assert asynced[2]["RateLimit"] == '"key";r=1;t=60, "account";r=0;t=72'


# --- the memo and the replica never skip the limiter ------------------------------------------


def _database(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    if kind == "sqlite":
        from keyturn.stores.sqlite import SQLiteDatabase

        return SQLiteDatabase(tmp_path / "keys.sqlite3")
    from keyturn.stores.postgres import PostgresDatabase

    db = PostgresDatabase(request.getfixturevalue("postgres_schema_url"))
    db.create_schema()
    return db


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_remembered_answer_never_skips_the_limit(
    kind: str, driver: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """With the replica on and the memo answering, the limit still refuses the (q+1)th
    request: the memo's hits are counted, and so are the limiter's refusals."""
    quota = 5
    db = _database(kind, tmp_path, request)
    with db:
        db.membership.add_organization("org_main", tenant_id="acme", default=True)
        db.membership.add_member("alice", "org_main", role="admin")
        key = KeyManager(db.keys, db.membership).create(
            "alice", name="ci", scope=Scope.tenant("acme")
        )
        rates = limiter(RateLimits(key=Rate(quota, 3600)))
        with Authenticator(db.keys, db.membership, rate_limiter=rates) as auth:
            for _ in range(1500):  # bounded: PostgreSQL's listener proves itself first
                if db.changes() is not None:
                    break
                time.sleep(0.01)
            ask = AuthRequest((f"Bearer {key.secret}",), ("default",), "GET", MODELS)
            if driver == "sync":
                outcomes = [auth.check(ask) for _ in range(quota + 3)]
            else:

                async def run() -> list[Any]:
                    return [await auth.check_async(ask) for _ in range(quota + 3)]

                outcomes = asyncio.run(run())
            hits = auth.memo.hits

    kinds = [type(outcome).__name__ for outcome, _ in outcomes]
    assert kinds == ["Principal"] * quota + ["RateLimited"] * 3
    assert hits >= quota + 3 - 1 > 0  # every request after the first was remembered
    assert rates.stats.allowed == quota and rates.stats.refused == 3
    assert outcomes[0][1][1] == ("RateLimit", f'"key";r={quota - 1};t=3600')
    refused = outcomes[-1][0]
    assert isinstance(refused, RateLimited) and refused.status == 429
    assert dict(refused.headers())["Retry-After"] == "4320"  # 5 weigh 4 at 0.2 into the next


# --- audit, metrics and usage see the reason ---------------------------------------------------


def test_the_refusal_is_audited_and_counted_as_rate_limited() -> None:
    store, membership, one, _ = seeded()
    events: list[AuditEvent] = []
    rates = limiter(RateLimits(key=Rate(1, 60)))
    with Authenticator(
        store, membership, rate_limiter=rates, audit=events.append, usage_interval=0.0
    ) as auth:
        ask = AuthRequest((f"Bearer {one.secret}",), ("default",), "GET", MODELS)
        first, second = auth.authenticate(ask), auth.authenticate(ask)
        assert auth.usage is not None
        auth.usage.close()
    assert isinstance(first, Principal) and isinstance(second, RateLimited)
    assert [event.allowed for event in events] == [True, False]
    error = events[1].error
    assert error is not None and error.reason is Reason.RATE_LIMITED
    assert error.status == 429 and error.key_id == one.info.key_id
    assert error.reason.value == "rate_limited"
    # The usage recorder wrote the refusal under its reason: what the usage chart reads.
    from datetime import date, timedelta

    rows = store.usage_of("alice", date.today() - timedelta(days=2))
    counted = {(row.key_id, row.outcome): row.requests for row in rows}
    assert counted[one.info.key_id, "rate_limited"] == 1
    assert counted[one.info.key_id, "accepted"] == 1


def test_metrics_carry_the_reason() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from keyturn.metrics import MetricsAudit

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    store, membership, one, _ = seeded()
    with Authenticator(
        store,
        membership,
        rate_limiter=limiter(RateLimits(key=Rate(1, 60))),
        audit=MetricsAudit(provider.get_meter("keyturn")),
    ) as auth:
        ask = AuthRequest((f"Bearer {one.secret}",), ("default",), "GET", MODELS)
        auth.authenticate(ask)
        auth.authenticate(ask)
    points = [
        dict(point.attributes or {})
        for resource in reader.get_metrics_data().resource_metrics  # type: ignore[union-attr]
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points  # type: ignore[union-attr]
    ]
    assert {"keyturn.outcome": "refused", "keyturn.reason": "rate_limited"} in points


# --- the engine down: fail open, fail closed, never a 401 ---------------------------------------


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def down_redis() -> Callable[[FaultPolicy], RateLimiter]:
    pytest.importorskip("redis")
    from keyturn.ratelimits.redis import RedisEngine

    url = f"redis://127.0.0.1:{closed_port()}/0"

    def make(faults: FaultPolicy) -> RateLimiter:
        return limiter(engine=RedisEngine(url), faults=faults)

    return make


@pytest.mark.parametrize("faults", [FaultPolicy.OPEN, FaultPolicy.CLOSED])
def test_an_engine_that_is_down(
    faults: FaultPolicy, down_redis: Callable[[FaultPolicy], RateLimiter]
) -> None:
    """Fail open: 200 with the RateLimit-Policy field only, counted. Fail closed: 503
    service_unavailable with Retry-After. Never a 401, never a 429, never a 500."""
    store, membership, one, _ = seeded()
    rates = down_redis(faults)
    with Authenticator(store, membership, rate_limiter=rates) as authenticator:
        world = FastWorld(authenticator, one, one)
        with world.client:
            replies = [world.client.get(MODELS, headers=bearer(one)) for _ in range(5)]

    statuses = {reply.status_code for reply in replies}
    assert rates.stats.faults >= 1
    if faults is FaultPolicy.OPEN:
        assert statuses == {200}
        assert all(reply.headers["ratelimit-policy"] == POLICY for reply in replies)
        assert all("ratelimit" not in reply.headers for reply in replies)
        assert rates.stats.failed_open == 5
    else:
        assert statuses == {503}
        for reply in replies:
            assert reply.json()["error"]["code"] == "service_unavailable"
            assert int(reply.headers["retry-after"]) >= 1
        assert rates.stats.unavailable == 5
        assert world.reached["http"] == 0


def test_fail_closed_is_a_503_refusal_with_its_reason() -> None:
    pytest.importorskip("redis")
    from keyturn.ratelimits.redis import RedisEngine

    store, membership, one, _ = seeded()
    engine = RedisEngine(f"redis://127.0.0.1:{closed_port()}/0")
    rates = limiter(engine=engine, faults=FaultPolicy.CLOSED)
    with Authenticator(store, membership, rate_limiter=rates) as auth:
        outcome = auth.authenticate(
            AuthRequest((f"Bearer {one.secret}",), ("default",), "GET", MODELS)
        )
    assert isinstance(outcome, ServiceUnavailable)
    assert outcome.reason is Reason.RATE_LIMIT_ENGINE
    assert outcome.status == 503 and outcome.retry_after >= 1


def test_a_refused_key_is_not_limited() -> None:
    """The limiter runs only on requests the decision let through: a wrong key is a 401,
    and takes nothing from anyone's quota."""
    store, membership, _, _ = seeded()
    rates = limiter(RateLimits(key=Rate(1, 60)))
    with Authenticator(store, membership, rate_limiter=rates) as auth:
        bad = auth.authenticate(AuthRequest(("Bearer rma_nope",), ("default",), "GET", MODELS))
    assert bad.status == 401  # type: ignore[union-attr]
    assert rates.stats.allowed == rates.stats.refused == 0


def test_the_option_is_checked_at_construction() -> None:
    store, membership, _, _ = seeded()
    with pytest.raises(TypeError, match="rate_limiter must be"):
        Authenticator(store, membership, rate_limiter=LIMITS)  # type: ignore[arg-type]
