"""The payload guard in both middlewares: bodies holding a key are refused, real keys recorded.

Each test runs against the ASGI middleware (messages sent as a server sends them, in chunks
the test chooses) and the WSGI middleware (a ``wsgi.input`` that hands out the chunks the
test chooses), in front of an app that echoes the body it got.
"""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import io
import json
import logging
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import attrs
import pytest

from keyturn import asgi as keyturn_asgi
from keyturn import wsgi as keyturn_wsgi
from keyturn._core import token as _token
from keyturn._core.scanner import keys_in
from keyturn.activity import Action, Channel
from keyturn.errors import Reason
from keyturn.payload import PayloadGuard
from tests.world import World, WorldKeyStore, make_world

SESSIONS = "/managed-agents/v1/sessions"
ROUTE = "request-body:POST /managed-agents/v1/"  # where a key found is recorded
OUTSIDE = "/healthz"
JSON = "application/json"


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    reads: int  # receive() calls, or wsgi.input reads

    def json(self) -> Any:
        return json.loads(self.body)


def digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


# --- the echo app, twice ------------------------------------------------------------------


def echo_asgi(seen: list[bytes]) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = b""
        for _ in range(100_000):  # bounded: the tests send fewer messages
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        seen.append(body)
        data = json.dumps({"size": len(body), "sha256": digest(body)}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": data})

    return app


def echo_wsgi(seen: list[bytes]) -> Any:
    def app(environ: Any, start_response: Any) -> list[bytes]:
        stream = environ["wsgi.input"]
        length = environ.get("CONTENT_LENGTH")
        body = stream.read(int(length)) if length else stream.read()
        seen.append(body)
        start_response("200 OK", [("content-type", JSON)])
        return [json.dumps({"size": len(body), "sha256": digest(body)}).encode()]

    return app


class Chunks:
    """A ``wsgi.input`` that hands out the given chunks, one per read (a short read for a
    larger one), and counts the reads."""

    def __init__(self, chunks: Sequence[bytes]) -> None:
        self.chunks = [chunk for chunk in chunks if chunk]
        self.reads = 0

    def read(self, size: int = -1) -> bytes:
        self.reads += 1
        if not self.chunks:
            return b""
        chunk = self.chunks.pop(0)
        if 0 <= size < len(chunk):
            chunk, rest = chunk[:size], chunk[size:]
            self.chunks.insert(0, rest)
        return chunk


@attrs.define
class Guarded:
    """One adapter with the guard, its world and the bodies its app received."""

    adapter: str
    world: World
    app: Any
    seen: list[bytes]

    def post(
        self,
        body: bytes | Sequence[bytes],
        *,
        key: str = "research",
        content_type: str | None = JSON,
        path: str = SESSIONS,
        length: bool = True,  # send Content-Length (else: chunked)
    ) -> Reply:
        chunks = [body] if isinstance(body, bytes) else list(body)
        whole = b"".join(chunks)
        headers = [("authorization", f"Bearer {self.world.keys[key]}")] if key else []
        if content_type is not None:
            headers.append(("content-type", content_type))
        if length:
            headers.append(("content-length", str(len(whole))))
        if self.adapter == "asgi":
            return asyncio.run(self._asgi(path, headers, chunks))
        return self._wsgi(path, headers, chunks, length)

    async def _asgi(self, path: str, headers: list[tuple[str, str]], chunks: list[bytes]) -> Reply:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers],
            "server": ("127.0.0.1", 80),
            "client": ("127.0.0.1", 50000),
        }
        pending = list(chunks) or [b""]
        reads = 0
        started: dict[str, Any] = {}
        body = b""

        async def receive() -> dict[str, Any]:
            nonlocal reads
            reads += 1
            if not pending:
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": pending.pop(0), "more_body": bool(pending)}

        async def send(message: dict[str, Any]) -> None:
            nonlocal body
            if message["type"] == "http.response.start":
                assert not started, "a second http.response.start"
                started.update(message)
            else:
                body += message.get("body", b"")

        await self.app(scope, receive, send)
        names = {n.decode("latin-1"): v.decode("latin-1") for n, v in started["headers"]}
        return Reply(started["status"], names, body, reads)

    def _wsgi(
        self, path: str, headers: list[tuple[str, str]], chunks: list[bytes], length: bool
    ) -> Reply:
        stream = Chunks(chunks)
        environ: dict[str, Any] = {
            "REQUEST_METHOD": "POST",
            "SCRIPT_NAME": "",
            "PATH_INFO": path,
            "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "80",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": stream,
            "wsgi.errors": io.StringIO(),
            "wsgi.multithread": False,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
            "wsgi.input_terminated": not length,
        }
        for name, value in headers:
            if name in ("content-type", "content-length"):
                environ[name.upper().replace("-", "_")] = value
            else:
                environ["HTTP_" + name.upper().replace("-", "_")] = value
        started: list[Any] = []

        def start_response(status: str, response_headers: Any, exc_info: Any = None) -> Any:
            started[:] = [int(status.split()[0]), dict(response_headers)]
            return lambda data: None

        body = b"".join(self.app(environ, start_response))
        return Reply(started[0], {k.lower(): v for k, v in started[1].items()}, body, stream.reads)


