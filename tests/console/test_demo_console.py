"""``make demo`` serves the key console: a newcomer can use it without reading any docs.

The demo runs as its own process on a free 127.0.0.1 port with a scratch SQLite store, and
is stopped by its PID. Chromium then signs in on the demo-only page and creates, copies,
lists, filters and revokes a key.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from keyturn.demo import USER, console_routes
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from tests.console.support import expect


def _demo_app() -> Any:
    from starlette.applications import Starlette

    membership = MemoryMembership()
    membership.add_organization("acme-main", tenant_id="acme", default=True)
    membership.add_member(USER, "acme-main", role="admin")
    return Starlette(routes=console_routes(MemoryKeyStore(), membership))


DEMO = "http://127.0.0.1:8000"
OWN = {"origin": DEMO}


def test_demo_console_sits_behind_a_demo_only_sign_in() -> None:
    """/console/ sends a visitor to a sign-in page that says it is for the demo only."""
    with TestClient(_demo_app(), base_url=DEMO, follow_redirects=False) as client:
        first = client.get("/console/")
        assert first.status_code == 303
        assert first.headers["location"] == "/demo/sign-in?next=%2Fconsole%2F"
        page = client.get("/demo/sign-in")
        assert "For this demo only." in page.text
        assert "Sign in as demo-user" in page.text
        refused = client.post("/demo/sign-in", content=b"account=mallory", headers=OWN)
        assert refused.status_code == 200
        assert "keyturn_demo_account" not in refused.headers.get("set-cookie", "")
        signed = client.post("/demo/sign-in", content=f"account={USER}".encode(), headers=OWN)
        assert signed.status_code == 303
        console = client.get("/console/")
        assert console.status_code == 200
        assert f"Signed in as <strong>{USER}</strong>" in console.text


@pytest.mark.parametrize(
    "headers",
    [
        {"origin": "https://evil.example"},
        {"sec-fetch-site": "cross-site"},
        {"origin": "null"},
        {},
    ],
    ids=["another origin", "cross-site", "opaque origin alone", "neither header"],
)
def test_the_demo_sign_in_refuses_a_form_of_another_site(headers: dict[str, str]) -> None:
    """Login CSRF: a form another site posts (or one that says nothing of its origin) signs
    no one in.
    """
    with TestClient(_demo_app(), base_url=DEMO, follow_redirects=False) as client:
        reply = client.post("/demo/sign-in", content=f"account={USER}".encode(), headers=headers)

    assert reply.status_code == 403
    assert "set-cookie" not in reply.headers


def test_the_demo_sign_in_cannot_be_framed() -> None:
    """The sign-in page forbids framing, as the console's pages do."""
    with TestClient(_demo_app(), base_url=DEMO) as client:
        page = client.get("/demo/sign-in")

    assert page.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


@pytest.mark.parametrize("path", ["/demo/sign-in", "/console/"])
def test_the_demo_answers_only_its_own_host_names(path: str) -> None:
    """DNS rebinding: a page whose name now points at 127.0.0.1 sends its own name as Host;
    neither the sign-in nor the console answers it, so it can neither sign in nor create a key.
    """
    rebound = "http://rebound.example:8000"
    with TestClient(_demo_app(), base_url=rebound, follow_redirects=False) as client:
        get = client.get(path)
        post = client.post(path, content=f"account={USER}".encode(), headers={"origin": rebound})

    assert get.status_code == 400
    assert post.status_code == 400
    assert "set-cookie" not in post.headers


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[str]:
    """``python -m keyturn.demo`` on a free port; yields the console URL it prints."""
    env = {
        **os.environ,
        "KEYTURN_DEMO_PORT": str(_free_port()),
        "KEYTURN_DEMO_STORE": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        "PYTHONUNBUFFERED": "1",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "keyturn.demo"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    watchdog = threading.Timer(60, process.kill)  # no hang, whatever happens
    watchdog.start()
    try:
        assert process.stdout is not None
        url = None
        for _ in range(60):  # bounded: the banner is shorter
            line = process.stdout.readline()
            found = re.search(r"Key console: (http://127\.0\.0\.1:\d+/console/) .*demo only", line)
            if found:
                url = found.group(1)
            if "Uvicorn running" in line or not line:
                break
        assert url is not None, "the demo did not print the console's address"
        yield url
    finally:
        watchdog.cancel()
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


def test_a_newcomer_uses_the_demo_console(browser: Any, demo: str) -> None:
    """Sign in, create, copy, list, filter and revoke a key on the running demo."""
    context = browser.new_context(timezone_id="Europe/Berlin")
    context.grant_permissions(
        ["clipboard-read", "clipboard-write"], origin=demo.rsplit("/console/")[0]
    )
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.goto(demo)
    expect()(page.locator(".warning")).to_contain_text("For this demo only.")
    page.click(f"text=Sign in as {USER}")
    expect()(page.locator(".who")).to_contain_text(USER)
    page.fill("#name", "my laptop")
    page.select_option("#scope", "organization:acme-research")
    page.click("#create-button")
    secret = page.locator("#secret").input_value()
    page.click("#copy")
    expect()(page.locator("#copy-status")).to_have_text("Copied to the clipboard.")
    assert page.evaluate("navigator.clipboard.readText()") == secret
    page.click("text=Done: back to your keys")
    expect()(page.locator("tbody tr")).to_have_count(3)  # two demo keys and this one
    page.select_option("#filter-scope", "organization:acme-research")
    page.click("button:text('Filter')")
    expect()(page.locator("tbody th")).to_have_text(["my laptop", "demo: research"])
    page.locator("tr", has_text="my laptop").locator("a.revoke").click()
    page.click("button:text('Revoke “my laptop”')")
    expect()(page.locator("tr", has_text="my laptop").locator(".status")).to_have_text("✕ Revoked")
    context.close()
