"""keyturn.fastapi: the caller as a dependency, and the key and header declared in OpenAPI."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from keyturn import Authenticator, CreatedKey, KeyManager, MissingPrincipal, Scope
from keyturn.asgi import ApiKeyMiddleware
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
