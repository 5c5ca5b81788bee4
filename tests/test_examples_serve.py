"""Each example file serves as it is: ``python examples/x.py`` with a store URL and a port,
a real request, then SIGTERM by PID; the server stops cleanly and its writes have landed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from keyturn import KeyManager, Scope
from keyturn.stores import open_database

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(path.stem for path in (ROOT / "examples").glob("*.py"))
MODELS = "/managed-agents/v1/models"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_serves_as_it_is(example: str, tmp_path: Path) -> None:
    """The example answers 200 with a key and 401 without; SIGTERM stops it with last_used_at."""
    url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    with open_database(url) as db:
        db.create_schema()
        db.membership.add_organization("org_main", tenant_id="acme", default=True)
        db.membership.add_member("alice", "org_main", role="admin")
        key = KeyManager(db.keys, db.membership).create(
            "alice", name="example", scope=Scope.tenant("acme")
        )
    port = free_port()
    errors = (tmp_path / "stderr").open("w")  # closed once the server has stopped
    server = subprocess.Popen(  # noqa: S603 -- our interpreter and our example
        [sys.executable, str(ROOT / "examples" / f"{example}.py")],
        cwd=tmp_path,
        env={**os.environ, "KEYTURN_STORE_URL": url, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=errors,
    )
    watchdog = threading.Timer(60, server.kill)  # no hang, whatever happens
    watchdog.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            for _ in range(400):  # bounded: about 20 seconds
                try:
                    health = client.get("/healthz")
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
            else:
                pytest.fail(f"{example} did not serve on port {port}")
            ok = client.get(
                MODELS,
                headers={"Authorization": f"Bearer {key.secret}", "x-organization-id": "default"},
            )
            refused = client.get(MODELS)
    finally:
        os.kill(server.pid, signal.SIGTERM)
        code = server.wait(20)
        watchdog.cancel()
        errors.close()

    assert health.status_code == 200
    assert ok.status_code == 200
    assert ok.json()["items"][0]["organization_id"] == "org_main"
    assert ok.headers["service-tenant-id"] == "acme"
    assert refused.status_code == 401
    # The example logs each refusal with its reason, as the demo does.
    logged = (tmp_path / "stderr").read_text()
    assert "INFO keyturn: refused" in logged and "with 401: missing" in logged, logged
    assert code in (0, -signal.SIGTERM)  # uvicorn re-raises SIGTERM once it has shut down
    with open_database(url) as db:
        stored = db.keys.get_key(key.info.key_id)
    assert stored is not None
    assert stored.last_used_at is not None  # the authenticator was closed on the way out
