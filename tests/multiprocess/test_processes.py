"""Many real processes over one store: what any of them commits, every server sees.

Three servers run the example apps over ONE store (a SQLite file, then a PostgreSQL
database): uvicorn with two workers (Starlette), gunicorn with two gthread workers of four
threads each (Flask), and hypercorn (Starlette; over ``AsyncPostgresDatabase`` for
PostgreSQL). While a bounded load loop sends requests to all of them, other processes
write: the key console, served by a uvicorn process of its own and used over HTTP as a
signed-in user's browser would (even rounds), or a process that keeps the store open and
writes through ``KeyManager`` (odd rounds, ``tests/multiprocess/writer.py``), creating,
rotating and revoking keys; and the ``keyturn`` command, run afresh for each organization
and membership change.

Each change is timed in this process: sent to its writer, and committed (the writer
answered, or the command exited). An answer is judged when its request was sent at least
``LAG`` after the commit: then a revoked key, or the key of a removed member or of a
removed organization, must be refused (401), and a new key accepted (200). The lag is
zero for SQLite (the next request sees the commit) and one second for PostgreSQL, the
bound kept for the change feed that will keep in-process replicas current
(``docs/decisions.md``). Requests in flight while a change is under way are not judged.
After each change, the next waits until every worker of every server has answered a
judged request for it. At the end, a fresh process lists every key and membership:
nothing written may be lost.

A server that loads the app before it forks its workers runs too: gunicorn ``--preload``
over a SQLite file, its parent having checked one key at start, so its workers inherit an
Authenticator that has run. It serves under the load above, judged alike; and on its own,
each key the parent never verified must be accepted by the worker it reaches, within the
request's bounded wait.

Servers are stopped by their process ids (each leads a process group with its workers);
every loop and every wait is bounded.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Protocol

import attrs
import pytest

from keyturn import KeyManager, Scope
from keyturn.stores import open_database
from tests.console.support import form_token
from tests.multiprocess.apps import STORE_URL, WARM_UP_KEY, WORKER_HEADER

ROOT = Path(__file__).resolve().parents[2]
LAG = {"sqlite": 0.0, "postgres": 1.0}  # seconds from a commit to its judged requests
ROUNDS = 3  # each: an organization and a member added, a key created, revoked, rotated,
# a key created for the new member, and that member (even rounds) or organization removed
THREADS_PER_SERVER = 2
MAX_REQUESTS = 200_000  # in all: the load loop's bound
PACE = 0.002  # seconds per request and load thread, at least
POLLS = 2_000  # 10 ms apart: how long a change may wait for its judged answers
READY_POLLS = 300  # 100 ms apart: how long a server may take to answer /healthz
WRITE_TIMEOUT = 60.0  # seconds a writer may take to answer one command
REQUEST_TIMEOUT = 10.0


@attrs.frozen
class Server:
    name: str
    workers: int  # processes that answer requests
    argv: Callable[[int], list[str]]


CONSOLE = Server(
    "console",
    1,
    lambda port: [
        *("-m", "uvicorn", "tests.multiprocess.apps:console"),
        *("--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"),
    ],
)
SERVERS = (  # the servers under load
    Server(
        "uvicorn",
        2,
        lambda port: [
            *("-m", "uvicorn", "tests.multiprocess.apps:asgi", "--workers", "2"),
            *("--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"),
        ],
    ),
    Server(
        "gunicorn",
        2,
        lambda port: [
            *("-m", "gunicorn", "--workers", "2", "--worker-class", "gthread"),
            *("--threads", "4", "--bind", f"127.0.0.1:{port}", "--log-level", "warning"),
            "tests.multiprocess.apps:wsgi",
        ],
    ),
    Server(
        "hypercorn",
        1,
        lambda port: [
            *("-m", "hypercorn", "tests.multiprocess.apps:make_async_asgi()"),
            *("--bind", f"127.0.0.1:{port}"),
        ],
    ),
)
PRELOADED = Server(  # the app built, and checked once, in the parent before the fork
    "gunicorn --preload",
    2,
    lambda port: [
        *("-m", "gunicorn", "--preload", "--workers", "2", "--worker-class", "gthread"),
        *("--threads", "4", "--bind", f"127.0.0.1:{port}", "--log-level", "warning"),
        "tests.multiprocess.apps:preloaded_wsgi",
    ],
)
FRESH_KEYS = 6  # keys the preloading parent never verified: one request each


# --- what was changed, and when -----------------------------------------------------------


@attrs.frozen
class Change:
    what: str  # "created", "revoked", "member removed" or "org removed"
    sent: float  # time.monotonic() when the change was asked for
    committed: float  # ... and when its writer said it was done
    works: bool  # whether the key authenticates once the change is seen


@attrs.define(eq=False)
class Key:
    key_id: str
    secret: str = attrs.field(repr=False)
    account: str
    tenant: bool  # a tenant key sends x-organization-id: default; an organization key none
    changes: list[Change]

    def expected(self, sent: float, answered: float, lag: float) -> Change | None:
        """The change in force for a request in flight from *sent* to *answered*.

        None while a change is under way: one that began before the answer came back (the
        server may have read the store after it committed) and committed less than *lag*
        before the request was sent.
        """
        current = None
        for change in self.changes:
            if answered < change.sent:
                break
            if sent < change.committed + lag:
                return None
            current = change
        return current

    def final_status(self) -> str:
        return {"created": "Active", "revoked": "Revoked"}.get(self.changes[-1].what, "Inactive")


@attrs.frozen
class Answer:
    sent: float
    answered: float
    server: str
    worker: str  # the process that answered
    key: Key
    status: int


class Ledger:
    """The keys under test and every answer; shared by the load threads and the test."""

    def __init__(self) -> None:
        self.keys: list[Key] = []  # appended only
        self.latest: Key | None = None  # the key of the latest change: probed most
        self.answers: list[Answer] = []  # appended only
        self._budget = itertools.count()
        self._lock = threading.Lock()

    def take(self) -> bool:
        """One request more, within MAX_REQUESTS."""
        with self._lock:
            return next(self._budget) < MAX_REQUESTS

    def changed(self, key: Key, change: Change) -> None:
        key.changes.append(change)
        if key not in self.keys:
            self.keys.append(key)
        self.latest = key


# --- the processes ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def get(port: int, key: Key) -> tuple[int, str]:
    """GET the models with *key* on a fresh connection; the status and the worker's pid."""
    headers = {"Authorization": f"Bearer {key.secret}"}
    if key.tenant:
        headers["x-organization-id"] = "default"
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
    try:
        connection.request("GET", "/managed-agents/v1/models", headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status, response.getheader(WORKER_HEADER, "")
    finally:
        connection.close()


def healthy(port: int) -> bool:
    """Whether the server answers HTTP (the console has no /healthz: its 404 will do)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status in (200, 404)
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


@contextmanager
def serving(
    server: Server, url: str, log: Path, env: dict[str, str] | None = None
) -> Iterator[int]:
    """*server* on a free port over *url*, with *env* added to its environment; stopped by
    its process id (and group) at the end."""
    port = free_port()
    env = {**os.environ, STORE_URL: url, "PYTHONPATH": str(ROOT), **(env or {})}
    with open(log, "wb") as output:
        process = subprocess.Popen(  # noqa: S603 -- our own interpreter and arguments
            [sys.executable, *server.argv(port)],
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its workers share its process group
        )
    try:
        for _ in range(READY_POLLS):
            if process.poll() is not None or healthy(port):
                break
            time.sleep(0.1)
        if process.poll() is not None or not healthy(port):
            pytest.fail(f"{server.name} did not start: {log.read_text(errors='replace')[-2000:]}")
        yield port
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(20)


def alive(pids: set[str]) -> set[str]:
    """Those of the workers *pids* still running once their server stopped; killed if any."""
    running = set(pids)
    for _ in range(200):  # a bounded poll: their server reaps them
        for pid in list(running):
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                running.discard(pid)
        if not running:
            break
        time.sleep(0.05)
    for pid in running:  # the test fails on them; they must not outlive it
        os.kill(int(pid), signal.SIGKILL)
    return running


def cli(url: str, *args: str) -> str:
    """The keyturn command, in a process of its own; its output."""
    done = subprocess.run(  # noqa: S603 -- our own interpreter and arguments
        [sys.executable, "-m", "keyturn.cli", "--store", url, *args],
        capture_output=True,
        text=True,
        timeout=WRITE_TIMEOUT,
    )
    assert done.returncode == 0, f"keyturn {' '.join(args)}: {done.stderr}"
    return done.stdout


class Writer(Protocol):
    def ask(self, **command: str) -> dict[str, str]:
        """Run one command of ``tests/multiprocess/writer.py``'s protocol; its answer."""


class ManagerWriter:
    """The ``KeyManager`` writer process (``tests/multiprocess/writer.py``) over *url*."""

    def __init__(self, url: str) -> None:
        self.process = subprocess.Popen(  # noqa: S603 -- our own interpreter and arguments
            [sys.executable, "-m", "tests.multiprocess.writer", url],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, **command: str) -> dict[str, str]:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps(command) + "\n")
        stdin.flush()
        readable, _, _ = select.select([stdout], [], [], WRITE_TIMEOUT)
        assert readable, f"the writer did not answer {command['op']} in time"
        reply: dict[str, str] = json.loads(stdout.readline())
        assert "error" not in reply, reply["error"]
        return reply

    def close(self) -> None:
        streams: list[IO[str] | None] = [self.process.stdin, self.process.stdout]
        for stream in streams:
            if stream is not None:
                stream.close()
        try:
            self.process.wait(WRITE_TIMEOUT)  # it stops at the end of its input
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(WRITE_TIMEOUT)


