"""The secret-scanning endpoint: signature first, then checksum, lookup and hash per candidate.

Every report is signed here with an ECDSA P-256 key the test generates; nothing reaches the
network. The stores are real (memory, and SQLite for the command line).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st
from werkzeug.test import Client

from keyturn import ApiKey, Authenticator, AuthRequest, KeyManager, Leaked, Reason, Scope, Status
from keyturn._core import token as _token
from keyturn.cli import main
from keyturn.errors import Refusal
from keyturn.leaks import (
    ASGILeakEndpoint,
    LeakReport,
    LeakResponder,
    WSGILeakEndpoint,
    github_public_keys,
)
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from keyturn.stores.sqlite import SQLiteDatabase
from tests.legacy import legacy_hash, legacy_runs
from tests.servers.loopback import serve_uvicorn, serve_waitress

NOW = datetime(2026, 11, 24, 6, 30, tzinfo=UTC)
URL = "https://github.com/octo/app/blob/5f2c/.env"
PATH = "/keyturn/secret-scanning"
IDENTIFIER = "test-signing-key-1"
SIGNING_KEY = ec.generate_private_key(ec.SECP256R1())
PEM = (
    SIGNING_KEY.public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    .decode("ascii")
)


class CountingStore(MemoryKeyStore):
    """A memory store that counts lookups, to show which candidates reach the store."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    def get_key(self, key_id: str) -> ApiKey | None:
        self.lookups += 1
        return super().get_key(key_id)


class World:
    def __init__(self, **options: Any) -> None:
        self.store = CountingStore()
        self.membership = MemoryMembership()
        self.membership.add_organization("org_acme", tenant_id="acme", default=True)
        self.membership.add_member("alice", "org_acme", role="admin")
        self.manager = KeyManager(self.store, self.membership, clock=lambda: NOW)
        self.created = self.manager.create("alice", name="deploys", scope=Scope.tenant("acme"))
        self.reports: list[LeakReport] = []
        options.setdefault("on_leak", self.reports.append)
        self.responder = LeakResponder(
            self.store, public_keys={IDENTIFIER: PEM}, clock=lambda: NOW, **options
        )
        self.client = Client(WSGILeakEndpoint(responder=self.responder, path=PATH))

    @property
    def key_id(self) -> str:
        return self.created.info.key_id

    def post(self, body: bytes, headers: dict[str, str] | None = None) -> Any:
        return self.client.post(
            PATH, data=body, headers=signed(body) if headers is None else headers
        )

    def leaked(self) -> Leaked | None:
        return self.manager.list("alice")[0].leaked


def signed(body: bytes, key: ec.EllipticCurvePrivateKey = SIGNING_KEY) -> dict[str, str]:
    signature = key.sign(body, ec.ECDSA(hashes.SHA256()))
    return {
        "Github-Public-Key-Identifier": IDENTIFIER,
        "Github-Public-Key-Signature": base64.b64encode(signature).decode("ascii"),
    }


def batch(*tokens: str, url: str = URL) -> bytes:
    return json.dumps(
        [{"token": t, "type": "keyturn_api_key", "url": url, "source": "content"} for t in tokens]
    ).encode()


def sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def wrong_secret(token: str) -> str:
    """The same key id with another secret, with a valid checksum."""
    other = _token.generate()
    body = token[: _token.TOKEN_LENGTH - _token.CHECKSUM_LENGTH - _token.SECRET_LENGTH]
    body += other.secret
    return body + _token._checksum(body)


def test_a_real_key_is_a_true_positive_recorded_and_handed_to_the_hook() -> None:
    """The answer labels the key, the key shows the report, the hook gets it; no revocation."""
    world = World()
    response = world.post(batch(world.created.secret))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json == [
        {
            "token_hash": sha256(world.created.secret),
            "token_type": "keyturn_api_key",
            "label": "true_positive",
        }
    ]
    assert world.leaked() == Leaked(url=URL, at=NOW)
    assert world.manager.list("alice")[0].status is Status.ACTIVE
    (report,) = world.reports
    assert (report.key_id, report.account_id, report.url, report.source) == (
        world.key_id,
        "alice",
        URL,
        "content",
    )
    assert (report.first, report.revoked, report.hint) == (True, False, world.created.info.hint)
    assert world.created.secret not in repr(report)


