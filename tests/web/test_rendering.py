"""The adapters' lean edges: one header pass, refusals rendered once, shared renderings safe.

A refusal's wire form is built once per distinct refusal and reused (``_web.rendered``); the
properties here hold it to what a fresh rendering of each refusal says, whatever came
before it, and show that a server changing the header list it was given changes nothing
for the next request. The ASGI header scan is held to a plain reading of every line.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from keyturn import Principal, Scope
from keyturn._web import _render, rendered
from keyturn.asgi import ApiKeyMiddleware as AsgiMiddleware
from keyturn.asgi import _read
from keyturn.errors import (
    InvalidRequest,
    NotFound,
    PermissionDenied,
    Reason,
    Refusal,
    ServiceUnavailable,
    Unauthorized,
)
from keyturn.wsgi import ApiKeyMiddleware as WsgiMiddleware
from tests.web.web_support import MODELS
from tests.world import World

NAMES = [
    b"authorization",
    b"Authorization",
    b"AUTHORIZATION",
    b"x-organization-id",
    b"X-Organization-Id",
    b"cache-control",  # the length of authorization
    b"transfer-encoding",  # the length of x-organization-id
    b"host",
    b"accept",
]
LINES = st.lists(st.tuples(st.sampled_from(NAMES), st.binary(max_size=12)).map(tuple), max_size=8)


@settings(max_examples=300, deadline=None)
@given(headers=LINES, strip=st.booleans())
def test_header_scan_reads_every_line_of_both_names(
    headers: list[tuple[bytes, bytes]], strip: bool
) -> None:
    """Every Authorization and x-organization-id line is read, in any case and in order;
    stripping takes out exactly the Authorization lines, and the server's list is left as is.
    """
    server = list(headers)
    scope: dict[str, Any] = {"type": "http", "method": "get", "headers": server}

    request = _read(scope, MODELS, strip)

    def values(name: bytes) -> tuple[str, ...]:
        return tuple(v.decode("latin-1") for n, v in headers if n.lower() == name)

    assert request.authorization == values(b"authorization")
    assert request.organization == values(b"x-organization-id")
    assert (request.method, request.path) == ("GET", MODELS)
    assert server == headers
    kept = [line for line in headers if line[0].lower() != b"authorization"]
    assert scope["headers"] == (kept if strip else headers)


REACHED = Principal(
    account_id="acct_1",
    key_id="k1",
    key_name="n",
    scope=Scope(tenant_id="tenant_1", organization_id=None),
    organization_id="org_1",
    tenant_id="tenant_1",
    role="member",
)
OTHER = Principal(
    account_id="acct_2",
    key_id="k2",
    key_name="n",
    scope=Scope(tenant_id="tenant_2", organization_id=None),
    organization_id="org_2",
    tenant_id="tenant_2",
    role="member",
)


@st.composite
def refusals(draw: st.DrawFn) -> Refusal:
    kind = draw(st.sampled_from([Unauthorized, InvalidRequest, NotFound, PermissionDenied, 0]))
    reason = draw(st.sampled_from(list(Reason)))
    message = draw(st.sampled_from([None, "Send exactly one x-organization-id header."]))
    if kind == 0:
        return ServiceUnavailable(reason, message, retry_after=draw(st.integers(1, 3)))
    assert isinstance(kind, type)
    principal = draw(st.sampled_from([REACHED, OTHER])) if kind is PermissionDenied else None
    return kind(reason, message, principal=principal)


@settings(max_examples=200, deadline=None)
@given(
    seen=st.lists(
        st.tuples(
            refusals(),
            st.sampled_from(["agents-api", "other"]),
            st.sampled_from(["GET", "HEAD", "head", "POST"]),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_a_shared_rendering_is_what_a_fresh_one_says(
    seen: list[tuple[Refusal, str, str]],
) -> None:
    """Whatever was rendered before, each refusal gets exactly its own wire form."""
    for error, realm, method in seen:
        form = rendered(error, realm, method)
        head = method.upper() == "HEAD"
        assert form == _render(error, realm, head)
        assert form.status == error.status
        assert form.headers[0] == ("content-type", "application/json")
        assert [line for line in form.headers if line in error.headers(realm)] == (
            error.headers(realm)
        )
        assert ("content-length", str(len(_render(error, realm, False).body))) in form.headers
        if head:
            assert form.body == b""
        else:
            assert json.loads(form.body) == error.body()


def test_a_server_changing_the_asgi_headers_changes_nothing_next(world: World) -> None:
    """The header list each refusal is sent with is the server's own to change."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("a refused request never reaches the app")

    middleware = AsgiMiddleware(app, authenticator=world.authenticator())
    starts: list[list[tuple[bytes, bytes]]] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            starts.append(list(message["headers"]))
            message["headers"].append((b"date", b"now"))  # as a server or wrapper may

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "method": "GET", "path": MODELS, "root_path": "", "headers": []}
    for _ in range(2):
        asyncio.run(middleware(dict(scope), receive, send))
    assert starts[0] == starts[1]
    assert (b"date", b"now") not in starts[1]


def test_a_server_changing_the_wsgi_headers_changes_nothing_next(world: World) -> None:
    """wsgiref adds its own lines to the list start_response gets: the next refusal has none."""

    def app(environ: Any, start_response: Any) -> list[bytes]:
        raise AssertionError("a refused request never reaches the app")

    middleware = WsgiMiddleware(app, authenticator=world.authenticator())
    starts: list[list[tuple[str, str]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        starts.append(list(headers))
        headers.append(("date", "now"))

    for _ in range(2):
        middleware({"REQUEST_METHOD": "GET", "PATH_INFO": MODELS}, start_response)
    assert starts[0] == starts[1]
    assert ("date", "now") not in starts[1]