class ConsoleWriter:
    """The key console on *port*, used over HTTP as a signed-in user's browser uses it:
    each form fetched for its one-use token, then posted from the console's origin."""

    def __init__(self, port: int) -> None:
        self.port = port

    def ask(self, **command: str) -> dict[str, str]:
        account, key_id = command["account"], command.get("key_id", "")
        if command["op"] == "revoke":
            status, page = self._submit(account, f"/console/revoke?key={key_id}", key=key_id)
            assert status == 303, page
            return {"status": "Revoked"}
        if command["op"] == "rotate":
            status, page = self._submit(account, f"/console/rotate?key={key_id}", key=key_id)
        else:
            organization = command.get("organization")
            scope = "tenant:acme" if organization is None else f"organization:{organization}"
            fields = {"name": command["name"], "lifetime": "30d", "date": "", "tz": ""}
            status, page = self._submit(account, "/console/", scope=scope, **fields)
        assert status == 201, page
        shown = re.search(r'id="secret" type="text" readonly value="(rma_\w+)"', page)
        assert shown is not None, "the created page shows no secret"
        secret = shown.group(1)
        return {"key_id": secret[4:16], "secret": secret}  # rma_ and the 12-character id

    def _submit(self, account: str, form_page: str, **fields: str) -> tuple[int, str]:
        status, page = self._send("GET", form_page, account)
        assert status == 200, page
        form = {"token": form_token(page), **fields}
        return self._send("POST", form_page.partition("?")[0], account, form)

    def _send(
        self, method: str, path: str, account: str, form: dict[str, str] | None = None
    ) -> tuple[int, str]:
        headers = {"Cookie": f"account={account}"}
        body = None
        if form is not None:
            headers["Origin"] = f"http://127.0.0.1:{self.port}"
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            body = urllib.parse.urlencode(form)
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WRITE_TIMEOUT)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.read().decode()
        finally:
            connection.close()


