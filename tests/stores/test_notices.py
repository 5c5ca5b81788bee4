"""Lifecycle notices: due once per key and notice, delivered by real SMTP and HTTP servers on
loopback, and claimed once by several processes at once on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email import message_from_bytes, policy
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from werkzeug.test import Client as WerkzeugClient

from keyturn import Authenticator, KeyManager, Lifetime, Scope, Status
from keyturn.activity import Action, ActivityNotKept, By
from keyturn.cli import main
from keyturn.notices import (
    REPLAY_WINDOW,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    NoticeKind,
    Notifier,
    SMTPDelivery,
    WebhookDelivery,
    WebhookRejected,
    due,
    sign,
    verify_webhook,
)
from keyturn.payload import PayloadGuard
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from keyturn.wsgi import ApiKeyMiddleware
from tests.stores.conftest import Backend
from tests.stores.test_activity import HostStore
from tests.stores.test_contract import TENANT, world
from tests.world import Clock

START = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
CONSOLE = "https://app.example.test/keys/"
SECRET = b"test-webhook-secret-0123456789"  # a plainly fake test secret


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- a real SMTP server on loopback -----------------------------------------------------------


@attrs.define
class Mailbox:
    port: int
    messages: list[Message] = attrs.field(factory=list)
    recipients: list[str] = attrs.field(factory=list)


@pytest.fixture
def smtp() -> Iterator[Mailbox]:
    """aiosmtpd on 127.0.0.1, in a thread of this process; stopped at the end."""
    from aiosmtpd.controller import Controller

    mailbox = Mailbox(free_port())

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            mailbox.messages.append(message_from_bytes(envelope.content, policy=policy.default))
            mailbox.recipients.extend(envelope.rcpt_tos)
            return "250 OK"

    controller = Controller(Handler(), hostname="127.0.0.1", port=mailbox.port)
    controller.start()
    try:
        yield mailbox
    finally:
        controller.stop()


def notifier(manager: KeyManager, port: int, **options: Any) -> Notifier:
    return Notifier(
        manager,
        deliver=SMTPDelivery("127.0.0.1", port, sender="keys@app.example.test", timeout=5),
        address_of=options.pop("address_of", lambda account: f"{account}@example.test"),
        console_url=CONSOLE,
        **options,
    )


def kinds(mailbox: Mailbox) -> list[str]:
    return [str(message["X-Keyturn-Notice"]) for message in mailbox.messages]


def setup(backend: Backend) -> tuple[KeyManager, Clock]:
    world(backend)
    clock = Clock(START)
    return KeyManager(backend.keys, backend.membership, clock=clock), clock


def test_a_key_is_told_each_threshold_once_then_its_expiry(backend: Backend, smtp: Mailbox) -> None:
    """14, 7, 1 days and expired: each once, by email, naming the key by name and hint with
    the console's link and never the secret; each recorded as a notice_sent event."""
    manager, clock = setup(backend)
    created = manager.create("alice", name="CI deploys", scope=TENANT, expiry=Lifetime.DAYS_30)
    run = notifier(manager, smtp.port).run
    assert run().sent == 0
    for left, kind in ((14, "expires_14d"), (6, "expires_7d"), (0.5, "expires_1d")):
        clock.now = created.info.expires_at - timedelta(days=left)
        assert run().sent == 1
        again = run()
        assert (again.sent, again.already_sent) == (0, 1)
        assert kinds(smtp)[-1] == kind
    clock.now = created.info.expires_at + timedelta(hours=1)
    assert run().sent == 1
    assert kinds(smtp) == ["expires_14d", "expires_7d", "expires_1d", "expired"]
    first = smtp.messages[0]
    assert first["To"] == "alice@example.test"
    assert first["Subject"] == f"Your API key “CI deploys” ({created.info.hint}) expires in 14 days"
    body = first.get_payload(decode=True).decode()
    assert CONSOLE in body and created.info.key_id in body
    assert created.secret not in body and created.secret[4:] not in body
    sent = [e for e in manager.activity("alice") if e.action is Action.NOTICE_SENT]
    assert [e.detail for e in reversed(sent)] == kinds(smtp)