def test_a_second_report_answers_again_but_keeps_the_first() -> None:
    """Reported twice: both answers are true positives; the key keeps the first URL."""
    world = World()
    world.post(batch(world.created.secret))
    response = world.post(batch(world.created.secret, url="https://gist.example/2"))
    assert response.json[0]["label"] == "true_positive"
    assert world.leaked() == Leaked(url=URL, at=NOW)
    assert [report.first for report in world.reports] == [True, False]


def test_revoke_true_revokes_and_authentication_then_refuses() -> None:
    """With revoke=True the leaked key is revoked at once, and the next request is refused."""
    world = World(revoke=True)
    assert world.post(batch(world.created.secret)).json[0]["label"] == "true_positive"
    assert world.reports[0].revoked is True
    assert world.manager.list("alice")[0].status is Status.REVOKED
    with Authenticator(world.store, world.membership) as auth:
        outcome = auth.authenticate(AuthRequest(authorization=(f"Bearer {world.created.secret}",)))
    assert isinstance(outcome, Refusal) and outcome.reason is Reason.REVOKED


def test_false_positives_junk_never_reaches_the_store() -> None:
    """Junk and typos are answered without a lookup; a wrong secret or unknown id is false."""
    world = World()
    typo = world.created.secret[:-1] + ("A" if world.created.secret[-1] != "A" else "B")
    response = world.post(batch("not a key", typo, "rma_" + "x" * 46))
    assert [a["label"] for a in response.json] == ["false_positive"] * 3
    assert world.store.lookups == 0
    unknown = _token.generate().token
    response = world.post(batch(unknown, wrong_secret(world.created.secret)))
    assert [a["label"] for a in response.json] == ["false_positive"] * 2
    assert world.store.lookups == 2
    assert world.leaked() is None and world.reports == []


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Github-Public-Key-Identifier": IDENTIFIER}, 401),
        ({"Github-Public-Key-Identifier": IDENTIFIER, "Github-Public-Key-Signature": "%%%"}, 401),
        ({"Github-Public-Key-Identifier": "unknown", "Github-Public-Key-Signature": "AAAA"}, 403),
    ],
)
def test_missing_or_unknown_signature_is_refused_unprocessed(
    headers: dict[str, str], status: int
) -> None:
    """Without a usable signature nothing is parsed, looked up or recorded."""
    world = World()
    response = world.post(batch(world.created.secret), headers=headers)
    assert response.status_code == status
    assert response.json["error"]["code"] in ("unauthorized", "forbidden")
    assert (world.store.lookups, world.leaked(), world.reports) == (0, None, [])


def test_a_signature_by_another_key_or_over_another_body_is_refused() -> None:
    """A forged signature or a tampered body gets 403 and changes nothing."""
    world = World()
    body = batch(world.created.secret)
    forged = signed(body, ec.generate_private_key(ec.SECP256R1()))
    assert world.post(body, headers=forged).status_code == 403
    tampered = body.replace(b"content", b"commit!")
    assert world.post(tampered, headers=signed(body)).status_code == 403
    assert (world.store.lookups, world.leaked()) == (0, None)


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"\xff\xfe",
        b'{"token": "x"}',
        b'[{"token": "x", "type": "t"}]',
        b'[{"token": 1, "type": "t", "url": "u"}]',
        b'[{"token": "x", "type": "t", "url": "u", "source": 3}]',
        b"[1]",
        b'[{"token": "\\ud800", "type": "t", "url": "u"}]',
        b'[{"token": "x", "type": "t", "url": "\\udfff"}]',
    ],
)
def test_malformed_reports_get_400(body: bytes) -> None:
    """A signed body that is not an array of candidates is refused whole, with a JSON error."""
    world = World()
    response = world.post(body)
    assert response.status_code == 400
    assert response.json["error"]["code"] == "invalid_request"


