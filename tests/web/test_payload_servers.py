"""The payload guard end to end: real servers on 127.0.0.1 (uvicorn, waitress), real HTTP,
keys recorded as leaked in a real SQLite file."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from werkzeug.wrappers import Request as WerkzeugRequest
from werkzeug.wrappers import Response as WerkzeugResponse

from keyturn import Authenticator
from keyturn import asgi as keyturn_asgi
from keyturn import wsgi as keyturn_wsgi
from keyturn.demo import DemoKeys, seed
from keyturn.payload import PayloadGuard
from keyturn.stores.sqlite import SQLiteDatabase
from tests.servers.loopback import serve_uvicorn, serve_waitress

SESSIONS = "/managed-agents/v1/sessions"
ROUTE = "request-body:POST /managed-agents/v1/"  # where a key found is recorded
MAX_BYTES = 64 * 1024


def _answer(body: bytes) -> dict[str, Any]:
    return {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}


def starlette_echo(authenticator: Authenticator, guard: PayloadGuard) -> Any:
    async def sessions(request: Request) -> JSONResponse:
        return JSONResponse(_answer(await request.body()))

    app = Starlette(routes=[Route(SESSIONS, sessions, methods=["POST"])])
    return keyturn_asgi.ApiKeyMiddleware(app, authenticator=authenticator, payload_guard=guard)


def werkzeug_echo(authenticator: Authenticator, guard: PayloadGuard) -> Any:
    @WerkzeugRequest.application
    def app(request: WerkzeugRequest) -> WerkzeugResponse:
        data = json.dumps(_answer(request.get_data()))
        return WerkzeugResponse(data, mimetype="application/json")

    return keyturn_wsgi.ApiKeyMiddleware(app, authenticator=authenticator, payload_guard=guard)


SERVERS = {"uvicorn": (starlette_echo, serve_uvicorn), "waitress": (werkzeug_echo, serve_waitress)}


@pytest.fixture(params=sorted(SERVERS))
def live(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[httpx.Client, DemoKeys, SQLiteDatabase]]:
    build, serve = SERVERS[request.param]
    with SQLiteDatabase(tmp_path / "keys.sqlite3") as db:
        keys = seed(db.keys, db.membership)
        with Authenticator(db.keys, db.membership) as authenticator:
            app = build(authenticator, PayloadGuard(max_bytes=MAX_BYTES))
            for port in serve(app):
                with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
                    yield client, keys, db


def test_over_real_http(live: tuple[httpx.Client, DemoKeys, SQLiteDatabase]) -> None:
    """A clean body passes whole; a key in one (sent at once, or chunked with the key cut
    between chunks) gets 400 and is recorded in the SQLite file; an oversized body gets 413."""
    client, keys, db = live
    auth = {
        "authorization": f"Bearer {keys.organization.secret}",
        "content-type": "application/json",
    }
    leaked = keys.tenant.secret

    clean = json.dumps({"messages": ["hello " * 1000]}).encode()
    passed = client.post(SESSIONS, content=clean, headers=auth)
    assert passed.status_code == 200
    assert passed.json() == _answer(clean)

    body = json.dumps({"messages": [f"my key is {leaked}"]}).encode()
    refused = client.post(SESSIONS, content=body, headers=auth)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "key_in_payload"
    assert leaked not in refused.text
    assert (
        refused.headers["service-organization-id"] == keys.organization.info.scope.organization_id
    )

    record = db.keys.get_key(keys.tenant.info.key_id)
    assert record is not None and record.leaked is not None
    assert record.leaked.url == ROUTE  # the guarded route, not the path
    assert record.revoked_at is None

    cut = body.index(b"rma_") + 20

    def chunked() -> Iterator[bytes]:
        yield body[:cut]
        yield body[cut:]

    streamed = client.post(SESSIONS, content=chunked(), headers=auth)
    assert streamed.status_code == 400
    assert streamed.json()["error"]["code"] == "key_in_payload"

    huge = b"[" + b" " * MAX_BYTES + b"]"
    assert client.post(SESSIONS, content=huge, headers=auth).status_code == 413
    # The connection stays usable, or is closed cleanly: the next request is answered.
    assert client.post(SESSIONS, content=clean, headers=auth).status_code == 200
