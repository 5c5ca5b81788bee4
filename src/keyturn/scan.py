"""Find keyturn API keys in text, files and diffs, so that none gets committed (spec section 5).

A key carries a checksum, so a string that merely looks like a key is not reported: what
is found is, with near certainty, a real key. Findings name the place, the key's id and its
hint -- never the secret -- so that the key can be revoked in the console::

    $ keyturn scan .
    config/settings.py:12:15: rma_…Yt9Q (key id 7Hc2LwQm9ZpX)
    $ echo $?
    1

How it reads:

1. Only regular files are read, whatever their size, in chunks of :data:`CHUNK_BYTES`: memory
   stays bounded. A symlink to ``/dev/zero`` or a named pipe is skipped, never read or
   waited on.
2. Text is UTF-8, or UTF-16 when a byte order mark says so or the NUL bytes fall every other
   byte; anything else holding NUL bytes in its first 8 KiB is binary and skipped.
3. A finding prints its place escaped, so a file name cannot hide it with terminal codes.
4. Work is linear in the size of the text, however many keys it holds.
5. In a diff (:func:`find_added_keys`), only added lines count: a commit that removes a
   leaked key is not blocked by the key it removes.
6. As a pre-commit check (``keyturn scan --staged``, :func:`find_staged_keys`), the staged
   files themselves are read from git's index, as ``keyturn scan FILE`` reads a file: not
   git's text diff, which says only "Binary files differ" for a UTF-16 file or one that
   ``.gitattributes`` marks ``binary`` or ``-diff``. A key counts as added when the file
   the commit replaces (the committed one, or a renamed or copied file's source) lacks it.
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

from keyturn._core import token as _token

__all__ = [
    "CHUNK_BYTES",
    "Finding",
    "find_added_keys",
    "find_keys",
    "find_staged_keys",
    "scan_paths",
]

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
CHUNK_BYTES: Final = 1024 * 1024  # read at a time; a file of any size is scanned
_SNIFF: Final = 8192  # bytes looked at to tell text from binary
# Characters of a window held back for the next chunk: a key may continue there, and the
# character after a key decides whether it stands alone.
_HELD: Final = _token.TOKEN_LENGTH


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
    return _find((text,), source)


def _find(pieces: Iterable[str], source: str) -> Iterator[Finding]:
    """Every key in the text made of *pieces*, in order, holding at most one piece and a key's
    length of text at a time.
    """
    window = ""  # the text not yet decided on, and one character before it
    base = 0  # where the window starts in the whole text
    start = 0  # where in the window the next key may start
    line, line_start, counted = 1, 0, 0  # newlines are counted once, up to `counted`
    remaining = iter(pieces)
    piece = next(remaining, None)
    while piece is not None:
        following = next(remaining, None)
        window = window + piece if window else piece  # one piece: the text itself
        # A key that may run on into the next piece is decided with that piece.
        decided = len(window) if following is None else max(start, len(window) - _HELD)
        for match in _CANDIDATE.finditer(window, start):
            if match.start() >= decided:
                break
            parsed = _token.parse(match.group())
            if not isinstance(parsed, _token.ParsedToken):
                continue
            at = base + match.start()
            newlines = window.count("\n", counted - base, match.start())
            if newlines:
                line += newlines
                line_start = base + window.rfind("\n", counted - base, match.start()) + 1
            counted = at
            yield Finding(
                source=source,
                line=line,
                column=at - line_start + 1,
                key_id=parsed.key_id,
                hint=parsed.hint,
            )
        cut = max(decided - 1, 0)  # one character stays: the lookbehind reads it
        newlines = window.count("\n", counted - base, cut)
        if newlines:
            line += newlines
            line_start = base + window.rfind("\n", counted - base, cut) + 1
        counted = max(counted, base + cut)
        window, base, start = window[cut:], base + cut, decided - cut
        piece = following


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


# The git on PATH, as the user would run it; options that fix the output's form. --raw
# names each staged file with the blob it replaces and its new blob, NUL-separated.
_GIT_STAGED: Final = (
    "git", "-c", "core.quotepath=off", "diff", "--cached", "--raw", "-z", "--no-abbrev",
    "--no-ext-diff", "--no-textconv", "--find-renames", "--find-copies",
)  # fmt: skip
_NO_BLOB: Final = "0" * 40
_GITLINK: Final = "160000"  # a submodule: the "blob" is a commit of another repository


def find_staged_keys() -> Iterator[Finding]:
    """Every key the next commit adds: in a staged file, and not in the file it replaces.

    Each staged file is read from git's index, in chunks, as :func:`scan_paths` reads a file.

    :raises subprocess.CalledProcessError: git failed, e.g. outside a repository.
    """
    done = subprocess.run(_GIT_STAGED, capture_output=True, check=True)  # noqa: S603
    fields = done.stdout.split(b"\0")
    at = 0
    while at + 1 < len(fields):
        # ":old_mode new_mode old_blob new_blob status", then one path, or two for R and C
        _, mode, old, new, status = fields[at].decode("ascii").lstrip(":").split(" ")
        at += 3 if status[:1] in ("R", "C") else 2
        path = fields[at - 1].decode("utf-8", "surrogateescape")
        if new == _NO_BLOB or mode == _GITLINK:  # deleted, or not a file
            continue
        before = (
            set()
            if old == _NO_BLOB
            else {(f.key_id, f.hint) for f in _find(_text(_blob(old)), path)}
        )
        for found in _find(_text(_blob(new)), path):
            if (found.key_id, found.hint) not in before:
                yield found


def _blob(name: str) -> Iterator[bytes]:
    """The content of one git object, in chunks."""
    with subprocess.Popen(  # noqa: S603 -- git on PATH, a blob id git gave us
        ["git", "cat-file", "blob", name],  # noqa: S607
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as git:
        assert git.stdout is not None
        while chunk := git.stdout.read(CHUNK_BYTES):
            yield chunk
        if git.wait() != 0:
            raise subprocess.CalledProcessError(
                git.returncode, git.args, stderr=git.stderr.read() if git.stderr else b""
            )


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


def _chunks(path: Path) -> Iterator[bytes]:
    """The file's bytes, in chunks; nothing for what is not a regular file (see the rules)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a pipe: no wait
    except OSError:
        return
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        while chunk := file.read(CHUNK_BYTES):
            yield chunk


