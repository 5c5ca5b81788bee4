"""Keys in request bodies: the scanner of the payload guard (D32). Pure; no I/O.

Feed it a body's bytes in chunks of any size; it says which keys the body holds. The
payload guard (``payload/``) decides what to do with them.

Rules of this file -- what it decides:

1. A key is what :func:`keyturn._core.token.parse` accepts: this file only finds candidates of
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
4. Memory is bounded: one chunk and 54 bytes of state per reading, and for a reading in
   another encoding (rule 6) up to 64 KiB waiting to be decoded, and what its decoder holds
   back (a few bytes; UTF-7's holds an unfinished shift sequence, at most the body, which
   the guard holds anyway). Work is linear in the body's size and done in C passes over
   each chunk (a Python call only per escaped key character); a UTF-8 chunk with no
   backslash costs a search for ``rma_`` and no copy.
5. At most :data:`MAX_KEYS` distinct keys are kept, in order of appearance; the scan goes
   on and :attr:`BodyScanner.more` says whether more were seen.
6. The body is read in every encoding a JSON parser reads it in: as its bytes (UTF-8, and
   every encoding that writes a key's characters as ASCII does), in the encoding its first
   four bytes name (a byte order mark, or RFC 8259's zero bytes, as ``json.loads`` and so
   Starlette, FastAPI, Flask and Django read them: UTF-16 and UTF-32, either byte order),
   and in the encoding the ``charset`` parameter of its ``Content-Type`` names (as Django
   REST framework reads it). A reading in another encoding is decoded with Python's own
   incremental decoder, across chunks, and read as UTF-8 by rules 1 to 3. A ``charset``
   that names no text encoding is refused by :class:`BodyScanner`: no parser reads it.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable
from typing import Final

from keyturn._core import token as _token

__all__ = ["MAX_KEYS", "BodyScanner", "keys_in", "text_encoding"]

MAX_KEYS: Final = 8  # distinct keys kept from one body (each costs a store read)
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
_DETECTED: Final = 4  # bytes a JSON parser reads its encoding from (RFC 8259, json.loads)
_BATCH: Final = 64 * 1024  # bytes decoded at a time in another encoding (rule 6)
# Encodings whose bytes for a key and its escapes are the ASCII ones: the raw reading has them.
_READ_RAW: Final = frozenset({"utf-8", "utf-8-sig", "ascii", "latin-1", "iso8859-1", "cp1252"})
# Encodings whose incremental decoders need a byte order mark, and the marks.
_BOMS: Final = {
    "utf-16": (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE),
    "utf-32": (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE),
}
# Text encodings no charset names but Python's own: their decoders warn on what they read.
_REFUSED: Final = frozenset({"unicode-escape"})


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


class _Reading:
    """One reading of a body as UTF-8 bytes, chunk by chunk (rules 2 and 3); each candidate
    of a key's shape goes to *found*."""

    __slots__ = ("_cut", "_found", "_kept")

    def __init__(self, found: Callable[[str], None]) -> None:
        self._cut = b""  # an escape the last chunk ended in
        self._kept = b""  # the last bytes read, where a key may start
        self._found = found

    def feed(self, chunk: bytes, final: bool) -> None:
        data = self._cut + chunk if self._cut else chunk
        text, self._cut = _unescaped(data, final) if b"\\" in data else (data, b"")
        window = self._kept + text if self._kept else text
        if _PREFIX in window:
            for match in _CANDIDATE.finditer(window):
                self._found(match.group().decode("ascii"))
        self._kept = window[-_KEPT:]


