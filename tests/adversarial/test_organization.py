"""Hostile ``x-organization-id`` headers, against both adapters.

Authentication comes first (D4): a bad key with any header is 401. With a good key the
header is trimmed of spaces and tabs and then must be ``default`` or an organization id
the creator reaches; anything else is 400 or 404, never a 500, and nothing of it is ever
echoed into a response header (the Target checks every reply for that).
"""

from __future__ import annotations

import pytest

from tests.adversarial.support import Target, assert_accepted, assert_refused, bearer
from tests.world import World

ORG = "x-organization-id"

MALFORMED = {
    "empty": "",
    "spaces only": "   ",
    "tabs only": "\t\t",
    "10 KB": "o" * 10_000,
    "129 characters": "o" * 129,
    "latin-1 letter": "org_r\xe9search",
    "UTF-8 letter": "org_r\xc3\xa9search",
    "full-width letters": "\xef\xbd\x8f\xef\xbd\x92\xef\xbd\x87",
    "CRLF and a header": "org_main\r\nset-cookie: session=stolen",
    "trailing LF": "org_main\n",
    "NUL inside": "org\x00main",
    "NBSP around": "\xa0org_main\xa0",
    "comma list": "a,b",
    "comma list of real ids": "org_main, org_research",
    "plus sign": "+12",
    "path traversal": "../org_main",
    "quoted": '"org_main"',
    "leading dot": ".org_main",
}

NOT_FOUND = {
    "DEFAULT in capitals": "DEFAULT",
    "Default capitalized": "Default",
    "zero-padded number": "0012",
    "number with a decimal": "12.0",
    "another tenant's organization": "org_globex",
    "organization out of reach": "org_secret",
    "id in capitals": "ORG_MAIN",
}

ACCEPTED = {
    "default": ("default", "org_main"),
    "default with spaces around": (" default ", "org_main"),
    "default with tabs around": ("\tdefault\t", "org_main"),
    "number": ("12", "12"),
    "number with spaces around": (" 12 ", "12"),
    "id with all allowed punctuation": ("org.research_x:1-a", "org.research_x:1-a"),
}


@pytest.fixture
def numbered(world: World) -> World:
    """Alice also belongs to organizations ``12`` and ``org.research_x:1-a`` of acme."""
    for organization in ("12", "org.research_x:1-a"):
        world.membership.add_organization(organization, tenant_id="acme")
        world.membership.add_member("alice", organization, role="member")
    return world


@pytest.mark.parametrize("value", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_header_is_400(target: Target, numbered: World, value: str) -> None:
    """A tenant key with a header that cannot be an organization id gets 400 naming it."""
    reply = target.send(bearer(numbered.keys["tenant"], (ORG, value)))

    assert_refused(reply, 400, numbered)
    assert "x-organization-id" in reply.json()["error"]["message"]


@pytest.mark.parametrize("value", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_header_with_organization_key_is_400(
    target: Target, world: World, value: str
) -> None:
    """An organization key with a malformed header is 400 too: it names nothing."""
    assert_refused(target.send(bearer(world.keys["research"], (ORG, value))), 400, world)


@pytest.mark.parametrize("value", MALFORMED.values(), ids=MALFORMED.keys())
@pytest.mark.parametrize("key", ["tenant_typo", "unknown"], ids=["mistyped key", "unknown key"])
def test_bad_key_with_malformed_header_is_401(
    target: Target, world: World, key: str, value: str
) -> None:
    """Authentication comes first: a bad key is 401 whatever the header holds."""
    assert_refused(target.send(bearer(world.keys[key], (ORG, value))), 401, world)


@pytest.mark.parametrize("value", NOT_FOUND.values(), ids=NOT_FOUND.keys())
def test_look_alike_organization_is_404(target: Target, numbered: World, value: str) -> None:
    """Case changes, zero padding and others' organizations name no reachable one: 404."""
    assert_refused(target.send(bearer(numbered.keys["tenant"], (ORG, value))), 404, numbered)


@pytest.mark.parametrize(("value", "organization"), ACCEPTED.values(), ids=ACCEPTED.keys())
def test_trimmed_header_is_accepted(
    target: Target, numbered: World, value: str, organization: str
) -> None:
    """Spaces and tabs around the value are trimmed; the id itself is matched exactly."""
    reply = target.send(bearer(numbered.keys["tenant"], (ORG, value)))

    assert_accepted(reply, organization, numbered)


@pytest.mark.parametrize(
    "values",
    [("org_main", "org_main"), ("org_main", "org_secret"), ("org_secret", "org_main"), ("", "")],
    ids=["same twice", "reachable then not", "not then reachable", "two empty"],
)
def test_two_headers_are_400(target: Target, world: World, values: tuple[str, str]) -> None:
    """Two x-organization-id lines are refused, whichever comes first (servers may join them)."""
    reply = target.send(bearer(world.keys["tenant"], *((ORG, value) for value in values)))

    assert_refused(reply, 400, world)