def _text(chunks: Iterator[bytes]) -> Iterator[str]:
    """*chunks* decoded as text (UTF-8 or UTF-16, told by the first chunk); nothing for
    binary data.
    """
    first = next(chunks, b"")
    encoding = _encoding(first)
    if encoding is None:
        return
    decoder = codecs.getincrementaldecoder(encoding)("replace")
    yield decoder.decode(first)
    for chunk in chunks:
        yield decoder.decode(chunk)
    yield decoder.decode(b"", final=True)  # an odd byte at the end of UTF-16 shows as U+FFFD


def _encoding(data: bytes) -> str | None:
    """The text encoding of data that starts with *data*, or ``None`` when it is binary."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    head = data[:_SNIFF]
    if b"\0" not in head:
        return "utf-8-sig"
    even, odd = head[0::2], head[1::2]
    for zeros, letters, encoding in ((odd, even, "utf-16-le"), (even, odd, "utf-16-be")):
        # Mostly ASCII in UTF-16: one byte of each pair is NUL, the other never is.
        if b"\0" not in letters and zeros.count(0) * 2 >= len(zeros):
            return encoding
    return None


def scan_paths(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Finding]:
    """Every key in the files under *paths* (folders are walked; binary files skipped).

    :raises FileNotFoundError: a path does not exist.
    """
    for path in paths:
        for file in _files(Path(path)):
            yield from _find(_text(_chunks(file)), str(file))