class Scenario:
    """The writes, each timed and recorded, each waited on until every worker was judged."""

    def __init__(
        self, url: str, ledger: Ledger, servers: tuple[Server, ...], writer: Writer, lag: float
    ) -> None:
        self.url, self.ledger, self.servers, self.lag = url, ledger, servers, lag
        self.writer = writer  # the console or the KeyManager process: the test switches

    def create(self, account: str, organization: str | None = None) -> Key:
        """A tenant key (in acme) or a key scoped to *organization*, by the writer."""
        sent = time.monotonic()
        if organization is None:
            reply = self.writer.ask(op="create", account=account, name="new")
        else:
            reply = self.writer.ask(
                op="create", account=account, name="team", organization=organization
            )
        key = Key(reply["key_id"], reply["secret"], account, organization is None, changes=[])
        self._committed(key, "created", sent)
        return key

    def rotate(self, old: Key) -> Key:
        """The replacement of *old*, by the writer; *old* keeps working."""
        sent = time.monotonic()
        reply = self.writer.ask(op="rotate", account=old.account, key_id=old.key_id)
        key = Key(reply["key_id"], reply["secret"], old.account, old.tenant, changes=[])
        self._committed(key, "created", sent)
        return key

    def revoke(self, key: Key) -> None:
        sent = time.monotonic()
        self.writer.ask(op="revoke", account=key.account, key_id=key.key_id)
        self._committed(key, "revoked", sent)

    def remove(self, key: Key, *command: str) -> None:
        """By the keyturn command, ``member remove`` or ``org remove``: *key* is Inactive."""
        sent = time.monotonic()
        cli(self.url, *command)
        self._committed(key, f"{command[0]} removed", sent)

    def _committed(self, key: Key, what: str, sent: float) -> None:
        change = Change(what, sent, time.monotonic(), works=what == "created")
        start = len(self.ledger.answers)
        self.ledger.changed(key, change)
        wait_for_judged(self.ledger, self.servers, key, change, self.lag, start)


# --- the load ----------------------------------------------------------------------------------


