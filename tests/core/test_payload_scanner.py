"""The payload guard's scanner (``keyturn._core.scanner``): which bodies hold a key."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyturn._core import token as _token
from keyturn._core.scanner import MAX_KEYS, BodyScanner, keys_in

# Test fixtures: generated keys, no store knows them.
KEYS = [_token.generate().token for _ in range(3)]
KEY = KEYS[0]


def escaped(key: str, positions: set[int]) -> str:
    """*key* with the characters at *positions* written as JSON \\u escapes."""
    return "".join(f"\\u{ord(c):04x}" if i in positions else c for i, c in enumerate(key))


def tokens(body: bytes, chunk_sizes: list[int] | None = None) -> list[str]:
    scanner = BodyScanner()
    if chunk_sizes is None:
        scanner.feed(body, final=True)
    else:
        at = 0
        for size in chunk_sizes:
            scanner.feed(body[at : at + size])
            at += size
        scanner.feed(body[at:])
        scanner.end()
    return [parsed.token for parsed in scanner.keys]


KEY_CHARACTERS = frozenset(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")


def reference(body: bytes) -> list[str]:
    """The keys of *body*, read by the rules of ``_payload`` one byte at a time."""
    out = bytearray()
    at = 0
    while at < len(body):
        code = body[at + 2 : at + 6]
        escape = body[at : at + 2] == b"\\u" and re.fullmatch(rb"[0-9A-Fa-f]{4}", code)
        if escape and int(code, 16) in KEY_CHARACTERS:
            out.append(int(code, 16))
            at += 6
            continue
        if body[at : at + 1] != b"\\":
            out += body[at : at + 1]
        at += 1
    found: list[str] = []
    for match in re.finditer(rb"rma_[A-Za-z0-9]{46}", bytes(out)):
        parsed = _token.parse(match.group().decode())
        if isinstance(parsed, _token.ParsedToken) and parsed.token not in found:
            found.append(parsed.token)
    return found[:MAX_KEYS]


@pytest.mark.parametrize(
    "body",
    [
        json.dumps({"messages": [{"role": "user", "content": f"use {KEY} please"}]}),
        json.dumps({"system": f"key={KEY}"}),  # glued to other text
        KEY,  # the whole body
        f"x{KEY}y",
        '"' + escaped(KEY, set(range(50))) + '"',  # every character escaped
        '"' + escaped(KEY, {3}) + '"',  # the underscore as \u005f
        '"' + escaped(KEY, {0, 17, 49}) + '"',
        '"' + escaped(KEY, {3}).replace("005f", "005F") + '"',  # upper-case hex digits
        '"\\' + KEY + '"',  # JSON reads \r then "ma_...", but the raw bytes hold the key
        f'"\\n{KEY}"',
        f'"\\\\{KEY}"',  # an escaped backslash, then the key
        '"\\\\' + escaped(KEY, {0})[1:] + '"',  # \\u0072...: read generously
    ],
)
def test_a_key_is_found_written_plainly_or_escaped(body: str) -> None:
    """A key is found plain, glued to text, after an escape, or spelled with JSON escapes."""
    assert tokens(body.encode()) == [KEY]


@pytest.mark.parametrize(
    "body",
    [
        json.dumps({"content": KEY[:-1]}),  # cut short
        json.dumps({"content": KEY[:20] + ("b" if KEY[20] == "a" else "a") + KEY[21:]}),  # typo
        json.dumps({"content": KEY.replace("rma_", "rmb_")}),
        '"' + KEY[:10] + "\\/" + KEY[10:] + '"',  # \/ reads as '/', which splits it
        json.dumps({"hint": _token.hint_of(KEY)}),
        "",
    ],
)
def test_no_key_where_a_json_reader_sees_none(body: str) -> None:
    """A key cut short, mistyped, split by an escaped '/', or escaped away is no key."""
    assert tokens(body.encode()) == []


def test_keys_are_kept_once_in_order_and_bounded() -> None:
    """Distinct keys in order of appearance, a repeat once; past MAX_KEYS, `more` says so."""
    assert tokens(f"{KEYS[1]} {KEYS[0]} {KEYS[1]} {KEYS[2]}".encode()) == [
        KEYS[1],
        KEYS[0],
        KEYS[2],
    ]
    many = [_token.generate().token for _ in range(MAX_KEYS + 2)]
    scanner = BodyScanner()
    scanner.feed(" ".join(many).encode(), final=True)
    assert [parsed.token for parsed in scanner.keys] == many[:MAX_KEYS]
    assert scanner.more
    assert all(key not in repr(scanner) for key in many)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 49, 50, 51])
def test_a_key_cut_by_every_chunk_boundary_is_found(size: int) -> None:
    """Chunks of any size, a key (plain or escaped) crossing each boundary, found once."""
    for text in (f'{{"a": "{KEY}"}}', '{"a": "' + escaped(KEY, {0, 3, 49}) + '"}'):
        body = text.encode()
        assert tokens(body, [size] * (len(body) // size)) == [KEY]


def test_an_escape_cut_at_the_very_end_is_read_as_it_stands() -> None:
    """A body ending in a lone backslash or a short \\u escape loses nothing before it."""
    for tail in (b"\\", b"\\u", b"\\u00", b"\\u007"):
        assert tokens(KEY.encode() + tail, [len(KEY) + 1]) == [KEY]


def test_a_huge_body_is_read_in_bounded_memory() -> None:
    """Many chunks of junk and backslashes: the scanner keeps only a key's length between them."""
    scanner = BodyScanner()
    junk = b"\\n\\u00e9rma_" * 5000
    for _ in range(50):
        scanner.feed(junk)
        assert len(scanner._raw._kept) < _token.TOKEN_LENGTH
    scanner.feed(KEY.encode(), final=True)
    assert [parsed.token for parsed in scanner.keys] == [KEY]


