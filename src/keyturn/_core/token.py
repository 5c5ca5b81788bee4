"""The key string: generate, parse, checksum, hint. Pure; no I/O.

Format (version 1), 50 characters, alphabet ``[A-Za-z0-9]`` after the prefix::

    rma_ IIIIIIIIIIII SSSSSSSSSSSSSSSSSSSSSSSSSSSS CCCCCC
    4    12: key id  28: secret                    6: checksum

- The key id (12 base62 characters, about 71 random bits) is the store's lookup key. It is
  not secret on its own, and is shown in the console so a key can be revoked by it.
- The secret (28 base62 characters, about 166 random bits) is never stored, only its hash.
- The checksum is CRC32 of everything before it, in 6 base62 digits, so a mistyped key is
  refused without touching the store.
- The length identifies the version: a later format will have another length, and old keys
  keep parsing.
"""

from __future__ import annotations

import re
import secrets
import zlib
from typing import Final

import attrs

from keyturn.errors import NotAKey, Reason

__all__ = [
    "ALPHABET",
    "PREFIX",
    "TOKEN_LENGTH",
    "ParsedToken",
    "SecretInfo",
    "check",
    "describe_secret",
    "generate",
    "hint_of",
    "is_key_id",
    "naming_id",
    "parse",
    "split",
]

PREFIX: Final = "rma_"
ALPHABET: Final = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
ID_LENGTH: Final = 12
SECRET_LENGTH: Final = 28
CHECKSUM_LENGTH: Final = 6
TOKEN_LENGTH: Final[int] = len(PREFIX) + ID_LENGTH + SECRET_LENGTH + CHECKSUM_LENGTH

_ID_END: Final = len(PREFIX) + ID_LENGTH
_BODY_END: Final = TOKEN_LENGTH - CHECKSUM_LENGTH
# re.ASCII keeps [A-Za-z0-9] from matching other scripts' letters and digits.
_SHAPE: Final = re.compile(rf"{PREFIX}[A-Za-z0-9]{{{TOKEN_LENGTH - len(PREFIX)}}}", re.ASCII)
_KEY_ID: Final = re.compile(rf"[A-Za-z0-9]{{{ID_LENGTH}}}", re.ASCII)
# Hint: the prefix, an ellipsis and the last four characters (U+2026, never sent in a header).
_ELLIPSIS: Final = "\u2026"


class ParsedToken:
    """A well-formed key string split into its key id and secret; the repr hides the secret."""

    __slots__ = ("key_id", "secret", "token")

    def __init__(self, token: str) -> None:
        self.token = token
        self.key_id, self.secret = split(token)

    @property
    def hint(self) -> str:
        return hint_of(self.token)

    def __repr__(self) -> str:
        return f"ParsedToken(key_id={self.key_id!r}, hint={self.hint!r})"


# Every two-digit base62 string, so that a checksum is three table lookups: CRC32 < 62**6.
_PAIRS: Final = tuple(high + low for high in ALPHABET for low in ALPHABET)


def _checksum(body: str) -> str:
    rest, low = divmod(zlib.crc32(body.encode("ascii")), 3844)
    high, middle = divmod(rest, 3844)
    return _PAIRS[high] + _PAIRS[middle] + _PAIRS[low]


def _random(length: int) -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(length))


def generate() -> ParsedToken:
    """Create a fresh key string from the operating system's CSPRNG."""
    body = PREFIX + _random(ID_LENGTH) + _random(SECRET_LENGTH)
    return ParsedToken(body + _checksum(body))


def parse(text: str) -> ParsedToken | Reason:
    """Split *text* into key id and secret, or say why it is not a key (no exception: hot path)."""
    wrong = check(text)
    return ParsedToken(text) if wrong is None else wrong


def check(text: str) -> Reason | None:
    """Why *text* is not a key (its shape, then its checksum), or ``None`` if it is one."""
    if len(text) != TOKEN_LENGTH or _SHAPE.fullmatch(text) is None:
        return Reason.MALFORMED
    if _checksum(text[:_BODY_END]) != text[_BODY_END:]:
        return Reason.BAD_CHECKSUM
    return None


def split(token: str) -> tuple[str, str]:
    """The key id and the secret of a key string of :data:`TOKEN_LENGTH` (the one place that
    knows the layout); :func:`parse` checks shape and checksum first."""
    return token[len(PREFIX) : _ID_END], token[_ID_END:_BODY_END]


def hint_of(token: str) -> str:
    """The part of a key that may be shown after creation: ``rma_…`` and the last four."""
    return PREFIX + _ELLIPSIS + token[-4:]


def is_key_id(text: str) -> bool:
    """Whether *text* has the shape of a key id, so that a message may repeat it."""
    return _KEY_ID.fullmatch(text) is not None


def naming_id(text: str) -> str:
    """How a message names *text*, given as a key id: ``id '<text>'`` if it is shaped like
    one, else ``that id`` -- other text may be part of a secret, and must not be echoed."""
    return f"id {text!r}" if is_key_id(text) else "that id"


@attrs.frozen
class SecretInfo:
    """What may be said about a key string: its key id and its hint, never the secret."""

    key_id: str
    hint: str


def describe_secret(secret: str) -> SecretInfo:
    """The key id and hint of a key string, e.g. to revoke a leaked key by its id.

    Needs no store: the id is part of the key. The secret itself is neither returned nor
    repeated in the error.

    :raises NotAKey: (a ``ValueError``) *secret* is not a well-formed key (wrong shape, or a
        checksum that does not match, as after a typo).
    """
    parsed = parse(secret) if isinstance(secret, str) else Reason.MALFORMED
    if parsed is Reason.MALFORMED:
        raise NotAKey(
            f"not a keyturn key: one is {PREFIX!r} and {TOKEN_LENGTH - len(PREFIX)} letters "
            "and digits"
        )
    if isinstance(parsed, Reason):
        raise NotAKey("not a keyturn key: its checksum does not match (a typo?)")
    return SecretInfo(parsed.key_id, parsed.hint)
