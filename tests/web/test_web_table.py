"""The HTTP behaviour of the middleware, as one table run against both adapters.

Each row is a request (headers with ``{key}`` placeholders filled from the world's keys),
an optional change to the world first, and the outcome the spec and design prescribe.
The ``client`` fixture runs every row through the ASGI and the WSGI middleware alike.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyturn import Reason, Unauthorized
from tests.web.web_support import (
    ADMIN,
    BOOM,
    HEALTHZ,
    MODELS,
    PUBLIC,
    SPOOF,
    WHOAMI,
    Client,
    Reply,
    Serve,
)
from tests.world import World

ORG = "x-organization-id"
NOWHERE = "/managed-agents/v1/nowhere"  # no such route in the app
RESEARCH, MAIN = "org_research", "org_main"
CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "permission_denied",
    404: "not_found",
    503: "service_unavailable",
}
CHALLENGE = 'Bearer realm="agents-api"'
# D6: whatever the reason, every 401 has this very body.
UNAUTHORIZED_BODY = Unauthorized(Reason.MISSING).body()

Setup = Callable[[World], None]


def bearer(key: str, *more: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {{{key}}}"), *more)


def expire(world: World) -> None:
    world.clock.advance(timedelta(days=31))  # keys get the default 30 days


def revoke(name: str) -> Setup:
    def setup(world: World) -> None:
        world.manager.revoke("alice", world.key_ids[name])

    return setup


def leave(*organizations: str) -> Setup:
    def setup(world: World) -> None:
        for organization in organizations:
            world.membership.remove_member("alice", organization)

    return setup


def break_store(world: World) -> None:
    world.store.broken = True


def break_membership(world: World) -> None:
    world.membership.broken = True


@attrs.frozen
class Case:
    id: str
    headers: tuple[tuple[str, str], ...]
    status: int
    path: str = WHOAMI
    setup: Setup | None = None
    organization: str | None = None  # where an accepted request ran

    def param(self) -> Any:
        return pytest.param(self, id=self.id)


def refused(
    id: str, headers: tuple[tuple[str, str], ...], status: int, **kw: Any
) -> Any:  # the middleware's own answer
    return Case(id, headers, status, **kw).param()


def accepted(
    id: str, headers: tuple[tuple[str, str], ...], organization: str, **kw: Any
) -> Any:  # reached the app as alice in *organization*
    return Case(id, headers, kw.pop("status", 200), organization=organization, **kw).param()


REFUSED = [
    # 401: missing, mistyped, expired, revoked or inactive (spec 7), one shape (D5, D6).
    refused("no Authorization", (), 401),
    refused("no Authorization, bare prefix", (), 401, path="/managed-agents/v1"),
    refused("other scheme", (("authorization", "Basic {tenant}"),), 401),
    refused("Bearer without token", (("authorization", "Bearer"),), 401),
    refused("Bearer and spaces only", (("authorization", "Bearer   "),), 401),
    refused("no space after Bearer", (("authorization", "Bearer{research}"),), 401),
    refused("token then extra part", (("authorization", "Bearer {research} x"),), 401),
    refused("key without scheme", (("authorization", "{research}"),), 401),
    refused(
        "two Authorization headers",
        (("authorization", "Bearer {research}"), ("authorization", "Bearer {research}")),
        401,
    ),
    refused("mistyped key", bearer("tenant_typo", (ORG, "default")), 401),
    refused("unknown key", bearer("unknown", (ORG, "default")), 401),
    refused("expired key", bearer("tenant", (ORG, "default")), 401, setup=expire),
    refused("revoked key", bearer("research"), 401, setup=revoke("research")),
    refused("inactive organization key", bearer("research"), 401, setup=leave("org_research")),
    refused(
        "inactive tenant key",
        bearer("tenant", (ORG, "default")),
        401,
        setup=leave("org_main", "org_research"),
    ),
    refused("bad key outranks bad header", bearer("tenant_typo", (ORG, "a,b")), 401),
    # 400: the tenant key's x-organization-id is missing or no organization id (spec 7, D8).
    refused("tenant key without x-organization-id", bearer("tenant"), 400),
    refused("empty x-organization-id", bearer("tenant", (ORG, "")), 400),
    refused("blank x-organization-id", bearer("tenant", (ORG, " \t ")), 400),
    refused("x-organization-id with a space", bearer("tenant", (ORG, "org main")), 400),
    refused("x-organization-id list", bearer("tenant", (ORG, "org_main,org_research")), 400),
    refused("x-organization-id too long", bearer("tenant", (ORG, "o" * 129)), 400),
    refused(
        "two x-organization-id headers",
        bearer("tenant", (ORG, "org_main"), (ORG, "org_main")),
        400,
    ),
    refused("organization key, malformed header", bearer("research", (ORG, "a/b")), 400),
    # 404: an organization the user cannot reach, or not the key's own (spec 7, D9, D10).
    refused("unknown organization", bearer("tenant", (ORG, "org_nope")), 404),
    refused("Default is not default", bearer("tenant", (ORG, "Default")), 404),
    refused("another tenant's organization", bearer("tenant", (ORG, "org_globex")), 404),
    refused("organization out of reach", bearer("tenant", (ORG, "org_secret")), 404),
    refused("organization key, other organization", bearer("research", (ORG, "org_main")), 404),
    refused("organization key, default is another", bearer("research", (ORG, "default")), 404),
    # 403 and 503: the extensions (D14, D15).
    refused("role policy", bearer("research"), 403, path=ADMIN, organization=RESEARCH),
    refused("key store down", bearer("tenant", (ORG, "default")), 503, setup=break_store),
    refused("membership provider down", bearer("research"), 503, setup=break_membership),
]

ACCEPTED = [
    accepted("organization key", bearer("research"), RESEARCH),
    accepted("organization key, own id", bearer("research", (ORG, "org_research")), RESEARCH),
    accepted("default organization key, default", bearer("main", (ORG, "default")), MAIN),
    accepted("tenant key, default", bearer("tenant", (ORG, "default")), MAIN),
    accepted("tenant key, organization id", bearer("tenant", (ORG, "org_research")), RESEARCH),
    accepted("x-organization-id trimmed", bearer("tenant", (ORG, " \torg_research ")), RESEARCH),
    accepted("scheme in lower case", (("authorization", "bearer {research}"),), RESEARCH),
    accepted("scheme in capitals", (("authorization", "BEARER {research}"),), RESEARCH),
    accepted("spaces before the token", (("authorization", "Bearer   {research}"),), RESEARCH),
    accepted(
        "header names in capitals",
        (("AUTHORIZATION", "Bearer {tenant}"), ("X-Organization-ID", "org_research")),
        RESEARCH,
    ),
    accepted("admin passes the role policy", bearer("main"), MAIN, path=ADMIN),
    accepted("the app's own 404", bearer("research"), RESEARCH, path=NOWHERE, status=404),
    accepted("the app's own 500", bearer("research"), RESEARCH, path=BOOM, status=500),
    accepted("the app's own service headers", bearer("research"), RESEARCH, path=SPOOF),
]


def send(client: Client, world: World, case: Case) -> Reply:
    if case.setup is not None:
        case.setup(world)
    headers = [(name, value.format(**world.keys)) for name, value in case.headers]
    return client.get(case.path, headers)


@pytest.mark.parametrize("case", REFUSED)
def test_refused(client: Client, world: World, case: Case) -> None:
    """A refused request gets the status, JSON body and headers of its row, and no app call.

    Only a 403 carries the service headers: the policy refuses after the request reached
    its organization; every other refusal comes before one was reached.
    """
    reply = send(client, world, case)

    assert reply.status == case.status
    assert world.calls == []
    assert reply.values("content-type") == ["application/json"]
    assert reply.values("content-length") == [str(len(reply.body))]
    body = reply.json()
    assert body == {"error": {"code": CODES[case.status], "message": body["error"]["message"]}}
    assert reply.body == json.dumps(body, separators=(",", ":")).encode()  # compact
    if case.status == 403:  # the policy refused in an organization the request reached (spec 5)
        assert reply.values("service-organization-id") == [case.organization]
        assert reply.values("service-tenant-id") == ["acme"]
    else:
        assert reply.values("service-organization-id") == []
        assert reply.values("service-tenant-id") == []
    if case.status == 401:
        assert body == UNAUTHORIZED_BODY
        presented = any(name.lower() == "authorization" for name, _ in case.headers)
        challenge = CHALLENGE + (', error="invalid_token"' if presented else "")
        assert reply.values("www-authenticate") == [challenge]
    else:
        assert reply.values("www-authenticate") == []
    if case.status == 400:
        assert "x-organization-id" in body["error"]["message"]
    assert reply.values("retry-after") == (["1"] if case.status == 503 else [])


@pytest.mark.parametrize("case", ACCEPTED)
def test_accepted(client: Client, world: World, case: Case) -> None:
    """An accepted request reaches the app, whose response carries the service headers once."""
    reply = send(client, world, case)

    assert reply.status == case.status
    assert world.calls == [case.path]
    assert reply.values("service-organization-id") == [case.organization]
    assert reply.values("service-tenant-id") == ["acme"]
    assert reply.values("www-authenticate") == []
    if case.path == WHOAMI:
        assert reply.json() == {
            "account_id": "alice",
            "organization_id": case.organization,
            "tenant_id": "acme",
            "role": "admin" if case.organization == "org_main" else "member",
            "authorization": None,  # stripped before the app
        }
    else:
        assert "error" not in reply.json()  # the app's own body, not a refusal


@pytest.mark.parametrize(
    "path", [HEALTHZ, PUBLIC, "/managed-agents/v1x", "/managed-agents", "/models"]
)
def test_unguarded_paths_pass_through(client: Client, world: World, path: str) -> None:
    """Paths outside the prefix and public paths reach the app untouched, without headers."""
    reply = client.get(path, [("authorization", "Bearer nonsense")])

    assert world.calls == [path]
    assert reply.status in (200, 404)
    assert reply.values("www-authenticate") == []
    assert reply.values("service-organization-id") == []


def test_public_paths_predicate(serve: Serve, world: World) -> None:
    """A predicate as public_paths exempts the paths it accepts, and only those."""
    client = serve(public_paths=lambda path: path.endswith("/public"))

    assert client.get(PUBLIC).status == 200
    assert client.get(MODELS).status == 401
    assert world.calls == [PUBLIC]


def test_other_prefix(serve: Serve, world: World) -> None:
    """The prefix is an option; the default one is then not guarded."""
    client = serve(prefix="/api/")

    assert client.get("/api").status == 401
    assert client.get("/api/anything").status == 401
    assert client.get(MODELS).status == 200


def test_authorization_kept_on_request(serve: Serve, world: World) -> None:
    """With strip_authorization=False the app sees the Authorization header as sent."""
    client = serve(strip_authorization=False)
    sent = f"Bearer {world.keys['research']}"

    reply = client.get(WHOAMI, [("authorization", sent)])

    assert reply.json()["authorization"] == sent


def test_realm(serve: Serve) -> None:
    """The realm option names the realm of the challenge."""
    reply = serve(realm="models").get(MODELS)

    assert reply.values("www-authenticate") == ['Bearer realm="models"']


def test_audit_hook_gets_the_reason(client: Client, world: World) -> None:
    """The Authenticator's audit hook sees method, path and the precise reason of a refusal."""
    revoke("research")(world)
    client.get(MODELS, [("authorization", f"Bearer {world.keys['research']}")])
    client.get(MODELS, [("authorization", f"Bearer {world.keys['main']}")])

    refusal, success = world.audit
    assert (refusal.method, refusal.path, refusal.error.reason) == ("GET", MODELS, Reason.REVOKED)
    assert success.allowed and success.principal.organization_id == "org_main"