@pytest.fixture
def world() -> Iterator[World]:
    world = make_world(keys=True)
    yield world
    for authenticator in world.authenticators:
        authenticator.close()


@pytest.fixture(params=["asgi", "wsgi"])
def guarded(request: pytest.FixtureRequest, world: World) -> Any:
    """Build one adapter (asgi, wsgi) with the guard: ``guarded(**guard_options)``."""

    def build(store: Any = None, **options: Any) -> Guarded:
        seen: list[bytes] = []
        authenticator = world.authenticator(**({} if store is None else {"store": store}))
        guard = PayloadGuard(**options)
        if request.param == "asgi":
            app: Any = keyturn_asgi.ApiKeyMiddleware(
                echo_asgi(seen), authenticator=authenticator, payload_guard=guard
            )
        else:
            app = keyturn_wsgi.ApiKeyMiddleware(
                echo_wsgi(seen), authenticator=authenticator, payload_guard=guard
            )
        return Guarded(request.param, world, app, seen)

    return build


def forged(key_id: str) -> str:
    """A key with a real key id, a valid checksum and a secret of its own (a test fixture)."""
    body = _token.PREFIX + key_id + _token.generate().secret
    return body + _token._checksum(body)


def message(key: str) -> bytes:
    return json.dumps({"role": "user", "content": f"Here is my key: {key}. Deploy it."}).encode()


# --- refusals ----------------------------------------------------------------------------


def test_a_real_key_in_a_json_body_is_refused_and_recorded(guarded: Any) -> None:
    """400 key_in_payload in the error shape, with the service headers; the app never runs;
    the key is recorded as leaked with where it was found, and not revoked."""
    site = guarded()
    world = site.world
    leaked = world.keys["main"]

    reply = site.post(message(leaked))

    assert reply.status == 400
    assert reply.json() == {
        "error": {
            "code": "key_in_payload",
            "message": "An API key was found in the request body: remove it and send the "
            "request again. A key belongs only in the Authorization header, never in a prompt "
            "or message.",
        }
    }
    assert reply.headers["content-type"] == JSON
    assert reply.headers["content-length"] == str(len(reply.body))
    assert reply.headers["service-organization-id"] == "org_research"
    assert reply.headers["service-tenant-id"] == "acme"
    assert leaked.encode() not in reply.body
    assert site.seen == []
    key = world.store.get_key(world.key_ids["main"])
    assert key is not None and key.leaked is not None
    assert key.leaked.url == ROUTE  # the guarded route, not the path
    assert key.leaked.at == world.clock.now
    assert key.revoked_at is None
    refused = world.audit[-1]
    assert refused.error.reason is Reason.KEY_IN_PAYLOAD
    assert refused.error.key_id == world.key_ids["research"]  # the sender's key, charged
    assert (refused.method, refused.path) == ("POST", SESSIONS)


