"""Bodies, attacked: every encoding a framework's JSON parser reads, and the Content-Length
values ``int()`` reads.

The apps are real frameworks (Starlette, Flask, Django, and a plain WSGI app that reads
``int(CONTENT_LENGTH)`` bytes as WebOb, Bottle and Falcon do) behind the payload guard; each
parses the body as its framework does and keeps what it parsed. Whatever the spelling, the
app never parses a key: the request is refused first.
"""

from __future__ import annotations

import io
import json
import re
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any

import flask
import pytest
from django.http import HttpRequest, JsonResponse
from django.test import Client as DjangoClient
from django.test import override_settings
from django.urls import path
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from keyturn import asgi as keyturn_asgi
from keyturn import wsgi as keyturn_wsgi
from keyturn.payload import PayloadGuard
from tests import django_project  # noqa: F401  (configures Django for this process)
from tests.world import World

SESSIONS = "/managed-agents/v1/sessions"
EXAMPLES = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
parsed: list[str] = []  # what the apps parsed, as JSON text: no key may be in it

# (encoding of the body, the Content-Type it is sent with): what a JSON parser reads,
# by detection (json.loads of bytes) or by the declared charset (Django REST framework).
SPELLINGS = [
    ("utf-8", "application/json"),
    ("utf-8-sig", "application/json"),
    ("utf-8", None),
    ("utf-16", "application/json"),
    ("utf-16-le", "application/json"),
    ("utf-16-be", "application/vnd.api+json"),
    ("utf-32", "application/json"),
    ("utf-32-le", "application/json"),
    ("utf-32-be", "application/json"),
    ("utf-16-le", "application/json; charset=utf-16-le"),
    ("utf-7", "application/json; charset=utf-7"),
    ("cp500", "application/json; charset=cp500"),
    ("cp1140", 'application/json; charset="IBM01140"'),
]


def escaped(key: str, positions: set[int]) -> str:
    """*key* as JSON text, the characters at *positions* written as \\u escapes."""
    return "".join(f"\\u{ord(c):04x}" if i in positions else c for i, c in enumerate(key))


# --- the apps: each parses as its framework does -------------------------------------------

Post = Callable[[bytes, str | None], int]  # (body, content type) -> status


def starlette_post(world: World) -> Iterator[Post]:
    async def sessions(request: Request) -> JSONResponse:
        parsed.append(json.dumps(await request.json()))
        return JSONResponse({})

    app = keyturn_asgi.ApiKeyMiddleware(
        Starlette(routes=[Route(SESSIONS, sessions, methods=["POST"])]),
        authenticator=world.authenticator(),
        payload_guard=PayloadGuard(),
    )
    with TestClient(app) as client:

        def post(body: bytes, content_type: str | None) -> int:
            headers = {"authorization": f"Bearer {world.keys['research']}"}
            if content_type is not None:
                headers["content-type"] = content_type
            return client.post(SESSIONS, content=body, headers=headers).status_code

        yield post


def flask_post(world: World) -> Iterator[Post]:
    app = flask.Flask(__name__)

    @app.post(SESSIONS)
    def sessions() -> dict[str, Any]:
        parsed.append(json.dumps(flask.request.get_json(force=True)))
        return {}

    app.wsgi_app = keyturn_wsgi.ApiKeyMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, authenticator=world.authenticator(), payload_guard=PayloadGuard()
    )
    client = app.test_client()

    def post(body: bytes, content_type: str | None) -> int:
        headers = {"authorization": f"Bearer {world.keys['research']}"}
        if content_type is not None:
            headers["content-type"] = content_type
        return client.post(SESSIONS, data=body, headers=headers).status_code

    yield post


def django_sessions(request: HttpRequest) -> JsonResponse:
    try:
        parsed.append(json.dumps(json.loads(request.body)))
    except ValueError:  # a body cut short by the length Django read: kept as it came
        parsed.append(request.body.decode("latin-1"))
        return JsonResponse({}, status=422)
    return JsonResponse({})


urlpatterns = [path(SESSIONS[1:], django_sessions)]


def django_post(world: World) -> Iterator[Post]:
    with override_settings(
        ROOT_URLCONF=__name__,
        MIDDLEWARE=["keyturn.django.ApiKeyMiddleware"],
        KEYTURN={"AUTHENTICATOR": world.authenticator(), "PAYLOAD_GUARD": True},
    ):
        client = DjangoClient()

        def post(body: bytes, content_type: str | None, **meta: str) -> int:
            headers = {"authorization": f"Bearer {world.keys['research']}"}
            return client.generic(
                "POST", SESSIONS, body, content_type or "", headers=headers, **meta
            ).status_code

        yield post


