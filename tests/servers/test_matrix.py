"""The server matrix: one table of raw requests, sent as bytes over a socket to the example
apps under every real server, so that nothing is normalised away before the middleware.

Each server starts once per module, in its own process on a free loopback port, is polled
for readiness a bounded number of times, and is stopped by its process id. For every case
the table records the status, the error code, the service headers and whether the app was
reached (the app notes every request it sees in a file, see ``apps.py``).

In CI (``CI=true``) every server must start; elsewhere a server that is not installed or
cannot start is skipped, with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from keyturn.demo import DEFAULT_ORGANIZATION, OTHER_ORGANIZATION, TENANT, seed
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
    app: str  # "asgi", "wsgi" or "django"
    argv: Callable[[int], list[str]]
    http2: bool = False
    websocket: bool = False


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


SERVERS = {
    "uvicorn-h11": Server(
        "uvicorn",
        "asgi",
        lambda port: python(
            "-m",
            "uvicorn",
            "tests.servers.apps:asgi",
            "--http",
            "h11",
            "--ws",
            "websockets",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ),
        websocket=True,
    ),
    "uvicorn-httptools": Server(
        "httptools",
        "asgi",
        lambda port: python(
            "-m",
            "uvicorn",
            "tests.servers.apps:asgi",
            "--http",
            "httptools",
            "--ws",
            "websockets",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ),
        websocket=True,
    ),
    "hypercorn-h1": Server(
        "hypercorn",
        "asgi",
        lambda port: python(
            "-m", "hypercorn", "tests.servers.apps:make_asgi()", "-b", f"127.0.0.1:{port}"
        ),
        websocket=True,
    ),
    "hypercorn-h2c": Server(
        "hypercorn",
        "asgi",
        lambda port: python(
            "-m", "hypercorn", "tests.servers.apps:make_asgi()", "-b", f"127.0.0.1:{port}"
        ),
        http2=True,
    ),
    "granian": Server(
        "granian",
        "asgi",
        lambda port: python(
            "-m",
            "granian",
            "--interface",
            "asgi",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "tests.servers.apps:asgi",
        ),
        websocket=True,
    ),
    "granian-wsgi": Server(
        "granian",
        "wsgi",
        lambda port: python(
            "-m",
            "granian",
            "--interface",
            "wsgi",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "tests.servers.apps:wsgi",
        ),
    ),
    "daphne": Server(
        "daphne",
        "asgi",
        lambda port: python(
            "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "tests.servers.apps:asgi"
        ),
        websocket=True,
    ),
    "gunicorn": Server(
        "gunicorn",
        "wsgi",
        lambda port: python(
            "-m",
            "gunicorn",
            "-b",
            f"127.0.0.1:{port}",
            "-w",
            "1",
            "--log-level",
            "warning",
            "tests.servers.apps:wsgi",
        ),
    ),
    "gunicorn-gthread": Server(
        "gunicorn",
        "wsgi",
        lambda port: python(
            "-m",
            "gunicorn",
            "-b",
            f"127.0.0.1:{port}",
            "-w",
            "1",
            "--threads",
            "2",
            "--log-level",
            "warning",
            "tests.servers.apps:wsgi",
        ),
    ),
    "waitress": Server(
        "waitress",
        "wsgi",
        lambda port: python(
            "-m",
            "waitress",
            "--listen",
            f"127.0.0.1:{port}",
            "--threads",
            "2",
            "tests.servers.apps:wsgi",
        ),
    ),
    "werkzeug": Server(
        "werkzeug",
        "wsgi",
        lambda port: python("-m", "tests.servers.run", "werkzeug", "wsgi", str(port)),
    ),
    "wsgiref": Server(
        "wsgiref",
        "wsgi",
        lambda port: python("-m", "tests.servers.run", "wsgiref", "wsgi", str(port)),
    ),
    "django-waitress": Server(
        "django",
        "django",
        lambda port: python(
            "-m",
            "waitress",
            "--listen",
            f"127.0.0.1:{port}",
            "--threads",
            "2",
            "tests.servers.apps:django",
        ),
    ),
}


# --- the table ------------------------------------------------------------------------------


@attrs.frozen
class Request:
    method: str
    target: str
    headers: tuple[tuple[str, str], ...] = ()
    websocket: bool = False  # an upgrade handshake: only the response head is read


@attrs.frozen
class Outcome:
    status: int  # 0: the server closed the connection without a response
    code: str | None  # the JSON error code, if the body has one
    service: tuple[str | None, str | None]  # service-organization-id, service-tenant-id
    reached: bool
    saw_key: bool  # the app saw the Authorization header
    body: bytes = attrs.field(repr=False)
    headers: tuple[tuple[str, str], ...] = attrs.field(repr=False)


Check = Callable[[str, list[Outcome]], None]  # (server, outcomes)


def refused(status: int, code: str) -> Check:
    def check(server: str, outcomes: list[Outcome]) -> None:
        (outcome,) = outcomes
        assert (outcome.status, outcome.code, outcome.reached) == (status, code, False)
        assert outcome.service == (None, None)

    return check


def served(organization: str) -> Check:
    def check(server: str, outcomes: list[Outcome]) -> None:
        (outcome,) = outcomes
        assert (outcome.status, outcome.reached) == (200, True)
        assert outcome.service == (organization, TENANT)
        assert b"agent-small" in outcome.body

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


def public(server: str, outcomes: list[Outcome]) -> None:
    (outcome,) = outcomes
    assert (outcome.status, outcome.reached, outcome.service) == (200, True, (None, None))


def head_then_get(server: str, outcomes: list[Outcome]) -> None:
    head, get = outcomes
    assert (head.status, head.body, head.reached) == (401, b"", False)
    assert "www-authenticate" in dict(head.headers)
    served(OTHER_ORGANIZATION)(server, [get])


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


MODELS = "/managed-agents/v1/models"
ORG = "Bearer {organization}"
TENANT_KEY = "Bearer {tenant}"
CASES: dict[str, tuple[tuple[Request, ...], Check]] = {
    # the spec's error table
    "no key": ((Request("GET", MODELS),), refused(401, "unauthorized")),
    "mistyped key": (
        (Request("GET", MODELS, (("authorization", "Bearer {typo}"),)),),
        refused(401, "unauthorized"),
    ),
    "two Authorization headers": (
        (Request("GET", MODELS, (("authorization", ORG), ("authorization", ORG))),),
        refused(401, "unauthorized"),
    ),
    "tenant key, no organization": (
        (Request("GET", MODELS, (("authorization", TENANT_KEY),)),),
        refused(400, "invalid_request"),
    ),
    "tenant key, malformed organization": (
        (Request("GET", MODELS, (("authorization", TENANT_KEY), ("x-organization-id", "a b"))),),
        refused(400, "invalid_request"),
    ),
    "tenant key, unknown organization": (
        (
            Request(
                "GET", MODELS, (("authorization", TENANT_KEY), ("x-organization-id", "org_nope"))
            ),
        ),
        refused(404, "not_found"),
    ),
    "organization key": (
        (Request("GET", MODELS, (("authorization", ORG),)),),
        served(OTHER_ORGANIZATION),
    ),
    "tenant key, default organization": (
        (
            Request(
                "GET", MODELS, (("authorization", TENANT_KEY), ("x-organization-id", "default"))
            ),
        ),
        served(DEFAULT_ORGANIZATION),
    ),
    "public path": ((Request("GET", "/healthz"),), public),
    "HEAD then GET, one connection": (
        (Request("HEAD", MODELS), Request("GET", MODELS, (("authorization", ORG),))),
        head_then_get,
    ),
    # the walk-arounds of issue 10, without a key
    "no leading slash": ((Request("GET", "managed-agents/v1/models"),), walled),
    "absolute form": ((Request("GET", "http://127.0.0.1{port}/managed-agents/v1/models"),), walled),
    "double slash": ((Request("GET", "//managed-agents/v1/models"),), walled),
    "lower-case method": ((Request("get", MODELS),), walled),
    "dot segments": ((Request("GET", "/x/../managed-agents/v1/models"),), walled),
    "encoded slash": ((Request("GET", "/managed-agents%2Fv1/models"),), walled),
    "encoded dot segments": ((Request("GET", "/x/%2E%2E/managed-agents/v1/models"),), walled),
    "double-encoded slash": ((Request("GET", "/managed-agents%252Fv1/models"),), walled),
    "Daphne-Root-Path header": (
        (Request("GET", "/v1/models", (("daphne-root-path", "/managed-agents"),)),),
        walled_on("daphne"),
    ),
    "SCRIPT_NAME header": (
        (Request("GET", MODELS, (("script_name", "/managed-agents"),)),),
        walled,
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
        f"{name}, with a key": ((Request("GET", target, (("authorization", ORG),)),), guarded)
        for name, target in [
            ("no leading slash", "managed-agents/v1/models"),
            ("absolute form", "http://127.0.0.1{port}/managed-agents/v1/models"),
            ("double slash", "//managed-agents/v1/models"),
        ]
    },
    # WebSocket handshakes (ASGI servers that speak it)
    "websocket without a key": ((Request("GET", MODELS, websocket=True),), websocket_walled),
    "websocket with a key": (
        (Request("GET", MODELS, (("authorization", ORG),), websocket=True),),
        websocket_passed,
    ),
}


# --- the servers ----------------------------------------------------------------------------


@attrs.frozen
class Keys:
    organization: str
    tenant: str
    typo: str


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Keys]:
    """One seeded SQLite key database that every server of the module reads."""
    path = tmp_path_factory.mktemp("matrix") / "keys.sqlite3"
    db = SQLiteDatabase(path)
    created = seed(db.keys, db.membership)
    db.close()
    organization = created.organization.secret
    typo = organization[:20] + ("b" if organization[20] == "a" else "a") + organization[21:]
    return path, Keys(organization, created.tenant.secret, typo)


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

    def seen(self) -> tuple[int, int]:
        """Requests the app has seen, and how many of them with an Authorization header."""
        if not self.reached_log.exists():
            return 0, 0
        lines = self.reached_log.read_text(encoding="utf-8").splitlines()
        return len(lines), sum(line.startswith("key ") for line in lines)


@pytest.fixture(scope="module", params=sorted(SERVERS))
def running(
    request: pytest.FixtureRequest,
    database: tuple[Path, Keys],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Running]:
    """One server process for the whole module, stopped by its process id at the end."""
    name = request.param
    server = SERVERS[name]
    if importlib.util.find_spec(server.module) is None:
        unavailable(name, f"{server.module} is not installed (it is in the dev group)")
    path, keys = database
    scratch = tmp_path_factory.mktemp(name)
    reached_log = scratch / "reached.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "KEYTURN_MATRIX_DB": str(path),
        "KEYTURN_MATRIX_REACHED": str(reached_log),
    }
    env.pop("CI", None)  # no server may change its behaviour under the test's CI flag
    why = ""
    for _ in range(START_ATTEMPTS):  # another process may take the free port first
        port = free_port()
        process = start(server, port, env, scratch / "server.log")
        try:
            why = wait_until_ready(process, port, scratch / "server.log")
            if not why:
                yield Running(name, server, port, reached_log, keys)
                return
        finally:
            stop(process)
    unavailable(name, why)


def start(server: Server, port: int, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as output:
        return subprocess.Popen(  # noqa: S603 -- our own interpreter and arguments
            server.argv(port),
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
    """Raw HTTP/1.1 over one socket: requests as bytes, responses parsed by hand."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT)
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

    def exchange(self, request: Request, keys: Keys) -> tuple[int, list[tuple[str, str]], bytes]:
        lines = [f"{request.method} {request.target} HTTP/1.1", f"host: 127.0.0.1:{self.port}"]
        lines += [f"{name}: {value}" for name, value in request.headers]
        if request.websocket:
            lines += [
                "upgrade: websocket",
                "connection: Upgrade",
                "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==",
                "sec-websocket-version: 13",
            ]
        text = "\r\n".join(lines) + "\r\n\r\n"
        self.sock.sendall(text.format(**attrs.asdict(keys), port=f":{self.port}").encode())
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
        except (EOFError, ConnectionError, IndexError, ValueError):
            return 0, [], b""
        return status, headers, body


