"""Write ``stores/_sync.py`` from ``stores/_async.py``: the SQL stores are written once.

The sync twin is the async source without its awaits: ``async def`` and ``async with``
lose ``async``, ``await x`` becomes ``x`` (and ``(await x).y`` becomes ``x.y``), and the
names in :data:`RENAMES` become their sync names. Everything else (comments, docstrings,
layout) is copied, then formatted by ruff as the project formats code. The module
docstring is :data:`DOCSTRING`, under a header that says where the file comes from.

Run it after changing ``_async.py``: ``python tools/async_to_sync.py``. A hygiene test
(``tests/hygiene/test_generated.py``) fails while ``_sync.py`` differs from its output.
"""

from __future__ import annotations

import ast
import itertools
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src/keyturn/stores/_async.py"
TARGET = ROOT / "src/keyturn/stores/_sync.py"

# Whole words of the async source and what the sync twin says instead.
RENAMES = {
    "AsyncSQLKeyStore": "SQLKeyStore",
    "AsyncSQLMembership": "SQLMembership",
    "AsyncKeyStore": "KeyStore",
    "AsyncMembershipProvider": "MembershipProvider",
    "adb": "db",
}

HEADER = "# Generated from _async.py by tools/async_to_sync.py: edit that file, not this one.\n"
DOCSTRING = (
    '"""The key store and membership over a synchronous SQL database: SQLite\'s and PostgreSQL\'s.'
    "\n\n:class:`SQLKeyStore` and :class:`SQLMembership` are ``_async.py`` without its awaits,"
    "\nmethod for method: see that module for what they do and what a database gives them.\n"
    '"""'
)


def to_sync(source: str) -> str:
    """The sync twin of *source*, before formatting."""
    tree = ast.parse(source)
    text = source.encode()  # the syntax tree's columns count bytes
    starts = [0, *itertools.accumulate(len(line) for line in text.splitlines(keepends=True))]

    def at(line: int | None, column: int | None) -> int:
        return starts[(line or 1) - 1] + (column or 0)

    docstring = tree.body[0]
    assert isinstance(docstring, ast.Expr), "the async module starts with its docstring"
    cuts = [(0, at(docstring.end_lineno, docstring.end_col_offset), b"")]  # (start, end, gone)
    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncFunctionDef | ast.AsyncWith | ast.AsyncFor):
            start = at(node.lineno, node.col_offset)
            cuts.append((start, start + len("async "), b"async"))
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.Await):
                continue
            start = at(child.lineno, child.col_offset)
            end = at(child.end_lineno, child.end_col_offset)
            operand = at(child.value.lineno, child.value.col_offset)
            if isinstance(node, ast.Attribute):  # (await x).y is x.y: x is a primary
                cuts.append((text.rindex(b"(", 0, start), operand, b"(await"))
                cuts.append((end, text.index(b")", end) + 1, b")"))
            else:
                cuts.append((start, operand, b"await"))
    for start, end, gone in sorted(cuts, reverse=True):
        if gone:
            assert b"".join(text[start:end].split()) == gone, text[start:end]
        text = text[:start] + text[end:]
    words = re.compile(r"\b(" + "|".join(RENAMES) + r")\b")
    return words.sub(lambda match: RENAMES[match[1]], HEADER + DOCSTRING + text.decode())


def generate() -> str:
    """What ``_sync.py`` must hold: the sync twin of ``_async.py``, formatted by ruff."""
    formatted = subprocess.run(  # noqa: S603 -- our own interpreter, ruff, our own source
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(TARGET), "-"],
        input=to_sync(SOURCE.read_text(encoding="utf-8")),
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return formatted.stdout


if __name__ == "__main__":
    TARGET.write_text(generate(), encoding="utf-8")
