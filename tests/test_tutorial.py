"""The tutorial (``docs/tutorial/``), followed as a reader would, in a fresh environment.

Its pages' ``python title="app.py"`` blocks are one file, built page by page: after each
page the file so far must import (each page's "Run it"), and the whole file passes ``mypy
--strict``. Then the finished ``app.py`` is served by uvicorn on 127.0.0.1, a real browser
(Debian's Chromium) signs in through its sign-in page, creates a key in the console, and the
``curl`` line the console shows answers 200, run as it is. The Flask and Django variants
(``flask_app.py``, ``django_app.py``) are built and checked the same way, and their
console is reached through their sign-in with the framework's test client. The
environment holds only what the tutorial says to install.
"""

from __future__ import annotations

import html
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from tests.console.conftest import browser  # noqa: F401 -- the fixture
from tests.environments import Environments
from tests.test_docs import free_port, python_blocks, requirements

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial"
PAGES = [TUTORIAL / "index.md", *sorted(TUTORIAL.glob("[0-9]-*.md"))]
TITLE = re.compile(r'^```python title="(?P<file>[\w.]+)"$', re.MULTILINE)
PASSWORD = "correct horse battery staple"


def files_of(page: Path) -> list[tuple[str, str]]:
    """The page's python blocks, in order, each with the file its title names."""
    text = page.read_text(encoding="utf-8")
    titles = [match["file"] for match in TITLE.finditer(text)]
    blocks = [code for _, code in python_blocks(text)]
    assert len(titles) == len(blocks), f"{page.name}: every python block names its file"
    return list(zip(titles, blocks, strict=True))