def test_the_requests_own_key_in_its_body_is_recorded_too(guarded: Any) -> None:
    """An agent echoing the very key it sends: refused and recorded."""
    site = guarded()
    reply = site.post(message(site.world.keys["research"]))
    assert reply.status == 400
    key = site.world.store.get_key(site.world.key_ids["research"])
    assert key is not None and key.leaked is not None


def test_with_revoke_the_key_found_is_revoked(guarded: Any) -> None:
    """revoke=True: the key found is revoked at once, stops working, and the record of key
    actions says what the guard did."""
    site = guarded(revoke=True)
    world = site.world

    assert site.post(message(world.keys["main"])).status == 400

    key = world.store.get_key(world.key_ids["main"])
    assert key is not None and key.revoked_at == world.clock.now
    assert site.post(b"{}", key="main").status == 401
    events = [e for e in world.manager.activity("alice") if e.key_id == world.key_ids["main"]]
    done = {(e.action, e.actor, e.channel, e.detail) for e in events}
    assert (
        Action.LEAK_REPORTED,
        "payload guard",
        Channel.LIBRARY,
        ROUTE,
    ) in done
    assert (
        Action.AUTO_REVOKED,
        "payload guard",
        Channel.LIBRARY,
        "found in a request body",
    ) in done


def test_a_forgery_of_a_real_key_id_is_refused_but_marks_nothing(guarded: Any) -> None:
    """A checksum-valid key with alice's key id and another secret: refused (it looks like a
    key to whoever reads the body), her key is neither marked leaked nor revoked."""
    site = guarded(revoke=True)
    world = site.world
    fake = forged(world.key_ids["main"])

    reply = site.post(message(fake))

    assert reply.status == 400 and reply.json()["error"]["code"] == "key_in_payload"
    key = world.store.get_key(world.key_ids["main"])
    assert key is not None and key.leaked is None and key.revoked_at is None


def test_an_unknown_key_and_a_typo(guarded: Any) -> None:
    """A key no store holds is refused and records nothing; a mistyped one is no key at all."""
    site = guarded()
    world = site.world
    assert site.post(message(world.keys["unknown"])).status == 400
    typo = site.post(message(world.keys["tenant_typo"]))
    assert typo.status == 200
    assert site.seen == [message(world.keys["tenant_typo"])]
    assert world.store.leaked_keys() == []


