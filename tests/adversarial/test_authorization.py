"""Hostile ``Authorization`` headers and key strings, against both adapters.

Every case gets its documented status with the JSON error body, never a 500 or a hang,
and (checked by the Target on every reply) no request text in any response header.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any

import pytest

from keyturn import Reason
from keyturn._core import token as _token
from tests.adversarial.support import (
    SpyStore,
    Target,
    assert_accepted,
    assert_refused,
    bearer,
    key_of,
    split,
)
from tests.world import World


def lines(*pairs: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return pairs


# --- the header's syntax --------------------------------------------------------------------

REFUSED = {
    "missing": lines(),
    "Basic scheme": lines(("authorization", "Basic {research}")),
    "Bearer alone": lines(("authorization", "Bearer")),
    "Bearer with trailing spaces": lines(("authorization", "Bearer    ")),
    "tab between scheme and token": lines(("authorization", "Bearer\t{research}")),
    "Bearer glued to the token": lines(("authorization", "Bearer{research}")),
    "scheme with a colon": lines(("authorization", "Bearer: {research}")),
    "key without a scheme": lines(("authorization", "{research}")),
    "extra part after the token": lines(("authorization", "Bearer {research} extra")),
    "second key after the token": lines(("authorization", "Bearer {research} {main}")),
    "quoted token": lines(("authorization", 'Bearer "{research}"')),
    "token as a parameter": lines(("authorization", "Bearer token={research}")),
    "two headers, valid then junk": lines(
        ("authorization", "Bearer {research}"), ("authorization", "Bearer junk")
    ),
    "two headers, junk then valid": lines(
        ("authorization", "Bearer junk"), ("authorization", "Bearer {research}")
    ),
    "two headers, both valid": lines(
        ("authorization", "Bearer {research}"), ("authorization", "Bearer {research}")
    ),
    "two headers spelled differently": lines(
        ("Authorization", "Bearer {research}"), ("authorization", "Bearer {research}")
    ),
    "comma-joined by a proxy, valid first": lines(
        ("authorization", "Bearer {research}, Bearer junk")
    ),
    "comma-joined by a proxy, junk first": lines(
        ("authorization", "Bearer junk, Bearer {research}")
    ),
    "comma-joined without a space": lines(("authorization", "Bearer {research},{research}")),
}

ACCEPTED = {
    "two spaces before the token": lines(("authorization", "Bearer  {research}")),
    "scheme in lower case": lines(("authorization", "bearer {research}")),
    "scheme in capitals": lines(("authorization", "BEARER {research}")),
    "scheme in mixed case": lines(("authorization", "bEaReR {research}")),
    "trailing spaces after the token": lines(("authorization", "Bearer {research}   ")),
    "tab after the token": lines(("authorization", "Bearer {research}\t")),
    "raw header name in capitals": lines(("AUTHORIZATION", "Bearer {research}")),
}


def filled(pairs: tuple[tuple[str, str], ...], world: World) -> list[tuple[str, str]]:
    return [(name, value.format(**world.keys)) for name, value in pairs]


@pytest.mark.parametrize("pairs", REFUSED.values(), ids=REFUSED.keys())
def test_malformed_authorization_is_401(target: Target, world: World, pairs: Any) -> None:
    """A missing, foreign, empty, split, padded or repeated Authorization header is one 401."""
    assert_refused(target.send(filled(pairs, world)), 401, world)


@pytest.mark.parametrize("pairs", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_lenient_authorization_is_accepted(target: Target, world: World, pairs: Any) -> None:
    """What RFC 6750 and HTTP allow (1*SP, any case, trailing whitespace) authenticates."""
    assert_accepted(target.send(filled(pairs, world)), "org_research", world)


# --- control, separator and non-ASCII characters ---------------------------------------------

CHARACTERS = {
    "NBSP": "\xa0",
    "NEL": "\x85",
    "unit separator": "\x1f",
    "NUL": "\x00",
    "CR": "\r",
    "LF": "\n",
    "CRLF": "\r\n",
    "DEL": "\x7f",
    "latin-1 e-acute": "\xe9",
    "UTF-8 e-acute": "\xc3\xa9",
    "UTF-8 emoji": "\xf0\x9f\x98\x80",
}
PLACES: dict[str, Callable[[str, str], str]] = {
    "before the token": lambda key, c: f"Bearer {c}{key}",
    "after the token": lambda key, c: f"Bearer {key}{c}",
    "instead of the space": lambda key, c: f"Bearer{c}{key}",
    "inside the token": lambda key, c: f"Bearer {key[:20]}{c}{key[21:]}",
    "in place of a key character": lambda key, c: f"Bearer {key[:20]}{c[-1]}{key[21:]}",
}


@pytest.mark.parametrize("character", CHARACTERS.values(), ids=CHARACTERS.keys())
@pytest.mark.parametrize("place", PLACES.values(), ids=PLACES.keys())
def test_odd_characters_around_a_valid_key_are_401(
    target: Target, world: World, place: Callable[[str, str], str], character: str
) -> None:
    """A valid key with a control, Unicode-space or non-ASCII byte added is refused, not
    trimmed into a match (Python's own strip() would eat NBSP, NEL and the separators).
    """
    value = place(world.keys["research"], character)

    assert_refused(target.send([("authorization", value)]), 401, world)


@pytest.mark.parametrize("size", [8 * 1024, 64 * 1024, 1024 * 1024], ids=["8KiB", "64KiB", "1MiB"])
@pytest.mark.parametrize(
    "shape",
    ["Bearer A{}", "Bearer rma_{}", "Bearer {}rma_"],
    ids=["letters", "key prefix then letters", "letters then key prefix"],
)
def test_huge_tokens_are_refused_cheaply(
    attack: Callable[..., Target],
    world: World,
    caplog: pytest.LogCaptureFixture,
    size: int,
    shape: str,
) -> None:
    """A token of 8 KiB to 1 MiB is refused without a store read or a hash (counted, not
    timed), and nothing of it reaches the log.
    """
    spy = SpyStore(world.store)
    authenticator = world.authenticator(store=spy)
    target = attack(authenticator=authenticator)
    value = shape.format("A" * size)
    caplog.set_level(logging.DEBUG)

    reply = target.send([("authorization", value)])

    assert_refused(reply, 401, world)
    assert spy.reads == 0
    assert caplog.records  # the refusal is logged ...
    assert max(len(record.getMessage()) for record in caplog.records) < 500  # ... briefly


@pytest.mark.parametrize("name", ["authorization", "x-organization-id"])
def test_flood_of_header_lines_is_refused_cheaply(
    attack: Callable[..., Target], world: World, name: str
) -> None:
    """Ten thousand repeated header lines are one refusal, not a 500: repeated Authorization
    lines cost no store read, a repeated organization header no more than one key's read
    (counted, not timed).
    """
    spy = SpyStore(world.store)
    authenticator = world.authenticator(store=spy)
    target = attack(authenticator=authenticator)
    flood = [(name, f"Bearer {world.keys['research']}")] * 10_000
    lines = flood if name == "authorization" else bearer(world.keys["tenant"], *flood)

    reply = target.send(lines)

    assert_refused(reply, 401 if name == "authorization" else 400, world)
    assert spy.reads <= (0 if name == "authorization" else 1)


# --- key strings ----------------------------------------------------------------------------


def flip(key: str, position: int) -> str:
    """*key* with one character replaced by another letter of the alphabet."""
    position %= len(key)
    replacement = "B" if key[position] == "A" else "A"
    return key[:position] + replacement + key[position + 1 :]


MISTYPED: dict[str, Callable[[str], str]] = {
    "wrong prefix": lambda key: "rmb_" + key[4:],
    "prefix in capitals": lambda key: "RMA_" + key[4:],
    "key in swapped case": lambda key: key[:4] + key[4:].swapcase(),
    "full-width prefix": lambda key: "\xef\xbd\x92\xef\xbd\x8d\xef\xbd\x81\xef\xbc\xbf" + key[4:],
    "Cyrillic a in the prefix": lambda key: "rm\xd0\xb0_" + key[4:],
    "one character short": lambda key: key[:-1],
    "one character long": lambda key: key + "A",
    "base64 padding added": lambda key: key + "=",
    "padding for the last character": lambda key: key[:-1] + "=",
    "flipped checksum character": lambda key: flip(key, -1),
    "flipped secret character": lambda key: flip(key, 30),
    "flipped key id character": lambda key: flip(key, 8),
    "prefix only": lambda key: "rma_",
    "the key twice": lambda key: key + key,
}


@pytest.fixture
def spied(attack: Callable[..., Target], world: World) -> tuple[Target, SpyStore]:
    """A target whose key store counts its reads."""
    spy = SpyStore(world.store)
    return attack(authenticator=world.authenticator(store=spy)), spy


@pytest.mark.parametrize("mistype", MISTYPED.values(), ids=MISTYPED.keys())
def test_mistyped_key_costs_no_lookup(
    spied: tuple[Target, SpyStore], world: World, mistype: Callable[[str], str]
) -> None:
    """A key with a wrong, look-alike or re-cased prefix, a wrong length or a broken
    checksum is refused with no store read.
    """
    target, spy = spied

    assert_refused(target.send(bearer(mistype(world.keys["research"]))), 401, world)
    assert spy.reads == 0


def test_random_key_with_valid_checksum_costs_one_lookup(
    spied: tuple[Target, SpyStore], world: World
) -> None:
    """A forged key with a right checksum and an unknown id costs one read."""
    target, spy = spied
    alphabet = _token.ALPHABET
    forged = key_of(
        "".join(secrets.choice(alphabet) for _ in range(_token.ID_LENGTH)),
        "".join(secrets.choice(alphabet) for _ in range(_token.SECRET_LENGTH)),
    )

    assert_refused(target.send(bearer(forged)), 401, world)
    assert spy.reads == 1
    assert world.audit[-1].error.reason is Reason.UNKNOWN_KEY


def test_id_of_one_key_with_secret_of_another(spied: tuple[Target, SpyStore], world: World) -> None:
    """Key A's id with key B's secret (checksum made right) is refused after one read, as a
    wrong secret."""
    target, spy = spied
    id_a, _ = split(world.keys["research"])
    _, secret_b = split(world.keys["main"])

    assert_refused(target.send(bearer(key_of(id_a, secret_b))), 401, world)
    assert spy.reads == 1
    assert world.audit[-1].error.reason is Reason.WRONG_SECRET


def test_unknown_id_and_wrong_secret_look_the_same(target: Target, world: World) -> None:
    """An unknown key id and a known id with a wrong secret get byte-identical replies."""
    key_id, secret = split(world.keys["research"])
    unknown = target.send(bearer(world.keys["unknown"]))
    wrong_secret = target.send(bearer(key_of(key_id, secret[::-1])))

    assert (unknown.status, unknown.headers, unknown.body) == (
        wrong_secret.status,
        wrong_secret.headers,
        wrong_secret.body,
    )
    assert_refused(unknown, 401, world)