@pytest.mark.parametrize("edge", ["wsgi", "asgi"])
def test_deeply_nested_json_gets_the_documented_400(edge: str) -> None:
    """A validly signed body of JSON nested far deeper than the stack is a 400 saying so,
    never a RecursionError (an ASGI 500, or a WSGI app raising).
    """
    world = World()
    body = b"[" * 200_000 + b"]" * 200_000
    if edge == "wsgi":
        response = world.post(body)
        status, error = response.status_code, response.json["error"]
    else:
        app = ASGILeakEndpoint(responder=world.responder, path=PATH)

        async def post() -> httpx.Response:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                return await client.post(PATH, content=body, headers=signed(body))

        answer = asyncio.run(post())
        status, error = answer.status_code, answer.json()["error"]

    assert status == 400
    assert error == {
        "code": "invalid_request",
        "message": "The body nests JSON too deeply: send an array of candidates.",
    }


def test_a_bad_candidate_refuses_the_whole_batch() -> None:
    """All or nothing: a real key before a malformed candidate is not recorded."""
    world = World()
    body = json.dumps(
        [{"token": world.created.secret, "type": "t", "url": URL}, {"token": "x"}]
    ).encode()
    assert world.post(body).status_code == 400
    assert world.leaked() is None


def test_size_method_and_path_limits() -> None:
    """Too large is 413 before reading; GET is 405; other paths are 404 without an app."""
    world = World(max_body=100)
    big = batch(world.created.secret, url="https://x.example/" + "a" * 200)
    assert world.post(big).status_code == 413
    response = world.client.get(PATH)
    assert (response.status_code, response.headers["allow"]) == (405, "POST")
    assert world.client.post("/elsewhere", data=b"[]").status_code == 404


def test_the_endpoint_refuses_to_sit_under_the_api_prefix() -> None:
    """The code host sends no API key: a path under /managed-agents/v1/ is a startup error."""
    responder = World().responder
    for path in ("/managed-agents/v1/leaks", "/managed-agents/v1", "//managed-agents/v1/x"):
        with pytest.raises(ValueError, match="must not sit under"):
            WSGILeakEndpoint(responder=responder, path=path)
        with pytest.raises(ValueError, match="must not sit under"):
            ASGILeakEndpoint(responder=responder, path=path)


def test_other_requests_reach_the_wrapped_app() -> None:
    """Wrapped around an app, only the endpoint's path is answered by it."""
    world = World()

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("content-type", "text/plain")])
        return [b"app"]

    client = Client(WSGILeakEndpoint(app, responder=world.responder, path=PATH))
    assert client.get("/health").data == b"app"
    body = batch(world.created.secret)
    assert client.post(PATH, data=body, headers=signed(body)).json[0]["label"] == "true_positive"


class FailingStore(MemoryKeyStore):
    def get_key(self, key_id: str) -> ApiKey | None:
        raise ConnectionError("database down")


def test_a_failing_store_is_503_and_a_failing_hook_is_only_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The code host retries a 503; the hook's failure never changes a recorded answer."""
    world = World()
    responder = LeakResponder(FailingStore(), public_keys={IDENTIFIER: PEM})
    body = batch(world.created.secret)
    response = Client(WSGILeakEndpoint(responder=responder)).post(
        "/keyturn/secret-scanning", data=body, headers=signed(body)
    )
    assert (response.status_code, response.headers["retry-after"]) == (503, "60")

    def broken(report: LeakReport) -> None:
        raise RuntimeError("mail server down")

    world = World(on_leak=broken)
    with caplog.at_level(logging.INFO, logger="keyturn"):
        assert world.post(batch(world.created.secret)).json[0]["label"] == "true_positive"
    assert world.leaked() == Leaked(url=URL, at=NOW)
    assert "on_leak hook failed" in caplog.text
    assert world.created.secret not in caplog.text
    assert world.created.secret[4:] not in caplog.text


