"""keyturn.fastapi: the caller as a dependency, and the key and header declared in OpenAPI."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any

import pytest
from fastapi import Depends, FastAPI, HTTPException
from fastapi.testclient import TestClient

from keyturn import Authenticator, CreatedKey, KeyManager, MissingPrincipal, Principal, Scope
from keyturn.asgi import ApiKeyMiddleware, current_principal
from keyturn.fastapi import Caller
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership

MODELS = "/managed-agents/v1/models"


@pytest.fixture
def world() -> Iterator[tuple[TestClient, CreatedKey]]:
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    key = KeyManager(store, membership).create("alice", name="CI", scope=Scope.tenant("acme"))

    app = FastAPI(title="Agents API")

    @app.get(MODELS)
    async def list_models(caller: Caller) -> dict[str, Any]:
        return {"account": caller.account_id, "organization": caller.organization_id}

    @app.get("/unguarded")
    async def unguarded(caller: Caller) -> dict[str, Any]:
        return {"account": caller.account_id}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    with Authenticator(store, membership) as authenticator:
        app.add_middleware(ApiKeyMiddleware, authenticator=authenticator)
        with TestClient(app) as client:
            yield client, key


def test_openapi_declares_the_key_and_the_organization_header(
    world: tuple[TestClient, CreatedKey],
) -> None:
    """The document has a bearer scheme and an x-organization-id header scheme, on the route."""
    client, _ = world
    document = client.get("/openapi.json").json()

    schemes = document["components"]["securitySchemes"]
    assert schemes["apiKey"]["type"] == "http"
    assert schemes["apiKey"]["scheme"] == "bearer"
    assert schemes["organization"] == {
        "type": "apiKey",
        "in": "header",
        "name": "x-organization-id",
        "description": "The organization a tenant-scoped key acts in: its id, or `default`.",
    }
    security = document["paths"][MODELS]["get"]["security"]
    assert {name for requirement in security for name in requirement} == {
        "apiKey",
        "organization",
    }
    assert "security" not in document["paths"]["/healthz"]["get"]


def test_request_with_key_reaches_the_route_as_its_caller(
    world: tuple[TestClient, CreatedKey],
) -> None:
    """What Swagger UI sends after Authorize (key and header) gets the caller; no key is 401."""
    client, key = world

    reply = client.get(
        MODELS, headers={"Authorization": f"Bearer {key.secret}", "x-organization-id": "default"}
    )
    refused = client.get(MODELS)

    assert reply.status_code == 200
    assert reply.json() == {"account": "alice", "organization": "org_main"}
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized"


def test_dependency_outside_the_guard_is_a_setup_error(
    world: tuple[TestClient, CreatedKey],
) -> None:
    """A route the middleware does not guard gets no caller: MissingPrincipal, never anonymous."""
    client, key = world

    with pytest.raises(MissingPrincipal):
        client.get("/unguarded", headers={"Authorization": f"Bearer {key.secret}"})


def test_expiry_header_through_add_middleware() -> None:
    """FastAPI's add_middleware passes expiry_header on: the route's answers (its own
    HTTPException too) carry the key's expiry, which Caller also holds; a 401 does not.
    """
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    key = KeyManager(store, membership).create("alice", name="CI", scope=Scope.tenant("acme"))
    app = FastAPI()

    @app.get(MODELS)
    async def list_models(caller: Caller) -> dict[str, Any]:
        assert caller.expires_at is not None
        return {"expires_at": caller.expires_at.isoformat()}

    @app.get("/managed-agents/v1/gone")
    async def gone(caller: Caller) -> None:
        raise HTTPException(status_code=410)

    headers = {"Authorization": f"Bearer {key.secret}", "x-organization-id": "default"}
    with Authenticator(store, membership) as authenticator:
        app.add_middleware(ApiKeyMiddleware, authenticator=authenticator, expiry_header=True)
        with TestClient(app) as client:
            ok = client.get(MODELS, headers=headers)
            gone_reply = client.get("/managed-agents/v1/gone", headers=headers)
            refused = client.get(MODELS)

    stated = datetime.fromisoformat(ok.headers["service-key-expires-at"])
    assert datetime.fromisoformat(ok.json()["expires_at"]) == key.info.expires_at
    assert stated == key.info.expires_at.replace(microsecond=0)
    assert gone_reply.status_code == 410
    assert gone_reply.headers["service-key-expires-at"] == ok.headers["service-key-expires-at"]
    assert refused.status_code == 401 and "service-key-expires-at" not in refused.headers


def test_current_principal_is_a_dependency_fastapi_reads(
    world: tuple[TestClient, CreatedKey],
) -> None:
    """``keyturn.asgi.current_principal`` in ``Depends`` gets the request and its caller."""
    client, key = world
    app = client.app
    assert isinstance(app, FastAPI)

    @app.get("/managed-agents/v1/me")
    async def me(caller: Annotated[Principal, Depends(current_principal)]) -> dict[str, Any]:
        return {"account": caller.account_id, "organization": caller.organization_id}

    reply = client.get(
        "/managed-agents/v1/me",
        headers={"Authorization": f"Bearer {key.secret}", "x-organization-id": "default"},
    )

    assert reply.status_code == 200
    assert reply.json() == {"account": "alice", "organization": "org_main"}
    assert "connection" not in client.get("/openapi.json").text  # not read as a query field
