"""The server matrix: one table of raw requests, sent as bytes over a socket to the apps of
``apps.py`` under every real server, so that nothing is normalised away before the middleware.

Each server starts once per module, in its own process on a free loopback port, is polled
for readiness a bounded number of times, and is stopped by its process id. For every case
the table records the status, the error code, the service headers and whether the app was
reached (the app notes every request it sees in a file, see ``apps.py``); every response is
also searched for the seeded secrets. HTTPS uses a throwaway self-signed certificate made by
the ``tls_files`` fixture; HTTP/2 is spoken with prior knowledge (h2c).

In CI (``CI=true``) every server must start; elsewhere a server that is not installed or
cannot start is skipped, with the reason. The PostgreSQL column needs
``KEYTURN_TEST_POSTGRES_DSN``: without it, it is skipped with the reason, unless
``KEYTURN_REQUIRE_POSTGRES=1`` or CI make it mandatory.
"""

from __future__ import annotations

import base64
import importlib.util
import ipaddress
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

import attrs
import pytest

from keyturn import CreatedKey
from keyturn.demo import DEFAULT_ORGANIZATION, OTHER_ORGANIZATION, TENANT, USER, seed
from keyturn.protocols import KeyStore, WritableMembership
from keyturn.stores.sqlite import SQLiteDatabase

ROOT = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI") == "true"
READY_TRIES = 300  # polls of the port, 0.1 s apart
START_ATTEMPTS = 3
SOCKET_TIMEOUT = 10.0
MAX_READS = 10_000  # recv calls per response, at most


@attrs.frozen
class Server:
    module: str  # what must be importable for the server to run
    app: str  # which app of ``apps.py`` it serves
    argv: Callable[[int, Path], list[str]]  # (port, the module's TLS files) -> command
    http2: bool = False
    websocket: bool = False
    tls: bool = False  # HTTPS, with the throwaway certificate of the ``tls_files`` fixture
    store: str = "sqlite"  # or "postgres": the async PostgreSQL store


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def uvicorn(app: str, http: str = "h11") -> Callable[[int, Path], list[str]]:
    return lambda port, files: python(
        "-m",
        "uvicorn",
        f"tests.servers.apps:{app}",
        "--http",
        http,
        "--ws",
        "websockets",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    )


def hypercorn(factory: str, *, tls: bool = False) -> Callable[[int, Path], list[str]]:
    def argv(port: int, files: Path) -> list[str]:
        certificate = ["--certfile", str(files / "cert.pem"), "--keyfile", str(files / "key.pem")]
        return python(
            "-m",
            "hypercorn",
            f"tests.servers.apps:{factory}()",
            "-b",
            f"127.0.0.1:{port}",
            *(certificate if tls else []),
        )

    return argv


def granian(interface: str, app: str, http: str = "auto") -> Callable[[int, Path], list[str]]:
    return lambda port, files: python(
        "-m",
        "granian",
        "--interface",
        interface,
        "--http",
        http,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        f"tests.servers.apps:{app}",
    )


def daphne(app: str) -> Callable[[int, Path], list[str]]:
    return lambda port, files: python(
        "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), f"tests.servers.apps:{app}"
    )


def gunicorn(app: str, *threads: str) -> Callable[[int, Path], list[str]]:
    return lambda port, files: python(
        "-m",
        "gunicorn",
        "-b",
        f"127.0.0.1:{port}",
        "-w",
        "1",
        *threads,
        "--log-level",
        "warning",
        f"tests.servers.apps:{app}",
    )


def waitress(app: str) -> Callable[[int, Path], list[str]]:
    return lambda port, files: python(
        "-m",
        "waitress",
        "--listen",
        f"127.0.0.1:{port}",
        "--threads",
        "2",
        f"tests.servers.apps:{app}",
    )


def run(server: str, app: str) -> Callable[[int, Path], list[str]]:
    return lambda port, files: python("-m", "tests.servers.run", server, app, str(port))


SERVERS = {
    "uvicorn-h11": Server("uvicorn", "asgi", uvicorn("asgi"), websocket=True),
    "uvicorn-httptools": Server("httptools", "asgi", uvicorn("asgi", "httptools"), websocket=True),
    "hypercorn-h1": Server("hypercorn", "asgi", hypercorn("make_asgi"), websocket=True),
    "hypercorn-h2c": Server("hypercorn", "asgi", hypercorn("make_asgi"), http2=True),
    "hypercorn-tls": Server(
        "hypercorn", "asgi", hypercorn("make_asgi", tls=True), websocket=True, tls=True
    ),
    "granian": Server("granian", "asgi", granian("asgi", "asgi"), websocket=True),
    "granian-h2": Server("granian", "asgi", granian("asgi", "asgi", "2"), http2=True),
    "granian-wsgi": Server("granian", "wsgi", granian("wsgi", "wsgi")),
    "daphne": Server("daphne", "asgi", daphne("asgi"), websocket=True),
    "gunicorn": Server("gunicorn", "wsgi", gunicorn("wsgi")),
    "gunicorn-gthread": Server("gunicorn", "wsgi", gunicorn("wsgi", "--threads", "2")),
    "waitress": Server("waitress", "wsgi", waitress("wsgi")),
    "werkzeug": Server("werkzeug", "wsgi", run("werkzeug", "wsgi")),
    "wsgiref": Server("wsgiref", "wsgi", run("wsgiref", "wsgi")),
    "django-waitress": Server("django", "django", waitress("django")),
    # the apps beyond the Starlette and Flask examples
    "quart-hypercorn": Server("quart", "quart", hypercorn("make_quart"), websocket=True),
    "quart-uvicorn": Server("quart", "quart", uvicorn("quart"), websocket=True),
    "fastapi-uvicorn": Server("fastapi", "fastapi", uvicorn("fastapi"), websocket=True),
    "bare-asgi-uvicorn": Server("uvicorn", "bare", uvicorn("bare"), websocket=True),
    "werkzeug-example": Server("werkzeug", "werkzeug", run("werkzeug", "werkzeug")),
    "django-native-gunicorn": Server("django", "django_native", gunicorn("django_native")),
    "django-native-uvicorn": Server("django", "django_native_asgi", uvicorn("django_native_asgi")),
    "django-native-daphne": Server("django", "django_native_asgi", daphne("django_native_asgi")),
    "postgres-uvicorn": Server(
        "psycopg", "postgres", uvicorn("postgres"), websocket=True, store="postgres"
    ),
}