class WrongStore(MemoryKeyStore):
    def get_key(self, key_id: str) -> ApiKey | None:
        return "a row"  # type: ignore[return-value]


def test_a_store_answer_of_the_wrong_type_is_503_naming_the_method(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store that answers nonsense fails closed, and the log says which method did."""
    world = World()
    body = batch(world.created.secret)
    responder = LeakResponder(WrongStore(), public_keys={IDENTIFIER: PEM})
    with caplog.at_level(logging.ERROR, logger="keyturn"):
        response = Client(WSGILeakEndpoint(responder=responder)).post(
            PATH, data=body, headers=signed(body)
        )
    assert response.status_code == 503
    assert "store.get_key answered a str" in caplog.text


def test_public_keys_from_a_callable_and_from_github_s_document() -> None:
    """A callable answers per identifier (None: unknown, raising: 503); the document parses."""
    world = World()
    document = json.dumps(
        {"public_keys": [{"key_identifier": IDENTIFIER, "key": PEM, "is_current": True}]}
    )
    assert github_public_keys(document) == {IDENTIFIER: PEM}
    with pytest.raises(ValueError, match="public keys document"):
        github_public_keys("[]")
    body = batch(world.created.secret)
    for keys, status in (
        ({IDENTIFIER: PEM}.get, 200),
        (lambda identifier: None, 403),
        (lambda identifier: "not a pem", 503),
        (lambda identifier: 1 / 0, 503),
        (lambda identifier: 42, 503),
    ):
        responder = LeakResponder(world.store, public_keys=keys)
        client = Client(WSGILeakEndpoint(responder=responder))
        assert client.post(PATH, data=body, headers=signed(body)).status_code == status


def test_a_bad_configured_key_is_a_startup_error() -> None:
    """A mapping's PEM is loaded at construction: a wrong key type is said at once."""
    p384 = ec.generate_private_key(ec.SECP384R1()).public_key()
    pem = p384.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(ValueError, match="P-256"):
        LeakResponder(MemoryKeyStore(), public_keys={"k": pem})

    async def hook(report: LeakReport) -> None: ...

    with pytest.raises(TypeError, match="plain function"):
        LeakResponder(MemoryKeyStore(), public_keys={}, on_leak=hook)
    with pytest.raises(TypeError, match="report_leak"):
        LeakResponder(object(), public_keys={})  # type: ignore[arg-type]


def test_the_asgi_endpoint_answers_like_the_wsgi_one() -> None:
    """Over ASGI: the same answer and record, a streamed oversize body 413, other paths 404."""
    world = World()
    app = ASGILeakEndpoint(responder=world.responder, path=PATH)
    body = batch(world.created.secret)

    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:

            async def chunks() -> Any:
                for _ in range(40):
                    yield b"x" * 40_000

            return [
                await client.post(PATH, content=body, headers=signed(body)),
                await client.post(PATH, content=chunks(), headers=signed(b"")),
                await client.get("/other"),
                await client.put(PATH, content=body),
            ]

    answer, oversize, other, put = asyncio.run(scenario())
    assert answer.json()[0]["label"] == "true_positive"
    assert world.leaked() == Leaked(url=URL, at=NOW)
    assert [oversize.status_code, other.status_code, put.status_code] == [413, 404, 405]


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300) | st.recursive(st.none() | st.text(), st.lists).map(
    lambda value: json.dumps(value).encode()
))  # fmt: skip
def test_any_signed_body_gets_200_or_400_never_an_error(body: bytes) -> None:
    """Whatever a signed body holds, the answer is a JSON 200 or 400."""
    world = World()
    response = world.post(body)
    assert response.status_code in (200, 400)
    assert isinstance(response.json, list | dict)