def test_inactive_leaked_and_revoked_keys_are_told(backend: Backend, smtp: Mailbox) -> None:
    """A key made Inactive, one reported leaked, one revoked by an operator, one revoked at
    its replacement's first use: one notice each (and none for the creator's own revoke)."""
    manager, clock = setup(backend)
    research = Scope.organization("org_research", tenant_id="acme")
    manager.create("alice", name="research", scope=research)  # to be Inactive
    leaked = manager.create("alice", name="leaked", scope=TENANT)
    operator = manager.create("alice", name="operator", scope=TENANT)
    rotated = manager.create("alice", name="rotated", scope=TENANT)
    own = manager.create("alice", name="own", scope=TENANT)
    backend.membership.remove_member("alice", "org_research")
    backend.keys.report_leak(leaked.info.key_id, "https://gist.example/abc", START)
    manager.revoke("alice", operator.info.key_id, by=By.operator("root", reason="in a log"))
    new = manager.rotate("alice", rotated.info.key_id, revoke_old_on_first_use=True)
    backend.keys.mark_used(new.info.key_id, START + timedelta(minutes=1))
    manager.revoke("alice", own.info.key_id)
    clock.advance(timedelta(hours=1))
    report = notifier(manager, smtp.port).run()
    assert report.sent == 4
    told = {
        (str(m["X-Keyturn-Notice"]), str(m["Subject"]).split("“")[1].split("”")[0])
        for m in smtp.messages
    }
    assert told == {
        ("inactive", "research"),
        ("leaked", "leaked"),
        ("revoked", "operator"),
        ("revoked", "rotated"),
    }
    bodies = "".join(m.get_payload(decode=True).decode() for m in smtp.messages)
    assert "revoked by operator root: in a log" in bodies
    assert 'seen at "https://gist.example/abc"' in bodies
    assert "revoked by keyturn (rotation)" in bodies
    assert notifier(manager, smtp.port).run().sent == 0


def test_a_failed_delivery_is_given_back_and_sent_by_the_next_run(
    backend: Backend, smtp: Mailbox, caplog: pytest.LogCaptureFixture
) -> None:
    """No SMTP server listening: the run reports a failure and keeps no claim; the next run,
    with the server there, sends the notice."""
    manager, _ = setup(backend)
    manager.create("alice", name="CI deploys", scope=TENANT, expiry=Lifetime.DAYS_7)
    down = notifier(manager, free_port()).run()
    assert (down.sent, down.failed) == (0, 1)
    assert "could not deliver the expires_7d notice" in caplog.text
    assert smtp.messages == []
    assert notifier(manager, smtp.port).run().sent == 1
    assert kinds(smtp) == ["expires_7d"]


def test_an_account_without_an_address_is_tried_again_later(
    backend: Backend, smtp: Mailbox
) -> None:
    """address_of answering None claims nothing: once the address is known, it is sent."""
    manager, _ = setup(backend)
    manager.create("alice", name="CI deploys", scope=TENANT, expiry=Lifetime.DAYS_1)
    unknown = notifier(manager, smtp.port, address_of=lambda account: None).run()
    assert (unknown.sent, unknown.no_address) == (0, 1)
    assert notifier(manager, smtp.port).run().sent == 1
    assert smtp.recipients == ["alice@example.test"]


def test_a_store_without_the_record_cannot_notify() -> None:
    """A host store without claims and the record: a typed error when the notifier is built."""
    membership = MemoryMembership()
    with pytest.raises(ActivityNotKept, match="a Notifier needs a key store"):
        notifier(KeyManager(HostStore(), membership), 25)


@given(left=st.timedeltas(min_value=timedelta(seconds=1), max_value=timedelta(days=400)))
def test_the_nearest_threshold_is_the_one_due(left: timedelta) -> None:
    """An Active key is due the nearest of 1, 7, 14 days it is within, and nothing beyond."""
    from tests.stores.test_contract import make_key

    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_default", tenant_id="acme", default=True)
    membership.add_member("alice", "org_default", role="admin")
    store.add_key(make_key(created_at=START - timedelta(days=1), expires_at=START + left))
    infos = KeyManager(store, membership, clock=lambda: START).list("alice")
    assert [info.status for info in infos] == [Status.ACTIVE]
    found = due({"alice": infos}, [], [], START, timedelta(days=30))
    expected = (
        [NoticeKind.EXPIRES_IN_1_DAY]
        if left <= timedelta(days=1)
        else [NoticeKind.EXPIRES_IN_7_DAYS]
        if left <= timedelta(days=7)
        else [NoticeKind.EXPIRES_IN_14_DAYS]
        if left <= timedelta(days=14)
        else []
    )
    assert [d.kind for d in found] == expected


# A request path a holder of alice's key chooses, to be read in her official mail.
PHISHING = "/managed-agents/v1/sessions/" + "Your account is locked: call +1 555 0100 now " * 45