def load(ledger: Ledger, server: str, port: int, stop: threading.Event) -> None:
    """Request with the latest changed key and every key in turn, until stopped (bounded).

    A request that gets no answer counts as status 0. At most one request per ``PACE``:
    on a fast machine the loop must not spend ``MAX_REQUESTS`` before the writes are done.
    """
    sent = 0.0
    for turn in itertools.count():
        if stop.is_set() or not ledger.take():
            return
        time.sleep(max(0.0, sent + PACE - time.monotonic()))
        latest = ledger.latest
        key = (
            latest if turn % 2 == 0 and latest is not None else ledger.keys[turn % len(ledger.keys)]
        )
        sent = time.monotonic()
        try:
            status, worker = get(port, key)
        except (OSError, http.client.HTTPException):
            status, worker = 0, ""
        ledger.answers.append(Answer(sent, time.monotonic(), server, worker, key, status))


def wait_for_judged(
    ledger: Ledger, servers: tuple[Server, ...], key: Key, change: Change, lag: float, start: int
) -> None:
    """Wait until every worker of every server answered a judged request for *change*."""
    seen: dict[str, set[str]] = {server.name: set() for server in servers}
    position = start
    for _ in range(POLLS):
        answers = ledger.answers[position:]
        position += len(answers)
        for answer in answers:
            if answer.key is key and answer.worker and answer.sent >= change.committed + lag:
                seen[answer.server].add(answer.worker)
        if all(len(seen[server.name]) >= server.workers for server in servers):
            return
        time.sleep(0.01)
    pytest.fail(f"no judged answer from every worker after {change.what} of {key.key_id}: {seen}")


# --- the suite ------------------------------------------------------------------------------


def verdict(answer: Answer, lag: float) -> str | None:
    """What is wrong with *answer*, or None (also when it is not judged)."""
    if answer.status not in (200, 401):
        return f"status {answer.status}"
    change = answer.key.expected(answer.sent, answer.answered, lag)
    if change is None or (answer.status == 200) == change.works:
        return None
    return "a new key refused" if change.works else f"a key accepted after {change.what}"


def seed(url: str, ledger: Ledger) -> None:
    """The tenant, alice's role and one tenant key of hers for each round's revoke."""
    with open_database(url) as db:
        db.membership.add_organization("org_default", tenant_id="acme", default=True)
        db.membership.add_member("alice", "org_default", role="admin")
        manager = KeyManager(db.keys, db.membership)
        for n in range(ROUNDS):
            created = manager.create("alice", name=f"seed {n}", scope=Scope.tenant("acme"))
            key = Key(created.info.key_id, created.secret, "alice", tenant=True, changes=[])
            ledger.changed(key, Change("created", 0.0, 0.0, works=True))


