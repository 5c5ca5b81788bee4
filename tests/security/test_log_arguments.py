"""Arguments loggers ship apart from the message: whatever the format renders of a key, the
record's arguments leave RedactKeys without it.

Sentry's logging integration sends ``record.args`` beside the message template, and JSON
formatters write them as fields: a format that renders part of a key (``%.12s``) or none
of it (an argument the format does not use) must not leave the whole key there.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from keyturn._core import token as _token
from keyturn.redaction import RedactKeys

KEY = _token.generate().token  # a test fixture: no store knows it
PIECES = [KEY[i : i + 8] for i in range(16, len(KEY) - 7)]  # no 8 characters of the secret


class Holder:
    """An object whose repr and str hold the key, as a client or request object's may."""

    def __repr__(self) -> str:
        return f"Holder(token={KEY!r})"


def shipped(record: logging.LogRecord) -> str:
    """What a handler may ship: the message, the template, the arguments and the fields."""
    fields = {name: repr(value) for name, value in vars(record).items()}
    return "\n".join([record.getMessage(), str(record.msg), repr(record.args), json.dumps(fields)])


VALUES = st.sampled_from([KEY, f"Bearer {KEY}", KEY.encode(), Holder(), [KEY], {"key": KEY}])
FILLER = st.one_of(st.integers(), st.text(max_size=10), st.none())


@settings(max_examples=300, deadline=None)
@given(
    precision=st.integers(0, 12),
    conversion=st.sampled_from(["s", "r"]),
    key_at=st.integers(0, 3),
    others=st.lists(FILLER, max_size=3),
    value=VALUES,
    named=st.booleans(),
)
def test_no_argument_leaves_the_filter_with_a_key(
    precision: int,
    conversion: str,
    key_at: int,
    others: list[Any],
    value: Any,
    named: bool,
) -> None:
    """A key-bearing value among other arguments, rendered cut short (``%.Ns``, ``%.Nr``)
    by position or by name, or not rendered at all: nothing shipped holds 8 characters of
    its secret, and the record still renders."""
    args: list[Any] = list(others)
    args.insert(min(key_at, len(args)), value)
    cut = f"%.{precision}{conversion}"
    if named:
        mapping = {f"a{i}": arg for i, arg in enumerate(args)}
        used = " ".join(f"%(a{i}){cut[1:]}" for i in range(len(args)) if i % 2 == 0)
        record = logging.LogRecord("x", logging.INFO, __file__, 1, used or "none", (mapping,), None)
    else:
        record = logging.LogRecord(
            "x", logging.INFO, __file__, 1, " ".join([cut] * len(args)), tuple(args), None
        )

    assert RedactKeys().filter(record) is True

    text = shipped(record)
    assert not [piece for piece in PIECES if piece in text]
