"""The ``keyturn`` command, in-process through ``main()`` and as a subprocess."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from keyturn.cli import _redact, main

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/keyturn.sqlite3"


@pytest.fixture
def keyturn(url: str, capsys: pytest.CaptureFixture[str]) -> Run:
    """Run one command against the test store: returns (exit status, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        status = main(["--store", url, *args])
        out, err = capsys.readouterr()
        return status, out, err

    return run


@pytest.fixture
def ready(keyturn: Run) -> Run:
    """A store with tenant acme (org_default, org_research) and alice in both."""
    for command in (
        ("db", "init"),
        ("org", "add", "org_default", "--tenant", "acme", "--default"),
        ("org", "add", "org_research", "--tenant", "acme"),
        ("member", "add", "alice", "org_default", "--role", "admin"),
        ("member", "add", "alice", "org_research", "--role", "member"),
    ):
        status, _, err = keyturn(*command)
        assert status == 0, err
    return keyturn


def create(run: Run, *args: str) -> tuple[str, str]:
    """Create a key for alice; return its id and its secret."""
    status, out, err = run("keys", "create", "--as", "alice", *args)
    assert status == 0, err
    return out.split()[2], out.strip().splitlines()[-1]


def test_help_shows_every_command_and_examples(capsys: pytest.CaptureFixture[str]) -> None:
    """--help lists the commands, store URLs, exit statuses and worked examples."""
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for text in ("db", "org", "member", "keys", "examples:", "store URLs:", "exit status:"):
        assert text in out
    assert main(["keys", "create", "--help"]) == 0
    assert "--expires-on YYYY-MM-DD" in capsys.readouterr().out


def test_create_prints_the_secret_once_and_list_never(ready: Run) -> None:
    """The secret appears once, labelled, at creation; the list shows the hint, never it."""
    status, out, _ = ready("keys", "create", "--as", "alice", "--name", "CI", "--tenant", "acme")
    assert status == 0
    secret = out.strip().splitlines()[-1]
    assert secret.startswith("rma_") and len(secret) == 50
    assert out.count(secret) == 1
    assert "shown once" in out
    assert "rma_\u2026" + secret[-4:] in out  # the hint
    for args in ((), ("--json",)):
        status, listing, _ = ready("keys", "list", "--as", "alice", *args)
        assert status == 0
        assert secret[-4:] in listing  # in the hint
        assert secret not in listing and secret[16:44] not in listing


def test_list_filters_by_status_and_scope(ready: Run) -> None:
    """--status and --scope (tenant, organization, or an organization id) filter the list."""
    tenant, _ = create(ready, "--name", "tenant", "--tenant", "acme", "--lifetime", "3h")
    research, _ = create(ready, "--name", "research", "--org", "org_research")
    default, _ = create(ready, "--name", "default", "--org", "org_default", "--lifetime", "90d")
    assert ready("keys", "revoke", "--as", "alice", default)[0] == 0

    def ids(*args: str) -> list[str]:
        status, out, _ = ready("keys", "list", "--as", "alice", "--json", *args)
        assert status == 0
        return [item["key_id"] for item in json.loads(out)]

    assert ids() == [default, research, tenant]  # newest first
    assert ids("--status", "active") == ids("--status", "Active") == [research, tenant]
    assert ids("--status", "revoked") == [default]
    assert ids("--scope", "tenant") == [tenant]
    assert ids("--scope", "organization") == [default, research]
    assert ids("--scope", "org_research") == [research]
    status, out, _ = ready("keys", "list", "--as", "alice", "--status", "expired")
    assert (status, out.strip()) == (0, "No keys of alice match.")
    status, out, _ = ready("keys", "list", "--as", "alice")
    assert out.splitlines()[0].split()[:3] == ["KEY", "ID", "HINT"]
    assert len(out.splitlines()) == 4


def test_json_output_describes_each_key(ready: Run) -> None:
    """keys list --json gives ids, hints, statuses, scopes and UTC instants."""
    key_id, secret = create(ready, "--name", "research", "--org", "org_research")
    (item,) = json.loads(ready("keys", "list", "--as", "alice", "--json")[1])
    assert item["key_id"] == key_id
    assert item["hint"] == "rma_\u2026" + secret[-4:]
    assert item["status"] == "Active"
    assert item["scope"] == {
        "kind": "organization",
        "tenant_id": "acme",
        "organization_id": "org_research",
    }
    created = datetime.fromisoformat(item["created_at"])
    assert datetime.fromisoformat(item["expires_at"]) - created == timedelta(days=30)
    assert item["revoked_at"] is None and item["last_used_at"] is None


def test_a_custom_date_expires_at_the_end_of_that_day_in_the_zone(ready: Run) -> None:
    """--expires-on with --time-zone expires at the next local midnight in that zone."""
    paris = ZoneInfo("Europe/Paris")
    day = datetime.now(paris).date() + timedelta(days=10)
    status, out, _ = ready(
        "keys", "create", "--as", "alice", "--name", "laptop", "--tenant", "acme",
        "--expires-on", day.isoformat(), "--time-zone", "Europe/Paris",
    )  # fmt: skip
    assert status == 0
    assert f"({day + timedelta(days=1)} 00:00 in Europe/Paris)" in out
    (item,) = json.loads(ready("keys", "list", "--as", "alice", "--json")[1])
    midnight = datetime.combine(day + timedelta(days=1), datetime.min.time(), tzinfo=paris)
    assert datetime.fromisoformat(item["expires_at"]) == midnight.astimezone(UTC)


def test_revoke_then_revoke_again(ready: Run) -> None:
    """A revoke succeeds once; the second one is refused with status 1."""
    key_id, _ = create(ready, "--name", "ci", "--tenant", "acme")
    status, out, _ = ready("keys", "revoke", "--as", "alice", key_id)
    assert status == 0 and f"Revoked key {key_id}" in out
    status, _, err = ready("keys", "revoke", "--as", "alice", key_id)
    assert status == 1 and "already Revoked" in err


def test_member_remove(ready: Run) -> None:
    """member remove takes a role away; removing it again is an error."""
    assert ready("member", "remove", "alice", "org_research")[0] == 0
    status, _, err = ready("member", "remove", "alice", "org_research")
    assert status == 1 and "no role" in err


TOMORROW_LAST_YEAR = (date.today() - timedelta(days=365)).isoformat()

FAILURES = [
    # (command, exit status, text in stderr)
    (("keys", "create", "--as", "alice", "--name", "x" * 101, "--tenant", "acme"), 2, "100"),
    (("keys", "create", "--as", "alice", "--name", "  ", "--tenant", "acme"), 2, "required"),
    (("keys", "create", "--as", "alice", "--name", "x", "--tenant", "acme",
      "--expires-on", TOMORROW_LAST_YEAR), 2, "outside the allowed range"),
    (("keys", "create", "--as", "alice", "--name", "x", "--tenant", "acme",
      "--expires-on", "2030-01-01", "--time-zone", "Mars/Olympus"), 2, "unknown time zone"),
    (("keys", "create", "--as", "alice", "--name", "x", "--tenant", "acme",
      "--time-zone", "Europe/Paris"), 2, "--time-zone goes with --expires-on"),
    (("keys", "create", "--as", "alice", "--name", "x", "--tenant", "acme",
      "--expires-on", "31/12/2030"), 2, "YYYY-MM-DD"),
    (("keys", "create", "--as", "alice", "--name", "x", "--tenant", "acme",
      "--org", "org_default"), 2, "not allowed with"),
    (("keys", "create", "--as", "alice", "--name", "x", "--tenant", "acme",
      "--lifetime", "2d"), 2, "invalid choice"),
    (("keys", "create", "--as", "alice", "--name", "x", "--org", "org_nope"), 1,
     "no organization 'org_nope'"),
    (("keys", "create", "--as", "bob", "--name", "x", "--tenant", "acme"), 1,
     "reaches no organization"),
    (("keys", "list", "--as", "alice", "--status", "lost"), 2, "invalid choice"),
    (("keys", "revoke", "--as", "alice", "NoSuchKey123"), 1, "no key with id"),
    (("org", "add", "org_second", "--tenant", "acme", "--default"), 1, "already has a default"),
    (("org", "add", "org_research", "--tenant", "globex"), 1, "already exists in tenant 'acme'"),
    (("org", "add", "org_x", "--tenant", " "), 2, "must not be empty"),
    (("keys", "create", "--as", "", "--name", "x", "--tenant", "acme"), 2, "must not be empty"),
    (("keys", "revoke", "--as", "alice", "rma_" + "x" * 46), 2, "not the key"),
    (("member", "add", "bob", "org_nope", "--role", "admin"), 1, "no organization"),
    (("keys",), 2, "required"),
]  # fmt: skip


@pytest.mark.parametrize(("command", "expected", "message"), FAILURES)
def test_failures_have_a_message_and_an_exit_status(
    ready: Run, command: tuple[str, ...], expected: int, message: str
) -> None:
    """Invalid values and usage exit 2; not found, not reachable and conflicts exit 1."""
    status, out, err = ready(*command)
    assert (status, out) == (expected, "")
    assert message in err
    assert "Traceback" not in err


def test_another_user_s_key_is_not_found(ready: Run) -> None:
    """A user cannot revoke or even see a key created by someone else."""
    key_id, _ = create(ready, "--name", "ci", "--tenant", "acme")
    assert ready("member", "add", "bob", "org_default", "--role", "admin")[0] == 0
    status, _, err = ready("keys", "revoke", "--as", "bob", key_id)
    assert status == 1 and "no key with id" in err
    assert json.loads(ready("keys", "list", "--as", "bob", "--json")[1]) == []


def test_an_uninitialized_store_is_not_created_by_accident(keyturn: Run, tmp_path: Path) -> None:
    """Every command but db init refuses a store that does not exist yet, and creates nothing."""
    status, _, err = keyturn("keys", "list", "--as", "alice")
    assert status == 1 and "keyturn db init" in err
    assert f"there is no store at {tmp_path / 'keyturn.sqlite3'}" in err  # the absolute path
    assert list(tmp_path.iterdir()) == []
    status, out, _ = keyturn("db", "init")
    assert status == 0 and "schema version 1" in out


def test_the_store_comes_from_the_flag_then_the_environment_then_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--store wins (before or after the command), then KEYTURN_STORE_URL, then the default."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KEYTURN_STORE_URL", raising=False)
    assert main(["db", "init"]) == 0
    assert (tmp_path / "keyturn.sqlite3").exists()
    monkeypatch.setenv("KEYTURN_STORE_URL", "sqlite:///from-env.db")
    assert main(["db", "init"]) == 0
    assert (tmp_path / "from-env.db").exists()
    assert main(["--store", "sqlite:///before.db", "db", "init"]) == 0
    assert (
        main(["--store", "sqlite:///ignored.db", "db", "init", "--store", "sqlite:///after.db"])
        == 0
    )
    assert (tmp_path / "before.db").exists() and (tmp_path / "after.db").exists()
    assert not (tmp_path / "ignored.db").exists()
    assert main(["--store", "redis://127.0.0.1", "db", "init"]) == 2
    assert "unsupported store URL scheme 'redis'" in capsys.readouterr().err


