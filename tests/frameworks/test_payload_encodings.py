"""The payload guard against what real frameworks parse: JSON in every encoding their parsers
read, at the ASGI (FastAPI), WSGI (Flask) and Django edges.

Each app parses the body with its framework's own JSON reader, under the guarded prefix and
outside it: outside, the app shows it reads the key; under it, the guard refuses the body.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import flask
import pytest
from django.http import HttpRequest, JsonResponse
from django.test import Client, override_settings
from django.urls import path
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from keyturn import Authenticator, CreatedKey, KeyManager, Scope
from keyturn import asgi as keyturn_asgi
from keyturn import wsgi as keyturn_wsgi
from keyturn.payload import PayloadGuard
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from tests import django_project  # noqa: F401  (configures Django for this process)

SESSIONS = "/managed-agents/v1/sessions"
OPEN = "/open"  # outside the prefix: what the framework's parser reads, unguarded
# What json.loads reads from bytes (RFC 8259's detection and byte order marks).
ENCODINGS = ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"]

# A client's post: (path, body, headers) -> (status, JSON answer).
Post = Callable[[str, bytes, dict[str, str]], tuple[int, Any]]


def fastapi_app(authenticator: Authenticator) -> Iterator[Post]:
    app = FastAPI()

    async def parse(request: Request) -> dict[str, Any]:
        return {"content": (await request.json())["content"]}

    app.post(SESSIONS)(parse)
    app.post(OPEN)(parse)
    app.add_middleware(
        keyturn_asgi.ApiKeyMiddleware, authenticator=authenticator, payload_guard=PayloadGuard()
    )
    with TestClient(app) as client:

        def post(at: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
            reply = client.post(at, content=body, headers=headers)
            return reply.status_code, reply.json()

        yield post


def flask_app(authenticator: Authenticator) -> Iterator[Post]:
    app = flask.Flask(__name__)

    def parse() -> dict[str, Any]:
        return {"content": flask.request.get_json()["content"]}

    app.post(SESSIONS, endpoint="sessions")(parse)
    app.post(OPEN, endpoint="open")(parse)
    app.wsgi_app = keyturn_wsgi.ApiKeyMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, authenticator=authenticator, payload_guard=PayloadGuard()
    )
    client = app.test_client()

    def post(at: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
        reply = client.post(at, data=body, headers=headers)
        return reply.status_code, reply.get_json()

    yield post


def django_parse(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"content": json.loads(request.body)["content"]})


urlpatterns = [path(SESSIONS[1:], django_parse), path(OPEN[1:], django_parse)]


def django_app(authenticator: Authenticator) -> Iterator[Post]:
    with override_settings(
        ROOT_URLCONF=__name__,
        MIDDLEWARE=["keyturn.django.ApiKeyMiddleware"],
        KEYTURN={"AUTHENTICATOR": authenticator, "PAYLOAD_GUARD": True},
    ):
        client = Client()

        def post(at: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
            content_type = headers.pop("content-type")
            reply = client.post(at, body, content_type=content_type, headers=headers)
            return reply.status_code, reply.json()

        yield post


EDGES = {"fastapi": fastapi_app, "flask": flask_app, "django": django_app}


@pytest.fixture(params=sorted(EDGES))
def edge(request: pytest.FixtureRequest) -> Iterator[tuple[Post, CreatedKey, CreatedKey]]:
    """An app of one framework behind the guard; alice's key that sends, and one to paste."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    manager = KeyManager(store, membership)
    sender = manager.create("alice", name="CI", scope=Scope.tenant("acme"))
    pasted = manager.create("alice", name="laptop", scope=Scope.tenant("acme"))
    with Authenticator(store, membership) as authenticator:
        for post in EDGES[request.param](authenticator):
            yield post, sender, pasted


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_json_in_every_encoding_the_framework_parses(
    edge: tuple[Post, CreatedKey, CreatedKey], encoding: str
) -> None:
    """The framework reads the key from the body (outside the prefix); under the prefix the
    guard refuses it with 400 key_in_payload, and the app is not reached."""
    post, sender, pasted = edge
    body = json.dumps({"content": f"use {pasted.secret}"}).encode(encoding)
    headers = {
        "authorization": f"Bearer {sender.secret}",
        "x-organization-id": "default",
        "content-type": "application/json",
    }
    assert post(OPEN, body, dict(headers)) == (200, {"content": f"use {pasted.secret}"})
    status, answer = post(SESSIONS, body, dict(headers))
    assert (status, answer["error"]["code"]) == (400, "key_in_payload")
    clean = json.dumps({"content": "hello"}).encode(encoding)
    assert post(SESSIONS, clean, dict(headers)) == (200, {"content": "hello"})
