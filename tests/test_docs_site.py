"""The docs site (``mkdocs.yml``, ``mkdocs_hooks.py``): it builds in strict mode with every
public name in the API reference, and a broken link, anchor or cross-reference fails it.

``make docs`` (run by ``make test``) builds the site itself; these tests check what the
build must catch and what the hooks must add, in scratch copies of the project's files.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = [sys.executable, "-m", "mkdocs", "build", "--strict"]
SOURCES = ["mkdocs.yml", "mkdocs_hooks.py", "README.md", "CHANGELOG.md", "docs", "examples", "src"]


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of the project at *root* into *site*."""
    return subprocess.run(  # noqa: S603 -- our own interpreter and config
        [*BUILD, "--config-file", root / "mkdocs.yml", "--site-dir", site],
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # its log, warnings and verdict, in order
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's site, built from the working tree."""
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT, out)
    assert done.returncode == 0, done.stdout[-4000:]
    return out


def test_readme_is_the_home_page(site: Path) -> None:
    """The README is the home page, its links to docs/ pointing at the site's pages."""
    home = (site / "index.html").read_text(encoding="utf-8")

    assert "authenticates requests to the agents API with personal API keys" in home
    assert 'href="concepts/"' in home
    assert 'href="examples/"' in home


def test_examples_are_pages(site: Path) -> None:
    """Each example is a page with its source, and the guides' links to it land there."""
    for example in (ROOT / "examples").glob("*.py"):
        page = (site / "examples" / example.stem / "index.html").read_text(encoding="utf-8")
        assert "create_app" in page
    quickstart = (site / "quickstart-wsgi" / "index.html").read_text(encoding="utf-8")
    assert 'href="../examples/flask_app/"' in quickstart


def test_the_console_screenshots_are_shown(site: Path) -> None:
    """The console page shows (or links) every screenshot, copied into the site."""
    console = (site / "console" / "index.html").read_text(encoding="utf-8")

    for image in (ROOT / "docs" / "img").glob("*.png"):
        assert f'="../img/{image.name}"' in console  # src= or href=
        assert (site / "img" / image.name).read_bytes() == image.read_bytes()


# Public names of the package the reference leaves out (docs/reference/index.md says which).
LEFT_OUT: set[str] = set()


def test_every_public_name_is_in_the_reference_once(site: Path) -> None:
    """Every name of a referenced module's ``__all__`` is on exactly one reference page (the
    package's names spread over pages by role), nothing else of the module's own is, no
    dunder method is; docstring roles became links."""
    pages: dict[str, str] = {}
    modules: set[str] = set()
    for source in sorted((ROOT / "docs" / "reference").glob("*.md")):
        folder = site / "reference" / ("" if source.stem == "index" else source.stem)
        page = (folder / "index.html").read_text(encoding="utf-8")
        pages[source.name] = page
        modules.update(re.findall(r"^::: ([\w.]+)$", source.read_text("utf-8"), re.MULTILINE))
        assert ":class:`" not in page, source.name
        assert not re.search(r'id="[\w.]*\.__\w+__"', page), f"{source.name}: a dunder method"
    for name in sorted(modules):
        public = {f"{name}.{member}" for member in importlib.import_module(name).__all__}
        for member in sorted(public - LEFT_OUT):
            on = [page for page, html in pages.items() if f'id="{member}"' in html]
            assert len(on) == 1, f"{member} is on {on}"
        shown = {
            f"{name}.{member}"
            for html in pages.values()
            for member in re.findall(rf'id="{re.escape(name)}\.(\w+)"', html)
        }
        submodules = {module for module in modules if module.startswith(f"{name}.")}
        assert shown - submodules <= public - LEFT_OUT, f"{name} shows {shown - public}"


def test_the_reference_leads_with_what_a_user_needs_first() -> None:
    """The API reference's navigation: the authenticator and middleware, the key manager,
    the console, the stores, then the errors, then the rest."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("  - API reference:\n")[1]
    pages = re.findall(r"reference/(\w+)\.md", nav.split("\n  - ")[0])
    assert pages == [
        "index",
        "middleware",
        "keys",
        "console",
        "stores",
        "errors",
        "keyturn",
        "tools",
        "ratelimits",
    ]
    middleware = (ROOT / "docs" / "reference" / "middleware.md").read_text(encoding="utf-8")
    assert "members: [Authenticator, Principal, Scope]" in middleware
    keys = (ROOT / "docs" / "reference" / "keys.md").read_text(encoding="utf-8")
    assert "members: [KeyManager, AsyncKeyManager," in keys


def test_navigation_names_are_plain(site: Path) -> None:
    """The navigation names what a page is for, in plain words; the tutorial comes first."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for clever in ("Decisions measured", "Usage you can see", "Leaked keys answered"):
        assert clever not in config
    for plain in ("Metrics: metrics.md", "Usage counts: usage.md", "Leaked keys: leaks.md"):
        assert plain in config
    assert "Troubleshooting: troubleshooting.md" in config


def test_docstring_examples_are_highlighted_code(site: Path) -> None:
    """A docstring's ``::`` block is Python code, highlighted; no ``::`` is left in the text."""
    middleware = (site / "reference" / "middleware" / "index.html").read_text(encoding="utf-8")

    assert '<span class="nn">keyturn.asgi</span>' in middleware  # the module's usage example
    for page in (site / "reference").rglob("*.html"):
        assert "::</p>" not in page.read_text(encoding="utf-8"), page


def test_the_hooks_pass_mypy_strict() -> None:
    """``mkdocs_hooks.py`` lives outside ``src/``, which ``make typecheck`` checks: it is
    held to the same bar here."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "mkdocs_hooks.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stdout[-4000:]


def _break_page(root: Path, text: str) -> None:
    with (root / "docs" / "errors.md").open("a", encoding="utf-8") as page:
        page.write(f"\n{text}\n")


BREAKAGES = {
    "a missing page": (lambda root: _break_page(root, "[a](nope.md)"), "'nope.md'"),
    "a missing anchor": (lambda root: _break_page(root, "[a](concepts.md#nope)"), "'#nope'"),
    "a file outside docs/ with no page": (
        lambda root: _break_page(root, "[a](../LICENSE)"),
        "'../LICENSE'",
    ),
    "a page left out of the nav": (
        lambda root: (root / "docs" / "orphan.md").write_text("# Orphan\n", encoding="utf-8"),
        "orphan.md",
    ),
    "a docstring naming nothing": (
        lambda root: (root / "src" / "keyturn" / "asgi.py").write_text(
            (ROOT / "src" / "keyturn" / "asgi.py")
            .read_text(encoding="utf-8")
            .replace(":class:`~keyturn.Authenticator`", ":class:`~keyturn.Authenticatr`"),
            encoding="utf-8",
        ),
        "keyturn.Authenticatr",
    ),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_the_build_fails_on(breakage: str, tmp_path: Path) -> None:
    """A copy of the project with one thing broken does not build, and the build says where."""
    root = tmp_path / "project"
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            root.mkdir(exist_ok=True)
            shutil.copy2(source, root / name)
    damage, message = BREAKAGES[breakage]
    damage(root)

    done = build(root, tmp_path / "site")

    assert done.returncode != 0
    assert "Aborted with" in done.stdout
    assert message in done.stdout, done.stdout[-4000:]