def test_the_key_is_never_echoed_nor_logged(guarded: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The log names the key id and where it was found, never the secret."""
    site = guarded()
    leaked = site.world.keys["main"]
    with caplog.at_level(logging.INFO, logger="keyturn"):
        reply = site.post(message(leaked))
    assert reply.status == 400
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert site.world.key_ids["main"] in text
    assert f"the body of 'POST' {SESSIONS!r}" in text
    assert leaked not in text
    assert all(leaked not in value for value in reply.headers.values())


@pytest.mark.parametrize("size", [1, 7, 25, 49, 50, 64])
def test_a_key_split_across_chunks_is_found(guarded: Any, size: int) -> None:
    """A body sent in chunks of any size, the key (plain or escaped) across boundaries."""
    site = guarded()
    key = site.world.keys["main"]
    for body in (message(key), json.dumps({"content": key}, ensure_ascii=True).encode()):
        escaped = body.replace(b"rma_", b"\\u0072ma\\u005f")
        for sent in (body, escaped):
            chunks = [sent[at : at + size] for at in range(0, len(sent), size)]
            for length in (True, False):
                reply = site.post(chunks, length=length)
                assert reply.status == 400, (size, sent, length)
    assert site.seen == []


def test_a_clean_body_reaches_the_app_byte_for_byte(guarded: Any) -> None:
    """No key: the app gets the very bytes sent, however they were chunked."""
    site = guarded()
    body = json.dumps({"content": "rma_ is the prefix of a key \\u0072ma_ " * 500}).encode()
    chunks = [body[at : at + 777] for at in range(0, len(body), 777)]
    for length in (True, False):
        reply = site.post(chunks, length=length)
        assert reply.status == 200
        assert reply.json() == {"size": len(body), "sha256": digest(body)}
    assert site.seen == [body, body]


def test_content_types(guarded: Any) -> None:
    """JSON and +json types and a body without a type are read; other types pass by default,
    and are read when configured."""
    site = guarded()
    body = message(site.world.keys["main"])
    assert site.post(body, content_type="application/json; charset=utf-8").status == 400
    assert site.post(body, content_type="Application/Vnd.Api+JSON").status == 400
    assert site.post(body, content_type=None).status == 400
    assert site.post(body, content_type="text/plain").status == 200
    assert site.post(body, content_type="multipart/form-data; boundary=x").status == 200
    assert site.seen == [body, body]

    everything = guarded(content_types=["*"])
    assert everything.post(body, content_type="text/plain").status == 400
    plain = guarded(content_types=["text/plain"])
    assert plain.post(body, content_type="text/plain").status == 400
    assert plain.post(body, content_type=JSON).status == 200


def test_a_body_longer_than_the_bound_is_refused(guarded: Any) -> None:
    """Past max_bytes: 413 without reading a byte when Content-Length says so, after reading
    the bound when it does not; a key within the bound still gets 400."""
    site = guarded(max_bytes=1000)
    world = site.world
    big = b"[" + b" " * 2000 + b"]"

    declared = site.post(big)
    assert declared.status == 413
    assert declared.json() == {
        "error": {
            "code": "payload_too_large",
            "message": "The request body is longer than the 1000 bytes this API reads: "
            "send a smaller one.",
        }
    }
    assert declared.headers["service-organization-id"] == "org_research"
    assert declared.reads == 0

    streamed = site.post([big[:600], big[600:1200], big[1200:]], length=False)
    assert streamed.status == 413
    assert streamed.reads <= 2

    early_key = message(world.keys["main"]) + b" " * 2000
    assert site.post([early_key[:500], early_key[500:]], length=False).status == 400
    exact = b"[" + b" " * 998 + b"]"
    assert site.post(exact).status == 200
    assert site.seen == [exact]


def test_a_refused_or_unguarded_request_body_is_not_read(guarded: Any) -> None:
    """A request the decision refuses never has its body read; nor one outside the prefix."""
    site = guarded()
    world = site.world
    body = message(world.keys["main"])

    assert site.post(body, key="").status == 401
    assert site.post(body, key="tenant").status == 400  # no x-organization-id
    outside = site.post(body, path=OUTSIDE)
    assert outside.status == 200
    assert world.store.leaked_keys() == []


class FailingLeakStore(WorldKeyStore):
    """The world's store, whose leak record fails like a dropped database."""

    def report_leak(self, key_id: str, url: str, at: datetime) -> bool:
        raise ConnectionError("key store unreachable")


def test_a_failing_store_leaves_the_refusal_standing(
    guarded: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The record fails: still 400, and the failure is logged without the key."""
    store = FailingLeakStore()
    world = make_world(keys=True)
    for name in ("main", "research"):
        key = world.store.get_key(world.key_ids[name])
        assert key is not None
        store.add_key(key)
    site = guarded(store=store)
    site.world.keys = {**site.world.keys, "research": world.keys["research"]}
    leaked = world.keys["main"]
    with caplog.at_level(logging.ERROR, logger="keyturn"):
        reply = site.post(message(leaked))
    assert reply.status == 400
    errors = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert errors == [
        "recording a key found in a request body failed at report_leak: ConnectionError"
    ]
    assert all(record.exc_info is None for record in caplog.records)


def test_the_options_are_checked_at_startup(world: World) -> None:
    """Bad options and a store that cannot record leaks fail when the app is built."""
    with pytest.raises(ValueError, match="max_bytes"):
        PayloadGuard(max_bytes=0)
    with pytest.raises(TypeError, match="content_types"):
        PayloadGuard(content_types="application/json")

    class ReadOnly:
        def get_key(self, key_id: str) -> None:
            return None

    authenticator = world.authenticator(store=ReadOnly())
    with pytest.raises(TypeError, match="report_leak"):
        keyturn_wsgi.ApiKeyMiddleware(
            echo_wsgi([]), authenticator=authenticator, payload_guard=PayloadGuard()
        )
    assert "max_bytes=1048576" in repr(PayloadGuard())


# --- encodings: every one a JSON parser reads ------------------------------------------------

# What json.loads reads from bytes (RFC 8259's detection, and a byte order mark), and so
# Starlette's and FastAPI's request.json(), Flask's get_json() and Django's json.loads.
ENCODINGS = ["utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_key_in_every_encoding_json_reads_is_refused(guarded: Any, encoding: str) -> None:
    """A body a JSON parser reads the key from, in UTF-16 or UTF-32 of either byte order,
    with or without a byte order mark, plain or escaped, cut anywhere: 400."""
    site = guarded()
    key = site.world.keys["main"]
    plain = message(key).decode()
    for text in (plain, plain.replace("rma_", "\\u0072ma\\u005f")):
        body = text.encode(encoding)
        assert key in json.loads(body)["content"]  # what the app's parser reads
        for size in (1, 3, 5, 64, len(body)):
            chunks = [body[at : at + size] for at in range(0, len(body), size)]
            for length in (True, False):
                assert site.post(chunks, length=length).status == 400, (size, length)
    assert site.seen == []


def utf7_hiding(key: str) -> bytes:
    """*key* in a JSON body in UTF-7, its first letter in base64: no ``rma_`` in the bytes."""
    return b'{"content": "+AHI-' + key[1:].encode("ascii") + b'"}'


@pytest.mark.parametrize(
    ("charset", "encode"),
    [
        ("utf-7", utf7_hiding),
        ("cp500", lambda key: json.dumps({"content": key}).encode("cp500")),  # EBCDIC
        ("UTF-16", lambda key: json.dumps({"content": key}).encode("utf-16")),
        ('"utf-32-be"', lambda key: json.dumps({"content": key}).encode("utf-32-be")),
    ],
)
def test_a_key_in_the_declared_charset_is_refused(guarded: Any, charset: str, encode: Any) -> None:
    """The ``charset`` of ``Content-Type`` is how Django REST framework reads a body: a key
    that only that encoding spells is refused too."""
    site = guarded()
    key = site.world.keys["main"]
    body = encode(key)
    assert key in codecs.decode(body, charset.strip('"'))  # what such a parser reads
    content_type = f"application/json; charset={charset}"
    for size in (1, 2, 7, len(body)):
        chunks = [body[at : at + size] for at in range(0, len(body), size)]
        assert site.post(chunks, content_type=content_type).status == 400
    assert site.seen == []


def test_a_charset_no_parser_reads_the_same_is_refused(guarded: Any) -> None:
    """A charset Python does not decode, one that is no text encoding, or two different
    ones (parsers differ on which counts): 400 invalid_request, charged to the sender, and
    the app never runs. The usual spellings of UTF-8 pass."""
    site = guarded()
    world = site.world
    body = b'{"content": "hello"}'
    for charset in ("klingon", "base64", "rot13", "utf-8; charset=utf-16"):
        reply = site.post(body, content_type=f"application/json; charset={charset}")
        assert reply.status == 400, charset
        assert reply.json()["error"] == {
            "code": "invalid_request",
            "message": "The charset of the request body is not one this API reads: send "
            "JSON in UTF-8.",
        }
        assert reply.headers["service-organization-id"] == "org_research"
        assert world.audit[-1].error.reason is Reason.UNREADABLE_BODY
        assert world.audit[-1].error.key_id == world.key_ids["research"]
    assert site.seen == []
    for charset in ("utf-8", '"UTF-8"', "utf8", "latin-1", "us-ascii"):
        assert site.post(body, content_type=f"application/json; charset={charset}").status == 200
    assert len(site.seen) == 5


def test_the_scanner_alone_misses_what_only_a_charset_spells() -> None:
    """The reason the charset is read: the raw bytes of these bodies hold no key."""
    key = _token.generate().token
    assert keys_in(utf7_hiding(key)) == []
    assert keys_in(json.dumps({"content": key}).encode("cp500")) == []


# --- who is charged, and how often audited --------------------------------------------------


def test_a_refusal_is_charged_to_the_sender_never_to_a_key_in_the_body(guarded: Any) -> None:
    """Bodies holding a forgery of alice's key id, a key no store holds and her real key:
    each refusal is one audit event naming the sender's key, counted against the sender as
    key_in_payload and nowhere as accepted; no key found in a body gets a usage row."""
    site = guarded()
    world = site.world
    sender = world.key_ids["research"]
    bodies = [
        message(forged(world.key_ids["main"])),
        message(world.keys["unknown"]),
        message(world.keys["main"]),
        message(forged("AAAAAAAAAAAA")),
    ]
    before = len(world.audit)
    for body in bodies:
        assert site.post(body).status == 400
    events = world.audit[before:]
    assert [(e.allowed, e.error.reason, e.error.key_id) for e in events] == [
        (False, Reason.KEY_IN_PAYLOAD, sender)
    ] * len(bodies)
    assert site.post(b"{}").status == 200
    assert len(world.audit) == before + len(bodies) + 1 and world.audit[-1].allowed
    world.authenticators[-1].close()  # writes the counts out
    counts = {(key_id, outcome): n for (key_id, _, outcome), n in world.store._usage.items()}
    assert counts == {(sender, "key_in_payload"): len(bodies), (sender, "accepted"): 1}


def test_every_guard_refusal_is_audited_once(guarded: Any) -> None:
    """413, and the 400 for a body the guard cannot read: one event each, the sender's."""
    site = guarded(max_bytes=100)
    world = site.world
    before = len(world.audit)
    assert site.post(b"[" + b" " * 200 + b"]").status == 413
    assert site.post(b"{}", content_type="application/json; charset=nope").status == 400
    assert [(e.error.reason, e.error.key_id) for e in world.audit[before:]] == [
        (Reason.PAYLOAD_TOO_LARGE, world.key_ids["research"]),
        (Reason.UNREADABLE_BODY, world.key_ids["research"]),
    ]


# --- WSGI: a Content-Length that int() reads and servers may not ----------------------------


@pytest.mark.parametrize("declared", ["+59", "5_9", " 59", "59 ", "\u0665\u0669", "-0", "0x3b"])
def test_a_content_length_that_is_not_plain_digits_is_refused(world: World, declared: str) -> None:
    """``int()`` reads ``+59``, ``5_9``, `` 59`` and Arabic-Indic digits, and WebOb, Bottle,
    Falcon and plain WSGI apps read that many bytes: the guard cannot know how many the app
    will read, so the request gets 400, never the app."""
    seen: list[bytes] = []
    app = keyturn_wsgi.ApiKeyMiddleware(
        echo_wsgi(seen), authenticator=world.authenticator(), payload_guard=PayloadGuard()
    )
    site = Guarded("wsgi", world, app, seen)
    body = message(world.keys["main"])
    headers = [
        ("authorization", f"Bearer {world.keys['research']}"),
        ("content-type", JSON),
        ("content-length", declared),
    ]
    reply = site._wsgi(SESSIONS, headers, [body], True)
    assert reply.status == 400
    assert reply.json()["error"] == {
        "code": "invalid_request",
        "message": "The Content-Length header is not a number of bytes: send its digits only.",
    }
    assert reply.headers["service-organization-id"] == "org_research"
    assert seen == []
    assert world.audit[-1].error.reason is Reason.UNREADABLE_BODY
