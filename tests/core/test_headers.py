"""The syntax of the two request headers, in one place: the pure parsers the decision uses.

The decision tests and the adapters' tables check what happens *after* parsing (which
status, which reason, that no adapter normalises a header away); what a valid
``Authorization`` or ``x-organization-id`` value looks like is tested here only.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyturn import Reason
from keyturn._core.decision import DEFAULT_ORGANIZATION_PATTERN, bearer_token, organization_header

PATTERN = re.compile(DEFAULT_ORGANIZATION_PATTERN, re.ASCII)
TOKEN = "rma_" + "A" * 46


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
@pytest.mark.parametrize("gap", [" ", "  ", "    "])
def test_scheme_is_case_insensitive_and_spaces_may_repeat(scheme: str, gap: str) -> None:
    """D5: the scheme is case-insensitive; one or more spaces may precede the token."""
    assert bearer_token((f"{scheme}{gap}{TOKEN}",)) == TOKEN


@pytest.mark.parametrize(
    ("authorization", "expected"),
    [
        ((), Reason.MISSING),
        (("",), Reason.NOT_BEARER),
        (("Bearer",), Reason.NOT_BEARER),
        (("Bearer   ",), Reason.NOT_BEARER),
        (("Basic dXNlcjpwYXNz",), Reason.NOT_BEARER),
        (("Token rma_x",), Reason.NOT_BEARER),
        (("Bearer\trma_x",), Reason.NOT_BEARER),
        ((f"Bearer {TOKEN}", f"Bearer {TOKEN}"), Reason.AUTHORIZATION_REPEATED),
        ((f" Bearer {TOKEN}\t",), TOKEN),  # optional whitespace around the value
        ((f"Bearer {TOKEN} extra",), f"{TOKEN} extra"),  # then malformed: not a key's length
    ],
)
def test_authorization_header(authorization: tuple[str, ...], expected: str | Reason) -> None:
    """The one Bearer token, or why there is none; the reason is precise, the status one."""
    assert bearer_token(authorization) == expected


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ((), None),
        (("default",), "default"),
        (("org_research",), "org_research"),
        ((" org_research\t",), "org_research"),
        (("default", "default"), Reason.ORG_HEADER_REPEATED),
        (("",), Reason.ORG_HEADER_INVALID),
        (("   ",), Reason.ORG_HEADER_INVALID),
        (("a,b",), Reason.ORG_HEADER_INVALID),
        (("org research",), Reason.ORG_HEADER_INVALID),
        (("org/research",), Reason.ORG_HEADER_INVALID),
        (("-leading",), Reason.ORG_HEADER_INVALID),
        (("ünïcode",), Reason.ORG_HEADER_INVALID),
        (("x" * 129,), Reason.ORG_HEADER_INVALID),
        (("a\r\nb",), Reason.ORG_HEADER_INVALID),
        (("a\x00",), Reason.ORG_HEADER_INVALID),
    ],
)
def test_organization_header(values: tuple[str, ...], expected: str | Reason | None) -> None:
    """D8: an organization id or ``default``; a value that is neither is a 400's reason."""
    assert organization_header(values, PATTERN) == expected


@given(st.text(max_size=200))
def test_any_organization_value_is_an_id_or_a_reason(value: str) -> None:
    """Whatever the text, the parser answers the stripped id or a 400's reason, never raises."""
    parsed = organization_header((value,), PATTERN)
    assert parsed is Reason.ORG_HEADER_INVALID or parsed == value.strip(" \t")


@pytest.mark.parametrize(
    "parser", [bearer_token, lambda values: organization_header(values, PATTERN)]
)
def test_a_str_in_place_of_a_tuple_is_a_type_error(parser: object) -> None:
    """A str is a sequence of str: the misuse is refused loudly, not parsed per character."""
    with pytest.raises(TypeError, match="tuple of header values"):
        parser("Bearer x")  # type: ignore[operator]
