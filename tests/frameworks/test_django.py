"""keyturn.django: the native middleware in Django's test clients and under its ASGI handler."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import path

from keyturn import (
    AuditEvent,
    Authenticator,
    CreatedKey,
    KeyManager,
    MissingPrincipal,
    Reason,
    Scope,
)
from keyturn.django import principal
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from tests import django_project  # noqa: F401  (configures Django for this process)

WHOAMI = "/managed-agents/v1/whoami"
ASYNC_WHOAMI = "/managed-agents/v1/async-whoami"


def whoami(request: HttpRequest) -> JsonResponse:
    caller = principal(request)
    return JsonResponse(
        {
            "account": caller.account_id,
            "organization": caller.organization_id,
            "same": request.principal is caller,
            "authorization": request.headers.get("authorization"),
        }
    )


async def async_whoami(request: HttpRequest) -> JsonResponse:
    return whoami(request)


def spoof(request: HttpRequest) -> HttpResponse:
    response = HttpResponse("spoofed")
    response["service-organization-id"] = "org_evil"
    response["service-key-expires-at"] = "never"
    return response


def boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("the view crashed")


def public(request: HttpRequest) -> HttpResponse:
    try:
        principal(request)
    except MissingPrincipal:
        return HttpResponse("anonymous")
    return HttpResponse("authenticated")


urlpatterns = [
    path(WHOAMI[1:], whoami),
    path(ASYNC_WHOAMI[1:], async_whoami),
    path("managed-agents/v1/spoof", spoof),
    path("managed-agents/v1/boom", boom),
    path("managed-agents/v1/health", public),
    path("outside", public),
]


@pytest.fixture(autouse=True)
def project() -> Iterator[None]:
    """This module's URLconf behind the middleware alone, in the tests' Django project."""
    with override_settings(ROOT_URLCONF=__name__, MIDDLEWARE=["keyturn.django.ApiKeyMiddleware"]):
        yield


@pytest.fixture
def world() -> Iterator[tuple[Authenticator, CreatedKey]]:
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    key = KeyManager(store, membership).create("alice", name="CI", scope=Scope.tenant("acme"))
    with (
        Authenticator(store, membership) as authenticator,
        override_settings(
            KEYTURN={
                "AUTHENTICATOR": authenticator,
                "PUBLIC_PATHS": ["/managed-agents/v1/health"],
            }
        ),
    ):
        yield authenticator, key


def bearer(key: CreatedKey) -> dict[str, str]:
    return {"authorization": f"Bearer {key.secret}", "x-organization-id": "default"}


def test_test_client_admits_a_key_and_the_view_gets_the_principal(
    world: tuple[Authenticator, CreatedKey],
) -> None:
    """Django's own test client: 200, the principal on the request, no Authorization left."""
    _, key = world
    reply = Client().get(WHOAMI, headers=bearer(key))

    assert reply.status_code == 200
    assert reply.json() == {
        "account": "alice",
        "organization": "org_main",
        "same": True,
        "authorization": None,
    }
    assert reply["service-organization-id"] == "org_main"
    assert reply["service-tenant-id"] == "acme"


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({}, 401, "unauthorized"),
        ({"authorization": "Bearer rma_typo"}, 401, "unauthorized"),
        ({"authorization": "KEY"}, 400, "invalid_request"),
        ({"authorization": "KEY", "x-organization-id": "org_nowhere"}, 404, "not_found"),
        ({"authorization": "KEY", "x-organization-id": "bad value"}, 400, "invalid_request"),
    ],
)
def test_refusals_are_the_specs_json_errors(
    world: tuple[Authenticator, CreatedKey], headers: dict[str, str], status: int, code: str
) -> None:
    """Refused requests get the status, JSON body and headers of the other middlewares."""
    _, key = world
    if headers.get("authorization") == "KEY":  # the fixture's key, which the table cannot name
        headers = {**headers, "authorization": f"Bearer {key.secret}"}

    reply = Client().get(WHOAMI, headers=headers)

    assert reply.status_code == status
    assert reply["content-type"] == "application/json"
    assert reply.json()["error"]["code"] == code
    assert "service-organization-id" not in reply
    if status == 401:
        assert reply["www-authenticate"].startswith('Bearer realm="agents-api"')


