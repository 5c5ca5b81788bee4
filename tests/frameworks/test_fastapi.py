"""keyturn.fastapi: the caller as a dependency, and the key, header and refusals in OpenAPI."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any

import pytest
from fastapi import APIRouter, Depends, FastAPI, HTTPException, WebSocket
from fastapi.testclient import TestClient

from keyturn import Authenticator, CreatedKey, KeyManager, MissingPrincipal, Principal, Scope
from keyturn.asgi import ApiKeyMiddleware, current_principal
from keyturn.fastapi import Caller, api_key, document
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from tests.web.web_support import load_example

MODELS = "/managed-agents/v1/models"


@pytest.fixture
def world() -> Iterator[tuple[TestClient, CreatedKey]]:
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    key = KeyManager(store, membership).create("alice", name="CI", scope=Scope.tenant("acme"))

    app = FastAPI(title="Agents API")
    document(app)

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


def conforms(value: Any, schema: dict[str, Any]) -> bool:
    """Whether *value* fits *schema* (the objects and strings of the error body's schema)."""
    if schema["type"] == "string":
        return isinstance(value, str)
    return (
        isinstance(value, dict)
        and set(schema["required"]) <= set(value)
        and all(conforms(value[name], sub) for name, sub in schema["properties"].items())
    )


ALTERNATIVES = [{"apiKey": []}, {"apiKey": [], "organization": []}]


def test_openapi_offers_the_key_alone_or_with_the_organization_header(
    world: tuple[TestClient, CreatedKey],
) -> None:
    """Both schemes are declared; the guarded operation takes the key alone (an
    organization-scoped key) or the key with the header (a tenant-scoped key), never the
    header alone; an operation without Caller declares nothing."""
    client, _ = world
    document = client.get("/openapi.json").json()

    schemes = document["components"]["securitySchemes"]
    assert schemes["apiKey"]["type"] == "http"
    assert schemes["apiKey"]["scheme"] == "bearer"
    assert schemes["organization"]["type"] == "apiKey"
    assert schemes["organization"]["in"] == "header"
    assert schemes["organization"]["name"] == "x-organization-id"
    assert document["paths"][MODELS]["get"]["security"] == ALTERNATIVES
    assert "security" not in document["paths"]["/healthz"]["get"]
    assert set(document["paths"]["/healthz"]["get"]["responses"]) == {"200"}
    assert "parameters" not in document["paths"]["/healthz"]["get"]


def test_openapi_declares_the_header_s_syntax(world: tuple[TestClient, CreatedKey]) -> None:
    """``x-organization-id`` is an optional header parameter whose pattern is design D8's
    syntax: a value it admits is read by the middleware (200 or 404, never 400), one it
    refuses is a 400; a tenant key without the header is the 400 the document declares."""
    client, key = world
    document = client.get("/openapi.json").json()
    [parameter] = document["paths"][MODELS]["get"]["parameters"]
    assert (parameter["name"], parameter["in"], parameter["required"]) == (
        "x-organization-id",
        "header",
        False,
    )
    pattern = re.compile(parameter["schema"]["pattern"])
    secret = {"Authorization": f"Bearer {key.secret}"}
    for value in ("default", "org_main", "org-x.y:z", "A" * 128, "a" * 129, "", "no way", "a/b"):
        reply = client.get(MODELS, headers={**secret, "x-organization-id": value})
        assert (reply.status_code != 400) == bool(pattern.fullmatch(value)), (value, reply)
    assert client.get(MODELS, headers=secret).status_code == 400  # a tenant key: needed


def test_openapi_declares_the_refusals_with_the_error_body(
    world: tuple[TestClient, CreatedKey],
) -> None:
    """The guarded operation lists 400, 401, 403, 404 and 503 with the error body's schema,
    and the middleware's real refusals fit that schema."""
    client, key = world
    document = client.get("/openapi.json").json()
    responses = document["paths"][MODELS]["get"]["responses"]
    schema = document["components"]["schemas"]["KeyturnError"]

    assert list(responses) == ["200", "400", "401", "403", "404", "429", "503"]
    for status in ("400", "401", "403", "404", "429", "503"):
        content = responses[status]["content"]["application/json"]
        assert content["schema"] == {"$ref": "#/components/schemas/KeyturnError"}
    assert "WWW-Authenticate" in responses["401"]["headers"]
    assert "Retry-After" in responses["503"]["headers"]
    secret = f"Bearer {key.secret}"
    refusals = {
        401: client.get(MODELS),
        400: client.get(MODELS, headers={"Authorization": secret}),
        404: client.get(MODELS, headers={"Authorization": secret, "x-organization-id": "nope"}),
    }
    for status, reply in refusals.items():
        assert reply.status_code == status
        assert str(status) in responses
        assert conforms(reply.json(), schema), reply.json()
    assert not conforms({"error": {"code": "unauthorized"}}, schema)  # the check can fail


def test_openapi_keeps_what_the_operation_declares_itself() -> None:
    """A status the route declares keeps the route's answer; without ``document`` the key
    is declared alone; ``organization_header=False`` declares the key alone too."""

    def app_with(**options: Any) -> dict[str, Any]:
        app = FastAPI()

        @app.get(MODELS, responses={404: {"description": "No such model."}})
        async def list_models(caller: Caller) -> dict[str, Any]:
            return {}

        if options.get("document", True):
            document(app, organization_header=options.get("organization_header", True))
        return app.openapi()

    kept = app_with()["paths"][MODELS]["get"]
    bare = app_with(document=False)
    key_only = app_with(organization_header=False)

    assert kept["responses"]["404"] == {"description": "No such model."}
    assert kept["responses"]["401"]["content"]
    assert bare["paths"][MODELS]["get"]["security"] == [{"apiKey": []}]
    assert "401" not in bare["paths"][MODELS]["get"]["responses"]
    assert key_only["paths"][MODELS]["get"]["security"] == [{"apiKey": []}]
    assert "parameters" not in key_only["paths"][MODELS]["get"]
    assert "organization" not in key_only["components"]["securitySchemes"]
    assert "KeyturnError" in key_only["components"]["schemas"]


def test_openapi_router_dependency_and_a_document_made_before() -> None:
    """A router's ``dependencies=[Depends(api_key)]`` declares its routes too; ``document``
    also amends a document FastAPI had generated before it was called."""
    app = FastAPI()
    router = APIRouter(prefix="/managed-agents/v1", dependencies=[Depends(api_key)])

    @router.get("/models")
    async def list_models() -> dict[str, Any]:
        return {}

    app.include_router(router)
    generated = app.openapi()
    document(app)

    assert app.openapi() is generated
    assert generated["paths"][MODELS]["get"]["security"] == ALTERNATIVES
    assert "503" in generated["paths"][MODELS]["get"]["responses"]


def test_caller_on_a_websocket_route() -> None:
    """Caller reads the principal of a WebSocket handshake the middleware accepted."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    key = KeyManager(store, membership).create("alice", name="CI", scope=Scope.tenant("acme"))
    app = FastAPI()

    @app.websocket("/managed-agents/v1/stream")
    async def stream(websocket: WebSocket, caller: Caller) -> None:
        await websocket.accept()
        await websocket.send_json({"account": caller.account_id})
        await websocket.close()

    headers = {"Authorization": f"Bearer {key.secret}", "x-organization-id": "default"}
    with Authenticator(store, membership) as authenticator:
        app.add_middleware(ApiKeyMiddleware, authenticator=authenticator)
        with (
            TestClient(app) as client,
            client.websocket_connect("/managed-agents/v1/stream", headers=headers) as socket,
        ):
            said = socket.receive_json()

    assert said == {"account": "alice"}


@pytest.mark.parametrize("dependency", ["Caller", "current_principal"])
def test_dependency_runs_on_the_event_loop(dependency: str) -> None:
    """Neither dependency sends a request through FastAPI's thread pool: no worker thread
    starts (FastAPI runs a plain ``def`` dependency on one, a hop per request)."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    key = KeyManager(store, membership).create("alice", name="CI", scope=Scope.tenant("acme"))
    app = FastAPI()
    if dependency == "Caller":

        @app.get(MODELS)
        async def list_models(caller: Caller) -> dict[str, Any]:
            return {"account": caller.account_id}

    else:

        @app.get(MODELS)
        async def list_models_too(
            caller: Principal = Depends(current_principal),  # noqa: B008
        ) -> dict[str, Any]:
            return {"account": caller.account_id}

    headers = {"Authorization": f"Bearer {key.secret}", "x-organization-id": "default"}
    with Authenticator(store, membership) as authenticator:
        app.add_middleware(ApiKeyMiddleware, authenticator=authenticator)
        with TestClient(app) as client:
            before = pool_threads()
            replies = [client.get(MODELS, headers=headers) for _ in range(3)]
            started = pool_threads() - before

    assert [reply.json() for reply in replies] == [{"account": "alice"}] * 3
    assert started == set()


def pool_threads() -> set[int]:
    """The worker threads of AnyIO's pool, where FastAPI runs plain functions."""
    return {t.ident or 0 for t in threading.enumerate() if t.name == "AnyIO worker thread"}


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


def test_the_example_app_documents_the_key_and_the_refusals() -> None:
    """examples/fastapi_app.py, as users copy it: one requirement and the refusals on the
    guarded route, nothing on its health check."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    with Authenticator(store, membership) as authenticator:
        app = load_example("fastapi_app").create_app(authenticator)
        with TestClient(app) as client:
            paths = client.get("/openapi.json").json()["paths"]

    assert paths[MODELS]["get"]["security"] == ALTERNATIVES
    assert {"400", "401", "403", "404", "503"} <= set(paths[MODELS]["get"]["responses"])
    assert "security" not in paths["/healthz"]["get"]


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