# --- the table ------------------------------------------------------------------------------


@attrs.frozen
class Request:
    method: str
    target: str
    headers: tuple[tuple[str, str], ...] = ()
    websocket: bool = False  # an upgrade handshake: only the response head is read
    body: bytes = b""
    chunked: bool = False  # the body sent with Transfer-Encoding: chunked (HTTP/1.1)
    pipelined: bool = False  # written before the response to the previous request is read


@attrs.frozen
class Outcome:
    status: int  # 0: the server closed the connection without a response
    code: str | None  # the JSON error code, if the body has one
    service: tuple[str | None, str | None]  # service-organization-id, service-tenant-id
    reached: bool
    saw_key: bool  # the app saw the Authorization header
    body: bytes = attrs.field(repr=False)
    headers: tuple[tuple[str, str], ...] = attrs.field(repr=False)
    error: str = ""  # the HTTP/2 protocol error in the response, as h2 names it

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key == name]


Check = Callable[[str, list[Outcome]], None]  # (server, outcomes)

CHALLENGE = 'Bearer realm="agents-api"'
INVALID_TOKEN = 'Bearer realm="agents-api", error="invalid_token"'
EXPIRES = "service-key-expires-at"
# The exact bodies of the spec's refusals (D7); the 400 for a target is checked by its code.
BODIES = {
    "unauthorized": (
        b'{"error":{"code":"unauthorized","message":"A valid API key is required: send it as '
        b"'Authorization: Bearer <key>'.\"}}"
    ),
    "not_found": (
        b'{"error":{"code":"not_found","message":'
        b'"The organization named by x-organization-id was not found."}}'
    ),
    "organization missing": (
        b'{"error":{"code":"invalid_request","message":"A tenant-scoped key needs the '
        b"x-organization-id header: an organization id or 'default'.\"}}"
    ),
    "organization invalid": (
        b'{"error":{"code":"invalid_request","message":'
        b"\"The x-organization-id header must be an organization id or 'default'.\"}}"
    ),
}


def refused(status: int, code: str, body: str | None = None, challenge: str = "") -> Check:
    """The middleware's own refusal: exact body (by its name in ``BODIES``) and challenge."""

    def check(server: str, outcomes: list[Outcome]) -> None:
        (outcome,) = outcomes
        assert (outcome.status, outcome.code, outcome.reached) == (status, code, False)
        assert outcome.service == (None, None)
        assert outcome.values(EXPIRES) == []
        if body is not None:
            assert outcome.body == BODIES[body]
        assert outcome.values("www-authenticate") == ([challenge] if challenge else [])

    return check


NO_KEY = refused(401, "unauthorized", "unauthorized", CHALLENGE)
BAD_KEY = refused(401, "unauthorized", "unauthorized", INVALID_TOKEN)
NOT_FOUND = refused(404, "not_found", "not_found")
NO_ORGANIZATION = refused(400, "invalid_request", "organization missing")
BAD_ORGANIZATION = refused(400, "invalid_request", "organization invalid")


def bad_organization(server: str, outcomes: list[Outcome]) -> None:
    """A malformed ``x-organization-id`` (D8): the middleware's 400, or the server's own 400
    for a header it will not parse; never a pass.
    """
    (outcome,) = outcomes
    assert outcome.status in (0, 400)
    assert not outcome.reached
    if outcome.code is not None:
        BAD_ORGANIZATION(server, outcomes)


def served(organization: str) -> Check:
    def check(server: str, outcomes: list[Outcome]) -> None:
        (outcome,) = outcomes
        assert (outcome.status, outcome.reached) == (200, True)
        assert outcome.service == (organization, TENANT)
        assert b"agent-small" in outcome.body
        assert len(outcome.values(EXPIRES)) == 1

    return check


def walled(server: str, outcomes: list[Outcome]) -> None:
    """Never a success, never the models, never the app."""
    for outcome in outcomes:
        assert outcome.status == 0 or outcome.status >= 400
        assert b"agent-small" not in outcome.body
        assert not outcome.reached


def walled_on(*servers: str) -> Check:
    """:func:`walled` on *servers*, which read the target as one under the prefix; elsewhere
    the app may be reached, to say it has no such route (404).
    """

    def check(server: str, outcomes: list[Outcome]) -> None:
        if server in servers:
            walled(server, outcomes)
        for outcome in outcomes:
            assert b"agent-small" not in outcome.body
            assert outcome.status == 404 or not outcome.reached

    return check


def guarded(server: str, outcomes: list[Outcome]) -> None:
    """With a key, an odd spelling is authenticated (or refused), never passed by."""
    (outcome,) = outcomes
    assert outcome.status in (0, 400, 404) or outcome.service == (OTHER_ORGANIZATION, TENANT)


def authenticated(server: str, outcomes: list[Outcome]) -> None:
    """The key was accepted: whatever the app answers, it ran in the key's organization."""
    (outcome,) = outcomes
    assert outcome.reached
    assert outcome.service == (OTHER_ORGANIZATION, TENANT)
    assert len(outcome.values(EXPIRES)) == 1


def denied(server: str, outcomes: list[Outcome]) -> None:
    """The role policy's 403 (D14): in the key's organization, which it names, app unreached."""
    (outcome,) = outcomes
    assert (outcome.status, outcome.code, outcome.reached) == (403, "permission_denied", False)
    assert outcome.service == (OTHER_ORGANIZATION, TENANT)


