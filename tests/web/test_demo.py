"""``python -m keyturn.demo``: the printed curl lines do what their comments say."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from keyturn import Authenticator, AuthRequest, Principal
from keyturn.demo import seed
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_seed_gives_working_keys() -> None:
    """seed() fills a store and a membership so that both demo keys authenticate."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    keys = seed(store, membership)
    authenticator = Authenticator(store, membership)
    try:
        tenant = authenticator.authenticate(
            AuthRequest(authorization=(f"Bearer {keys.tenant.secret}",), organization=("default",))
        )
        organization = authenticator.authenticate(
            AuthRequest(authorization=(f"Bearer {keys.organization.secret}",))
        )
    finally:
        authenticator.close()
    assert isinstance(tenant, Principal) and tenant.organization_id == "acme-main"
    assert isinstance(organization, Principal) and organization.organization_id == "acme-research"


def test_demo_serves_what_it_prints(tmp_path: Path) -> None:
    """The demo starts uvicorn on SQLite, and each printed curl line gets the status it names."""
    port = free_port()
    store = tmp_path / "demo.sqlite3"
    env = {
        **os.environ,
        "KEYTURN_DEMO_PORT": str(port),
        "KEYTURN_DEMO_STORE": f"sqlite:///{store}",
        "PYTHONUNBUFFERED": "1",
    }
    demo = subprocess.Popen(
        [sys.executable, "-m", "keyturn.demo"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    watchdog = threading.Timer(30, demo.kill)  # no hang, whatever happens
    watchdog.start()
    try:
        assert demo.stdout is not None
        lines: list[str] = []
        while sum(line.startswith("curl ") for line in lines) < 4 and len(lines) < 40:
            lines.append(demo.stdout.readline())
        commands = []
        for comment, command in itertools.pairwise(lines):
            if comment.startswith("# ") and command.startswith("curl "):
                status = re.match(r"# (\d{3})", comment)
                assert status is not None
                commands.append((int(status[1]), shlex.split(command)))
        assert [status for status, _ in commands] == [200, 200, 400, 401]

        with httpx.Client(timeout=5) as client:
            for _ in range(200):  # bounded: about 10 seconds
                try:
                    client.get(f"http://127.0.0.1:{port}/healthz")
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
            for expected, argv in commands:
                headers = [
                    (name, value)
                    for flag, header in itertools.pairwise(argv)
                    if flag == "-H"
                    for name, value in [header.split(": ", 1)]
                ]
                reply = client.get(argv[-1], headers=headers)
                assert reply.status_code == expected, (argv, reply.text)
                if expected == 200:
                    assert reply.headers["service-tenant-id"] == "acme"
                    assert reply.json()["items"]
    finally:
        watchdog.cancel()
        demo.terminate()
        demo.wait(10)
        if demo.stdout is not None:
            demo.stdout.close()
    assert store.is_file()  # the keys live in the embedded SQLite store, not in memory
