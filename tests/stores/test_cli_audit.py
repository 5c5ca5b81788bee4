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

from keyturn import cli
from keyturn.activity import Action, new_event
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
    monkeypatch.setattr(cli, "EXPORT_PAGE", page)
    with SQLiteDatabase(url.removeprefix("sqlite:///")) as db:
        before = {e.event_id for e in db.keys.events_since(None, 10_000)}
        for minute in instants:
            event = new_event(make_key(), Action.CREATED, START + timedelta(minutes=minute))
            db.keys.record_event(event)
        expected = [e.event_id for e in db.keys.events_since(None, 10_000)]
    exported = [str(e["event_id"]) for e in lines(ready("audit", "export")[1])]
    assert exported == expected
    assert len(set(exported) - before) == len(instants)
