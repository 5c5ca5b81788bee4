"""Find keyturn API keys in text, files and diffs, so that none gets committed (spec section 5).

A key carries a checksum, so a string that merely looks like a key is not reported: what
is found is, with near certainty, a real key. Findings name the place, the key's id and its
hint -- never the secret -- so that the key can be revoked in the console::

    $ keyturn scan .
    config/settings.py:12:15: rma_…Yt9Q (key id 7Hc2LwQm9ZpX)
    $ echo $?
    1

Rules of this file:

1. Only regular files are read, and only those of at most :data:`MAX_FILE_BYTES`: a larger
   file is skipped after reading one byte more than that, and a symlink to ``/dev/zero``
   or a named pipe is skipped, never read or waited on.
2. Text is UTF-8, or UTF-16 when a byte order mark says so or the NUL bytes fall every other
   byte; anything else with a NUL byte in its first 8 KiB is binary and skipped.
3. A finding prints its place escaped, so a file name cannot hide it with terminal codes.
4. Work is linear in the size of the text, however many keys it holds.
5. In a diff (:func:`find_added_keys`), only added lines count: a commit that removes a
   leaked key is not blocked by the key it removes. As a pre-commit check:
   ``keyturn scan --staged``.
"""

from __future__ import annotations

import codecs
import os
import re
import stat
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

import attrs

from keyturn import _token

__all__ = ["MAX_FILE_BYTES", "Finding", "find_added_keys", "find_keys", "scan_paths", "staged_diff"]

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
_SNIFF: Final = 8192  # bytes looked at to tell text from binary


@attrs.frozen(kw_only=True)
class Finding:
    """A key found in text: where, and which key (by id and hint, never by its secret)."""

    source: str
    line: int
    column: int
    key_id: str
    hint: str

    def __str__(self) -> str:
        source = "".join(  # every unprintable character (escapes, newlines, bad bytes) as \x..
            c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
            for c in self.source
        )
        return f"{source}:{self.line}:{self.column}: {self.hint} (key id {self.key_id})"


def find_keys(text: str, source: str = "<text>") -> Iterator[Finding]:
    """Every well-formed key (valid checksum) in *text*, in order."""
    line, line_start, counted = 1, 0, 0  # newlines are counted once, up to `counted`
    for match in _CANDIDATE.finditer(text):
        parsed = _token.parse(match.group())
        if not isinstance(parsed, _token.ParsedToken):
            continue
        start = match.start()
        newlines = text.count("\n", counted, start)
        if newlines:
            line += newlines
            line_start = text.rfind("\n", counted, start) + 1
        counted = start
        yield Finding(
            source=source,
            line=line,
            column=start - line_start + 1,
            key_id=parsed.key_id,
            hint=parsed.hint,
        )


def find_added_keys(diff: str) -> Iterator[Finding]:
    """Every key on an added line of a unified diff (``git diff``), placed in the new file."""
    source, line, old_left, new_left = "<diff>", 0, 0, 0
    for text in diff.split("\n"):
        if old_left > 0 or new_left > 0:  # inside a hunk
            kind, text = text[:1], text[1:]
            if kind in ("+", " "):
                if kind == "+":
                    for found in find_keys(text, source):
                        yield attrs.evolve(found, line=line)
                line, new_left = line + 1, new_left - 1
            if kind in ("-", " "):
                old_left -= 1
        elif text.startswith("+++ "):
            source = _diff_path(text[4:])
        elif hunk := _HUNK.match(text):
            old_left = int(hunk["old"] or 1)
            line, new_left = int(hunk["start"]), int(hunk["new"] or 1)


_HUNK: Final = re.compile(r"@@ -\d+(?:,(?P<old>\d+))? \+(?P<start>\d+)(?:,(?P<new>\d+))? @@")


# The git on PATH, as the user would run it; options that fix the output's form.
_GIT_DIFF_STAGED: Final = (
    "git", "-c", "core.quotepath=on", "diff", "--cached", "--no-color", "--no-ext-diff",
    "--no-textconv", "--unified=0", "--find-renames", "--src-prefix=a/", "--dst-prefix=b/",
)  # fmt: skip


def staged_diff() -> str:
    """What the next commit adds and removes: ``git diff --cached``, in a fixed form.

    :raises subprocess.CalledProcessError: git failed, e.g. outside a repository.
    """
    done = subprocess.run(_GIT_DIFF_STAGED, capture_output=True, check=True)  # noqa: S603
    return done.stdout.decode("utf-8", "surrogateescape")


def _diff_path(name: str) -> str:
    name = name.rstrip("\r").split("\t")[0]
    if name.startswith('"') and name.endswith('"'):  # git's C-style quoting, octal bytes
        escaped = name[1:-1].encode("utf-8", "surrogateescape")
        try:
            unquoted = escaped.decode("unicode_escape").encode("latin-1")
        except UnicodeError:  # not git's quoting after all: keep the name as written
            unquoted = escaped
        name = unquoted.decode("utf-8", "surrogateescape")
    return name.removeprefix("b/")


def _files(path: Path) -> Iterator[Path]:
    if not os.path.lexists(path):
        raise FileNotFoundError(f"no such file or directory: {path}")
    if not path.is_dir():
        yield path
        return
    for root, directories, files in os.walk(path):
        directories[:] = sorted(d for d in directories if d not in SKIPPED_DIRECTORIES)
        for name in sorted(files):
            yield Path(root, name)


def _read_text(path: Path) -> str | None:
    """The file's text, or ``None`` for what cannot hold a key as text: see the rules."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a pipe: no wait
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = file.read(MAX_FILE_BYTES + 1)
    return None if len(data) > MAX_FILE_BYTES else _decode(data)


def _decode(data: bytes) -> str | None:
    """*data* as text (UTF-8 or UTF-16), or ``None`` when it is binary."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return data.decode("utf-16", "replace")
    head = data[:_SNIFF]
    if b"\0" not in head:
        return data.decode("utf-8-sig", "replace")
    even, odd = head[0::2], head[1::2]
    for zeros, letters, encoding in ((odd, even, "utf-16-le"), (even, odd, "utf-16-be")):
        # Mostly ASCII in UTF-16: one byte of each pair is NUL, the other never is.
        if b"\0" not in letters and zeros.count(0) * 2 >= len(zeros):
            return data[: len(data) // 2 * 2].decode(encoding, "replace")
    return None


def scan_paths(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Finding]:
    """Every key in the files under *paths* (folders are walked; binary files skipped).

    :raises FileNotFoundError: a path does not exist.
    """
    for path in paths:
        for file in _files(Path(path)):
            text = _read_text(file)
            if text is not None:
                yield from find_keys(text, str(file))
