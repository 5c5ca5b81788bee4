"""Each example app, driven through its own framework's test client, with the demo's keys."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest
from starlette.testclient import TestClient
from werkzeug.test import Client as WerkzeugClient

from keyturn import Authenticator
from keyturn.demo import DemoKeys, seed
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from tests.web.web_support import HEALTHZ, MODELS, load_example


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    json: Any


Get = Callable[..., Reply]


def starlette_client(app: Any) -> Iterator[Get]:
    with TestClient(app) as client:

        def get(path: str, headers: dict[str, str]) -> Reply:
            response = client.get(path, headers=headers)
            return Reply(response.status_code, dict(response.headers), response.json())

        yield get


def flask_client(app: Any) -> Iterator[Get]:
    client = app.test_client()

    def get(path: str, headers: dict[str, str]) -> Reply:
        response = client.get(path, headers=headers)
        return Reply(response.status_code, dict(response.headers), response.get_json())

    yield get


def werkzeug_client(app: Any) -> Iterator[Get]:
    client = WerkzeugClient(app)

    def get(path: str, headers: dict[str, str]) -> Reply:
        response = client.get(path, headers=headers)
        with response:
            return Reply(response.status_code, dict(response.headers), response.json)

    yield get


DRIVERS = {
    "starlette_app": starlette_client,
    "fastapi_app": starlette_client,  # FastAPI's TestClient is Starlette's
    "flask_app": flask_client,
    "werkzeug_app": werkzeug_client,
}


@pytest.fixture(params=sorted(DRIVERS))
def example(request: pytest.FixtureRequest) -> Iterator[tuple[Get, DemoKeys]]:
    store, membership = MemoryKeyStore(), MemoryMembership()
    keys = seed(store, membership)
    with Authenticator(store, membership) as authenticator:  # closing twice is harmless
        app = load_example(request.param).create_app(authenticator)
        yield from ((get, keys) for get in DRIVERS[request.param](app))


def test_models_with_organization_key(example: tuple[Get, DemoKeys]) -> None:
    """An organization key lists the models there, with the service headers."""
    get, keys = example
    reply = get(MODELS, {"authorization": f"Bearer {keys.organization.secret}"})

    assert reply.status == 200
    assert reply.json == {
        "items": [
            {"id": "agent-small", "organization_id": "acme-research"},
            {"id": "agent-large", "organization_id": "acme-research"},
        ]
    }
    assert reply.headers["service-organization-id"] == "acme-research"
    assert reply.headers["service-tenant-id"] == "acme"


def test_models_with_tenant_key(example: tuple[Get, DemoKeys]) -> None:
    """A tenant key needs x-organization-id: 400 without it, 200 in the default organization."""
    get, keys = example
    authorization = {"authorization": f"Bearer {keys.tenant.secret}"}

    missing = get(MODELS, authorization)
    default = get(MODELS, {**authorization, "x-organization-id": "default"})

    assert missing.status == 400
    assert missing.json["error"]["code"] == "invalid_request"
    assert default.status == 200
    assert default.headers["service-organization-id"] == "acme-main"


def test_models_without_key(example: tuple[Get, DemoKeys]) -> None:
    """No key, no models: 401 with the challenge."""
    get, _ = example
    reply = get(MODELS, {})

    assert reply.status == 401
    assert reply.json["error"]["code"] == "unauthorized"
    assert reply.headers["www-authenticate"] == 'Bearer realm="agents-api"'


def test_healthz_is_public(example: tuple[Get, DemoKeys]) -> None:
    """The health check needs no key and names no organization."""
    get, _ = example
    reply = get(HEALTHZ, {})

    assert (reply.status, reply.json) == (200, {"status": "ok"})
    assert "service-organization-id" not in reply.headers
