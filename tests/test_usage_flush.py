"""Queued ``last_used_at`` writes and request counts survive a forgotten close: at exit, and at
lifespan shutdown."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from datetime import date, datetime
from pathlib import Path

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from keyturn import ApiKey, Authenticator, KeyManager, Scope
from keyturn.asgi import ApiKeyMiddleware
from keyturn.stores import open_database
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from keyturn.usage import ACCEPTED

MODELS = "/managed-agents/v1/models"


def test_sync_store_writes_out_at_interpreter_exit(tmp_path: Path) -> None:
    """A script that authenticates once and exits without close() still records the use."""
    url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    with open_database(url) as db:
        db.create_schema()
        db.membership.add_organization("org_main", tenant_id="acme", default=True)
        db.membership.add_member("alice", "org_main", role="admin")
        created = KeyManager(db.keys, db.membership).create(
            "alice", name="script", scope=Scope.tenant("acme")
        )
    script = textwrap.dedent(
        f"""
        import time
        from keyturn import Authenticator, AuthRequest, Principal
        from keyturn.stores import open_database

        db = open_database({url!r})
        mark_used = db.keys.mark_used

        def slow_mark_used(key_id, at):  # a slow database: the write is still queued at exit
            time.sleep(0.5)
            mark_used(key_id, at)

        db.keys.mark_used = slow_mark_used
        auth = Authenticator(db.keys, db.membership)
        request = AuthRequest(authorization=("Bearer {created.secret}",), organization=("default",))
        assert isinstance(auth.authenticate(request), Principal)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)  # noqa: S603

    with open_database(url) as db:
        key = db.keys.get_key(created.info.key_id)
    assert key is not None
    assert key.last_used_at is not None


class SlowAsyncStore:
    """An async key store whose ``mark_used`` takes a few loop turns, like a network database."""

    def __init__(self, store: MemoryKeyStore) -> None:
        self.store = store
        self.marked: list[str] = []

    async def get_key(self, key_id: str) -> ApiKey | None:
        return self.store.get_key(key_id)

    async def add_key(self, key: ApiKey) -> None:
        self.store.add_key(key)

    async def keys_of(self, account_id: str) -> list[ApiKey]:
        return list(self.store.keys_of(account_id))

    async def revoke_key(self, key_id: str, at: datetime) -> bool:
        return self.store.revoke_key(key_id, at)

    async def mark_used(self, key_id: str, at: datetime) -> None:
        for _ in range(20):
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        self.marked.append(key_id)


def test_async_store_writes_land_before_lifespan_shutdown_completes() -> None:
    """An app that never calls aclose(): the middleware waits for the write at shutdown."""
    memory, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    created = KeyManager(memory, membership).create("alice", name="CI", scope=Scope.tenant("acme"))
    store = SlowAsyncStore(memory)

    async def models(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    authenticator = Authenticator(store, membership)
    app = ApiKeyMiddleware(Starlette(routes=[Route(MODELS, models)]), authenticator=authenticator)
    with TestClient(app) as client:
        reply = client.get(
            MODELS,
            headers={"Authorization": f"Bearer {created.secret}", "x-organization-id": "default"},
        )
        assert reply.status_code == 200
    authenticator.close()

    assert store.marked == [created.info.key_id]


def test_counts_are_written_at_interpreter_exit(tmp_path: Path) -> None:
    """A script that authenticates three times and exits without close() still adds its
    three requests to the key's counts."""
    url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    with open_database(url) as db:
        db.create_schema()
        db.membership.add_organization("org_main", tenant_id="acme", default=True)
        db.membership.add_member("alice", "org_main", role="admin")
        created = KeyManager(db.keys, db.membership).create(
            "alice", name="script", scope=Scope.tenant("acme")
        )
    script = textwrap.dedent(
        f"""
        from keyturn import Authenticator, AuthRequest, Principal
        from keyturn.stores import open_database

        db = open_database({url!r})
        auth = Authenticator(db.keys, db.membership)
        request = AuthRequest(authorization=("Bearer {created.secret}",), organization=("default",))
        for _ in range(3):
            assert isinstance(auth.authenticate(request), Principal)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)  # noqa: S603

    with open_database(url) as db:
        rows = db.keys.usage_of("alice", date(2000, 1, 1))
    assert [(row.outcome, row.requests) for row in rows] == [(ACCEPTED, 3)]


class SlowCountingStore(SlowAsyncStore):
    """The slow async store, keeping counts as well."""

    async def count_usage(self, day: date, counts: Mapping[tuple[str, str], int]) -> None:
        await asyncio.sleep(0.05)
        self.store.count_usage(day, counts)


def test_async_store_counts_land_before_lifespan_shutdown_completes() -> None:
    """An app that never calls aclose(): the middleware writes the counts it still holds at
    shutdown, accepted and refused alike."""
    memory, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    created = KeyManager(memory, membership).create("alice", name="CI", scope=Scope.tenant("acme"))
    store = SlowCountingStore(memory)

    async def models(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    authenticator = Authenticator(store, membership)
    app = ApiKeyMiddleware(Starlette(routes=[Route(MODELS, models)]), authenticator=authenticator)
    bearer = {"Authorization": f"Bearer {created.secret}"}
    with TestClient(app) as client:
        for _ in range(4):
            assert client.get(MODELS, headers={**bearer, "x-organization-id": "default"}).is_success
        assert client.get(MODELS, headers=bearer).status_code == 400
    authenticator.close()

    totals = {row.outcome: row.requests for row in memory.usage_of("alice", date(2000, 1, 1))}
    assert totals == {ACCEPTED: 4, "org_header_missing": 1}