APPS = {"starlette": starlette_post, "flask": flask_post, "django": django_post}


@pytest.fixture(params=sorted(APPS))
def post(request: pytest.FixtureRequest, world: World) -> Iterator[Post]:
    parsed.clear()
    yield from APPS[request.param](world)


def holds_key(world: World) -> bool:
    return any(key in text for text in parsed for key in world.keys.values())


@EXAMPLES
@given(
    spelling=st.sampled_from(SPELLINGS),
    which=st.sampled_from(["main", "tenant", "unknown"]),
    positions=st.sets(st.integers(0, 49), max_size=5),
    before=st.text(alphabet=st.characters(codec="latin-1", exclude_categories=["Cs"])),
)
def test_a_key_in_any_body_a_parser_reads_never_reaches_it(
    post: Post,
    world: World,
    spelling: tuple[str, str | None],
    which: str,
    positions: set[int],
    before: str,
) -> None:
    """A key, plain or escaped, after any text, in a JSON body in any encoding the app's
    parser reads it in: 400 key_in_payload, and the app parses nothing."""
    encoding, content_type = spelling
    text = '{"content": "' + json.dumps(before)[1:-1] + escaped(world.keys[which], positions)
    body = (text + '"}').encode(encoding, "backslashreplace")
    assert post(body, content_type) == 400
    assert parsed == []


# --- Content-Length values int() reads --------------------------------------------------------


# What int() strips around a number, and the digits it reads, of every script.
def _stripped(space: str) -> bool:
    try:
        return int(f"{space}1{space}") == 1
    except ValueError:
        return False


SPACES = [chr(c) for c in range(0x110000) if chr(c).isspace() and _stripped(chr(c))]
DIGITS = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Nd"]


@st.composite
def int_readable(draw: st.DrawFn, below: int = 0x110000, most: int = 4) -> str:
    """A text int() reads as a length that is not plain ASCII digits, of characters below
    *below* (0x100: what a WSGI environ's latin-1 text can hold)."""
    digits = st.sampled_from([d for d in DIGITS if ord(d) < below])
    spaces = st.text(alphabet=st.sampled_from([c for c in SPACES if ord(c) < below]), max_size=2)
    chosen = draw(st.lists(digits, min_size=1, max_size=most))
    joined = chosen[0] + "".join(("_" if draw(st.booleans()) else "") + d for d in chosen[1:])
    text = draw(spaces) + draw(st.sampled_from(["", "+", "-"])) + joined + draw(spaces)
    if re.fullmatch(r"[0-9]+", text, re.ASCII):
        text = "+" + text
    int(text)  # what WebOb, Bottle, Falcon and plain WSGI apps call
    return text


def plain_wsgi(world: World) -> Any:
    """A WSGI app that reads int(CONTENT_LENGTH) bytes of its input and parses them."""

    def app(environ: Any, start_response: Any) -> list[bytes]:
        length = int(environ["CONTENT_LENGTH"])
        parsed.append(environ["wsgi.input"].read(max(0, length)).decode("latin-1"))
        start_response("200 OK", [("content-type", "application/json")])
        return [b"{}"]

    return keyturn_wsgi.ApiKeyMiddleware(
        app, authenticator=world.authenticator(), payload_guard=PayloadGuard()
    )


@EXAMPLES
@given(length=int_readable())
def test_a_content_length_int_reads_fails_closed_on_wsgi(world: World, length: str) -> None:
    """WSGI: 400 invalid_request before the app, whichever length int() would read."""
    parsed.clear()
    app = plain_wsgi(world)
    body = json.dumps({"content": world.keys["main"]}).encode()
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": SESSIONS,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": length,
        "HTTP_AUTHORIZATION": f"Bearer {world.keys['research']}",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": io.StringIO(),
        "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0),
        "wsgi.multithread": False,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    answer: list[str] = []
    reply = b"".join(app(environ, lambda status, headers: answer.append(status)))
    assert answer == ["400 Bad Request"], length
    assert json.loads(reply)["error"]["code"] == "invalid_request"
    assert parsed == []


@EXAMPLES
@given(length=int_readable(below=0x100, most=2))
def test_django_reads_what_the_guard_reads_whatever_the_length(world: World, length: str) -> None:
    """Django reads the body its own way (int() of CONTENT_LENGTH, or nothing), and the guard
    scans that very body: the view never parses a key."""
    parsed.clear()
    body = json.dumps({"content": world.keys["main"]}).encode()
    assume(0 <= int(length) <= len(body))  # Django's test client sends no more than it has
    for post in django_post(world):
        status = post(body, "application/json", CONTENT_LENGTH=length)  # type: ignore[call-arg]
        assert status in (400, 422) and not holds_key(world), (length, status)
