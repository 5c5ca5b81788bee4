"""`keyturn keys list` shows each key's last seven days as a sparkline, in ASCII where the
output cannot show Unicode blocks, and as numbers in --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyturn.cli import main
from keyturn.stores.sqlite import SQLiteDatabase
from keyturn.usage import ACCEPTED, ASCII_BLOCKS, BLOCKS, sparkline
from tests.stores.test_cli import Run, create

TODAY = datetime.now(UTC).date()


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A store with tenant acme and alice in its default organization."""
    url = f"sqlite:///{tmp_path}/keyturn.sqlite3"
    for command in (
        ("db", "init"),
        ("org", "add", "org_default", "--tenant", "acme", "--default"),
        ("member", "add", "alice", "org_default", "--role", "admin"),
    ):
        assert main(["--store", url, *command]) == 0
    return url


@pytest.fixture
def ready(url: str, capsys: pytest.CaptureFixture[str]) -> Run:
    """Run one command against the store: (exit status, stdout, stderr)."""
    capsys.readouterr()

    def run(*args: str) -> tuple[int, str, str]:
        status = main(["--store", url, *args])
        out, err = capsys.readouterr()
        return status, out, err

    return run


def count(url: str, key_id: str, days_ago: int, accepted: int, refused: int = 0) -> None:
    counts = {(key_id, ACCEPTED): accepted, (key_id, "revoked"): refused}
    with SQLiteDatabase(url.removeprefix("sqlite:///")) as db:
        db.keys.count_usage(TODAY - timedelta(days=days_ago), counts)


def test_the_list_shows_the_last_seven_days(ready: Run, url: str) -> None:
    """A key's row holds one block per day, oldest first, today last, with the week's total
    of accepted requests and its refusals; a day eight days ago is not in it."""
    key_id, _ = create(url, "CI", tenant="acme")
    quiet_id, _ = create(url, "quiet", tenant="acme")
    for days_ago, accepted in ((0, 80), (1, 10), (3, 40), (8, 500)):
        count(url, key_id, days_ago, accepted)
    count(url, key_id, 0, 0, refused=2)
    status, listing, _ = ready("keys", "list", "--as", "alice")
    assert status == 0
    assert "LAST 7 DAYS" in listing.splitlines()[0]
    [row] = [line for line in listing.splitlines() if line.startswith(key_id)]
    assert "···▄·▁█ 130 (2 refused)" in row
    [quiet] = [line for line in listing.splitlines() if line.startswith(quiet_id)]
    assert "······· 0" in quiet


def test_json_gives_the_seven_days_as_numbers(ready: Run, url: str) -> None:
    """--json lists the seven days, oldest first, with accepted and refused counts."""
    key_id, _ = create(url, "CI", tenant="acme")
    count(url, key_id, 0, 5, refused=1)
    count(url, key_id, 6, 7)
    _, output, _ = ready("keys", "list", "--as", "alice", "--json")
    [listed] = json.loads(output)
    days = listed["last_7_days"]
    assert [day["day"] for day in days] == [
        (TODAY - timedelta(days=n)).isoformat() for n in range(6, -1, -1)
    ]
    assert (days[0]["accepted"], days[-1]["accepted"], days[-1]["refused"]) == (7, 5, 1)


def test_an_ascii_terminal_gets_an_ascii_sparkline(ready: Run, url: str) -> None:
    """Where standard output is ASCII, the sparkline is drawn with ASCII characters and the
    hint's ellipsis is three dots: the command neither fails nor prints a replacement."""
    key_id, _ = create(url, "CI", tenant="acme")
    count(url, key_id, 0, 80)
    count(url, key_id, 3, 40)
    done = subprocess.run(  # noqa: S603 -- our own interpreter and arguments
        [sys.executable, "-m", "keyturn", "--store", url, "keys", "list", "--as", "alice"],
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode("ascii")  # raises if anything else got through
    [row] = [line for line in out.splitlines() if line.startswith(key_id)]
    assert "rma_..." in row
    assert "...=..@ 120" in row


@given(st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=30))
def test_a_sparkline_has_one_level_per_value(values: list[int]) -> None:
    """One character per value; zero is the blank mark, any other count at least the
    lowest block; the largest value is the top block; larger values never draw lower."""
    for ascii_only, levels, none in ((False, BLOCKS, "·"), (True, ASCII_BLOCKS, ".")):
        line = sparkline(values, ascii=ascii_only)
        assert len(line) == len(values)
        for value, mark in zip(values, line, strict=True):
            assert (mark == none) == (value == 0)
        if max(values) > 0:
            assert line[values.index(max(values))] == levels[-1]
        height = [-1 if mark == none else levels.index(mark) for mark in line]
        ordered = sorted(zip(values, height, strict=True))
        assert [h for _, h in ordered] == sorted(h for _, h in ordered)