def policy_walled(server: str, outcomes: list[Outcome]) -> None:
    """An odd spelling of the policy's route: the policy sees what the router dispatches
    (D21), so a member's key never reaches it; 403, or a refusal of the spelling.
    """
    (outcome,) = outcomes
    assert outcome.status == 0 or outcome.status >= 400
    assert b"admin" not in outcome.body
    assert not outcome.reached or outcome.status == 404


def public(server: str, outcomes: list[Outcome]) -> None:
    (outcome,) = outcomes
    assert (outcome.status, outcome.reached, outcome.service) == (200, True, (None, None))
    assert outcome.values(EXPIRES) == []


def head_then_get(server: str, outcomes: list[Outcome]) -> None:
    """A refused HEAD: the GET refusal's headers, its length, no body; then the connection
    still reads the next response right (D24), over HTTP/1.1 and HTTP/2 alike.
    """
    head, get = outcomes
    assert (head.status, head.body, head.reached) == (401, b"", False)
    assert head.values("www-authenticate") == [CHALLENGE]
    assert head.values("content-length") in ([str(len(BODIES["unauthorized"]))], [])
    served(OTHER_ORGANIZATION)(server, [get])


# Granian's HTTP/2 sends the app's body with a HEAD response, with or without the middleware
# (a public path shows it): h2 refuses that DATA frame and resets. Recorded in the server
# notes of docs/security.md; the middleware's own refusals to HEAD carry no body there either.
HEAD_BODY_ON_HTTP2 = ("granian-h2",)


def head_answered_by_app(authenticated_as: str | None) -> Check:
    """A HEAD the app answers (a key accepted, or a public path): its headers, no body; then
    a GET still reads right.
    """

    def check(server: str, outcomes: list[Outcome]) -> None:
        head, get = outcomes
        assert head.reached
        assert head.status in (200, 405)  # FastAPI's GET routes answer HEAD with 405
        assert head.service == ((authenticated_as, TENANT) if authenticated_as else (None, None))
        assert len(head.values(EXPIRES)) == (1 if authenticated_as else 0)
        if server in HEAD_BODY_ON_HTTP2:
            assert head.error == "InvalidBodyLengthError"  # the server's body on a HEAD
        else:
            assert (head.body, head.error) == (b"", "")
        assert (get.status, get.reached) == (200, True)

    return check


def refusal_then_served(server: str, outcomes: list[Outcome]) -> None:
    """A refusal, then the next request on the connection gets its own answer: its own 200,
    or no answer if the server closed the connection after the refusal. The refused
    request's body is never read as the next request.
    """
    first, second = outcomes
    NO_KEY(server, [first])
    if second.status != 0:
        served(OTHER_ORGANIZATION)(server, [second])


def underscore_twin(server: str, outcomes: list[Outcome]) -> None:
    """``x_organization_id`` beside ``x-organization-id``: some WSGI servers map both to one
    environ key (joined: 400; or the last wins: 404), some drop it; never a pass into another
    organization.
    """
    (outcome,) = outcomes
    assert outcome.status in (200, 400, 404)
    if outcome.status == 200:
        assert outcome.service == (OTHER_ORGANIZATION, TENANT)


def websocket_walled(server: str, outcomes: list[Outcome]) -> None:
    (outcome,) = outcomes
    assert outcome.status != 101
    assert not outcome.reached


def websocket_passed(server: str, outcomes: list[Outcome]) -> None:
    (outcome,) = outcomes
    assert outcome.reached  # the example has no WebSocket route: its router closes it


def console_lists(server: str, outcomes: list[Outcome]) -> None:
    """Signed in and with no key: the console's page, with the user's keys."""
    (outcome,) = outcomes
    assert outcome.status == 200
    assert b"demo: research" in outcome.body


def console_refused(server: str, outcomes: list[Outcome]) -> None:
    """Refused with 403 (D25, D30): no page, no key list."""
    (outcome,) = outcomes
    assert outcome.status == 403
    assert b"demo: research" not in outcome.body


MODELS = "/managed-agents/v1/models"
ADMIN = "/managed-agents/v1/admin"  # only admins, by the role policy of POLICY_APPS
POLICY_APPS = ("quart", "bare")
CONSOLE = "/console"
PREFIXED_CONSOLE = MODELS.rpartition("/")[0] + CONSOLE  # mounted behind the middleware
ORG = "Bearer {organization}"
TENANT_KEY = "Bearer {tenant}"
SIGNED_IN = ("cookie", f"matrix_account={USER}")
FORM = ("content-type", "application/x-www-form-urlencoded")


def org_key(*headers: tuple[str, str], method: str = "GET", target: str = MODELS) -> Request:
    return Request(method, target, (("authorization", ORG), *headers))


def tenant_key(organization: str) -> Request:
    return Request(
        "GET", MODELS, (("authorization", TENANT_KEY), ("x-organization-id", organization))
    )


def authorization(*values: str, target: str = MODELS) -> Request:
    return Request("GET", target, tuple(("authorization", value) for value in values))


def console(
    *headers: tuple[str, str], method: str = "GET", body: bytes = b"", target: str = "/console/"
) -> Request:
    extra = (FORM,) if body else ()
    return Request(method, target, (SIGNED_IN, *headers, *extra), body=body)


