"""Rotation on every store: the link is kept, and the creator's auto-revoke lands with the
replacement's usage write, in one statement -- end to end through both middlewares.

Each test runs against memory, SQLite, PostgreSQL and async PostgreSQL (see ``backend``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from werkzeug.test import Client
from werkzeug.wrappers import Response

from keyturn import Authenticator, KeyManager, Status
from keyturn import asgi as keyturn_asgi
from keyturn import wsgi as keyturn_wsgi
from tests.stores.conftest import Backend
from tests.stores.test_contract import TENANT, clock_now, make_key, wait_until, world

PATH = "/managed-agents/v1/models"


def _asgi_app() -> Starlette:
    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"data": []})

    return Starlette(routes=[Route(PATH, models)])


def _wsgi_app(environ: dict[str, Any], start_response: Any) -> Any:
    return Response('{"data": []}', content_type="application/json")(environ, start_response)


@pytest.fixture(params=["asgi", "wsgi"])
def edge(request: pytest.FixtureRequest, backend: Backend) -> str:
    if request.param == "wsgi" and backend.runner is not None:
        pytest.skip("an async store serves the ASGI middleware only")
    return str(request.param)


@pytest.fixture
def loop(backend: Backend) -> Iterator[asyncio.Runner]:
    """The async store's own loop, or one for this test."""
    if backend.runner is not None:
        yield backend.runner
    else:
        with asyncio.Runner() as runner:
            yield runner


def get(edge: str, auth: Authenticator, loop: asyncio.Runner, secret: str) -> int:
    """One request through the real middleware of *edge*; the response's status."""
    headers = {"authorization": f"Bearer {secret}", "x-organization-id": "default"}
    if edge == "wsgi":
        client = Client(keyturn_wsgi.ApiKeyMiddleware(_wsgi_app, authenticator=auth))
        return client.get(PATH, headers=headers).status_code
    app = keyturn_asgi.ApiKeyMiddleware(_asgi_app(), authenticator=auth)

    async def call() -> int:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return (await client.get(PATH, headers=headers)).status_code

    return loop.run(call())


def test_the_replacement_s_first_request_revokes_the_old_key_when_the_creator_asked(
    backend: Backend, edge: str, loop: asyncio.Runner
) -> None:
    """Two rotations, one with the creator's auto-revoke: a request with each new key, and
    the usage write revokes exactly the old key whose creator asked, at the use's instant."""
    world(backend)
    clock = clock_now()
    manager = KeyManager(backend.keys, backend.membership, clock=clock)
    auto_old = manager.create("alice", name="auto", scope=TENANT)
    kept_old = manager.create("alice", name="kept", scope=TENANT)
    clock.now += timedelta(days=1)
    auto_new = manager.rotate("alice", auto_old.info.key_id, revoke_old_on_first_use=True)
    kept_new = manager.rotate("alice", kept_old.info.key_id)
    stored = backend.keys.get_key(auto_new.info.key_id)
    assert (stored.replaces, stored.revoke_old_on_first_use) == (auto_old.info.key_id, True)
    auth = backend.authenticator(clock=clock, usage_interval=0)

    def info(key_id: str) -> Any:
        return next(i for i in manager.list("alice") if i.key_id == key_id)

    try:
        assert get(edge, auth, loop, auto_old.secret) == 200  # the old key's use: no effect
        clock.now += timedelta(minutes=10)
        used_at = clock.now
        assert get(edge, auth, loop, auto_new.secret) == 200
        assert get(edge, auth, loop, kept_new.secret) == 200
        assert wait_until(backend, lambda: info(auto_old.info.key_id).status is Status.REVOKED)
        assert wait_until(backend, lambda: info(kept_old.info.key_id).replacement_confirmed)
        clock.now += timedelta(minutes=1)
        assert get(edge, auth, loop, auto_old.secret) == 401
        assert get(edge, auth, loop, kept_old.secret) == 200  # never revoked unasked
    finally:
        auth.close()
    revoked = info(auto_old.info.key_id)
    assert (revoked.revoked_at, revoked.replaced_by, revoked.replacement_first_used_at) == (
        used_at,
        auto_new.info.key_id,
        used_at,
    )
    kept = info(kept_old.info.key_id)
    assert (kept.status, kept.revoked_at, kept.replacement_first_used_at) == (
        Status.ACTIVE,
        None,
        used_at,
    )
    assert info(auto_new.info.key_id).status is Status.ACTIVE


ROTATIONS = 6