def test_a_huge_body_in_another_encoding_is_read_in_bounded_memory() -> None:
    """In UTF-16, each reading keeps a key's length, and at most a batch waits to be decoded."""
    scanner = BodyScanner("utf-7")
    junk = "\\n\\u00e9rma_".encode("utf-16") * 5000
    for _ in range(50):
        scanner.feed(junk)
        assert len(scanner._raw._kept) < _token.TOKEN_LENGTH
        for reading in scanner._decoded:
            assert len(reading._reading._kept) < _token.TOKEN_LENGTH
            assert len(reading._pending) < 64 * 1024
    assert len(scanner._decoded) == 2  # UTF-16 by its byte order mark, UTF-7 as declared
    scanner.feed(KEY.encode("utf-16-le"), final=True)
    assert [parsed.token for parsed in scanner.keys] == [KEY]


def test_keys_in_reads_one_piece() -> None:
    """keys_in: the parsed keys of a whole body; the repr of each hides the secret."""
    (found,) = keys_in(KEY.encode())
    assert found.key_id == _token.split(KEY)[0]
    assert KEY not in repr(found)


# Junk that means something to the scanner: escapes, hex digits, pieces of the prefix.
JUNK = st.text(alphabet='\\u0123456789abcdefABrma_" {}:\n/é', max_size=60)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, list[str]]:
    """A body of junk with 0-3 keys at random places, each plain or partly escaped; the keys
    put in where a JSON reader, or the raw bytes, show them."""
    parts: list[str] = []
    inserted: list[str] = []
    for _ in range(draw(st.integers(0, 3))):
        junk = draw(JUNK)
        key = draw(st.sampled_from(KEYS))
        positions = draw(st.sets(st.integers(0, 49), max_size=6))
        parts += (junk, escaped(key, positions))
        if key not in inserted:
            inserted.append(key)
    parts.append(draw(JUNK))
    return "".join(parts).encode(), inserted


@settings(max_examples=300, deadline=None)
@given(bodies(), st.lists(st.integers(1, 80), max_size=30))
def test_found_if_and_only_if_present_whatever_the_chunking(
    body: tuple[bytes, list[str]], chunk_sizes: list[int]
) -> None:
    """Random bodies, random chunks: the scanner finds exactly the reference reading's keys,
    and every key put in."""
    data, inserted = body
    found = tokens(data, chunk_sizes)
    assert found == reference(data)
    assert set(inserted) <= set(found)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(1, 40), max_size=20))
def test_random_bytes_hold_no_key_and_never_raise(data: bytes, chunk_sizes: list[int]) -> None:
    """Arbitrary bytes, chunked anyhow: read without error, and as the reference reads them."""
    assert tokens(data, chunk_sizes) == reference(data) == []


# --- encodings (rule 6) ----------------------------------------------------------------------

# What json.loads reads from bytes: RFC 8259's detection and byte order marks.
JSON_ENCODINGS = [
    "utf-8-sig",
    "utf-16",
    "utf-16-le",
    "utf-16-be",
    "utf-32",
    "utf-32-le",
    "utf-32-be",
]


def scanned(body: bytes, chunk_sizes: list[int], charset: str | None = None) -> list[str]:
    scanner = BodyScanner(charset)
    at = 0
    for size in chunk_sizes:
        scanner.feed(body[at : at + size])
        at += size
    scanner.feed(body[at:])
    scanner.end()
    return [parsed.token for parsed in scanner.keys]


@settings(max_examples=300, deadline=None)
@given(
    bodies(),
    st.sampled_from(JSON_ENCODINGS),
    st.lists(st.integers(1, 80), max_size=30),
)
def test_every_encoding_json_reads_is_read(
    body: tuple[bytes, list[str]], encoding: str, chunk_sizes: list[int]
) -> None:
    """Random bodies in UTF-16 or UTF-32 (either byte order, with or without a byte order
    mark) or UTF-8 with one, cut anyhow: every key put in is found, as in UTF-8."""
    data, inserted = body
    encoded = data.decode().encode(encoding)
    assert set(inserted) <= set(scanned(encoded, chunk_sizes))


@settings(max_examples=300, deadline=None)
@given(
    bodies(),
    st.sampled_from(["utf-7", "cp500", "cp1026", "utf-16-le", "utf-32-be", "shift_jis"]),
    st.lists(st.integers(1, 80), max_size=30),
)
def test_the_declared_charset_is_read(
    body: tuple[bytes, list[str]], charset: str, chunk_sizes: list[int]
) -> None:
    """A body in the encoding its charset names: every key put in is found."""
    data, inserted = body
    encoded = data.decode().encode(charset, "backslashreplace")  # é is not in every one
    assert set(inserted) <= set(scanned(encoded, chunk_sizes, charset))


@settings(max_examples=200, deadline=None)
@given(
    st.binary(max_size=300),
    st.sampled_from([None, "utf-7", "utf-16", "utf-32", "raw_unicode_escape", "cp500", "big5"]),
    st.lists(st.integers(1, 40), max_size=20),
)
def test_random_bytes_in_any_charset_never_raise(
    data: bytes, charset: str | None, chunk_sizes: list[int]
) -> None:
    """Arbitrary bytes, any declared charset, chunked anyhow: read without error."""
    assert scanned(data, chunk_sizes, charset) == []


def test_a_charset_that_is_no_text_encoding_is_refused() -> None:
    """Unknown names, bytes-to-bytes codecs and decoders that cannot be lenient."""
    for charset in ("klingon", "base64", "zlib", "rot13", "idna", "unicode_escape", ""):
        with pytest.raises(LookupError):
            BodyScanner(charset)
    assert BodyScanner("UTF8").keys == []