CASES: dict[str, tuple[tuple[Request, ...], Check]] = {
    # the spec's error table
    "no key": ((Request("GET", MODELS),), NO_KEY),
    "mistyped key": ((authorization("Bearer {typo}"),), BAD_KEY),
    "two Authorization headers": ((authorization(ORG, ORG),), BAD_KEY),
    "tenant key, no organization": (
        (Request("GET", MODELS, (("authorization", TENANT_KEY),)),),
        NO_ORGANIZATION,
    ),
    "tenant key, malformed organization": ((tenant_key("a b"),), BAD_ORGANIZATION),
    "tenant key, unknown organization": ((tenant_key("org_nope"),), NOT_FOUND),
    "organization key": ((org_key(),), served(OTHER_ORGANIZATION)),
    "tenant key, default organization": ((tenant_key("default"),), served(DEFAULT_ORGANIZATION)),
    "public path": ((Request("GET", "/healthz"),), public),
    "HEAD then GET, one connection": ((Request("HEAD", MODELS), org_key()), head_then_get),
    "HEAD with a key, then GET": (
        (org_key(method="HEAD"), org_key()),
        head_answered_by_app(OTHER_ORGANIZATION),
    ),
    "HEAD of a public path, then GET": (
        (Request("HEAD", "/healthz"), Request("GET", "/healthz")),
        head_answered_by_app(None),
    ),
    # credential spellings (D5)
    "lower-case bearer": ((authorization("bearer {organization}"),), served(OTHER_ORGANIZATION)),
    "upper-case BEARER": ((authorization("BEARER {organization}"),), served(OTHER_ORGANIZATION)),
    "two spaces before the key": (
        (authorization("Bearer  {organization}"),),
        served(OTHER_ORGANIZATION),
    ),
    "header name in capitals": (
        (Request("GET", MODELS, (("AUTHORIZATION", ORG),)),),
        served(OTHER_ORGANIZATION),
    ),
    "tab between scheme and key": ((authorization("Bearer\t{organization}"),), BAD_KEY),
    "Token scheme": ((authorization("Token {organization}"),), BAD_KEY),
    "Basic with the key": ((authorization("Basic {basic}"),), BAD_KEY),
    "the key with no scheme": ((authorization("{organization}"),), BAD_KEY),
    "Bearer and nothing": ((authorization("Bearer"),), BAD_KEY),
    "misspelt scheme": ((authorization("Bearerr {organization}"),), BAD_KEY),
    "key and a second part": ((authorization("Bearer {organization} x"),), BAD_KEY),
    "key, comma, key": ((authorization("Bearer {organization}, Bearer {organization}"),), BAD_KEY),
    "tenant key beside the key": ((authorization(ORG, TENANT_KEY),), BAD_KEY),
    "Basic line, then the key": ((authorization("Basic eDp5", ORG),), BAD_KEY),
    "the key, then a Basic line": ((authorization(ORG, "Basic eDp5"),), BAD_KEY),
    "the key in x-api-key": ((Request("GET", MODELS, (("x-api-key", "{organization}"),)),), NO_KEY),
    "the key in the query": ((Request("GET", MODELS + "?api_key={organization}"),), NO_KEY),
    # organization spellings (D8, D9, D10)
    "tenant key, organization padded with spaces": (
        (tenant_key(f"  {OTHER_ORGANIZATION}  "),),
        served(OTHER_ORGANIZATION),
    ),
    "tenant key, organization named": (
        (tenant_key(OTHER_ORGANIZATION),),
        served(OTHER_ORGANIZATION),
    ),
    "tenant key, Default capitalised": ((tenant_key("Default"),), NOT_FOUND),
    "tenant key, comma list": (
        (tenant_key(f"{DEFAULT_ORGANIZATION},{OTHER_ORGANIZATION}"),),
        BAD_ORGANIZATION,
    ),
    "tenant key, two organization lines": (
        (
            Request(
                "GET",
                MODELS,
                (
                    ("authorization", TENANT_KEY),
                    ("x-organization-id", OTHER_ORGANIZATION),
                    ("x-organization-id", OTHER_ORGANIZATION),
                ),
            ),
        ),
        refused(400, "invalid_request"),
    ),
    "tenant key, organization too long": ((tenant_key("a" * 129),), BAD_ORGANIZATION),
    "tenant key, organization with a slash": ((tenant_key("acme/research"),), BAD_ORGANIZATION),
    "tenant key, organization not ASCII": ((tenant_key("acme-résearch"),), bad_organization),
    "tenant key, header name in capitals": (
        (
            Request(
                "GET",
                MODELS,
                (("authorization", TENANT_KEY), ("X-Organization-Id", OTHER_ORGANIZATION)),
            ),
        ),
        served(OTHER_ORGANIZATION),
    ),
    "organization key, its own organization": (
        (org_key(("x-organization-id", OTHER_ORGANIZATION)),),
        served(OTHER_ORGANIZATION),
    ),
    "organization key, another organization": (
        (org_key(("x-organization-id", DEFAULT_ORGANIZATION)),),
        NOT_FOUND,
    ),
    "organization key, default (not its own)": (
        (org_key(("x-organization-id", "default")),),
        NOT_FOUND,
    ),
    # method spellings: what the router dispatches is what is authenticated (D21)
    "lower-case method": ((Request("get", MODELS),), walled),
    "lower-case method, with a key": ((org_key(method="get"),), guarded),
    "mixed-case method": ((Request("Get", MODELS),), walled),
    "POST without a key": ((Request("POST", MODELS),), NO_KEY),
    "OPTIONS without a key": ((Request("OPTIONS", MODELS),), NO_KEY),
    "an unknown method": ((Request("FROB", MODELS),), walled),
    "DELETE with a key": ((org_key(method="DELETE"),), authenticated),
    # the walk-arounds of issue 10, without a key
    "no leading slash": ((Request("GET", "managed-agents/v1/models"),), walled),
    "absolute form": ((Request("GET", "http://127.0.0.1{port}/managed-agents/v1/models"),), walled),
    "absolute form, https": (
        (Request("GET", "https://127.0.0.1{port}/managed-agents/v1/models"),),
        walled,
    ),
    "absolute form, another host": (
        (Request("GET", "http://api.invalid/managed-agents/v1/models"),),
        walled,
    ),
    "double slash": ((Request("GET", "//managed-agents/v1/models"),), walled),
    "double slash inside": ((Request("GET", "/managed-agents/v1//models"),), walled),
    "dot segment": ((Request("GET", "/managed-agents/v1/./models"),), walled),
    "dot segments": ((Request("GET", "/x/../managed-agents/v1/models"),), walled),
    "trailing slash": ((Request("GET", MODELS + "/"),), NO_KEY),
    "query string": ((Request("GET", MODELS + "?x=1"),), NO_KEY),
    "encoded slash": ((Request("GET", "/managed-agents%2Fv1/models"),), walled),
    "encoded slash, lower case": ((Request("GET", "/managed-agents%2fv1/models"),), walled),
    "encoded letter": ((Request("GET", "/managed-agents/v1/%6Dodels"),), walled),
    "encoded dot segments": ((Request("GET", "/x/%2E%2E/managed-agents/v1/models"),), walled),
    "double-encoded slash": ((Request("GET", "/managed-agents%252Fv1/models"),), walled),
    "triple-encoded slash": ((Request("GET", "/managed-agents%25252Fv1/models"),), walled),
    "path parameter": ((Request("GET", MODELS + ";x=1"),), walled_on()),
    "upper-case path": ((Request("GET", "/MANAGED-AGENTS/v1/models"),), walled_on()),
    "Daphne-Root-Path header": (
        (Request("GET", "/v1/models", (("daphne-root-path", "/managed-agents"),)),),
        walled_on("daphne", "django-native-daphne"),
    ),
    "SCRIPT_NAME header": (
        (Request("GET", MODELS, (("script_name", "/managed-agents"),)),),
        walled,
    ),
    "SCRIPT_NAME header with target /v1/models": (
        (Request("GET", "/v1/models", (("script_name", "/managed-agents"),)),),
        walled_on("gunicorn", "gunicorn-gthread", "django-native-gunicorn"),
    ),
    "underscore twin of x-organization-id": (
        (
            Request(
                "GET",
                MODELS,
                (
                    ("authorization", TENANT_KEY),
                    ("x-organization-id", OTHER_ORGANIZATION),
                    ("x_organization_id", "org_nope"),
                ),
            ),
        ),
        underscore_twin,
    ),
    # the same with a key: authenticated, so the key never reaches the app
    **{
        f"{name}, with a key": ((org_key(target=target),), guarded)
        for name, target in [
            ("no leading slash", "managed-agents/v1/models"),
            ("absolute form", "http://127.0.0.1{port}/managed-agents/v1/models"),
            ("double slash", "//managed-agents/v1/models"),
            ("encoded slash", "/managed-agents%2Fv1/models"),
            ("dot segments", "/x/../managed-agents/v1/models"),
        ]
    },
    # the role policy of the Quart and framework-less apps, with a member's key (D14, D21)
    "admin route, a member's key": ((org_key(target=ADMIN),), denied),
    "admin route, a member's key, lower-case method": (
        (org_key(method="get", target=ADMIN),),
        policy_walled,
    ),
    **{
        f"admin route, a member's key, {name}": ((org_key(target=target),), policy_walled)
        for name, target in [
            ("dot segments", "/x/../managed-agents/v1/admin"),
            ("double slash", "//managed-agents/v1/admin"),
            ("encoded slash", "/managed-agents%2Fv1/admin"),
            ("absolute form", "http://127.0.0.1{port}/managed-agents/v1/admin"),
            ("trailing dot segment", "/managed-agents/v1/admin/."),
        ]
    },
    # bodies and connections after a refusal (HTTP/1.1)
    "chunked body refused, then the key, pipelined": (
        (
            Request("POST", MODELS, body=b"GET /healthz HTTP/1.1\r\n\r\n", chunked=True),
            attrs.evolve(org_key(), pipelined=True),
        ),
        refusal_then_served,
    ),
    "sized body refused, then the key": (
        (Request("POST", MODELS, body=b'{"model": "agent-small"}'), org_key()),
        refusal_then_served,
    ),
    "no key, then the key, pipelined": (
        (Request("GET", MODELS), attrs.evolve(org_key(), pipelined=True)),
        refusal_then_served,
    ),
    # WebSocket handshakes (ASGI servers that speak it)
    "websocket without a key": ((Request("GET", MODELS, websocket=True),), websocket_walled),
    "websocket with a key": (
        (Request("GET", MODELS, (("authorization", ORG),), websocket=True),),
        websocket_passed,
    ),
    # every form of target RFC 3986 allows: scheme:path, scheme:/path, //authority/path (D20)
    "scheme and one slash": ((Request("GET", "http:/managed-agents/v1/models"),), walled),
    "scheme and no slash": ((Request("GET", "http:managed-agents/v1/models"),), walled),
    "scheme in capitals": (
        (Request("GET", "HTTP://127.0.0.1{port}/managed-agents/v1/models"),),
        walled,
    ),
    "mixed-case scheme and one slash": (
        (Request("GET", "Http:/managed-agents/v1/models"),),
        walled,
    ),
    "another scheme and one slash": ((Request("GET", "ftp:/managed-agents/v1/models"),), walled),
    "authority with no scheme": (
        (Request("GET", "//127.0.0.1{port}/managed-agents/v1/models"),),
        walled,
    ),
    **{
        f"{name}, with a key": ((org_key(target=target),), guarded)
        for name, target in [
            ("scheme and one slash", "http:/managed-agents/v1/models"),
            ("scheme and no slash", "http:managed-agents/v1/models"),
            ("authority with no scheme", "//127.0.0.1{port}/managed-agents/v1/models"),
        ]
    },
    "admin route, a member's key, scheme and one slash": (
        (org_key(target="http:/managed-agents/v1/admin"),),
        policy_walled,
    ),
    # the console reads a key in every form the gate reads, on every line (D30)
    "console, tab after Bearer": (
        (console(("authorization", "Bearer\t{organization}")),),
        console_refused,
    ),
    "console, Token scheme": (
        (console(("authorization", "Token {organization}")),),
        console_refused,
    ),
    "console, Basic with the key": (
        (console(("authorization", "Basic {basic}")),),
        console_refused,
    ),
    "console, the key with no scheme": (
        (console(("authorization", "{organization}")),),
        console_refused,
    ),
    "console, a Basic line then the key": (
        (console(("authorization", "Basic eDp5"), ("authorization", ORG)),),
        console_refused,
    ),
    "console, an empty line then the key": (
        (console(("authorization", ""), ("authorization", ORG)),),
        console_refused,
    ),
    "console under the prefix, with the key": (
        (console(("authorization", ORG), target=PREFIXED_CONSOLE + "/"),),
        console_refused,
    ),
    "console under the prefix, no key": ((console(target=PREFIXED_CONSOLE + "/"),), NO_KEY),
    # the key console, signed in (D25, D30)
    "console, signed in": ((console(),), console_lists),
    "console, with the key": ((console(("authorization", ORG)),), console_refused),
    "console, with the tenant key": ((console(("authorization", TENANT_KEY)),), console_refused),
    "console, lower-case bearer and spaces": (
        (console(("authorization", "bearer   {organization}")),),
        console_refused,
    ),
    "console, the key then a Basic line": (
        (console(("authorization", ORG), ("authorization", "Basic eDp5")),),
        console_refused,
    ),
    "console, cross-origin POST": (
        (console(("origin", "http://evil.invalid"), method="POST", body=b"name=x"),),
        console_refused,
    ),
    "console, cross-site POST": (
        (console(("sec-fetch-site", "cross-site"), method="POST", body=b"name=x"),),
        console_refused,
    ),
}


