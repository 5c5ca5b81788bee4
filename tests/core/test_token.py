"""Key strings (D1, D2): shape, checksum, round trip, hint, and what a typo does."""

from __future__ import annotations

import string

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from keyturn import Reason
from keyturn._core import token as _token

BODY_ALPHABET = string.ascii_letters + string.digits
ids = st.text(BODY_ALPHABET, min_size=_token.ID_LENGTH, max_size=_token.ID_LENGTH)
secrets_ = st.text(BODY_ALPHABET, min_size=_token.SECRET_LENGTH, max_size=_token.SECRET_LENGTH)


def build(key_id: str, secret: str) -> str:
    body = _token.PREFIX + key_id + secret
    return body + _token._checksum(body)


def test_generated_key_has_the_documented_shape() -> None:
    """A fresh key is 50 characters: the prefix, then only [A-Za-z0-9]."""
    token = _token.generate().token
    assert len(token) == _token.TOKEN_LENGTH == 50
    assert token.startswith("rma_")
    assert set(token[4:]) <= set(BODY_ALPHABET)


def test_generated_keys_are_distinct() -> None:
    """Two thousand fresh keys share neither an id nor a secret."""
    tokens = [_token.generate() for _ in range(2000)]
    assert len({t.key_id for t in tokens}) == len({t.secret for t in tokens}) == 2000


@given(ids, secrets_)
def test_format_then_parse_is_identity(key_id: str, secret: str) -> None:
    """Any id and secret, once formatted, parse back to themselves."""
    parsed = _token.parse(build(key_id, secret))
    assert isinstance(parsed, _token.ParsedToken)
    assert (parsed.key_id, parsed.secret) == (key_id, secret)


@given(ids, secrets_, st.data())
def test_every_single_character_change_is_refused(
    key_id: str, secret: str, data: st.DataObject
) -> None:
    """Replacing any one character by any other is caught by shape or checksum."""
    token = build(key_id, secret)
    position = data.draw(st.integers(0, len(token) - 1), label="position")
    replacement = data.draw(st.characters().filter(lambda c: c != token[position]), label="char")
    changed = token[:position] + replacement + token[position + 1 :]
    assert _token.parse(changed) in (Reason.MALFORMED, Reason.BAD_CHECKSUM)


def test_every_single_character_change_of_one_key_is_refused_exhaustively() -> None:
    """All 50 x 61 same-alphabet substitutions of one key fail the checksum or the prefix."""
    token = _token.generate().token
    for position in range(len(token)):
        for char in BODY_ALPHABET + "_":
            if char != token[position]:
                changed = token[:position] + char + token[position + 1 :]
                assert isinstance(_token.parse(changed), Reason), (position, char)


@given(ids, secrets_, st.integers(0, 49))
def test_a_dropped_or_doubled_character_is_refused(key_id: str, secret: str, position: int) -> None:
    """One character short or one too many is never a key."""
    token = build(key_id, secret)
    assert _token.parse(token[:position] + token[position + 1 :]) is Reason.MALFORMED
    doubled = token[:position] + token[position] + token[position:]
    assert _token.parse(doubled) is Reason.MALFORMED


@given(st.text())
@example("rma_" + "A" * 46)
@example("RMA_" + "A" * 46)
@example("rma_" + "Ａ" * 46)
@example("rma_" + "٣" * 46)  # Arabic-Indic digit: \d would match it, [0-9] must not
def test_arbitrary_text_is_not_a_key(text: str) -> None:
    """Random text never parses as a key (a valid checksum by chance is 1 in 5.7e10)."""
    assert isinstance(_token.parse(text), Reason)


def test_trailing_newline_is_not_ignored() -> None:
    """A key followed by a newline is malformed (no `$`-matches-before-newline slip)."""
    token = _token.generate().token
    assert _token.parse(token + "\n") is Reason.MALFORMED
    assert _token.parse(token[:-1] + "\n") is Reason.MALFORMED


def test_hint_is_prefix_ellipsis_and_last_four() -> None:
    """The hint shows `rma_`, an ellipsis (U+2026) and the last four characters only."""
    parsed = _token.generate()
    assert parsed.hint == "rma_\u2026" + parsed.token[-4:]
    assert _token.hint_of(parsed.token) == parsed.hint


def test_parsed_token_repr_hides_the_secret() -> None:
    """The repr of a parsed key names its id and hint, never its secret."""
    parsed = _token.generate()
    assert parsed.secret not in repr(parsed)
    assert parsed.token not in repr(parsed)
    assert parsed.key_id in repr(parsed)


@pytest.mark.parametrize("length", [0, 1, 49, 51, 8 * 1024, 1024 * 1024])
def test_wrong_length_is_malformed(length: int) -> None:
    """Anything but 50 characters is refused before any other work."""
    assert _token.parse("a" * length) is Reason.MALFORMED
