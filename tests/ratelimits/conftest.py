"""Fixtures for the rate limit tests: one contract, run against every engine keyturn ships.

Redis tests read ``KEYTURN_TEST_REDIS_URL`` (a ``redis://`` URL) and use a key prefix of
their own per test; PostgreSQL tests read ``KEYTURN_TEST_POSTGRES_DSN`` and work in a
schema of their own per test. Unset, they skip with the reason shown in the summary; with
``KEYTURN_REQUIRE_REDIS=1`` or ``KEYTURN_REQUIRE_POSTGRES=1`` (as in CI) a missing or
unreachable server fails them instead.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from keyturn import Principal, Scope
from keyturn.ratelimits import InProcessEngine, RateEngine
from tests.stores.conftest import make_postgres_schema, postgres_server  # noqa: F401 -- fixtures


def redis_unavailable(reason: str) -> None:
    if os.environ.get("KEYTURN_REQUIRE_REDIS") == "1":
        pytest.fail(f"KEYTURN_REQUIRE_REDIS=1 but {reason}", pytrace=False)
    pytest.skip(f"Redis tests skipped: {reason}")


@pytest.fixture(scope="session")
def redis_server() -> str:
    """The test server's URL, or a skip (a failure when Redis is required)."""
    url = os.environ.get("KEYTURN_TEST_REDIS_URL", "")
    if not url:
        redis_unavailable("KEYTURN_TEST_REDIS_URL is not set")
    if not url.startswith(("redis://", "rediss://", "unix://")):
        pytest.fail("KEYTURN_TEST_REDIS_URL must be a redis:// URL", pytrace=False)
    import redis

    try:
        with redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5) as client:
            client.ping()
    except redis.RedisError as exc:
        redis_unavailable(f"cannot reach the Redis server: {exc}")
    return url


@pytest.fixture
def redis_prefix(redis_server: str) -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted at the end."""
    import redis

    prefix = f"keyturn-test:{os.getpid()}:{secrets.token_hex(4)}:"
    yield prefix
    with redis.Redis.from_url(redis_server, socket_timeout=5) as client:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)


@pytest.fixture
def postgres_schema_url(make_postgres_schema: Callable[[], str]) -> str:  # noqa: F811
    """An empty schema of this test's own (the engine makes its table there)."""
    return make_postgres_schema()


ENGINES = [
    "inprocess",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=ENGINES)
def engine_factory(request: pytest.FixtureRequest) -> Iterator[Callable[[], RateEngine]]:
    """Makes engines over one set of counts: each call is another instance's engine (the
    in-process engine is one object, shared as one process would share it)."""
    made: list[RateEngine] = []
    name = request.param
    if name == "inprocess":
        only = InProcessEngine()

        def make() -> RateEngine:
            return only

    elif name == "redis":
        from keyturn.ratelimits.redis import RedisEngine

        url = request.getfixturevalue("redis_server")
        prefix = request.getfixturevalue("redis_prefix")

        def make() -> RateEngine:
            engine = RedisEngine(url, prefix=prefix, deadline=5.0)
            made.append(engine)
            return engine

    else:
        from keyturn.ratelimits.postgres import PostgresEngine

        url = request.getfixturevalue("postgres_schema_url")

        def make() -> RateEngine:
            engine = PostgresEngine(url, deadline=5.0)
            made.append(engine)
            return engine

    yield make
    for engine in made:
        engine.close()


@pytest.fixture
def engine(engine_factory: Callable[[], RateEngine]) -> RateEngine:
    """One engine of each kind, with no counts."""
    return engine_factory()


def principal(account: str = "alice", key: str = "key1", organization: str = "org_a") -> Any:
    """A principal as the authenticator hands it over."""
    return Principal(
        account_id=account,
        key_id=key,
        key_name=key,
        scope=Scope.organization(organization, tenant_id="acme"),
        organization_id=organization,
        tenant_id="acme",
        role="member",
    )