# --- the servers ----------------------------------------------------------------------------


@attrs.frozen
class Keys:
    """The seeded keys, as the table's ``{organization}``, ``{tenant}``, ... placeholders."""

    organization: str = attrs.field(repr=False)
    tenant: str = attrs.field(repr=False)
    typo: str = attrs.field(repr=False)
    basic: str = attrs.field(repr=False)  # the organization key as Basic: base64("<key>:")
    expiries: tuple[str, str]  # both keys' expiries, as the expiry header gives them


def expiry(key: CreatedKey) -> str:
    return key.info.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")


def seeded(keys: KeyStore, membership: WritableMembership) -> Keys:
    created = seed(keys, membership)
    organization = created.organization.secret
    typo = organization[:20] + ("b" if organization[20] == "a" else "a") + organization[21:]
    return Keys(
        organization,
        created.tenant.secret,
        typo,
        base64.b64encode(f"{organization}:".encode()).decode(),
        (expiry(created.organization), expiry(created.tenant)),
    )


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Keys]:
    """One seeded SQLite key database that every server of the module reads."""
    path = tmp_path_factory.mktemp("matrix") / "keys.sqlite3"
    db = SQLiteDatabase(path)
    keys = seeded(db.keys, db.membership)
    db.close()
    return path, keys


