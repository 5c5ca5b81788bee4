"""End to end: the examples under real servers (uvicorn, waitress) on 127.0.0.1, over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from keyturn import Authenticator
from keyturn.demo import DemoKeys, seed
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from tests.servers.loopback import serve_uvicorn, serve_waitress
from tests.web.web_support import HEALTHZ, MODELS, load_example

SERVERS = {
    "uvicorn": ("starlette_app", serve_uvicorn),
    "waitress": ("flask_app", serve_waitress),
}


@pytest.fixture(params=sorted(SERVERS))
def live(request: pytest.FixtureRequest) -> Iterator[tuple[httpx.Client, DemoKeys]]:
    example, serve = SERVERS[request.param]
    store, membership = MemoryKeyStore(), MemoryMembership()
    keys = seed(store, membership)
    with Authenticator(store, membership) as authenticator:
        app = load_example(example).create_app(authenticator)
        for port in serve(app):
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
                yield client, keys


def test_real_http(live: tuple[httpx.Client, DemoKeys]) -> None:
    """Over real HTTP: 200 with service headers, the app's 404 with them, 400 and 401 without."""
    client, keys = live
    organization = {"authorization": f"Bearer {keys.organization.secret}"}
    tenant = {"authorization": f"Bearer {keys.tenant.secret}"}

    ok = client.get(MODELS, headers=organization)
    assert ok.status_code == 200
    assert [item["id"] for item in ok.json()["items"]] == ["agent-small", "agent-large"]
    assert ok.headers["service-organization-id"] == "acme-research"
    assert ok.headers["service-tenant-id"] == "acme"

    in_default = client.get(MODELS, headers={**tenant, "x-organization-id": "default"})
    assert in_default.headers["service-organization-id"] == "acme-main"

    app_404 = client.get("/managed-agents/v1/nothing-here", headers=organization)
    assert app_404.status_code == 404
    assert app_404.headers["service-organization-id"] == "acme-research"

    missing_org = client.get(MODELS, headers=tenant)
    assert missing_org.status_code == 400
    assert missing_org.json()["error"]["code"] == "invalid_request"
    assert "service-organization-id" not in missing_org.headers

    anonymous = client.get(MODELS)
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"] == 'Bearer realm="agents-api"'
    assert anonymous.headers["content-type"] == "application/json"

    health = client.get(HEALTHZ)
    assert (health.status_code, health.json()) == (200, {"status": "ok"})

    head = client.head(MODELS)
    assert (head.status_code, head.content) == (401, b"")


def test_repeated_headers_over_the_wire(live: tuple[httpx.Client, DemoKeys]) -> None:
    """Two x-organization-id lines are refused by both servers, merged or not."""
    client, keys = live
    headers = [
        ("authorization", f"Bearer {keys.tenant.secret}"),
        ("x-organization-id", "default"),
        ("x-organization-id", "default"),
    ]

    reply = client.get(MODELS, headers=headers)

    assert reply.status_code == 400
