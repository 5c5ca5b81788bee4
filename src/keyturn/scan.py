"""Find keyturn API keys in text and files, so that none gets committed (spec section 5).

A key carries a checksum, so a string that merely looks like a key is not reported: what
is found is, with near certainty, a real key. Findings name the place, the key's id and its
hint -- never the secret -- so that the key can be revoked in the console::

    $ keyturn scan .
    config/settings.py:12:15: rma_…Yt9Q (key id 7Hc2LwQm9ZpX)
    $ echo $?
    1

As a pre-commit check: ``git diff --cached | keyturn scan -``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

import attrs

from keyturn import _token

__all__ = ["Finding", "find_keys", "scan_paths"]

# A key not glued to other word characters, so a longer token is not mistaken for one.
_CANDIDATE: Final = re.compile(
    rf"(?<![A-Za-z0-9_]){_token.PREFIX}[A-Za-z0-9]{{{_token.TOKEN_LENGTH - len(_token.PREFIX)}}}"
    r"(?![A-Za-z0-9_])",
    re.ASCII,
)
# Folders that hold no source of yours, only tools' state or dependencies.
SKIPPED_DIRECTORIES: Final = frozenset(
    {".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache",
     ".pytest_cache", ".ruff_cache", ".hypothesis", ".tox", ".nox"}
)  # fmt: skip
MAX_FILE_BYTES: Final = 16 * 1024 * 1024


@attrs.frozen(kw_only=True)
class Finding:
    """A key found in text: where, and which key (by id and hint, never by its secret)."""

    source: str
    line: int
    column: int
    key_id: str
    hint: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}:{self.column}: {self.hint} (key id {self.key_id})"


def find_keys(text: str, source: str = "<text>") -> Iterator[Finding]:
    """Every well-formed key (valid checksum) in *text*, in order."""
    for match in _CANDIDATE.finditer(text):
        parsed = _token.parse(match.group())
        if isinstance(parsed, _token.ParsedToken):
            start = match.start()
            line_start = text.rfind("\n", 0, start) + 1
            yield Finding(
                source=source,
                line=text.count("\n", 0, start) + 1,
                column=start - line_start + 1,
                key_id=parsed.key_id,
                hint=parsed.hint,
            )


def _files(path: Path) -> Iterator[Path]:
    if path.is_file():
        yield path
        return
    for root, directories, files in os.walk(path):
        directories[:] = sorted(d for d in directories if d not in SKIPPED_DIRECTORIES)
        for name in sorted(files):
            yield Path(root, name)


def _read_text(path: Path) -> str | None:
    """The file's text, or ``None`` for what cannot hold a key as text (binary, huge)."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", "replace")


def scan_paths(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Finding]:
    """Every key in the files under *paths* (folders are walked; binary files skipped)."""
    for path in paths:
        for file in _files(Path(path)):
            text = _read_text(file)
            if text is not None:
                yield from find_keys(text, str(file))