@pytest.fixture(scope="module")
def postgres_database() -> Iterator[tuple[str, Keys]]:
    """A seeded schema of its own on the test PostgreSQL server, dropped at the end.

    Skipped, with the reason, without ``KEYTURN_TEST_POSTGRES_DSN``; a failure instead with
    ``KEYTURN_REQUIRE_POSTGRES=1``, or in CI.
    """
    url = os.environ.get("KEYTURN_TEST_POSTGRES_DSN", "")
    required = IN_CI or os.environ.get("KEYTURN_REQUIRE_POSTGRES") == "1"
    if not url:
        if required:
            pytest.fail("the PostgreSQL server column needs KEYTURN_TEST_POSTGRES_DSN")
        pytest.skip("postgres-uvicorn: KEYTURN_TEST_POSTGRES_DSN is not set")
    import psycopg

    from keyturn.stores.postgres import PostgresDatabase

    schema = f"keyturn_matrix_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    try:
        scoped = f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
        with PostgresDatabase(scoped) as db:
            db.create_schema()
            keys = seeded(db.keys, db.membership)
        yield scoped, keys
    finally:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as connection:
            connection.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway self-signed certificate for 127.0.0.1, made here: a test fixture only."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "keyturn matrix test fixture")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    files = tmp_path_factory.mktemp("tls")
    (files / "cert.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (files / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return files


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def unavailable(name: str, why: str) -> None:
    if IN_CI:
        pytest.fail(f"{name} must run in CI: {why}")
    pytest.skip(f"{name}: {why}")


@attrs.frozen
class Running:
    name: str
    server: Server
    port: int
    reached_log: Path
    keys: Keys
    tls: ssl.SSLContext | None

    def seen(self) -> tuple[int, int]:
        """Requests the app has seen, and how many of them with an Authorization header."""
        if not self.reached_log.exists():
            return 0, 0
        lines = self.reached_log.read_text(encoding="utf-8").splitlines()
        return len(lines), sum(line.startswith("key ") for line in lines)

    def connect(self) -> Http1 | Http2:
        if self.server.http2:
            return Http2(self.port)
        return Http1(self.port, self.tls)


@pytest.fixture(scope="module", params=sorted(SERVERS))
def running(
    request: pytest.FixtureRequest,
    database: tuple[Path, Keys],
    tls_files: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Running]:
    """One server process for the whole module, stopped by its process id at the end."""
    name = request.param
    server = SERVERS[name]
    if importlib.util.find_spec(server.module) is None:
        unavailable(name, f"{server.module} is not installed (it is in the dev group)")
    store, keys = database
    scratch = tmp_path_factory.mktemp(name)
    reached_log = scratch / "reached.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "KEYTURN_MATRIX_DB": str(store),
        "KEYTURN_MATRIX_REACHED": str(reached_log),
    }
    if server.store == "postgres":
        env["KEYTURN_MATRIX_POSTGRES"], keys = request.getfixturevalue("postgres_database")
    tls = None
    if server.tls:
        tls = ssl.create_default_context(cafile=tls_files / "cert.pem")
    env.pop("CI", None)  # no server may change its behaviour under the test's CI flag
    why = ""
    for _ in range(START_ATTEMPTS):  # another process may take the free port first
        port = free_port()
        process = start(server.argv(port, tls_files), env, scratch / "server.log")
        try:
            why = wait_until_ready(process, port, scratch / "server.log")
            if not why:
                yield Running(name, server, port, reached_log, keys, tls)
                return
        finally:
            stop(process)
    unavailable(name, why)


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as output:
        return subprocess.Popen(  # noqa: S603 -- our own interpreter and arguments
            argv,
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its workers share its process group
        )