def test_every_server_sees_every_commit_and_nothing_is_lost(store_url: str, tmp_path: Path) -> None:
    """Three servers of five workers over one store (and over SQLite a preloaded gunicorn
    of two more): no stale answer, no lost write."""
    kind = "sqlite" if store_url.startswith("sqlite") else "postgres"
    lag = LAG[kind]
    ledger = Ledger()
    seed(store_url, ledger)
    # The preloaded gunicorn over SQLite only: over PostgreSQL its workers would share the
    # connections their parent's pool opened, which are the stores' to renew in a child.
    servers = (*SERVERS, PRELOADED) if kind == "sqlite" else SERVERS
    warm_up = {WARM_UP_KEY: ledger.keys[0].secret}  # revoked in the first round, not before
    stop = threading.Event()
    with ExitStack() as stack:
        ports = {
            server.name: stack.enter_context(
                serving(server, store_url, tmp_path / f"{server.name}.log", warm_up)
            )
            for server in servers
        }
        console = ConsoleWriter(
            stack.enter_context(serving(CONSOLE, store_url, tmp_path / "console.log"))
        )
        writer = ManagerWriter(store_url)
        stack.callback(writer.close)
        threads = [
            threading.Thread(target=load, args=(ledger, name, port, stop))
            for name, port in ports.items()
            for _ in range(THREADS_PER_SERVER)
        ]
        for thread in threads:
            thread.start()

        def stop_load() -> None:
            stop.set()
            for thread in threads:
                thread.join(REQUEST_TIMEOUT * 2)

        stack.callback(stop_load)

        scenario = Scenario(store_url, ledger, servers, console, lag)
        for round_ in range(ROUNDS):
            scenario.writer = console if round_ % 2 == 0 else writer
            organization = f"org_round_{round_}"
            cli(store_url, "org", "add", organization, "--tenant", "acme")
            cli(store_url, "member", "add", "carol", organization, "--role", "member")
            new = scenario.create("alice")
            scenario.revoke(ledger.keys[round_])  # a seeded key
            scenario.rotate(new)
            carols = scenario.create("carol", organization)
            if round_ % 2 == 0:
                scenario.remove(carols, "member", "remove", "carol", organization)
            else:
                scenario.remove(carols, "org", "remove", organization)
        stop_load()
        workers = {
            name: {a.worker for a in ledger.answers if a.server == name and a.worker}
            for name in ports
        }
    assert alive(set().union(*workers.values())) == set(), "workers outlived their server"

    judged = [a for a in ledger.answers if a.key.expected(a.sent, a.answered, lag) is not None]
    wrong = Counter((v, a.server) for a in ledger.answers if (v := verdict(a, lag)) is not None)
    per_worker = Counter((a.server, a.worker) for a in ledger.answers)
    # Informational: stale answers inside the lag, which the lag allows.
    in_lag = sum(1 for a in ledger.answers if verdict(a, 0.0) and not verdict(a, lag))
    summary = (
        f"{kind}: {len(ledger.answers)} answers, {len(judged)} judged, "
        f"{sum(1 for k in ledger.keys for c in k.changes if c.sent)} changes, "
        f"{in_lag} stale within the lag; per worker {dict(per_worker)}"
    )
    print(summary)  # shown with pytest -rP
    # What a wrong answer was, precisely: enough to tell a stale store from a bad judge.
    details = [
        f"{verdict(a, lag)}: key {a.key.key_id} of {a.key.account} on {a.server} "
        f"(worker {a.worker}), status {a.status}, sent {a.sent:.4f}, "
        f"answered {a.answered:.4f}; changes "
        + ", ".join(
            f"{c.what} sent {c.sent:.4f}, committed {c.committed:.4f}" for c in a.key.changes
        )
        for a in ledger.answers
        if verdict(a, lag) is not None
    ][:5]
    assert wrong == Counter(), "\n".join([summary, *details])
    for server in servers:
        assert len(workers[server.name]) >= server.workers, summary

    # Nothing lost: a fresh process reads back every key, status and membership.
    for account in ("alice", "carol"):
        listed = json.loads(cli(store_url, "keys", "list", "--as", account, "--json"))
        assert {key["key_id"]: key["status"] for key in listed} == {
            key.key_id: key.final_status() for key in ledger.keys if key.account == account
        }
    organizations = json.loads(cli(store_url, "org", "list", "--json"))
    kept = [f"org_round_{n}" for n in range(0, ROUNDS, 2)]  # odd rounds removed theirs
    assert sorted(org["id"] for org in organizations) == ["org_default", *kept]
    assert json.loads(cli(store_url, "member", "list", "org_default", "--json")) == [
        {"account_id": "alice", "role": "admin"}
    ]
    for organization in kept:
        assert json.loads(cli(store_url, "member", "list", organization, "--json")) == []


def test_preloaded_workers_verify_keys_their_parent_never_saw(tmp_path: Path) -> None:
    """gunicorn ``--preload`` over a SQLite file: its parent built the Authenticator and
    verified one key (the usage writer ran on its thread) before it forked
    the workers; each key it never saw is accepted by the worker the request reaches."""
    url = f"sqlite:///{tmp_path / 'keyturn.sqlite3'}"
    scope = Scope.organization("org_default", tenant_id="acme")
    with open_database(url) as db:
        db.membership.add_organization("org_default", tenant_id="acme", default=True)
        db.membership.add_member("alice", "org_default", role="admin")
        manager = KeyManager(db.keys, db.membership)
        warm_up = manager.create("alice", name="start-up check", scope=Scope.tenant("acme"))
        created = [manager.create("alice", name=f"k{n}", scope=scope) for n in range(FRESH_KEYS)]
    fresh = [Key(key.info.key_id, key.secret, "alice", tenant=False, changes=[]) for key in created]
    statuses: Counter[int | str] = Counter()
    workers: set[str] = set()
    log = tmp_path / "gunicorn.log"
    with serving(PRELOADED, url, log, {WARM_UP_KEY: warm_up.secret}) as port:
        for key in fresh:
            try:
                status, worker = get(port, key)  # bounded: REQUEST_TIMEOUT
            except (OSError, http.client.HTTPException):
                status, worker = "no answer", ""
            statuses[status] += 1
            workers.add(worker)
    assert alive(workers - {""}) == set(), "workers outlived their server"
    assert statuses == Counter({200: FRESH_KEYS}), (
        f"keys the parent never verified: {dict(statuses)} of {FRESH_KEYS}, "
        f"answered by workers {sorted(workers - {''})}"
    )