def test_service_headers_replace_the_views_and_survive_a_crash(
    world: tuple[Authenticator, CreatedKey],
) -> None:
    """A view's own service headers are replaced; a crashing view's 500 still names its org."""
    _, key = world
    client = Client(raise_request_exception=False)

    spoofed = client.get("/managed-agents/v1/spoof", headers=bearer(key))
    crashed = client.get("/managed-agents/v1/boom", headers=bearer(key))

    assert spoofed["service-organization-id"] == "org_main"
    assert crashed.status_code == 500
    assert crashed["service-organization-id"] == "org_main"


def test_public_and_outside_paths_pass_without_a_principal(
    world: tuple[Authenticator, CreatedKey],
) -> None:
    """A public path under the prefix and a path outside it reach the view anonymously."""
    client = Client()

    assert client.get("/managed-agents/v1/health").content == b"anonymous"
    assert client.get("/outside").content == b"anonymous"


def test_async_client_with_an_async_view(world: tuple[Authenticator, CreatedKey]) -> None:
    """Django's AsyncClient runs the middleware asynchronously: 200, then 401 without a key."""
    _, key = world

    async def ask() -> tuple[Any, Any]:
        client = AsyncClient()
        return (
            await client.get(ASYNC_WHOAMI, headers=bearer(key)),
            await client.get(ASYNC_WHOAMI),
        )

    reply, refused = asyncio.run(ask())

    assert reply.status_code == 200
    assert reply.json()["organization"] == "org_main"
    assert refused.status_code == 401


@pytest.mark.parametrize("view", [WHOAMI, ASYNC_WHOAMI])
def test_under_djangos_asgi_handler(world: tuple[Authenticator, CreatedKey], view: str) -> None:
    """Django's ASGIHandler, driven over an ASGI transport: sync and async views alike."""
    _, key = world

    async def ask() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=ASGIHandler())
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return (
                await client.get(view, headers=bearer(key)),
                await client.get(view, headers={"x-organization-id": "default"}),
            )

    reply, refused = asyncio.run(ask())

    assert reply.status_code == 200
    assert reply.json()["account"] == "alice"
    assert reply.headers["service-tenant-id"] == "acme"
    assert refused.status_code == 401
    assert refused.json() == {
        "error": {
            "code": "unauthorized",
            "message": "A valid API key is required: send it as 'Authorization: Bearer <key>'.",
        }
    }


@pytest.mark.parametrize(
    ("keyturn", "message"),
    [
        ({}, "exactly one of"),
        ({"STORE_URL": "sqlite:///x.sqlite3", "AUTHENTICATOR": "a.b"}, "exactly one of"),
        ({"AUTHENTICATOR": "no_such_module.auth"}, "no_such_module"),
        ({"AUTHENTICATOR": "os.sep"}, "not an Authenticator"),
        ({"STORE_URL": "sqlite:///x.sqlite3", "PREFX": "/"}, "unknown KEYTURN settings"),
        ({"STORE_URL": "redis://x"}, "unsupported store URL"),
    ],
)
def test_misconfiguration_is_said_at_startup(keyturn: dict[str, Any], message: str) -> None:
    """A wrong KEYTURN setting is an ImproperlyConfigured naming it, before any request."""
    with override_settings(KEYTURN=keyturn), pytest.raises(ImproperlyConfigured, match=message):
        Client().get("/outside")


# --- the opt-in expiry header -------------------------------------------------------------


def expiry_settings(authenticator: Authenticator, **more: Any) -> Any:
    return override_settings(KEYTURN={"AUTHENTICATOR": authenticator, **more})


