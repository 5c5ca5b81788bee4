"""What only the WSGI middleware does: PEP 3333 conformance, start_response, iterables."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any
from wsgiref.util import setup_testing_defaults
from wsgiref.validate import validator

import pytest
from flask import Flask, request
from werkzeug.test import Client
from werkzeug.wrappers import Request

from keyturn import MissingPrincipal
from keyturn.wsgi import ApiKeyMiddleware, principal
from tests.web.web_support import MODELS, wsgi_app
from tests.world import World


class Server:
    """The server side of one WSGI call, by PEP 3333: start_response and the body."""

    def __init__(self) -> None:
        self.status = ""
        self.headers: list[tuple[str, str]] = []

    def start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Any:
        if exc_info is not None and self.status:  # nothing is sent yet: replace the response
            exc_info = None
        self.status, self.headers = status, headers
        return lambda data: None

    def call(self, app: Any, path: str, **headers: str) -> bytes:
        environ: dict[str, Any] = {
            "SCRIPT_NAME": "",
            "PATH_INFO": path,
            "QUERY_STRING": "",
            **headers,
        }
        setup_testing_defaults(environ)
        body = app(environ, self.start_response)
        try:
            return b"".join(body)
        finally:
            if hasattr(body, "close"):
                body.close()


@pytest.mark.parametrize(
    ("path", "key", "status"),
    [
        (MODELS, "research", "200 OK"),
        (MODELS, None, "401 Unauthorized"),
        ("/x", None, "404 NOT FOUND"),
    ],
)
def test_passes_wsgiref_validator(world: World, path: str, key: str | None, status: str) -> None:
    """Accepted, refused and passed-through requests all conform to PEP 3333."""
    app = ApiKeyMiddleware(wsgi_app(world), authenticator=world.authenticator())
    headers = {"HTTP_AUTHORIZATION": f"Bearer {world.keys[key]}"} if key else {}
    server = Server()

    server.call(validator(app), path, **headers)

    assert server.status.upper() == status.upper()


def test_exc_info_response_gets_the_headers(world: World) -> None:
    """An app that replaces its response with exc_info still sends the headers, once."""

    def app(environ: Any, start_response: Any) -> Iterable[bytes]:
        start_response("200 OK", [("content-type", "text/plain")])
        try:
            raise RuntimeError("rendering failed")
        except RuntimeError:
            start_response(
                "500 Internal Server Error", [("content-type", "text/plain")], sys.exc_info()
            )
        return [b"failed"]

    middleware = ApiKeyMiddleware(app, authenticator=world.authenticator())
    server = Server()

    server.call(middleware, MODELS, HTTP_AUTHORIZATION=f"Bearer {world.keys['research']}")

    assert server.status == "500 Internal Server Error"
    assert server.headers == [
        ("content-type", "text/plain"),
        ("service-organization-id", "org_research"),
        ("service-tenant-id", "acme"),
    ]


def test_iterable_is_passed_through(world: World) -> None:
    """The app's iterable is returned as is: unbuffered, and its close() still runs."""
    events: list[str] = []

    class Body:
        def __iter__(self) -> Iterator[bytes]:
            events.append("first chunk")
            yield b"a"
            events.append("second chunk")
            yield b"b"

        def close(self) -> None:
            events.append("closed")

    body = Body()

    def app(environ: Any, start_response: Any) -> Body:
        start_response("200 OK", [])
        return body

    middleware = ApiKeyMiddleware(app, authenticator=world.authenticator())
    environ = {"PATH_INFO": MODELS, "HTTP_AUTHORIZATION": f"Bearer {world.keys['research']}"}
    setup_testing_defaults(environ)

    returned = middleware(environ, Server().start_response)
    chunks = iter(returned)
    assert next(chunks) == b"a"
    assert events == ["first chunk"]
    returned.close()  # type: ignore[attr-defined]

    assert returned is body
    assert events == ["first chunk", "closed"]


def test_principal_in_environ(world: World) -> None:
    """The principal sits in environ["keyturn.principal"]; Authorization is stripped."""
    seen: dict[str, Any] = {}

    def app(environ: Any, start_response: Any) -> Iterable[bytes]:
        seen.update(environ)
        start_response("204 No Content", [])
        return []

    middleware = ApiKeyMiddleware(app, authenticator=world.authenticator())
    Server().call(middleware, MODELS, HTTP_AUTHORIZATION=f"Bearer {world.keys['main']}")

    assert principal(seen) is seen["keyturn.principal"]
    assert seen["keyturn.principal"].organization_id == "org_main"
    assert "HTTP_AUTHORIZATION" not in seen


def test_principal_from_werkzeug_and_flask_requests(world: World) -> None:
    """The accessor takes a Werkzeug request and Flask's request proxy."""
    flask = Flask(__name__)

    @flask.get(MODELS)
    def models() -> dict[str, str]:
        return {
            "flask": principal(request).organization_id,
            "werkzeug": principal(Request(request.environ)).organization_id,
        }

    flask.wsgi_app = ApiKeyMiddleware(flask.wsgi_app, authenticator=world.authenticator())  # type: ignore[method-assign]
    reply = flask.test_client().get(
        MODELS, headers={"authorization": f"Bearer {world.keys['main']}"}
    )

    assert reply.json == {"flask": "org_main", "werkzeug": "org_main"}


def test_principal_outside_the_prefix(world: World) -> None:
    """Asking for the principal where the middleware did not authenticate is a clear error."""

    @Request.application
    def app(request: Request) -> Any:
        return principal(request)

    client = Client(ApiKeyMiddleware(app, authenticator=world.authenticator()))
    with pytest.raises(MissingPrincipal, match="outside the middleware's prefix"):
        client.get("/elsewhere")


def test_a_crash_before_responding_is_a_500_with_the_service_headers(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """An app raising before it responds gets a 500 naming the organization, logged."""

    def app(environ: Any, start_response: Any) -> Iterable[bytes]:
        raise RuntimeError("the app broke")

    client = Client(ApiKeyMiddleware(app, authenticator=world.authenticator()))
    reply = client.get(MODELS, headers={"authorization": f"Bearer {world.keys['main']}"})
    assert reply.status_code == 500
    assert reply.headers["service-organization-id"] == "org_main"
    assert reply.headers["service-tenant-id"] == "acme"
    assert "the app broke" in caplog.text


@pytest.mark.parametrize(
    ("header", "value", "status"),
    [
        ("HTTP_AUTHORIZATION", "Bearer {research}, Bearer {research}", "401 Unauthorized"),
        ("HTTP_X_ORGANIZATION_ID", "org_main, org_research", "400 Bad Request"),
    ],
)
def test_merged_headers_are_refused(world: World, header: str, value: str, status: str) -> None:
    """A server's comma-joined repeated header is refused, never split and guessed."""
    app = ApiKeyMiddleware(wsgi_app(world), authenticator=world.authenticator())
    server = Server()
    environ = {"HTTP_AUTHORIZATION": f"Bearer {world.keys['tenant']}"}
    environ[header] = value.format(**world.keys)

    server.call(app, MODELS, **environ)

    assert server.status == status
    assert world.calls == []