def wait_until_ready(process: subprocess.Popen[bytes], port: int, log: Path) -> str:
    """Poll the port a bounded number of times: "" once it answers, else why not."""
    for _ in range(READY_TRIES):
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            return f"exited with {process.returncode}: {tail}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            time.sleep(0.1)
        else:
            return ""
    return f"no answer on port {port} after {READY_TRIES} tries"


def stop(process: subprocess.Popen[bytes]) -> None:
    """Stop the server by its process id (and its workers, in its process group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


# --- the clients ----------------------------------------------------------------------------


class Http1:
    """Raw HTTP/1.1 over one socket (TLS when given a context): requests as bytes, responses
    parsed by hand.
    """

    def __init__(self, port: int, tls: ssl.SSLContext | None = None) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT)
        self.sock = tls.wrap_socket(sock, server_hostname="127.0.0.1") if tls else sock
        self.buffer = b""
        self.port = port
        self.kept_alive = True  # whether the last response left the connection open

    def close(self) -> None:
        self.sock.close()

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError
        self.buffer += chunk

    def _take(self, size: int) -> bytes:
        for _ in range(MAX_READS):
            if len(self.buffer) >= size:
                break
            self._fill()
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def _line(self) -> bytes:
        for _ in range(MAX_READS):
            if b"\r\n" in self.buffer:
                break
            self._fill()
        line, _, self.buffer = self.buffer.partition(b"\r\n")
        return line

    def write(self, request: Request, keys: Keys) -> None:
        lines = [f"{request.method} {request.target} HTTP/1.1", f"host: 127.0.0.1:{self.port}"]
        lines += [f"{name}: {value}" for name, value in request.headers]
        if request.websocket:
            lines += [
                "upgrade: websocket",
                "connection: Upgrade",
                "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==",
                "sec-websocket-version: 13",
            ]
        body = request.body
        if request.chunked:
            lines.append("transfer-encoding: chunked")
            body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
        elif body:
            lines.append(f"content-length: {len(body)}")
        text = "\r\n".join(lines) + "\r\n\r\n"
        head = text.format(**attrs.asdict(keys), port=f":{self.port}").encode("latin-1")
        self.sock.sendall(head + body)

    def read(self, request: Request) -> tuple[int, list[tuple[str, str]], bytes]:
        try:
            status_line = self._line()
            headers: list[tuple[str, str]] = []
            for _ in range(1000):
                line = self._line()
                if not line:
                    break
                name, _, value = line.decode("latin-1").partition(":")
                headers.append((name.strip().lower(), value.strip()))
            status = int(status_line.split()[1])
            fields = dict(headers)
            connection = fields.get("connection", "").lower()
            self.kept_alive = connection != "close" and (
                status_line.startswith(b"HTTP/1.1") or connection == "keep-alive"
            )
            if (
                request.method == "HEAD"
                or request.websocket
                or status < 200
                or status in (204, 304)
            ):
                body = b""
            elif "content-length" in fields:
                body = self._take(int(fields["content-length"]))
            elif fields.get("transfer-encoding", "").lower() == "chunked":
                body = b""
                for _ in range(MAX_READS):
                    size = int(self._line().split(b";")[0], 16)
                    chunk = self._take(size + 2)[:size]
                    if size == 0:
                        break
                    body += chunk
            else:
                for _ in range(MAX_READS):
                    try:
                        self._fill()
                    except EOFError:
                        break
                body, self.buffer = self.buffer, b""
        except (EOFError, ConnectionError, IndexError, ValueError, ssl.SSLError):
            self.kept_alive = False
            return 0, [], b""
        return status, headers, body

    def exchange(self, request: Request, keys: Keys) -> tuple[int, list[tuple[str, str]], bytes]:
        self.write(request, keys)
        return self.read(request)


class Http2:
    """Raw HTTP/2 with prior knowledge (h2c): frames built with the h2 state machine.

    ``error`` names the protocol error h2 found in the last response ("" if none); the
    connection is then given up.
    """

    kept_alive = True
    error = ""

    def __init__(self, port: int) -> None:
        import h2.config
        import h2.connection

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT)
        config = h2.config.H2Configuration(
            client_side=True, header_encoding="latin-1", validate_outbound_headers=False
        )
        self.conn = h2.connection.H2Connection(config=config)
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def close(self) -> None:
        self.sock.close()

    def exchange(self, request: Request, keys: Keys) -> tuple[int, list[tuple[str, str]], bytes]:
        import h2.events
        import h2.exceptions

        target = request.target.format(**attrs.asdict(keys), port="")
        stream = self.conn.get_next_available_stream_id()
        headers = [
            (":method", request.method),
            (":path", target),
            (":scheme", "http"),
            (":authority", "127.0.0.1"),
        ] + [(name, value.format(**attrs.asdict(keys))) for name, value in request.headers]
        body = request.body
        self.conn.send_headers(stream, headers, end_stream=not body)
        if body:
            self.conn.send_data(stream, body, end_stream=True)
        self.sock.sendall(self.conn.data_to_send())
        status, got, body = 0, [], b""
        self.error = ""
        buffer = b""
        for _ in range(MAX_READS):
            data = self.sock.recv(65536)
            if not data:
                break
            buffer += data
            done = False
            # One frame at a time, so that a frame h2 refuses (a body on a HEAD response)
            # still leaves the events of the frames before it.
            while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3]):
                size = 9 + int.from_bytes(buffer[:3])
                frame, buffer = buffer[:size], buffer[size:]
                try:
                    events = self.conn.receive_data(frame)
                except h2.exceptions.ProtocolError as exc:
                    self.error, self.kept_alive, done = type(exc).__name__, False, True
                    break
                for event in events:
                    if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream:
                        got = [(str(k), str(v)) for k, v in event.headers]
                        status = int(dict(got)[":status"])
                    elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream:
                        body += event.data
                        self.conn.acknowledge_received_data(event.flow_controlled_length, stream)
                    elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                        done = done or event.stream_id == stream
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        done = True
            if self.error:
                break
            self.sock.sendall(self.conn.data_to_send())
            if done:
                break
        return status, got, body


def outcome(
    status: int,
    headers: list[tuple[str, str]],
    body: bytes,
    reached: bool,
    saw_key: bool,
    error: str = "",
) -> Outcome:
    fields = dict(headers)
    code = None
    if fields.get("content-type", "").startswith("application/json"):
        try:
            code = json.loads(body)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = None
    return Outcome(
        status,
        code,
        (fields.get("service-organization-id"), fields.get("service-tenant-id")),
        reached,
        saw_key,
        body,
        tuple(headers),
        error,
    )


# WSGI servers that hand a target's leading "//" to the app as one "/".
READS_LEADING_SLASHES_AS_ONE: Final = frozenset(
    {"waitress", "django-waitress", "werkzeug", "werkzeug-example", "wsgiref"}
)


def skipped(running: Running, requests: tuple[Request, ...]) -> str:
    """Why this server's column has no cell for these requests ("" when it has one)."""
    if any(r.websocket for r in requests) and not running.server.websocket:
        return f"{running.name} serves no WebSocket in this matrix"
    if any("admin" in r.target for r in requests) and running.server.app not in POLICY_APPS:
        return f"{running.name} serves an app without a role policy"
    if running.server.http2 and any(r.chunked or r.pipelined for r in requests):
        return "chunked bodies and pipelining are HTTP/1.1's"
    if running.name in READS_LEADING_SLASHES_AS_ONE and any(
        r.target.startswith("//") for r in requests
    ):
        # Seen on each: GET //127.0.0.1:PORT/managed-agents/v1/models arrives as PATH_INFO
        # /127.0.0.1:PORT/managed-agents/v1/models, a path no router takes for the API.
        return f"{running.name} reads //host/path as the path /host/path, outside the API"
    prefixed = any(r.target.startswith(PREFIXED_CONSOLE) for r in requests)
    if prefixed and running.server.app not in ("asgi", "fastapi", "postgres"):
        return f"{running.name} mounts no console under the prefix (the Starlette apps do)"
    return ""