def test_leaked_keys_on_sqlite_and_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A report on a real SQLite store shows in `keyturn keys leaked`, table and JSON."""
    path = tmp_path / "keyturn.sqlite3"
    with SQLiteDatabase(path) as db:
        db.membership.add_organization("org_acme", tenant_id="acme", default=True)
        db.membership.add_member("alice", "org_acme", role="admin")
        created = KeyManager(db.keys, db.membership).create(
            "alice", name="deploys", scope=Scope.tenant("acme")
        )
        responder = LeakResponder(db.keys, public_keys={IDENTIFIER: PEM}, clock=lambda: NOW)
        body = batch(created.secret, url="https://x.example/\x1b[31mred")
        response = Client(WSGILeakEndpoint(responder=responder)).post(
            PATH, data=body, headers=signed(body)
        )
        assert response.json[0]["label"] == "true_positive"
    store = f"sqlite:///{path}"
    assert main(["--store", store, "keys", "leaked"]) == 0
    out = capsys.readouterr().out
    assert created.info.key_id in out and "2026-11-24 06:30:00 UTC" in out
    assert "\x1b" not in out and "https://x.example/\ufffd[31mred" in out
    assert created.secret not in out
    assert main(["--store", store, "keys", "leaked", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["key_id"] == created.info.key_id and entry["account_id"] == "alice"
    assert entry["reported_at"] == "2026-11-24T06:30:00+00:00" and entry["revoked_at"] is None


def test_no_leak_reported_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty list is a sentence, not an empty table."""
    store = f"sqlite:///{tmp_path}/k.sqlite3"
    assert main(["--store", store, "db", "init"]) == 0
    assert main(["--store", store, "keys", "leaked"]) == 0
    assert capsys.readouterr().out.endswith("No key has been reported leaked.\n")


class AsyncStore:
    """An async key store over a memory one; its lookups can be made to hang."""

    def __init__(self, store: MemoryKeyStore, *, hang: bool = False) -> None:
        self.store, self.hang = store, hang

    async def get_key(self, key_id: str) -> ApiKey | None:
        if self.hang:
            await asyncio.sleep(30)
        return self.store.get_key(key_id)

    async def report_leak(self, key_id: str, url: str, at: datetime) -> bool:
        return self.store.report_leak(key_id, url, at)

    async def revoke_key(self, key_id: str, at: datetime) -> bool:
        return self.store.revoke_key(key_id, at)


def asgi_post(app: Any, body: bytes, headers: dict[str, str], **scope: Any) -> httpx.Response:
    async def scenario() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, **scope)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post(PATH, content=body, headers=headers)

    return asyncio.run(scenario())


def test_an_async_store_is_awaited_and_a_hanging_one_is_503() -> None:
    """Over ASGI an async store's calls are awaited, and bounded by the timeout."""
    world = World()
    body = batch(world.created.secret)
    responder = LeakResponder(
        AsyncStore(world.store), public_keys={IDENTIFIER: PEM}, on_leak=world.reports.append
    )
    with pytest.raises(TypeError, match="ASGI"):
        WSGILeakEndpoint(responder=responder)
    with pytest.raises(TypeError, match="respond_async"):
        responder.respond("POST", {}, body)
    answer = asgi_post(ASGILeakEndpoint(responder=responder), body, signed(body))
    assert answer.json()[0]["label"] == "true_positive"
    assert world.leaked() is not None and len(world.reports) == 1
    hanging = LeakResponder(
        AsyncStore(world.store, hang=True), public_keys={IDENTIFIER: PEM}, timeout=0.05
    )
    assert asgi_post(ASGILeakEndpoint(responder=hanging), body, signed(body)).status_code == 503


