"""Keys in request bodies: the scanner of the payload guard (D32). Pure; no I/O.

Feed it a body's bytes in chunks of any size; it says which keys the body holds. The
payload guard (``payload.py``) decides what to do with them.

Rules of this file -- what it decides:

1. A key is what :func:`keyturn._token.parse` accepts: this file only finds candidates of
   its shape (``rma_`` and 46 letters and digits) and hands each to ``parse``, which checks
   the checksum. A candidate glued to other letters or digits counts: whoever reads the body
   can cut it out as easily.
2. The body is read as its raw bytes and as a JSON parser reads its strings, at once, and
   generously: each ``\\uXXXX`` escape of a letter, digit or underscore reads as that
   character (``\\u0072`` is ``r``, ``\\u005f`` is ``_``), then every backslash is
   dropped (``\\/`` reads as ``/``, ``\\n`` as ``n``, ``\\u00e9`` as ``u00e9``). So a key
   is found whether it is written plainly, spelled with escapes, or sits right after an
   escape (``"\\rma_..."``: JSON reads a carriage return, the raw bytes hold the key). A
   letter or digit more around a key hides nothing (rule 1). The generosity finds keys a
   JSON parser would not (``\\\\u0072ma_...``, an escaped backslash and then ``u0072``);
   such bodies are made, never met by chance. An escape cut by a chunk's end is read with
   the next chunk.
3. A key cut by a chunk's end is found: the last 49 bytes of what was read are kept and
   read again with the next chunk. No key fits in 49 bytes, so none is found twice.
4. Memory is bounded: one chunk and 54 bytes of state. Work is linear in the body's size
   and done in C passes over each chunk (a Python call only per escaped key character); a
   chunk with no backslash costs a search for ``rma_`` and no copy.
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
# Escapes, read in C passes (a Python call only per escape of a key character):
_KEY_CHARACTER: Final = re.compile(  # \u0030-\u0039, \u0041-\u005a, \u005f, \u0061-\u007a
    rb"\\u00(3[0-9]|4[1-9A-Fa-f]|5[0-9Aa]|5[Ff]|6[1-9A-Fa-f]|7[0-9Aa])"
)
_CUT: Final = re.compile(rb"\\(?:u[0-9A-Fa-f]{0,3})?")  # an escape the chunk's end may cut


def _character(match: re.Match[bytes]) -> bytes:
    return bytes((int(match.group(1), 16),))


def _unescaped(data: bytes, final: bool) -> tuple[bytes, bytes]:
    """*data* with its escapes read (rule 2), and the bytes of an escape cut by its end."""
    cut = b""
    if not final:
        start = data.rfind(b"\\", max(0, len(data) - 5))
        if start >= 0 and _CUT.fullmatch(data, start):
            data, cut = data[:start], data[start:]
    return _KEY_CHARACTER.sub(_character, data).translate(None, b"\\"), cut


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