def test_db_init_names_a_missing_membership(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A SQLite path in a directory that does not exist is a usage error that names it."""
    assert main(["--store", f"sqlite:///{tmp_path}/nowhere/keys.sqlite3", "db", "init"]) == 2
    assert f"there is no directory {tmp_path / 'nowhere'}" in capsys.readouterr().err


def test_an_organization_id_no_header_can_name_is_added_with_a_warning(ready: Run) -> None:
    """org add warns about an id that x-organization-id cannot carry, and re-adding is fine."""
    status, _, err = ready("org", "add", "team one", "--tenant", "acme")
    assert status == 0 and "warning: x-organization-id cannot name 'team one'" in err
    status, _, err = ready("org", "add", "org_research", "--tenant", "acme")
    assert (status, err) == (0, "")


def test_demo_help_names_the_demo_s_own_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    """keyturn demo --help gives the demo's store and port defaults, not the command's."""
    assert main(["demo", "--help"]) == 0
    out = capsys.readouterr().out
    assert "$KEYTURN_DEMO_STORE" in out and "$KEYTURN_DEMO_PORT" in out
    assert "$KEYTURN_STORE_URL" not in out


def test_an_unreachable_postgresql_store_is_one_line_with_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The pool's connection errors become one error line, with the reason, password hidden."""
    pytest.importorskip("psycopg_pool")
    with socket.socket() as sock:  # a port nothing listens on: the connection is refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"postgresql://app:hunter2@127.0.0.1:{port}/app"
    assert main(["--store", url, "keys", "list", "--as", "alice"]) == 1  # after the 5 s timeout
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hunter2" not in err
    assert f"cannot connect to the store postgresql://app:***@127.0.0.1:{port}/app" in err
    assert "refused" in err


def test_passwords_in_store_urls_are_never_printed() -> None:
    """A store URL is shown with its password replaced."""
    assert _redact("postgresql://app:hunter2@127.0.0.1:5432/keys") == (
        "postgresql://app:***@127.0.0.1:5432/keys"
    )
    assert _redact("sqlite:///keyturn.sqlite3") == "sqlite:///keyturn.sqlite3"


def test_the_command_runs_as_a_program(url: str) -> None:
    """`python -m keyturn.cli` works, and exits 2 on a usage error with argparse's message."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603 -- our own interpreter and arguments
            [sys.executable, "-m", "keyturn.cli", "--store", url, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert run("db", "init").returncode == 0
    done = run("keys", "create", "--name", "x", "--tenant", "acme")
    assert done.returncode == 2
    assert "--as" in done.stderr


@pytest.mark.postgres
def test_postgresql_store_needs_db_init(
    make_postgres_schema: Callable[[], str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Against PostgreSQL, commands ask for db init until it ran, and then work."""
    url = make_postgres_schema()
    assert main(["--store", url, "keys", "list", "--as", "alice"]) == 1
    assert "keyturn db init" in capsys.readouterr().err
    assert main(["--store", url, "db", "init"]) == 0
    assert main(["--store", url, "org", "add", "org_default", "--tenant", "acme", "--default"]) == 0
    assert main(["--store", url, "member", "add", "alice", "org_default", "--role", "admin"]) == 0
    capsys.readouterr()
    assert (
        main(
            ["--store", url, "keys", "create", "--as", "alice", "--name", "ci", "--tenant", "acme"]
        )
        == 0
    )
    secret = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["--store", url, "keys", "list", "--as", "alice"]) == 0
    listing = capsys.readouterr().out
    assert "Active" in listing and secret not in listing