def test_a_key_found_in_a_body_is_told_by_the_guards_route_only() -> None:
    """The payload guard finds alice's real key in a body sent to a path of 2,000
    characters: her leaked notice names the method and the guarded route, quoted, and no
    character of the rest of the path."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_default", tenant_id="acme", default=True)
    membership.add_member("alice", "org_default", role="admin")
    membership.add_member("mallory", "org_default", role="admin")
    manager = KeyManager(store, membership, clock=lambda: START)
    leaked = manager.create("alice", name="laptop", scope=TENANT)
    sender = manager.create("mallory", name="mine", scope=TENANT)

    def app(environ: Any, start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"{}"]

    with Authenticator(store, membership, clock=lambda: START) as authenticator:
        guarded = ApiKeyMiddleware(app, authenticator=authenticator, payload_guard=PayloadGuard())
        reply = WerkzeugClient(guarded).post(
            PHISHING,
            data=json.dumps({"content": leaked.secret}),
            headers={"authorization": f"Bearer {sender.secret}", "x-organization-id": "default"},
            content_type="application/json",
        )
    assert (reply.status_code, reply.json["error"]["code"]) == (400, "key_in_payload")
    record = store.get_key(leaked.info.key_id)
    assert record is not None and record.leaked is not None
    assert record.leaked.url == "request-body:POST /managed-agents/v1/"

    outbox: list[Any] = []
    clock = lambda: START + timedelta(hours=1)  # noqa: E731
    later = KeyManager(store, membership, clock=clock)
    Notifier(later, deliver=outbox.append, address_of=lambda a: a, console_url=CONSOLE).run()
    (notice,) = [n for n in outbox if n.kind is NoticeKind.LEAKED]
    assert notice.detail == 'seen in the body of a request to "/managed-agents/v1/" (POST)'
    assert "555" not in notice.text and "locked" not in notice.text


def test_a_place_recorded_before_is_quoted_and_bounded() -> None:
    """A leak recorded with a whole path, or by a code host with a URL of its choosing:
    the notice quotes it (escaped, one line) and cuts it short."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_default", tenant_id="acme", default=True)
    membership.add_member("alice", "org_default", role="admin")
    manager = KeyManager(store, membership, clock=lambda: START)
    old = manager.create("alice", name="old", scope=TENANT)
    hosted = manager.create("alice", name="hosted", scope=TENANT)
    store.report_leak(old.info.key_id, "request-body:POST " + PHISHING + "\r\nBcc: x", START)
    store.report_leak(hosted.info.key_id, "https://gist.example/" + "a\n" * 300, START)

    found = due({}, store.leaked_keys(), [], START, timedelta(days=30))

    details = {d.name: d.detail or "" for d in found}
    assert details["old"].startswith('seen in the body of a request to "/managed-agents/v1/')
    assert details["old"].endswith('\u2026" (POST)')
    assert details["hosted"].startswith('seen at "https://gist.example/a\\na\\n')
    assert all("\n" not in d and "\r" not in d and len(d) < 450 for d in details.values())


# --- a real HTTP receiver on loopback ---------------------------------------------------------


@attrs.define
class Receiver:
    url: str
    bodies: list[dict[str, Any]] = attrs.field(factory=list)
    answer: int = 204
    lock: threading.Lock = attrs.field(factory=threading.Lock)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook receiver on 127.0.0.1 that checks each notice with verify_webhook."""
    state = Receiver("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            try:
                notice = verify_webhook(
                    SECRET,
                    timestamp=self.headers[TIMESTAMP_HEADER],
                    signature=self.headers[SIGNATURE_HEADER],
                    body=body,
                )
            except WebhookRejected:
                self.send_response(401)
            else:
                with state.lock:
                    state.bodies.append(notice)
                self.send_response(state.answer)
                if 300 <= state.answer < 400:
                    self.send_header("location", "/elsewhere")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_port}/hooks/T0KEN-in-the-path"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


def test_a_signed_webhook_is_verified_by_the_receiver(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """The notice's JSON arrives signed and in the replay window; a 500 or a redirect is a
    failure whose claim is given back; a wrong secret is refused by the receiver; the log
    never shows the URL's path, which may hold a token."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_default", tenant_id="acme", default=True)
    membership.add_member("alice", "org_default", role="admin")
    manager = KeyManager(store, membership, clock=lambda: START)
    created = manager.create("alice", name="CI deploys", scope=TENANT, expiry=Lifetime.DAYS_7)

    def run(secret: bytes = SECRET) -> Any:
        hook = WebhookDelivery(receiver.url, secret=secret, timeout=5)
        return Notifier(manager, deliver=hook, address_of=lambda a: a, console_url=CONSOLE).run()

    assert run(b"another-secret-of-16-bytes").failed == 1  # the receiver answered 401
    receiver.answer = 500
    assert run().failed == 1
    receiver.answer = 302  # not followed: the POST would arrive as an empty GET
    assert run().failed == 1
    assert "answered 302" in caplog.text and "T0KEN" not in caplog.text
    receiver.answer = 204
    assert run().sent == 1
    notice = receiver.bodies[-1]
    assert (notice["kind"], notice["to"], notice["key_id"], notice["hint"]) == (
        "expires_7d",
        "alice",
        created.info.key_id,
        created.info.hint,
    )
    assert notice["console_url"] == CONSOLE and created.secret not in json.dumps(notice)
    assert "secret" not in repr(WebhookDelivery(receiver.url, secret=SECRET)).lower()