class _Decoded:
    """A reading of a body in another encoding: decoded as it comes, then read as UTF-8
    (rule 6). Bytes are decoded in batches: some decoders (UTF-7's) decode again what they
    hold back, so a call per tiny chunk could cost the square of the body."""

    __slots__ = ("_decoder", "_pending", "_reading", "failed")

    def __init__(self, encoding: str, found: Callable[[str], None]) -> None:
        self._decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
        self._pending = bytearray()
        self._reading = _Reading(found)
        self.failed = False  # the decoder raised: the body cannot be read in it

    def feed(self, chunk: bytes, final: bool) -> None:
        if self.failed:
            return
        self._pending += chunk
        if len(self._pending) < _BATCH and not final:
            return
        try:
            text = self._decoder.decode(bytes(self._pending), final)
        except (ValueError, Warning):  # lenient decoders still refuse some input: fail closed
            self.failed = True
            return
        finally:
            self._pending.clear()
        self._reading.feed(text.encode("utf-8", "replace"), final)


def text_encoding(charset: str) -> str:
    """The codec Python decodes *charset* with (``utf-16`` for ``UTF16``).

    :raises LookupError: no text encoding goes by that name (``base64`` is none either), or
        its decoder cannot replace what it cannot read (``idna``).
    """
    name = codecs.lookup(charset).name
    if name in _REFUSED:
        raise LookupError(f"{charset!r} is not read")
    try:
        b"\0\0\0\0".decode(name, "replace")  # LookupError for a bytes-to-bytes codec
    except UnicodeError:
        raise LookupError(f"{charset!r} cannot be read leniently") from None
    return name


class BodyScanner:
    """Reads one body, chunk by chunk, for keys (see the rules of this file).

    :param charset: the ``charset`` parameter of the body's ``Content-Type``, if it has one:
        the body is read in that encoding too (rule 6).
    :raises LookupError: *charset* names no text encoding Python knows.

    Its repr names how many keys it found, never one of them.
    """

    __slots__ = ("_declared", "_decoded", "_done", "_head", "_raw", "keys", "more")

    def __init__(self, charset: str | None = None) -> None:
        self._raw = _Reading(self._found)  # the bytes as they are: UTF-8 and ASCII's kin
        self._declared = None if charset is None else text_encoding(charset)
        self._head: bytes | None = b""  # the first bytes, until the encoding is detected
        self._decoded: list[_Decoded] = []  # the readings in other encodings (rule 6)
        self._done = False
        self.keys: list[_token.ParsedToken] = []  # distinct, in order, at most MAX_KEYS
        self.more = False  # more distinct keys were seen than kept

    def __repr__(self) -> str:
        return f"BodyScanner(keys={len(self.keys)}, more={self.more})"

    def feed(self, chunk: bytes, final: bool = False) -> None:
        """Read the next *chunk* of the body; *final*: it is the last one."""
        if self._done:
            return
        self._done = final
        self._raw.feed(chunk, final)
        if self._head is not None:  # the encoding is not known yet: the first bytes say it
            head = self._head + chunk if self._head else chunk
            if len(head) < _DETECTED and not final:
                self._head = head
                return
            self._head = None
            self._decoded = [_Decoded(encoding, self._found) for encoding in self._encodings(head)]
            chunk = head
        for reading in self._decoded:
            reading.feed(chunk, final)

    @property
    def unreadable(self) -> bool:
        """A decoder refused the body: it cannot be read in an encoding a parser may use."""
        return any(reading.failed for reading in self._decoded)

    def end(self) -> None:
        """The body ended: what was held back (an escape it was cut in, bytes a decoder
        waits on) is read as it stands."""
        self.feed(b"", final=True)

    def _encodings(self, head: bytes) -> list[str]:
        """The encodings other than UTF-8 the body is read in: the one a JSON parser
        detects from its first bytes, and the declared one."""
        candidates = [codecs.lookup(json.detect_encoding(head)).name]
        declared = self._declared
        if declared in _BOMS and not head.startswith(_BOMS[declared]):
            # Python's incremental decoder refuses these without a BOM; bytes.decode reads
            # them in the machine's byte order: both orders are read.
            candidates += [f"{declared}-le", f"{declared}-be"]
        elif declared is not None:
            candidates.append(declared)
        found: list[str] = []
        for encoding in candidates:
            if encoding not in _READ_RAW and encoding not in found:
                found.append(encoding)
        return found

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