def test_the_old_key_is_refused_right_after_the_replacement_s_first_use(
    backend: Backend, edge: str, loop: asyncio.Runner
) -> None:
    """With the Authenticator's defaults (usage written off the request's path, once a minute
    per key), the request right after a replacement's first use with the old key is refused:
    the old key warm in the memo and the replica each time, none accepted of six."""
    world(backend)
    manager = KeyManager(backend.keys, backend.membership)
    auth = backend.authenticator()
    accepted = 0
    try:
        for n in range(ROTATIONS):
            old = manager.create("alice", name=f"agent {n}", scope=TENANT)
            new = manager.rotate("alice", old.info.key_id, revoke_old_on_first_use=True)
            assert get(edge, auth, loop, old.secret) == 200  # decided, then kept
            assert get(edge, auth, loop, old.secret) == 200  # answered from what was kept
            assert get(edge, auth, loop, new.secret) == 200  # the first use...
            accepted += get(edge, auth, loop, old.secret) == 200  # ...and the next request
    finally:
        auth.close()
    assert accepted == 0
    assert all(info.status is Status.REVOKED for info in manager.list("alice")[1::2])


@contextlib.contextmanager
def writes_held(request: pytest.FixtureRequest, key_id: str) -> Iterator[None]:
    """Another session holds what the key's usage write needs: SQLite's write lock, or the
    key's row in PostgreSQL. Reads go on."""
    holder: Any
    if request.getfixturevalue("backend").name == "sqlite":
        holder = sqlite3.connect(request.getfixturevalue("sqlite_path"), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
    else:
        import psycopg

        holder = psycopg.connect(request.getfixturevalue("postgres_url"))
        holder.execute("SELECT 1 FROM keyturn_keys WHERE key_id = %s FOR UPDATE", (key_id,))
    try:
        yield
    finally:
        holder.rollback()
        holder.close()


@pytest.mark.parametrize(
    "backend",
    [
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("postgres-async", marks=pytest.mark.postgres),
    ],
    indirect=True,
)
def test_a_first_use_whose_revoke_cannot_be_written_is_refused(
    backend: Backend, edge: str, loop: asyncio.Runner, request: pytest.FixtureRequest
) -> None:
    """While the replacement's first use cannot be written, its request gets 503 and the old
    key still works (nothing was revoked); once it can, the new key passes and the old one is
    refused on the next request."""
    world(backend)
    manager = KeyManager(backend.keys, backend.membership)
    old = manager.create("alice", name="agent", scope=TENANT)
    new = manager.rotate("alice", old.info.key_id, revoke_old_on_first_use=True)
    auth = backend.authenticator(timeout=0.5)
    try:
        assert get(edge, auth, loop, old.secret) == 200
        with writes_held(request, new.info.key_id):
            assert get(edge, auth, loop, new.secret) == 503
            assert get(edge, auth, loop, old.secret) == 200
        assert get(edge, auth, loop, new.secret) == 200
        assert get(edge, auth, loop, old.secret) == 401
    finally:
        auth.close()


@pytest.mark.parametrize(
    "backend",
    [
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("postgres-async", marks=pytest.mark.postgres),
    ],
    indirect=True,
)
def test_a_first_use_leaves_this_process_s_replica_before_the_write_returns(
    backend: Backend,
) -> None:
    """The usage write of a replacement's first use drops the old key and the new one from
    the process's replica before it returns: the next request with either reads them anew."""
    world(backend)
    manager = KeyManager(backend.keys, backend.membership)
    old = manager.create("alice", name="agent", scope=TENANT)
    new = manager.rotate("alice", old.info.key_id, revoke_old_on_first_use=True)
    pair = (old.info.key_id, new.info.key_id)

    def kept(key_id: str) -> bool:
        backend.keys.lookup(key_id, None)  # read through, and kept once the feed is current
        return backend.native_keys.lookup_cached(key_id, None) is not None

    assert wait_until(backend, lambda: all(kept(key_id) for key_id in pair))
    backend.keys.mark_used(new.info.key_id, clock_now().now)
    assert [backend.native_keys.lookup_cached(key_id, None) for key_id in pair] == [None, None]


def test_the_usage_write_leaves_final_keys_and_unlinked_keys_alone(backend: Backend) -> None:
    """mark_used on a replacement: an Expired old key stays Expired, a Revoked one keeps its
    instant, and a key that replaces nothing changes no other row."""
    clock = clock_now()
    now = clock.now
    expired = make_key("ExpiredOld01", created_at=now - timedelta(days=40))
    revoked = make_key("RevokedOld01", revoked_at=now - timedelta(days=1))
    bystander = make_key("Bystander001")
    keys = [
        expired,
        revoked,
        bystander,
        make_key("ExpiredNew01", replaces="ExpiredOld01", revoke_old_on_first_use=True),
        make_key("RevokedNew01", replaces="RevokedOld01", revoke_old_on_first_use=True),
        make_key("Unlinked0001"),
    ]
    for key in keys:
        backend.keys.add_key(key)
    for key_id in ("ExpiredNew01", "RevokedNew01", "Unlinked0001"):
        backend.keys.mark_used(key_id, now)
    assert backend.keys.get_key("ExpiredOld01") == expired
    assert backend.keys.get_key("RevokedOld01") == revoked
    assert backend.keys.get_key("Bystander001") == bystander
    for key in keys[3:]:
        assert backend.keys.get_key(key.key_id) == attrs.evolve(
            key, last_used_at=now, first_used_at=now
        )


def test_a_late_usage_write_still_revokes_the_old_key(backend: Backend) -> None:
    """A write older than the recorded use moves no last_used_at, but a use is a use."""
    now = clock_now().now
    old = make_key("OldKey000001")
    new = make_key(
        "NewKey000001",
        replaces="OldKey000001",
        revoke_old_on_first_use=True,
        last_used_at=now,
    )
    backend.keys.add_key(old)
    backend.keys.add_key(new)
    earlier = now - timedelta(seconds=30)
    backend.keys.mark_used("NewKey000001", earlier)
    assert backend.keys.get_key("NewKey000001") == new
    assert backend.keys.get_key("OldKey000001") == attrs.evolve(old, revoked_at=earlier)


def test_the_usage_write_finds_both_rows_by_primary_key(sqlite_path: Path) -> None:
    """The one statement that records a use and may revoke the old key reads no other row:
    SQLite answers each side of its OR from the primary key, never by scanning the table."""
    import sqlite3

    from keyturn.stores import _sql
    from keyturn.stores.sqlite import SQLiteDatabase

    with SQLiteDatabase(sqlite_path) as db:
        db.keys.get_key("NoSuchKey123")  # creates the schema
    connection = sqlite3.connect(sqlite_path)
    try:
        at = clock_now().now.isoformat()
        params = ("k", at, "k", at, "k", at, "k", at, at, "k")
        plan = connection.execute(
            "EXPLAIN QUERY PLAN " + _sql.Statements.with_placeholder("?").mark_used, params
        ).fetchall()
    finally:
        connection.close()
    steps = [row[3] for row in plan]
    assert not any(step.startswith("SCAN") for step in steps), steps
    assert sum("USING INDEX" in step and "(key_id=?)" in step for step in steps) == 3, steps


@settings(max_examples=60, deadline=None)
@given(
    asked=st.booleans(),
    linked=st.booleans(),
    old_revoked=st.sampled_from([None, -60, 0, 60]),  # seconds from the use, or never
    old_expires=st.sampled_from([-60, 0, 60]),  # seconds from the use
    late=st.booleans(),  # the write is older than the use already recorded
)
def test_the_sql_usage_write_follows_the_one_rule(
    asked: bool, linked: bool, old_revoked: int | None, old_expires: int, late: bool
) -> None:
    """SQLite's mark_used statement revokes the old key exactly when the rule the memory
    store calls (``_lifecycle.revoked_by_use``) says so, at the use's instant."""
    from keyturn._core.lifecycle import revoked_by_use
    from keyturn.stores.sqlite import SQLiteDatabase

    at = clock_now().now
    seconds = timedelta(seconds=1)
    old = make_key(
        "OldKey000001",
        created_at=at - timedelta(days=40),
        revoked_at=None if old_revoked is None else at + old_revoked * seconds,
    )
    old = attrs.evolve(old, expires_at=at + old_expires * seconds)
    new = make_key(
        "NewKey000001",
        replaces="OldKey000001" if linked else None,
        revoke_old_on_first_use=asked,
        last_used_at=at + seconds if late else None,
    )
    with (
        tempfile.TemporaryDirectory() as scratch,
        SQLiteDatabase(Path(scratch) / "k.sqlite3") as db,
    ):
        db.keys.add_key(old)
        db.keys.add_key(new)
        db.keys.mark_used(new.key_id, at)
        stored = db.keys.get_key(old.key_id)
    expected = attrs.evolve(old, revoked_at=at) if revoked_by_use(new, old, at) else old
    assert stored == expected