@attrs.define
class SlowReceiver:
    url: str
    answered: list[bool] = attrs.field(factory=list)  # whether each request got its answer
    lock: threading.Lock = attrs.field(factory=threading.Lock)


# A 204 with a header long enough that, a byte every 0.2 s, it takes half a minute.
SLOW_ANSWER = b"HTTP/1.1 204 No Content\r\nx-padding: " + b"." * 120 + b"\r\n\r\n"


@pytest.fixture
def slow_receiver() -> Iterator[SlowReceiver]:
    """A receiver on 127.0.0.1 that sends its answer to the first request a byte every
    0.2 s (each read of the sender's is quick; the whole is not), and the rest at once."""
    state = SlowReceiver("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            with state.lock:
                first = not state.answered
                state.answered.append(False)
                index = len(state.answered) - 1
            try:
                if first:
                    for byte in SLOW_ANSWER:
                        self.wfile.write(bytes((byte,)))
                        time.sleep(0.2)
                else:
                    self.wfile.write(SLOW_ANSWER)
            except OSError:  # the sender hung up
                return
            state.answered[index] = True

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_port}/hooks"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


@pytest.mark.timeout(60)
def test_a_slow_receiver_is_cut_off_at_the_timeout_and_the_run_goes_on(
    slow_receiver: SlowReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """Three notices, the first answered a byte at a time: timeout bounds the whole request,
    so that delivery fails (given back, for the next run) and the other two are sent."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_default", tenant_id="acme", default=True)
    membership.add_member("alice", "org_default", role="admin")
    manager = KeyManager(store, membership, clock=lambda: START)
    for name in ("one", "two", "three"):
        manager.create("alice", name=name, scope=TENANT, expiry=Lifetime.DAYS_7)
    hook = WebhookDelivery(slow_receiver.url, secret=SECRET, timeout=1.0)

    report = Notifier(manager, deliver=hook, address_of=lambda a: a, console_url=CONSOLE).run()

    assert (report.sent, report.failed) == (2, 1)
    # The receiver marks an answer sent after its last write, which the sender may have read
    # first: wait (bounded) for its threads to finish.
    for _ in range(200):
        if slow_receiver.answered[1:] == [True, True]:
            break
        time.sleep(0.01)
    assert slow_receiver.answered[1:] == [True, True]
    assert "no answer within 1.0s" in caplog.text


def test_verify_webhook_refuses_replays_tampering_and_missing_headers() -> None:
    """Outside the window, another body, another signature, or no header: refused."""
    body = b'{"kind": "expired"}'
    now = 1_800_000_000
    good = f"v1={sign(SECRET, str(now), body)}"
    assert verify_webhook(SECRET, timestamp=str(now), signature=good, body=body, now=now) == {
        "kind": "expired"
    }
    late = now + REPLAY_WINDOW + 1
    cases = [
        ({"timestamp": str(now), "signature": good, "now": late}, "seconds away"),
        ({"timestamp": str(now), "signature": good, "body": body + b" "}, "does not match"),
        ({"timestamp": str(now + 1), "signature": good}, "does not match"),
        ({"timestamp": None, "signature": good}, "send both"),
        ({"timestamp": "-5", "signature": good}, "Unix seconds"),
    ]
    for changes, message in cases:
        arguments: dict[str, Any] = {"timestamp": str(now), "signature": good, "body": body}
        arguments["now"] = now
        arguments.update(changes)
        with pytest.raises(WebhookRejected, match=message):
            verify_webhook(SECRET, **arguments)


@given(position=st.integers(0, 30), flip=st.integers(1, 255))
def test_any_changed_byte_of_a_signed_body_is_refused(position: int, flip: int) -> None:
    """Flip any bit pattern of any byte of the body: the signature no longer verifies."""
    body = b'{"kind":"leaked","key":"k1"}'
    position %= len(body)
    changed = bytearray(body)
    changed[position] ^= flip
    signature = f"v1={sign(SECRET, '1800000000', body)}"
    with pytest.raises(WebhookRejected):
        verify_webhook(
            SECRET, timestamp="1800000000", signature=signature, body=bytes(changed), now=1.8e9
        )


@settings(max_examples=500)
@given(
    timestamp=st.one_of(
        st.text(),
        st.text(alphabet="0123456789²³¹٠١٢٣٤٥٦٧٨٩０１", min_size=1, max_size=30),
        st.text(alphabet="0123456789", min_size=13, max_size=6000),
        st.just("9" * 400),
        st.just("1" * 5000),
    ),
    signature=st.text(),
    body=st.one_of(st.binary(), st.just(b"[" * 100_000)),
)
def test_verify_webhook_raises_only_webhook_rejected(
    timestamp: str, signature: str, body: bytes
) -> None:
    """Any header text a client may send (digits of any script, thousands of them, lone
    surrogates): WebhookRejected, as documented, never another exception."""
    with pytest.raises(WebhookRejected):
        verify_webhook(SECRET, timestamp=timestamp, signature=signature, body=body, now=1.8e9)


def test_a_body_nested_too_deep_is_rejected_once_signed() -> None:
    """A signed body no JSON parser can nest so deep: rejected, not a RecursionError."""
    body = b"[" * 100_000
    signature = f"v1={sign(SECRET, '1800000000', body)}"
    with pytest.raises(WebhookRejected, match="not JSON"):
        verify_webhook(SECRET, timestamp="1800000000", signature=signature, body=body, now=1.8e9)


# --- several instances at once: one notice, not three -----------------------------------------

INSTANCES = 3
KEYS = 12


def run_instances(store_url: str, receiver: Receiver) -> list[str]:
    """Start INSTANCES ``keyturn notify`` processes at once; each one's output, in order."""
    environment = {**os.environ, "KEYTURN_WEBHOOK_SECRET": SECRET.decode()}
    command = [
        sys.executable,
        "-m",
        "keyturn",
        "notify",
        "--store",
        store_url,
        "--console-url",
        CONSOLE,
        "--webhook",
        receiver.url,
    ]
    processes = [
        subprocess.Popen(  # noqa: S603 -- our own interpreter and arguments
            command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(INSTANCES)
    ]
    outputs = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                os.kill(process.pid, 9)
                process.wait(10)
        assert process.returncode == 0, err
        outputs.append(out)
    return outputs


def seed(db: Any) -> None:
    db.membership.add_organization("org_default", tenant_id="acme", default=True)
    db.membership.add_member("alice", "org_default", role="admin")
    manager = KeyManager(db.keys, db.membership)
    for number in range(KEYS):
        manager.create("alice", name=f"key {number}", scope=TENANT, expiry=Lifetime.DAYS_7)


def check_once(outputs: list[str], receiver: Receiver) -> None:
    sent = sum(int(out.split()[1]) for out in outputs)
    notices = [(body["key_id"], body["kind"]) for body in receiver.bodies]
    assert sent == KEYS == len(notices) == len(set(notices))


def test_instances_on_one_sqlite_file_send_each_notice_once(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Three processes run ``keyturn notify`` at once on one SQLite file: each key's notice
    arrives once, and their reports add up to the notices sent."""
    from keyturn.stores.sqlite import SQLiteDatabase

    path = tmp_path / "keys.sqlite3"
    with SQLiteDatabase(path) as db:
        seed(db)
    check_once(run_instances(f"sqlite:///{path}", receiver), receiver)


@pytest.mark.postgres
def test_instances_on_one_postgres_database_send_each_notice_once(
    postgres_url: str, receiver: Receiver
) -> None:
    """The same with PostgreSQL: the primary key of keyturn_notices lets one claim win."""
    from keyturn.stores.postgres import PostgresDatabase

    with PostgresDatabase(postgres_url) as db:
        seed(db)
    check_once(run_instances(postgres_url, receiver), receiver)


def test_notify_without_the_webhook_secret_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--webhook needs its secret in the environment, never on the command line."""
    monkeypatch.delenv("KEYTURN_WEBHOOK_SECRET", raising=False)
    url = f"sqlite:///{tmp_path}/k.sqlite3"
    assert main(["--store", url, "db", "init"]) == 0
    status = main(
        ["--store", url, "notify", "--console-url", CONSOLE, "--webhook", "http://127.0.0.1:9/"]
    )
    assert status == 2 and "KEYTURN_WEBHOOK_SECRET" in capsys.readouterr().err
