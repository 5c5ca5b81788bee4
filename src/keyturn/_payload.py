"""Keys in request bodies: the scanner of the payload guard (D32). Pure; no I/O.

Feed it a body's bytes in chunks of any size; it says which keys the body holds. The
payload guard (``payload.py``) decides what to do with them.

Rules of this file -- what it decides:

1. A key is what :func:`keyturn._token.parse` accepts: this file only finds candidates of
   its shape (``rma_`` and 46 letters and digits) and hands each to ``parse``, which checks
   the checksum. A candidate glued to other letters or digits counts: whoever reads the body
   can cut it out as easily.
2. The body is read both as its raw bytes and as a JSON parser reads its strings, in one
   pass: each backslash escape is replaced by what it stands for when that is an ASCII
   character (``\\u0072`` is ``r``, ``\\u005f`` is ``_``; any other ``\\uXXXX`` reads as
   a space), and the backslash of every other escape is dropped (``\\/`` reads as ``/``,
   ``\\n`` as ``n``). So a key is found whether it is written plainly, spelled with escapes,
   or sits right after an escape (``"\\rma_..."``, whose raw bytes hold the key). An escape
   cut by a chunk's end is read with the next chunk. The cost of dropping the backslash:
   a text that holds a key only once ``\\n`` is read as ``n`` is found too; it is made,
   never met by chance.
3. A key cut by a chunk's end is found: the last 49 bytes of what was read are kept and
   read again with the next chunk. No key fits in 49 bytes, so none is found twice.
4. Memory is bounded: one chunk and 54 bytes of state. Work is linear in the body's size;
   a chunk with no backslash costs a search for ``rma_`` and no copy of the chunk.
5. At most :data:`MAX_KEYS` distinct keys are kept, in order of appearance; the scan goes
   on and :attr:`BodyScanner.more` says whether more were seen.
"""

from __future__ import annotations

import re
from typing import Final

from keyturn import _token

__all__ = ["MAX_KEYS", "BodyScanner", "keys_in"]

MAX_KEYS: Final = 8  # distinct keys kept from one body (each may cost an argon2 run)
_PREFIX: Final = _token.PREFIX.encode("ascii")
_CANDIDATE: Final = re.compile(
    rb"%s[A-Za-z0-9]{%d}" % (_PREFIX, _token.TOKEN_LENGTH - len(_PREFIX)), re.ASCII
)
# Bytes kept for the next chunk: a key may start there (rule 3).
_KEPT: Final = _token.TOKEN_LENGTH - 1
_ESCAPE: Final = re.compile(rb"\\(?:u([0-9A-Fa-f]{4})|(.))", re.DOTALL)
_HEX: Final = re.compile(rb"[0-9A-Fa-f]{0,3}")
_DROP_BACKSLASH: Final = re.compile(rb"\\(.)", re.DOTALL)
# \uXXXX -> the ASCII character, or a space for anything else (rule 2)
_ASCII: Final = tuple(bytes([code]) for code in range(128))


def _unescaped(data: bytes, final: bool) -> tuple[bytes, bytes]:
    """*data* with its escapes read (rule 2), and the bytes of an escape cut by its end."""
    if b"\\u" not in data and not data.endswith(b"\\"):
        # No \u escape and none cut: each escape is a backslash to drop, done in C.
        return _DROP_BACKSLASH.sub(rb"\1", data), b""
    pieces: list[bytes] = []
    at = 0
    for match in _ESCAPE.finditer(data):
        start = match.start()
        code = match.group(1)
        if code is not None:
            value = int(code, 16)
            read = _ASCII[value] if value < 128 else b" "
        else:
            read = match.group(2)
            if not final and read == b"u" and _HEX.fullmatch(data, match.end()):
                return b"".join(pieces) + data[at:start], data[start:]  # \u cut short
        pieces += (data[at:start], read)
        at = match.end()
    if not final and at < len(data) and data.endswith(b"\\"):
        # The one backslash no escape took: an escape the next chunk finishes.
        return b"".join(pieces) + data[at:-1], b"\\"
    pieces.append(data[at:])
    return b"".join(pieces), b""


class BodyScanner:
    """Reads one body, chunk by chunk, for keys (see the rules of this file).

    Its repr names how many keys it found, never one of them.
    """

    __slots__ = ("_cut", "_kept", "keys", "more")

    def __init__(self) -> None:
        self._cut = b""  # an escape the last chunk ended in
        self._kept = b""  # the last bytes read, where a key may start
        self.keys: list[_token.ParsedToken] = []  # distinct, in order, at most MAX_KEYS
        self.more = False  # more distinct keys were seen than kept

    def __repr__(self) -> str:
        return f"BodyScanner(keys={len(self.keys)}, more={self.more})"

    def feed(self, chunk: bytes, final: bool = False) -> None:
        """Read the next *chunk* of the body; *final*: it is the last one."""
        data = self._cut + chunk if self._cut else chunk
        text, self._cut = _unescaped(data, final) if b"\\" in data else (data, b"")
        window = self._kept + text if self._kept else text
        if _PREFIX in window:
            for match in _CANDIDATE.finditer(window):
                self._found(match.group().decode("ascii"))
        self._kept = window[-_KEPT:]

    def end(self) -> None:
        """The body ended: an escape it was cut in is read as it stands."""
        if self._cut:
            self.feed(b"", final=True)

    def _found(self, candidate: str) -> None:
        parsed = _token.parse(candidate)
        if not isinstance(parsed, _token.ParsedToken):
            return
        if any(kept.token == parsed.token for kept in self.keys):
            return
        if len(self.keys) < MAX_KEYS:
            self.keys.append(parsed)
        else:
            self.more = True


def keys_in(body: bytes) -> list[_token.ParsedToken]:
    """The keys *body* holds, read in one piece (for tests and tools)."""
    scanner = BodyScanner()
    scanner.feed(body, final=True)
    return scanner.keys
