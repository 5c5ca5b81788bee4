"""A newcomer's first hour, scripted: the built wheel in a clean environment with one extra,
the ``keyturn`` command, and an example served by a real server, as the README tells it.

The environment holds the wheel with ``[wsgi]`` (which adds nothing: the WSGI adapter needs
only the core) and Werkzeug, as the Werkzeug example's docstring says to install; the
example is served by the standard library's server. Every process started here is bounded
by a timeout and stopped by its PID.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.environments import ROOT, Environments

SECRET = re.compile(r"rma_[A-Za-z0-9]{46}")
MODELS = "/managed-agents/v1/models"


# What a console page does when its signed-in user creates a key.
CREATE_KEY = """
import os, sys
from keyturn import KeyManager, Scope
from keyturn.stores import open_database
with open_database(os.environ["KEYTURN_STORE_URL"]) as db:
    created = KeyManager(db.keys, db.membership).create(
        "alice", name=sys.argv[1], scope=Scope.tenant("acme")
    )
print(created.secret)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Newcomer:
    """A shell in a scratch directory, with the clean environment's programs."""

    def __init__(self, python: Path, home: Path) -> None:
        self.python = python
        self.home = home
        self.env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("PYTHONPATH", "VIRTUAL_ENV", "KEYTURN_STORE_URL")
        }
        self.env["KEYTURN_STORE_URL"] = f"sqlite:///{home / 'keys.sqlite3'}"

    def run(self, *argv: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(  # noqa: S603 -- the environment's own programs
            [str(self.python.parent / argv[0]), *argv[1:]],
            cwd=self.home,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == expect, (argv, done.stdout, done.stderr)
        return done

    def keyturn(self, *argv: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        return self.run("keyturn", *argv, expect=expect)

    def keys(self, account: str) -> dict[str, dict[str, Any]]:
        listed = json.loads(self.keyturn("keys", "list", "--as", account, "--json").stdout)
        return {key["key_id"]: key for key in listed}


@pytest.fixture(scope="module")
def newcomer(environments: Environments, tmp_path_factory: pytest.TempPathFactory) -> Newcomer:
    return Newcomer(
        environments.python(["keyturn[wsgi]", "werkzeug"]), tmp_path_factory.mktemp("newcomer")
    )


def test_missing_extras_name_what_to_install(newcomer: Newcomer) -> None:
    """With only [wsgi], importing another extra's module says which extra to install."""
    for module, extra in [("fastapi", "fastapi"), ("django", "django"), ("client", "client")]:
        failed = newcomer.run("python", "-c", f"import keyturn.{module}", expect=1)
        assert f"pip install 'keyturn[{extra}]'" in failed.stderr
    postgres = (
        "from keyturn.stores import open_database; open_database('postgresql://x@127.0.0.1/x')"
    )
    assert (
        "pip install 'keyturn[postgres]'" in newcomer.run("python", "-c", postgres, expect=1).stderr
    )


def test_walk(newcomer: Newcomer) -> None:
    """Store, organization, member, two keys, an emergency revoke, a scan; then the example
    serves them.
    """
    newcomer.keyturn("db", "init")
    newcomer.keyturn("org", "add", "org_acme", "--tenant", "acme", "--default")
    newcomer.keyturn("member", "add", "alice", "org_acme", "--role", "admin")
    # Keys are made in the console, for the signed-in user: here, by KeyManager, as a host's
    # console page would (the command creates no key).
    created = [newcomer.run("python", "-c", CREATE_KEY, name).stdout for name in ("CI", "laptop")]
    kept, leaked = (SECRET.findall(output)[-1] for output in created)
    kept_id, leaked_id = kept[4:16], leaked[4:16]
    assert set(newcomer.keys("alice")) == {kept_id, leaked_id}

    # The leaked key sits in a file: the scanner finds it by id, never printing the secret.
    (newcomer.home / "settings.env").write_text(f"AGENTS_KEY={leaked}\n", encoding="utf-8")
    scan = newcomer.keyturn("scan", ".", expect=1)
    assert leaked_id in scan.stdout
    assert leaked not in scan.stdout + scan.stderr
    newcomer.keyturn("keys", "revoke", "--as", "alice", leaked_id, "--reason", "in settings.env")
    assert newcomer.keys("alice")[leaked_id]["status"] == "Revoked"

    # The example, copied as a user would, served as it is by the standard library's server.
    example = shutil.copy(ROOT / "examples" / "werkzeug_app.py", newcomer.home / "app.py")
    port = free_port()
    server = subprocess.Popen(  # noqa: S603 -- the environment's Python and our example
        [str(newcomer.python), example],
        cwd=newcomer.home,
        env={**newcomer.env, "PORT": str(port), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    watchdog = threading.Timer(60, server.kill)  # no hang, whatever happens
    watchdog.start()
    try:
        assert server.stdout is not None
        assert server.stdout.readline().startswith(f"Serving on http://127.0.0.1:{port}")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            bearer = {"Authorization": f"Bearer {kept}", "x-organization-id": "default"}
            ok = client.get(MODELS, headers=bearer)
            revoked = client.get(MODELS, headers={**bearer, "Authorization": f"Bearer {leaked}"})
            missing = client.get(MODELS, headers={"Authorization": f"Bearer {kept}"})
            health = client.get("/healthz")
    finally:
        os.kill(server.pid, signal.SIGTERM)
        code = server.wait(10)
        watchdog.cancel()
        if server.stdout is not None:
            server.stdout.close()

    assert ok.status_code == 200
    assert ok.json()["items"][0] == {"id": "agent-small", "organization_id": "org_acme"}
    assert (ok.headers["service-organization-id"], ok.headers["service-tenant-id"]) == (
        "org_acme",
        "acme",
    )
    assert revoked.status_code == 401
    assert revoked.json()["error"]["code"] == "unauthorized"
    assert missing.status_code == 400
    assert health.json() == {"status": "ok"}
    assert code == 0  # SIGTERM stops the example cleanly...
    assert newcomer.keys("alice")[kept_id]["last_used_at"] is not None  # ...its writes landed


def test_make_refuses_an_old_python_without_leaving_a_venv(tmp_path: Path) -> None:
    """With a Python older than 3.11, make says what to do and leaves no .venv behind."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    old = tmp_path / "python3.10"
    old.write_text('#!/bin/sh\n[ "$1" = "-V" ] && echo "Python 3.10.12" && exit 0\nexit 1\n')
    old.chmod(0o755)
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")

    done = subprocess.run(  # noqa: S603 -- make, in a scratch copy of the project's Makefile
        ["make", "demo", f"PYTHON={old}"],  # noqa: S607
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode != 0
    assert "needs Python 3.11 or newer" in done.stderr
    assert "Python 3.10.12" in done.stderr
    assert not (tmp_path / ".venv").exists()
