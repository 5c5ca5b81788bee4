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
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from keyturn import Authenticator, AuthRequest, KeyManager, Principal, Status
from keyturn.demo import USER, seed
from keyturn.stores import open_database
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
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(30, demo.kill)  # no hang, whatever happens
    watchdog.start()
    try:
        assert demo.stdout is not None
        lines: list[str] = []
        while len(lines) < 60 and (not lines or "list them with" not in lines[-1]):
            lines.append(demo.stdout.readline())
        hint = shlex.split(lines[-1].split("list them with ", 1)[1])
        commands = []
        for comment, command in itertools.pairwise(lines):
            if comment.startswith("# ") and command.startswith("curl "):
                status = re.match(r"# (\d{3})", comment)
                assert status is not None
                commands.append((int(status[1]), shlex.split(command)))
        assert [status for status, _ in commands] == [200, 200, 400, 404, 401]

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
        # The demo writes every request's counts at once: its console's chart is current
        # while it runs (two accepted; the tenant key's two refusals), not a minute behind.
        counts: dict[str, int] = {}
        for _ in range(200):  # bounded: about 10 seconds
            with open_database(f"sqlite:///{store}") as db:
                rows = db.keys.usage_of(USER, datetime.now(UTC).date() - timedelta(days=1))
            counts = {}
            for row in rows:
                counts.setdefault(row.outcome, 0)
                counts[row.outcome] += row.requests
            if sum(counts.values()) == 4:
                break
            time.sleep(0.05)
        assert counts == {"accepted": 2, "org_header_missing": 1, "org_not_found": 1}
    finally:
        watchdog.cancel()
        demo.terminate()
        _, console = demo.communicate(timeout=10)
    assert store.is_file()  # the keys live in the embedded SQLite store, not in memory
    # Each refusal is on the console, with its reason: 400, 404, 401 in the printed order.
    refusals = [line for line in console.splitlines() if "keyturn: refused " in line]
    assert [line.split(" with ")[1][:3] for line in refusals] == ["400", "404", "401"]
    assert "org_header_missing" in refusals[0]
    # The printed hint works as printed: the demo user's two keys, both active.
    listed = subprocess.run(hint, capture_output=True, text=True, timeout=30, check=True)  # noqa: S603
    assert listed.stdout.count("demo: ") == 2


def test_seed_again_replaces_the_demo_keys() -> None:
    """A second seed revokes the first run's keys: the user has two active demo keys, not four."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    first = seed(store, membership)
    second = seed(store, membership)

    active = KeyManager(store, membership).list(USER, status=Status.ACTIVE)

    assert {info.key_id for info in active} == {
        second.tenant.info.key_id,
        second.organization.info.key_id,
    }
    assert first.tenant.info.key_id not in {info.key_id for info in active}
