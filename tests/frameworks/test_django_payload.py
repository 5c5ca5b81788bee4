"""keyturn.django with the payload guard: Django's sync and async handlers, and its settings."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, JsonResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import path

from keyturn import AuditEvent, Authenticator, CreatedKey, KeyManager, Scope
from keyturn.django import ApiKeyMiddleware
from keyturn.payload import PayloadGuard
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from tests import django_project  # noqa: F401  (configures Django for this process)

SESSIONS = "/managed-agents/v1/sessions"
ROUTE = "request-body:POST /managed-agents/v1/"  # where a key found is recorded
seen: list[bytes] = []


def sessions(request: HttpRequest) -> JsonResponse:
    seen.append(request.body)
    return JsonResponse({"size": len(request.body)})


urlpatterns = [path(SESSIONS[1:], sessions)]


@pytest.fixture
def keys() -> Iterator[tuple[MemoryKeyStore, CreatedKey, CreatedKey]]:
    """alice's key that sends, and her key that gets pasted into a body, behind the guard."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    manager = KeyManager(store, membership)
    sender = manager.create("alice", name="CI", scope=Scope.tenant("acme"))
    pasted = manager.create("alice", name="laptop", scope=Scope.tenant("acme"))
    seen.clear()
    with (
        Authenticator(store, membership) as authenticator,
        override_settings(
            ROOT_URLCONF=__name__,
            MIDDLEWARE=["keyturn.django.ApiKeyMiddleware"],
            KEYTURN={
                "AUTHENTICATOR": authenticator,
                "PAYLOAD_GUARD": {"max_bytes": 4096, "revoke": True},
            },
        ),
    ):
        yield store, sender, pasted


def headers(key: CreatedKey) -> dict[str, str]:
    return {"authorization": f"Bearer {key.secret}", "x-organization-id": "default"}


def body(key: CreatedKey) -> str:
    return json.dumps({"messages": [{"role": "system", "content": f"use {key.secret}"}]})


def check_refused(reply: Any, store: MemoryKeyStore, pasted: CreatedKey) -> None:
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "key_in_payload"
    assert reply["service-organization-id"] == "org_main"
    assert pasted.secret.encode() not in reply.content
    assert seen == []
    record = store.get_key(pasted.info.key_id)
    assert record is not None and record.leaked is not None and record.revoked_at is not None
    assert record.leaked.url == ROUTE  # the guarded route, not the path


def test_sync_handler(keys: tuple[MemoryKeyStore, CreatedKey, CreatedKey]) -> None:
    """Django's WSGI side: a key in the body gets 400, recorded and revoked; a clean body
    reaches the view, which still reads request.body; an oversized one gets 413."""
    store, sender, pasted = keys
    client = Client()
    clean = client.post(SESSIONS, "{}", content_type="application/json", headers=headers(sender))
    assert clean.status_code == 200 and clean.json() == {"size": 2}
    seen.clear()
    reply = client.post(
        SESSIONS, body(pasted), content_type="application/json", headers=headers(sender)
    )
    check_refused(reply, store, pasted)
    big = client.post(
        SESSIONS, " " * 5000, content_type="application/json", headers=headers(sender)
    )
    assert big.status_code == 413
    assert big.json()["error"]["code"] == "payload_too_large"


def test_async_handler(keys: tuple[MemoryKeyStore, CreatedKey, CreatedKey]) -> None:
    """Django's ASGI side: the same answers, the leak recorded from the event loop."""
    store, sender, pasted = keys

    async def send() -> Any:
        return await AsyncClient().post(
            SESSIONS, body(pasted), content_type="application/json", headers=headers(sender)
        )

    check_refused(asyncio.run(send()), store, pasted)


def test_a_refusal_is_audited_once_and_charged_to_the_sender(
    keys: tuple[MemoryKeyStore, CreatedKey, CreatedKey],
) -> None:
    """Django's sync and async handlers: each guarded request is one audit event; a refusal
    names the sender's key, never the key found in the body."""
    from django.conf import settings

    store, sender, pasted = keys
    events: list[AuditEvent] = []
    membership = settings.KEYTURN["AUTHENTICATOR"].membership
    with Authenticator(store, membership, audit=events.append) as authenticator:
        config = {**settings.KEYTURN, "AUTHENTICATOR": authenticator}
        with override_settings(KEYTURN=config):
            sync = Client().post(
                SESSIONS, body(pasted), content_type="application/json", headers=headers(sender)
            )

            async def send() -> Any:
                return await AsyncClient().post(
                    SESSIONS, body(pasted), content_type="application/json", headers=headers(sender)
                )

            asynchronous = asyncio.run(send())
            clean = Client().post(
                SESSIONS, "{}", content_type="application/json", headers=headers(sender)
            )
    assert (sync.status_code, asynchronous.status_code, clean.status_code) == (400, 400, 200)
    assert [(e.allowed, e.error and e.error.key_id) for e in events] == [
        (False, sender.info.key_id),
        (False, sender.info.key_id),
        (True, None),
    ]


def test_the_setting_is_checked_at_startup(
    keys: tuple[MemoryKeyStore, CreatedKey, CreatedKey],
) -> None:
    """A wrong PAYLOAD_GUARD is an ImproperlyConfigured when Django builds the middleware."""
    from django.conf import settings

    for wrong in ("yes", {"max_bytes": 0}, {"nonsense": 1}):
        config = {**settings.KEYTURN, "PAYLOAD_GUARD": wrong}
        with override_settings(KEYTURN=config), pytest.raises(ImproperlyConfigured):
            ApiKeyMiddleware(sessions)
    for right in (True, PayloadGuard(), None):
        with override_settings(KEYTURN={**settings.KEYTURN, "PAYLOAD_GUARD": right}):
            ApiKeyMiddleware(sessions)
