"""PostgreSQL restarted under load, on a private server this test starts and stops.

The shared test server is never restarted: this test runs its own (``initdb`` and
``pg_ctl`` from the machine's PostgreSQL, as the ``postgres`` user when run as root), on a
free loopback port, stopped by its PID at the end. Requests flow from three threads while
the server restarts and a key is revoked; none may accept the revoked key past the feed's
lag, none may be a 401 for the good key or a 500, and once the listener is back the warm
path reads nothing again, without restarting the app.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from keyturn import Authenticator, KeyManager, Principal, Reason, Refusal
from tests.stores.conftest import _postgres_unavailable
from tests.stores.test_replica import TENANT, eventually, request, seed

LAG = 1.0  # the feed's documented bound for this test: a loaded 2-core machine
REQUESTS_PER_THREAD = 4000  # the load loop's bound


@attrs.define
class PrivateServer:
    data: Path
    port: int
    pg_ctl: str
    as_postgres: list[str]

    @property
    def log(self) -> Path:
        return self.data.parent / "log"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def ctl(self, *args: str) -> None:
        subprocess.run(  # noqa: S603 -- the machine's own pg_ctl, fixed arguments
            [
                *self.as_postgres,
                self.pg_ctl,
                "-D",
                str(self.data),
                "-w",
                "-l",
                str(self.log),
                *args,
            ],
            check=True,
            timeout=120,
            # Not a pipe: the server it starts would hold it open, and this call wait on it.
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None


@pytest.fixture
def private_postgres() -> Iterator[PrivateServer]:
    binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not binaries:
        _postgres_unavailable("no PostgreSQL server binaries (initdb) on this machine")
    bin_dir = binaries[-1].parent
    as_postgres: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        runuser = shutil.which("runuser")
        if runuser is None:
            _postgres_unavailable("running as root without runuser to become postgres")
        as_postgres = [runuser, "-u", "postgres", "--"]
    top = Path(tempfile.mkdtemp(prefix="keyturn-pg-"))
    data = top / "data"
    if as_postgres:
        shutil.chown(top, user="postgres")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = PrivateServer(data, port, str(bin_dir / "pg_ctl"), as_postgres)
    options = f"-p {port} -k {top} -c listen_addresses=127.0.0.1 -c fsync=off"
    try:
        subprocess.run(  # noqa: S603 -- the machine's own initdb, fixed arguments
            [
                *as_postgres,
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
            check=True,
            timeout=120,
            capture_output=True,
        )
        server.ctl("-o", options, "start")
        yield server
    finally:
        pid = server.pid()
        if pid is not None:
            os.kill(pid, signal.SIGQUIT)  # immediate shutdown, by its PID
            deadline = time.monotonic() + 30
            while server.pid() is not None and time.monotonic() < deadline:
                time.sleep(0.05)
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.postgres
def test_a_restart_under_load_accepts_no_revoked_key_and_recovers(
    private_postgres: PrivateServer,
) -> None:
    """Through a restart: 200 or 503 for the good key, never 401 or 500; the key revoked
    right after the restart refused past the lag; and zero reads once the feed is back."""
    import psycopg
    from psycopg_pool import ConnectionPool

    from keyturn.stores.postgres import PostgresDatabase

    executed: list[str] = []

    class Counting(psycopg.Connection[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            executed.append(str(query))
            return super().execute(query, params, **kwargs)

    url = private_postgres.url
    pool = ConnectionPool(
        url, connection_class=Counting, kwargs={"autocommit": True}, timeout=1.0, open=True
    )
    db = PostgresDatabase(pool=pool)
    db.create_schema()
    good = seed(db)
    doomed = KeyManager(db.keys, db.membership).create("alice", name="doomed", scope=TENANT)
    auth = Authenticator(db.keys, db.membership, usage_interval=None, timeout=2.0)
    auth.authenticate(request(good))
    assert eventually(lambda: db.replica.current)

    answers: list[tuple[float, str, object]] = []
    stop = threading.Event()

    def load() -> None:
        for index in range(REQUESTS_PER_THREAD):
            if stop.is_set():
                return
            name, secret = ("good", good) if index % 2 else ("doomed", doomed.secret)
            sent = time.monotonic()
            answers.append((sent, name, auth.authenticate(request(secret))))
            time.sleep(0.002)

    threads = [threading.Thread(target=load) for _ in range(3)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        private_postgres.ctl("-m", "fast", "restart")
        with psycopg.connect(url, autocommit=True) as raw:
            raw.execute(
                "UPDATE keyturn_keys SET revoked_at = now() WHERE key_id = %s",
                (doomed.info.key_id,),
            )
        revoked = time.monotonic()
        assert eventually(lambda: db.replica.current, seconds=30)
        time.sleep(LAG + 0.5)  # requests keep flowing past the lag
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    statuses = {
        name: {
            "ok" if isinstance(outcome, Principal) else outcome.reason  # type: ignore[union-attr]
            for _, who, outcome in answers
            if who == name
        }
        for name in ("good", "doomed")
    }
    assert statuses["good"] <= {"ok", Reason.BACKEND_ERROR, Reason.BACKEND_TIMEOUT}
    assert "ok" in statuses["good"]
    late = [outcome for sent, who, outcome in answers if who == "doomed" and sent > revoked + LAG]
    assert late and all(
        isinstance(outcome, Refusal) and outcome.reason is Reason.REVOKED for outcome in late
    )
    assert isinstance(auth.authenticate(request(good)), Principal)  # refills after the restart
    executed.clear()
    for _ in range(10):
        assert isinstance(auth.authenticate(request(good)), Principal)
    assert executed == []
    auth.close()
    db.close()
    pool.close()
