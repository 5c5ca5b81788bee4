"""Every ```python block of README.md and docs/*.md runs, each file's blocks in order.

A file's blocks share one namespace, like a reader following the page. A block whose info
string says ``python no-run`` is skipped; other languages (sh, text, ...) are not code.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>.*)$")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """The ``(line number, code)`` of each runnable python block of a Markdown page."""
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
        if info[:1] in (["python"], ["py"]) and "no-run" not in info:
            blocks.append((start + 1, "\n".join(body)))
    return blocks


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


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_code_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each python block of the page runs, in order, in one namespace per page."""
    monkeypatch.chdir(tmp_path)  # files a page creates land in a scratch directory
    namespace: dict[str, object] = {"__name__": f"docs.{page.stem}"}
    for line, code in python_blocks(page.read_text(encoding="utf-8")):
        exec(compile(code, f"{page.relative_to(ROOT)}:{line}", "exec"), namespace)  # noqa: S102
