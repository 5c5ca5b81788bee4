"""Secrets at rest and names on screen: the database file's mode, and key names (D26)."""

from __future__ import annotations

import os
import re
import stat
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyturn import KeyManager, Scope
from keyturn._core.lifecycle import validate_name
from keyturn.errors import InvalidKeyName
from keyturn.stores.sqlite import SQLiteDatabase


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
def test_sqlite_database_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """The key database, and the journal files SQLite makes beside it, are created 0600
    even under a permissive umask.
    """
    path = tmp_path / "keys.sqlite3"
    old = os.umask(0o022)
    try:
        db = SQLiteDatabase(path)
        db.membership.add_organization("org_a", tenant_id="acme", default=True)
        db.membership.add_member("alice", "org_a", role="admin")
        KeyManager(db.keys, db.membership).create("alice", name="n", scope=Scope.tenant("acme"))
        files = sorted(tmp_path.iterdir())
        modes = {file.name: stat.S_IMODE(file.stat().st_mode) for file in files}
        db.close()
    finally:
        os.umask(old)

    assert "keys.sqlite3" in modes
    assert set(modes.values()) == {0o600}, modes


DECEPTIVE = {
    "zero-width space only": "\u200b",
    "zero-width joiners around text": "\u200dprod\u200d",
    "right-to-left override": "prod\u202eved",
    "left-to-right isolate": "\u2066prod\u2069",
    "byte order mark": "\ufeffprod",
    "soft hyphen": "pro\u00add",
    "line separator": "a\u2028b",
    "paragraph separator": "a\u2029b",
    "lone surrogate": "a\ud800b",
    "tag characters": "\U000e0070\U000e0072",
}


@pytest.mark.parametrize("name", DECEPTIVE.values(), ids=DECEPTIVE.keys())
def test_names_that_display_as_another_text_are_refused(name: str) -> None:
    """Format characters, separators and surrogates are refused, naming the code point."""
    with pytest.raises(InvalidKeyName, match=r"U\+[0-9A-F]{4,5}"):
        validate_name(name)


@pytest.mark.parametrize(
    "name",
    ["\u3164", "\u115f\u1160", "\ufe0f", "\u034f \u3164", "\u2800", "\u2800\u2800 ", "\U0001d159"],
    ids=str.encode,
)
def test_names_empty_once_ignorables_are_removed_are_refused(name: str) -> None:
    """A name made only of default-ignorable code points (fillers, variation selectors), or
    of characters drawn blank (the braille blank U+2800), shows as nothing, and is refused.
    """
    with pytest.raises(InvalidKeyName, match=re.escape("shows as nothing")):
        validate_name(name)


@given(st.text(min_size=1, max_size=100))
def test_an_accepted_name_shows_what_it_holds(raw: str) -> None:
    """Whatever is accepted holds no format, control, surrogate or separator character and
    has something visible.
    """
    try:
        name = validate_name(raw)
    except InvalidKeyName:
        return
    assert not {unicodedata.category(c) for c in name} & {"Cc", "Cf", "Cs", "Zl", "Zp"}
    assert name.strip()


def test_ordinary_names_still_pass() -> None:
    """Names in any script, with emoji and combining accents, are accepted as typed."""
    for name in ("nightly sync", "Café ☕", "日本語のキー", "e\u0301te\u0301", "👍🏽"):
        assert validate_name(name) == name