def the_environment(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ALICE_PASSWORD": PASSWORD,
        "SESSION_SECRET": "ab" * 32,
        "CONSOLE_SECRET": "cd" * 32,
        "KEYS_DB": f"sqlite:///{tmp_path / 'keys.sqlite3'}",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def test_the_tutorial_comes_first_and_each_page_ends_in_run_it() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:\n", 1)[1]
    assert nav.splitlines()[1] == "  - Tutorial:"
    for page in PAGES:
        assert page.name in nav, page.name
        assert re.search(r"^##+ Run it", page.read_text(encoding="utf-8"), re.M), page.name


@pytest.fixture(scope="module")
def tutorial_python(environments: Environments) -> Path:
    wanted: set[str] = set()
    for page in PAGES:
        wanted |= requirements(page.read_text(encoding="utf-8"))
    return environments.python(wanted)


def _write(folder: Path, name: str, blocks: list[str]) -> Path:
    path = folder / name
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return path


def test_each_page_runs_and_the_file_passes_mypy(tutorial_python: Path, tmp_path: Path) -> None:
    """After each page, ``app.py`` (and ``flask_app.py``) as built so far imports; the
    finished files pass mypy --strict."""
    built: dict[str, list[str]] = {}
    for page in PAGES:
        for name, code in files_of(page):
            built.setdefault(name, []).append(code)
        for name, blocks in built.items():
            _write(tmp_path, name, blocks)
            done = subprocess.run(  # noqa: S603 -- our interpreter and the page's file
                [tutorial_python, "-W", "error", "-c", f"import {name.removesuffix('.py')}"],
                cwd=tmp_path,
                env=the_environment(tmp_path),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, f"{page.name}, {name}:\n{done.stderr[-3000:]}"
    assert set(built) == {"app.py", "flask_app.py", "django_app.py"}
    checked = subprocess.run(  # noqa: S603 -- our interpreter and the tutorial's files
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--disable-error-code=import-untyped",  # Django ships no types
            "--no-incremental",
            "--python-executable",
            tutorial_python,
            "--config-file",
            os.devnull,
            "app.py",
            "flask_app.py",
            "django_app.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stdout[-3000:]


FLASK_SIGN_IN = f"""
from werkzeug.test import Client

import flask_app

browser = Client(flask_app.app)
sent = browser.get("/console/")
assert sent.headers["Location"] == "/login?next=%2Fconsole%2F", sent.headers
back = browser.post(
    "/login", data={{"username": "alice", "password": {PASSWORD!r}, "next": "/console/"}}
)
assert (back.status_code, back.headers["Location"]) == (303, "/console/"), back.status_code
assert "Signed in as <strong>alice</strong>" in browser.get("/console/").text
assert browser.get("/managed-agents/v1/models").status_code == 401
"""


DJANGO_SIGN_IN = f"""
import django_app  # configures Django first

from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

call_command("migrate", verbosity=0)
User.objects.create_user("alice", password={PASSWORD!r})
browser = Client()
sent = browser.get("/console/")
assert sent["Location"] == "/accounts/login/?next=%2Fconsole%2F", sent
assert browser.get(sent["Location"]).status_code == 200
back = browser.post(
    "/accounts/login/", {{"username": "alice", "password": {PASSWORD!r}, "next": "/console/"}}
)
assert back["Location"] == "/console/", back
assert "Signed in as <strong>alice</strong>" in browser.get("/console/").text
assert browser.get("/managed-agents/v1/models").status_code == 401
"""


@pytest.mark.parametrize(
    ("name", "script"), [("flask_app.py", FLASK_SIGN_IN), ("django_app.py", DJANGO_SIGN_IN)]
)
def test_a_variant_serves_the_console_behind_its_sign_in(
    tutorial_python: Path, tmp_path: Path, name: str, script: str
) -> None:
    app = [code for page in PAGES for file, code in files_of(page) if file == name]
    _write(tmp_path, name, app)
    done = subprocess.run(  # noqa: S603 -- our interpreter and the tutorial's app
        [tutorial_python, "-W", "error", "-c", script],
        cwd=tmp_path,
        env=the_environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _serve(argv: list[str], tmp_path: Path, port: int, log: IO[str]) -> subprocess.Popen[str]:
    server = subprocess.Popen(  # noqa: S603 -- our interpreter and the tutorial's app
        argv,
        cwd=tmp_path,
        env=the_environment(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=log,
        text=True,
    )
    with httpx.Client(timeout=5) as client:
        for _ in range(400):  # bounded: about 20 seconds
            try:
                client.get(f"http://127.0.0.1:{port}/login")
                return server
            except httpx.TransportError:
                time.sleep(0.05)
    server.kill()
    pytest.fail(f"the tutorial's app did not serve:\n{(tmp_path / 'server.log').read_text()}")


def test_a_key_made_in_the_browser_answers_200(
    tutorial_python: Path,
    tmp_path: Path,
    browser: Any,  # noqa: F811 -- the fixture
) -> None:
    """The finished app, served by uvicorn: the console sends the browser to the sign-in
    with ``next``, back after it; the key created there works with the page's curl line."""
    from playwright.sync_api import expect

    app = [code for page in PAGES for name, code in files_of(page) if name == "app.py"]
    _write(tmp_path, "app.py", app)
    port = free_port()
    uvicorn = [tutorial_python, "-m", "uvicorn", "app:app", "--host", "127.0.0.1"]
    log = (tmp_path / "server.log").open("w")
    server = _serve([*uvicorn, "--port", str(port)], tmp_path, port, log)
    watchdog = threading.Timer(120, server.kill)  # no hang, whatever happens
    watchdog.start()
    try:
        context = browser.new_context(timezone_id="Europe/Paris")
        page = context.new_page()
        page.set_default_timeout(10_000)
        page.goto(f"http://127.0.0.1:{port}/console/")
        expect(page).to_have_url(f"http://127.0.0.1:{port}/login?next=%2Fconsole%2F")
        page.fill("input[name=username]", "alice")
        page.fill("input[name=password]", PASSWORD)
        page.click("button")
        expect(page).to_have_url(f"http://127.0.0.1:{port}/console/")
        page.fill("#name", "my laptop")
        page.click("#create-button")
        curl = page.locator("#curl").inner_text()
        context.close()
        argv = shlex.split(html.unescape(curl))
        assert "x-organization-id: default" in argv  # a tenant key names its organization
        if shutil.which("curl") is not None:  # the line as it is, by curl itself
            argv[1:1] = ["-s", "-o", "/dev/null", "-w", "%{http_code}"]
            status = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout  # noqa: S603
        else:
            headers = dict(h.split(": ", 1) for h in argv[2:-1:2])
            status = str(httpx.get(argv[-1], headers=headers, timeout=10).status_code)
    finally:
        watchdog.cancel()
        server.send_signal(signal.SIGTERM)
        server.wait(20)
        log.close()
    assert status == "200", (tmp_path / "server.log").read_text()
    # The key was never refused on the way.
    assert "refused" not in (tmp_path / "server.log").read_text()