def echoed(keys: Keys, outcome: Outcome) -> list[str]:
    """The secrets (or their secret parts) that a response carries anywhere."""
    text = outcome.body.decode("latin-1") + repr(outcome.headers)
    secrets_ = (keys.organization, keys.tenant, keys.typo, keys.basic)
    return [s for s in secrets_ for part in (s, s[-28:]) if part in text]


def pipeline(client: Http1, running: Running, requests: tuple[Request, ...]) -> list[Outcome]:
    """All requests written at once, then the responses read. The app's log cannot say which
    request reached it, so each counts as reached only if the app saw exactly as many
    requests as there are successes; otherwise every one does, and a refusal's check fails.
    """
    before = running.seen()
    for request in requests:
        client.write(request, running.keys)
    answers = []
    for request in requests:  # after a "connection: close", no other answer is to come
        answers.append(client.read(request) if client.kept_alive else (0, [], b""))
    after = running.seen()
    successes = [status == 200 for status, _, _ in answers]
    exact = after[0] - before[0] == sum(successes)
    return [
        outcome(*answer, reached=success or not exact, saw_key=after[1] > before[1])
        for answer, success in zip(answers, successes, strict=True)
    ]


@pytest.mark.parametrize("case", sorted(CASES))
def test_server_matrix(running: Running, case: str) -> None:
    """Each row of the table, sent as raw bytes, under each real server: the outcome the
    spec and issue 10 require, the app reached only when a key was accepted, and no secret
    echoed anywhere in a response.
    """
    requests, check = CASES[case]
    why = skipped(running, requests)
    if why:
        pytest.skip(why)
    client = running.connect()
    outcomes = []
    try:
        if isinstance(client, Http1) and any(r.pipelined for r in requests):
            outcomes = pipeline(client, running, requests)
        for request in requests[len(outcomes) :]:
            if not client.kept_alive:  # the server closes after each response
                client.close()
                client = running.connect()
            before = running.seen()
            status, headers, body = client.exchange(request, running.keys)
            after = running.seen()
            reached, saw_key = after[0] > before[0], after[1] > before[1]
            error = client.error if isinstance(client, Http2) else ""
            outcomes.append(outcome(status, headers, body, reached, saw_key, error))
    finally:
        client.close()
    print(f"{running.name} | {case} | {outcomes!r}")  # the recorded row, shown with -rP
    api = [
        o
        for r, o in zip(requests, outcomes, strict=True)
        if not r.target.startswith((CONSOLE, PREFIXED_CONSOLE))
    ]
    assert not any(o.saw_key for o in api), "the app saw a key"
    assert not any(echoed(running.keys, o) for o in outcomes), "a response echoed a secret"
    for o in outcomes:  # where present, the expiry header names a seeded key's expiry
        assert set(o.values(EXPIRES)) <= set(running.keys.expiries)
    check(running.name, outcomes)
