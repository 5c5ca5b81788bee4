"""Every ```python block of README.md and docs/*.md runs as a reader would run it.

A page's blocks run in order in one namespace, like a reader following the page, in a
clean environment holding only the built wheel and what the page tells its reader to
``pip install`` (``pip install 'keyturn[asgi]' httpx2``, in a code block or inline): a page
that forgets a package fails here. They run with warnings as errors, so a deprecation
warning the reader would see fails too. Pasted into one file, a page's blocks pass
``mypy --strict`` against the same environment (untyped packages, i.e. Django, aside),
``no-run`` blocks included.

A block whose info string says ``python no-run`` is skipped; other languages (sh, text, ...)
are not code.

The quickstarts are also followed the way their text offers: the WSGI page's
plain-Werkzeug section with only what that section says to install, and each page's app
served by the commands it names (``waitress-serve``, ``gunicorn``, ``uvicorn``) from the
page's environment.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import attrs
import pytest

from tests.environments import Environments

ROOT = Path(__file__).resolve().parents[1]
ALL_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>.*)$")
PIP_INSTALL = re.compile(r"pip install ([^`\n#]+)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def python_blocks(text: str, *, no_run: bool = False) -> list[tuple[int, str]]:
    """The ``(line number, code)`` of each runnable python block of a Markdown page.

    *no_run* keeps the blocks marked ``no-run`` too (they need a server, but still type-check).
    """
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        index += 1
        if opening is None:
            continue
        indent, fence, info = opening["indent"], opening["fence"], opening["info"].split()
        start, body = index, []
        while index < len(lines):
            line = lines[index]
            index += 1
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                break
            body.append(line.removeprefix(indent))
        if info[:1] in (["python"], ["py"]) and (no_run or "no-run" not in info):
            blocks.append((start + 1, "\n".join(body)))
    return blocks


# Options whose next word is their value, not a package (``--find-links dist``).
VALUED_OPTIONS = frozenset({"-f", "--find-links", "-i", "--index-url", "--extra-index-url"})


def requirements(text: str) -> set[str]:
    """What the page tells its reader to ``pip install`` (a source checkout's ``.`` aside)."""
    named: set[str] = set()
    for arguments in PIP_INSTALL.findall(text):
        words = shlex.split(arguments)
        named.update(
            word
            for before, word in zip(["", *words], words, strict=False)
            if not word.startswith(("-", ".")) and word != "..." and before not in VALUED_OPTIONS
        )
    return named


def test_fences_are_found() -> None:
    """The block finder keeps python blocks, skips no-run and other languages, and dedents."""
    page = "\n".join(
        [
            "text",
            "```python",
            "a = 1",
            "```",
            "```sh",
            "make test",
            "```",
            "- item",
            "  ```python",
            "  b = a + 1",
            "  ```",
            "```python no-run",
            "c = 1 / 0",
            "```",
        ]
    )

    assert python_blocks(page) == [(3, "a = 1"), (10, "b = a + 1")]
    assert python_blocks(page, no_run=True)[-1] == (13, "c = 1 / 0")


def test_requirements_are_what_the_page_says_to_install() -> None:
    """Install lines in blocks and inline code count; options, their values and a source
    checkout do not."""
    page = "\n".join(
        [
            "```sh",
            "pip install 'keyturn[asgi]' httpx2   # the test client",
            "```",
            "Serve it: `pip install uvicorn`, or from a checkout `pip install -e '.[asgi]'`.",
            "A wheel: `pip install --find-links dist 'keyturn[wsgi]' -f wheels flask`.",
        ]
    )

    assert requirements(page) == {"keyturn[asgi]", "httpx2", "uvicorn", "keyturn[wsgi]", "flask"}


PAGES = [page for page in ALL_PAGES if python_blocks(page.read_text(encoding="utf-8"))]
IDS = [str(page.relative_to(ROOT)) for page in PAGES]


def _script(page: Path) -> str:
    """A program that runs the page's blocks in order, each under its page:line name."""
    blocks = python_blocks(page.read_text(encoding="utf-8"))
    name = str(page.relative_to(ROOT))
    return "\n".join(
        [
            # The program's own globals: the page runs as __main__, as a pasted file would.
            f"for _line, _code in {blocks!r}:",
            f'    exec(compile(_code, f"{name}:{{_line}}", "exec"), globals())',
            "",
        ]
    )


def _pasted(page: Path) -> str:
    """The page's blocks pasted into one module, as a reader copying them would."""
    blocks = python_blocks(page.read_text(encoding="utf-8"), no_run=True)
    return "\n\n".join(f"# {page.name}:{line}\n{code}" for line, code in blocks) + "\n"


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_code_blocks_run(page: Path, environments: Environments, tmp_path: Path) -> None:
    """The page's blocks run, in order, with only what the page says to install."""
    python = environments.python(requirements(page.read_text(encoding="utf-8")))
    script = tmp_path / "page.py"
    script.write_text(_script(page), encoding="utf-8")

    done = subprocess.run(  # noqa: S603 -- our own interpreter and script
        [python, "-W", "error", script],
        cwd=tmp_path,  # files a page creates land in a scratch directory
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )

    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_code_blocks_pass_mypy_strict(
    page: Path, environments: Environments, tmp_path: Path
) -> None:
    """The page's blocks, pasted into one file, pass mypy --strict in the page's environment."""
    python = environments.python(requirements(page.read_text(encoding="utf-8")))
    pasted = tmp_path / f"page_{page.stem.replace('-', '_')}.py"  # never a package's name
    pasted.write_text(_pasted(page), encoding="utf-8")

    done = subprocess.run(  # noqa: S603 -- our own interpreter and file
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--disable-error-code=import-untyped",  # Django ships no types: a reader's setting
            "--no-incremental",
            "--python-executable",
            python,
            "--config-file",
            os.devnull,
            pasted,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stdout[-4000:]


# --- The WSGI quickstart, section by section and served -----------------------------------

WSGI_PAGE = ROOT / "docs" / "quickstart-wsgi.md"


def section(text: str, heading: str) -> str:
    """The part of a page from *heading* (a whole heading line) to the next heading at its
    level or above, outside code blocks; the lines above it are kept blank, so that line
    numbers still match the page."""
    lines = text.splitlines()
    start = lines.index(heading)
    level = len(heading) - len(heading.lstrip("#"))
    end, fence = len(lines), ""
    for number in range(start + 1, len(lines)):
        line = lines[number]
        if fence:
            fence = "" if line.strip().startswith(fence) else fence
        elif (opening := FENCE.match(line)) is not None:
            fence = opening["fence"]
        elif line.startswith("#") and len(line) - len(line.lstrip("#")) <= level:
            end = number
            break
    return "\n" * start + "\n".join(lines[start:end]) + "\n"


def test_section_is_cut_at_its_level() -> None:
    """A section holds its subsections and code, and stops at the next heading of its level."""
    page = "# Page\n\n## A\n\n```sh\n# a comment\n```\n\n### A.1\n\nb\n\n## B\n\nc\n"

    assert section(page, "## A").strip() == "## A\n\n```sh\n# a comment\n```\n\n### A.1\n\nb"
    assert section(page, "### A.1").strip() == "### A.1\n\nb"
    assert section(page, "## B").count("\n") == page.count("\n")  # line numbers kept


def _run_blocks(python: Path, blocks: list[tuple[int, str]], tmp_path: Path) -> str:
    script = tmp_path / "section.py"
    script.write_text(
        "\n".join(
            [
                f"for _line, _code in {blocks!r}:",
                '    exec(compile(_code, f"quickstart-wsgi.md:{_line}", "exec"), globals())',
                "",
            ]
        ),
        encoding="utf-8",
    )
    done = subprocess.run(  # noqa: S603 -- our own interpreter and script
        [python, "-W", "error", script],
        cwd=tmp_path,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def test_wsgi_werkzeug_section_runs_without_flask(
    environments: Environments, tmp_path: Path
) -> None:
    """The plain-Werkzeug section runs after section 1 with only what it says to install."""
    text = WSGI_PAGE.read_text(encoding="utf-8")
    werkzeug = section(text, "### Plain Werkzeug, or any WSGI callable")
    wanted = requirements(werkzeug)
    assert "flask" not in wanted
    python = environments.python(wanted)

    blocks = python_blocks(section(text, "## 1. An Authenticator")) + python_blocks(werkzeug)
    _run_blocks(python, blocks, tmp_path)


@attrs.frozen
class Served:
    """A quickstart's "save both blocks as module.py" and one server command it names."""

    page: str
    app_section: str  # the section whose first block is the app (section 1 has the key)
    command: tuple[str, ...]  # {port} is filled in; always on 127.0.0.1
    organization: str | None  # the x-organization-id the page's key needs
    owner: str  # the organization the page's app answers with


SERVED = {
    "wsgi, waitress-serve": Served(
        "quickstart-wsgi.md",
        "### Flask",
        ("waitress-serve", "--listen=127.0.0.1:{port}", "module:app"),
        None,
        "org_research",
    ),
    "wsgi, gunicorn": Served(
        "quickstart-wsgi.md",
        "### Flask",
        ("gunicorn", "--bind", "127.0.0.1:{port}", "module:app"),
        None,
        "org_research",
    ),
    "asgi, uvicorn": Served(
        "quickstart-asgi.md",
        "### Starlette",
        ("uvicorn", "--host", "127.0.0.1", "--port", "{port}", "module:app"),
        "default",
        "org_main",
    ),
}


@pytest.mark.parametrize("served", sorted(SERVED))
def test_quickstart_serves_as_the_page_says(
    served: str, environments: Environments, tmp_path: Path
) -> None:
    """The page's "save both blocks as module.py" (with its ``print(key.secret)``) serves
    under the commands it names, in the page's environment: 200 with the key, 401 without."""
    import httpx

    case = SERVED[served]
    text = (ROOT / "docs" / case.page).read_text(encoding="utf-8")
    python = environments.python(requirements(text))
    both = python_blocks(section(text, "## 1. An Authenticator"))[:1]
    both += python_blocks(section(text, case.app_section))[:1]
    (tmp_path / "module.py").write_text(
        "\n\n".join(code for _, code in both) + "\nprint(key.secret, flush=True)\n",
        encoding="utf-8",
    )
    port = free_port()
    program, *arguments = (word.format(port=port) for word in case.command)
    process = subprocess.Popen(  # noqa: S603 -- the page's command, from the page's environment
        [python.parent / program, *arguments],
        cwd=tmp_path,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(60, process.kill)  # no hang, whatever happens
    watchdog.start()
    refused = ok = None
    try:
        assert process.stdout is not None
        secret = process.stdout.readline().strip()  # "" when the server died first
        if secret.startswith("rma_"):
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
                for _ in range(400):  # bounded: about 20 seconds
                    try:
                        refused = client.get("/managed-agents/v1/models")
                        break
                    except httpx.TransportError:
                        time.sleep(0.05)
                headers = {"Authorization": f"Bearer {secret}"}
                if case.organization is not None:
                    headers["x-organization-id"] = case.organization
                ok = client.get("/managed-agents/v1/models", headers=headers)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
        errors = process.communicate(timeout=20)[1]  # waits, and closes the pipes
        watchdog.cancel()

    assert refused is not None and ok is not None, f"{served} did not serve:\n{errors[-4000:]}"
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized"
    assert ok.status_code == 200
    assert ok.json() == {"items": [{"id": "agent-small", "owner": case.owner}]}
    assert ok.headers["service-organization-id"] == case.owner


QUICKSTARTS = [
    ROOT / "docs" / name for name in ("quickstart-asgi.md", "quickstart-wsgi.md", "django.md")
]
FIRST_KEY = "### A first key in development"


def _first_key_block(page: Path) -> str:
    text = page.read_text(encoding="utf-8")
    assert FIRST_KEY in text, page.name
    [(_, code), *_] = python_blocks(text.split(FIRST_KEY, 1)[1])
    return code


def test_every_quickstart_makes_a_first_key_with_key_manager(tmp_path: Path) -> None:
    """Each quickstart has the same first-key snippet, not the command that makes no keys;
    run as a file, it prints a key the page's store then accepts."""
    from keyturn import Authenticator, AuthRequest, Principal
    from keyturn.stores import open_database

    snippets = {page.name: _first_key_block(page) for page in QUICKSTARTS}
    assert len(set(snippets.values())) == 1, snippets
    [snippet] = set(snippets.values())
    assert "KeyManager(" in snippet
    for page in QUICKSTARTS:
        assert "create keys with the\n`keyturn` command" not in page.read_text(encoding="utf-8")

    (tmp_path / "first_key.py").write_text(snippet, encoding="utf-8")
    for _ in range(2):  # run twice: the setup lines may run again, each run makes a key
        done = subprocess.run(
            [sys.executable, "first_key.py"], cwd=tmp_path, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
    secret = done.stdout.strip()
    with (
        open_database(f"sqlite:///{tmp_path / 'keyturn.sqlite3'}") as db,
        Authenticator(db.keys, db.membership) as authenticator,
    ):
        decided = authenticator.authenticate(
            AuthRequest(authorization=(f"Bearer {secret}",), organization=("default",))
        )
    assert isinstance(decided, Principal)
    assert (decided.account_id, decided.organization_id) == ("alice", "org_main")


def test_every_install_line_says_how_to_install_from_a_clone() -> None:
    """keyturn is not on the package index yet: a page that says ``pip install
    'keyturn[...]'`` also says the line that works from a clone."""
    installs = re.compile(r"pip install '?keyturn\b")
    for page in ALL_PAGES:
        text = page.read_text(encoding="utf-8")
        if page.name in ("decisions.md", "performance.md") or not installs.search(text):
            continue  # the two mention the extras, and ask the reader to install nothing
        assert re.search(r"pip install -e '?\.", text), page.name


def test_the_readme_says_what_a_test_run_needs() -> None:
    """The README's extras table names every extra of pyproject.toml; its test section names
    the database the PostgreSQL tests need, how long a run takes, and how to run a part."""
    import tomllib

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    table = readme.split("| Extra | For |", 1)[1].split("\n\n", 1)[0]
    for extra in project["project"]["optional-dependencies"]:
        assert f"| `{extra}` |" in table, extra
    assert "createdb -h 127.0.0.1 -U postgres test" in readme
    assert re.search(r"A whole run is long: about \d+ minutes", readme)
    assert 'make test PYTEST_ARGS="' in readme
    dev = project["dependency-groups"]["dev"]
    names = [re.split(r"[<>=\[]", item)[0] for item in dev if isinstance(item, str)]
    assert len(names) == len(set(names)), "a package listed twice in the dev group"
