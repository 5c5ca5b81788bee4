"""``keyturn audit export`` and the record the command's own revoke leaves."""

from __future__ import annotations

import json
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyturn.activity import Action, new_event
from keyturn.cli import _commands
from keyturn.stores.sqlite import SQLiteDatabase
from tests.stores import test_cli
from tests.stores.test_cli import Run, create
from tests.stores.test_contract import make_key

# The command's own fixtures: a SQLite store URL, a runner, and the store with acme's world.
url, keyturn, ready = test_cli.url, test_cli.keyturn, test_cli.ready

START = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def lines(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]


def test_an_operator_revoke_is_on_the_creator_s_record(ready: Run, url: str) -> None:
    """keys revoke records the operator, the CLI channel and the reason on the key."""
    key_id, _ = create(url, "ci", tenant="acme")
    assert ready("keys", "revoke", "--as", "alice", key_id, "--reason", "in a build log")[0] == 0
    status, out, _ = ready("audit", "export")
    assert status == 0
    created, revoked = lines(out)
    assert (created["action"], created["channel"], created["actor"]) == (
        "created",
        "library",
        "alice",
    )
    assert (revoked["action"], revoked["channel"], revoked["detail"]) == (
        "revoked",
        "cli",
        "in a build log",
    )
    assert str(revoked["actor"]).startswith("operator ")
    assert revoked["key_id"] == key_id and "secret" not in out


def test_export_since_and_to_a_file_only_its_owner_reads(
    ready: Run, url: str, tmp_path: Path
) -> None:
    """--since keeps the later events; --output writes the file with mode 600."""
    with SQLiteDatabase(url.removeprefix("sqlite:///")) as db:
        for days in (0, 1, 2):
            db.keys.record_event(new_event(make_key(), Action.CREATED, START + timedelta(days)))
    target = tmp_path / "events.jsonl"
    status, _, err = ready("audit", "export", "--since", "2026-11-22", "--output", str(target))
    assert status == 0 and "Wrote 2 event(s)" in err
    assert [e["at"] for e in lines(target.read_text())] == [
        "2026-11-22T12:00:00+00:00",
        "2026-11-23T12:00:00+00:00",
    ]
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert ready("audit", "export", "--since", "2026-11-23T12:00:00Z")[1].count("\n") == 1


@pytest.mark.parametrize("since", ["yesterday", "2026-13-01", "7w"])
def test_an_unreadable_since_is_a_usage_error(ready: Run, since: str) -> None:
    """--since takes a date, an instant or a span; anything else is exit status 2."""
    status, _, err = ready("audit", "export", "--since", since)
    assert status == 2 and "--since" in err


def test_export_replaces_an_existing_file_with_an_owner_only_one(
    ready: Run, tmp_path: Path
) -> None:
    """An existing world-readable file at --output is replaced by a new file of mode 600
    (not truncated in place, keeping its mode); nothing else is left in the folder."""
    folder = tmp_path / "out"
    folder.mkdir()
    target = folder / "events.jsonl"
    target.write_text("old contents\n")
    target.chmod(0o644)
    status, _, err = ready("audit", "export", "--output", str(target))
    assert status == 0 and "Wrote" in err
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert "old contents" not in target.read_text()
    assert [p.name for p in folder.iterdir()] == ["events.jsonl"]


def test_export_never_writes_through_a_symbolic_link(ready: Run, tmp_path: Path) -> None:
    """--output naming a symbolic link: the link itself is replaced by the export, and the
    file it pointed to is left as it was."""
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not yours to overwrite\n")
    elsewhere.chmod(0o644)
    link = tmp_path / "events.jsonl"
    link.symlink_to(elsewhere)
    status, _, _ = ready("audit", "export", "--output", str(link))
    assert status == 0
    assert not link.is_symlink()
    assert stat.S_IMODE(os.lstat(link).st_mode) == 0o600
    assert elsewhere.read_text() == "not yours to overwrite\n"
    assert stat.S_IMODE(os.stat(elsewhere).st_mode) == 0o644


def test_export_to_a_folder_that_is_not_there_is_a_usage_error(ready: Run, tmp_path: Path) -> None:
    """No such folder: exit status 2, said plainly."""
    status, _, err = ready("audit", "export", "--output", str(tmp_path / "no" / "events.jsonl"))
    assert status == 2 and "cannot write" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "since", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "0001-01-01T00:00+01:00"]
)
def test_a_since_outside_the_years_utc_reads_is_a_usage_error(ready: Run, since: str) -> None:
    """An instant that parses yet lies outside the years 1 to 9999 in UTC: exit status 2
    with a message, never a traceback."""
    status, _, err = ready("audit", "export", "--since", since)
    assert status == 2 and "--since" in err and "outside the years" in err
    assert "Traceback" not in err


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(instants=st.lists(st.integers(0, 3), min_size=0, max_size=12), page=st.integers(1, 4))
def test_export_pages_write_every_event_once(
    ready: Run, url: str, monkeypatch: pytest.MonkeyPatch, instants: list[int], page: int
) -> None:
    """Whatever the page size and however many events share an instant, the export writes
    each event exactly once, oldest first."""
    monkeypatch.setattr(_commands, "EXPORT_PAGE", page)
    with SQLiteDatabase(url.removeprefix("sqlite:///")) as db:
        before = {e.event_id for e in db.keys.events_since(None, 10_000)}
        for minute in instants:
            event = new_event(make_key(), Action.CREATED, START + timedelta(minutes=minute))
            db.keys.record_event(event)
        expected = [e.event_id for e in db.keys.events_since(None, 10_000)]
    exported = [str(e["event_id"]) for e in lines(ready("audit", "export")[1])]
    assert exported == expected
    assert len(set(exported) - before) == len(instants)