class Http2:
    """Raw HTTP/2 with prior knowledge (h2c): frames built with the h2 state machine."""

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

        target = request.target.format(**attrs.asdict(keys), port="")
        stream = self.conn.get_next_available_stream_id()
        headers = [
            (":method", request.method),
            (":path", target),
            (":scheme", "http"),
            (":authority", "127.0.0.1"),
        ] + [(name, value.format(**attrs.asdict(keys))) for name, value in request.headers]
        self.conn.send_headers(stream, headers, end_stream=True)
        self.sock.sendall(self.conn.data_to_send())
        status, got, body = 0, [], b""
        for _ in range(MAX_READS):
            data = self.sock.recv(65536)
            if not data:
                break
            done = False
            for event in self.conn.receive_data(data):
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
            self.sock.sendall(self.conn.data_to_send())
            if done:
                break
        return status, got, body


def outcome(
    status: int, headers: list[tuple[str, str]], body: bytes, reached: bool, saw_key: bool
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
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_server_matrix(running: Running, case: str) -> None:
    """Each row of the table, sent as raw bytes, under each real server: the outcome the
    spec and issue 10 require, and the app reached only when a key was accepted.
    """
    requests, check = CASES[case]
    if any(r.websocket for r in requests) and not running.server.websocket:
        pytest.skip(f"{running.name} serves no WebSocket in this matrix")
    client: Any = Http2(running.port) if running.server.http2 else Http1(running.port)
    outcomes = []
    try:
        for request in requests:
            if not getattr(client, "kept_alive", True):  # the server closes after each response
                client.close()
                client = Http1(running.port)
            before = running.seen()
            status, headers, body = client.exchange(request, running.keys)
            after = running.seen()
            reached, saw_key = after[0] > before[0], after[1] > before[1]
            outcomes.append(outcome(status, headers, body, reached, saw_key))
    finally:
        client.close()
    print(f"{running.name} | {case} | {outcomes!r}")  # the recorded row, shown with -rP
    assert not any(o.saw_key for o in outcomes), "the app saw a key"
    check(running.name, outcomes)