def test_expiry_header_is_opt_in_and_only_on_accepted_responses(
    world: tuple[Authenticator, CreatedKey],
) -> None:
    """EXPIRY_HEADER: the key's expiry on the view's responses (its crash's 500 and a
    spoofed line replaced too), never on a refusal; without the setting, on none.
    """
    authenticator, key = world
    expires = key.info.expires_at.astimezone(UTC).replace(microsecond=0)
    client = Client(raise_request_exception=False)
    by_default = client.get("/managed-agents/v1/spoof", headers=bearer(key))
    with expiry_settings(authenticator, EXPIRY_HEADER=True):
        client = Client(raise_request_exception=False)
        replies = {
            "ok": client.get(WHOAMI, headers=bearer(key)),
            "head": client.head(WHOAMI, headers=bearer(key)),
            "spoof": client.get("/managed-agents/v1/spoof", headers=bearer(key)),
            "crash": client.get("/managed-agents/v1/boom", headers=bearer(key)),
            "401": client.get(WHOAMI),
            "400": client.get(WHOAMI, headers={"authorization": f"Bearer {key.secret}"}),
        }

    assert by_default.get("service-key-expires-at") is None
    statuses = {name: reply.status_code for name, reply in replies.items()}
    assert statuses == {"ok": 200, "head": 200, "spoof": 200, "crash": 500, "401": 401, "400": 400}
    stated = {name: reply.get("service-key-expires-at") for name, reply in replies.items()}
    assert {name: value for name, value in stated.items() if value is not None} == {
        name: expires.strftime("%Y-%m-%dT%H:%M:%SZ") for name in ("ok", "head", "spoof", "crash")
    }
    assert datetime.fromisoformat(str(stated["ok"])) == expires


def test_expiry_header_under_the_async_chain(world: tuple[Authenticator, CreatedKey]) -> None:
    """The async middleware path sets it too, and not on its refusals."""
    authenticator, key = world

    async def ask() -> tuple[Any, Any]:
        client = AsyncClient()
        return (
            await client.get(ASYNC_WHOAMI, headers=bearer(key)),
            await client.get(ASYNC_WHOAMI),
        )

    with expiry_settings(authenticator, EXPIRY_HEADER=True):
        reply, refused = asyncio.run(ask())

    assert reply.status_code == 200
    assert datetime.fromisoformat(reply["service-key-expires-at"]) <= key.info.expires_at
    assert refused.status_code == 401 and "service-key-expires-at" not in refused


def test_a_target_with_no_single_reading_is_refused_and_audited(
    world: tuple[Authenticator, CreatedKey],
) -> None:
    """A path that climbs out of the prefix gets the adapters' 400, and the audit hook hears it."""
    authenticator, key = world
    events: list[AuditEvent] = []
    with (
        Authenticator(
            authenticator.store, authenticator.membership, audit=events.append
        ) as audited,
        override_settings(KEYTURN={"AUTHENTICATOR": audited}),
    ):
        reply = Client().get("/managed-agents/v1/%2E%2E/whoami", headers=bearer(key))

    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "invalid_request"
    (event,) = events
    assert event.principal is None and event.error is not None
    assert (event.error.reason, event.method) == (Reason.UNREADABLE_TARGET, "GET")


I18N = override_settings(
    ROOT_URLCONF="tests.frameworks.django_i18n_urls",
    USE_I18N=True,
    LANGUAGE_CODE="en",
    LANGUAGES=[("en", "English"), ("fr", "French"), ("pt-br", "Brazilian Portuguese")],
    MIDDLEWARE=["keyturn.django.ApiKeyMiddleware", "django.middleware.locale.LocaleMiddleware"],
)


@pytest.mark.parametrize(
    "prefix", ["", "/fr", "/pt-br", "/fr-ca"], ids=["none", "fr", "pt-br", "a variant"]
)
def test_a_language_prefix_of_i18n_patterns_is_guarded(
    world: tuple[Authenticator, CreatedKey], prefix: str
) -> None:
    """Under ``i18n_patterns`` a language prefix routes to the API's views: it needs a key
    there as without it, and with one the view runs as the key's creator.
    """
    _, key = world
    with I18N:
        anonymous = Client().get(prefix + WHOAMI)
        keyed = Client().get(prefix + WHOAMI, headers=bearer(key))

    assert anonymous.status_code == 401
    assert keyed.status_code in (200, 404)  # 404: Django routes no such language prefix
    if prefix in ("", "/fr"):
        assert keyed.status_code == 200
        assert keyed.json()["account"] == "alice"