def test_revocation_is_immediate(client: Client, world: World) -> None:
    """A key that worked is refused on the very next request after revocation."""
    headers = [("authorization", f"Bearer {world.keys['research']}")]
    assert client.get(MODELS, headers).status == 200

    revoke("research")(world)

    assert client.get(MODELS, headers).status == 401


def test_expiry_is_exact(client: Client, world: World) -> None:
    """A key works until the instant before its expiry and not at it."""
    headers = [("authorization", f"Bearer {world.keys['research']}")]
    world.clock.advance(timedelta(days=30) - timedelta(microseconds=1))
    assert client.get(MODELS, headers).status == 200

    world.clock.advance(timedelta(microseconds=1))

    assert client.get(MODELS, headers).status == 401


# --- large input spaces ------------------------------------------------------------------

HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.just("\t"))
KEY_SHAPED = st.from_regex(r"rma_[A-Za-z0-9]{46}", fullmatch=True)
# The world is only read by these tests, so one world serves every example.
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(
    authorization=st.one_of(
        HEADER_TEXT,
        HEADER_TEXT.map(lambda text: f"Bearer {text}"),
        KEY_SHAPED.map(lambda token: f"Bearer {token}"),
    ),
    organization=st.none() | HEADER_TEXT,
)
def test_random_credentials_never_authenticate(
    client: Client, world: World, authorization: str, organization: str | None
) -> None:
    """No generated Authorization value gets past the middleware, and none causes a 500."""
    headers = [("authorization", authorization)]
    if organization is not None:
        headers.append((ORG, organization))

    reply = client.get(MODELS, headers)

    assert reply.status == 401
    assert reply.json() == UNAUTHORIZED_BODY
    assert world.calls == []


@FUZZ
@given(organization=HEADER_TEXT)
def test_random_organization_header(client: Client, world: World, organization: str) -> None:
    """A tenant key with any x-organization-id gets 200 only for a reachable organization."""
    headers = [("authorization", f"Bearer {world.keys['tenant']}"), (ORG, organization)]

    reply = client.get(MODELS, headers)

    reachable = {"default", "org_main", "org_research"}
    if organization.strip(" \t") in reachable:
        assert reply.status == 200
    else:
        assert reply.status in (400, 404)
        assert reply.values("service-organization-id") == []