def test_the_asgi_endpoint_passes_other_traffic_to_its_app_and_honours_root_path() -> None:
    """Other paths reach the app; under a root_path the endpoint's path is the routed one."""
    world = World()
    calls: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        calls.append(scope["path"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    endpoint = ASGILeakEndpoint(app, responder=world.responder, path=PATH)
    body = batch(world.created.secret)
    mounted = asgi_post(endpoint, body, signed(body), root_path="/svc")
    assert mounted.json()[0]["label"] == "true_positive"

    async def other() -> int:
        transport = httpx.ASGITransport(app=endpoint)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return (await client.get("/health")).status_code

    assert asyncio.run(other()) == 204 and calls == ["/health"]


def test_a_bare_asgi_endpoint_completes_the_lifespan() -> None:
    """Served alone, the endpoint answers lifespan startup and shutdown."""
    app = ASGILeakEndpoint(responder=World().responder)
    sent: list[dict[str, Any]] = []
    inbox = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]

    async def receive() -> dict[str, Any]:
        return inbox.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app({"type": "lifespan"}, receive, send))
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def test_a_chunked_wsgi_body_is_bounded_too() -> None:
    """Without Content-Length, a server-terminated stream is read up to the limit, no further."""
    world = World(max_body=200)
    small, big = batch(world.created.secret), b"[" + b" " * 500 + b"]"
    for body, status in ((small, 200), (big, 413)):
        environ = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": PATH,
            "wsgi.input": io.BytesIO(body),
            "wsgi.input_terminated": True,
            **{f"HTTP_{k.upper().replace('-', '_')}": v for k, v in signed(body).items()},
        }
        started: list[str] = []
        endpoint = WSGILeakEndpoint(responder=world.responder, path=PATH)
        endpoint(environ, lambda line, headers, seen=started: seen.append(line))
        assert started[0].startswith(str(status))


@pytest.mark.parametrize("server", ["uvicorn", "waitress"])
def test_over_real_http_on_loopback(server: str) -> None:
    """Under uvicorn (ASGI) and waitress (WSGI): answered, oversize 413, unsigned 401."""
    world = World(max_body=4096)
    if server == "uvicorn":
        serving = serve_uvicorn(ASGILeakEndpoint(responder=world.responder, path=PATH))
    else:
        serving = serve_waitress(WSGILeakEndpoint(responder=world.responder, path=PATH))
    body = batch(world.created.secret)
    for port in serving:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            answered = client.post(PATH, content=body, headers=signed(body))
            oversize = client.post(PATH, content=b"[" + b" " * 5000 + b"]")
            unsigned = client.post(PATH, content=body)
    assert answered.json()[0]["label"] == "true_positive"
    assert [oversize.status_code, unsigned.status_code] == [413, 401]
    assert world.leaked() == Leaked(url=URL, at=NOW)


def test_a_candidate_of_a_key_with_a_legacy_hash_is_checked_as_a_request_s_key() -> None:
    """A key still holding an argon2id hash from before SHA-256 is recognised (argon2 once
    per process), and a forged secret for its id is a false positive."""
    probe = World()
    key_id, secret = _token.split(probe.created.secret)
    stored = probe.store.get_key(key_id)
    assert stored is not None
    assert probe.store.upgrade_hash(key_id, stored.secret_hash, legacy_hash(secret))
    responder = LeakResponder(probe.store, public_keys={IDENTIFIER: PEM}, clock=lambda: NOW)
    client = Client(WSGILeakEndpoint(responder=responder, path=PATH))
    forged_body = _token.PREFIX + key_id + "F" * _token.SECRET_LENGTH
    forged = batch(forged_body + _token._checksum(forged_body))
    body = batch(probe.created.secret)
    runs = legacy_runs()
    assert client.post(PATH, data=forged, headers=signed(forged)).json[0]["label"] == (
        "false_positive"
    )
    for _ in range(2):
        answer = client.post(PATH, data=body, headers=signed(body))
        assert answer.json[0]["label"] == "true_positive"
    assert legacy_runs() == runs + 2  # the forgery's run, and the key's one
