"""The ``keyturn`` command, in-process through ``main()`` and as a subprocess."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyturn import KeyManager, Lifetime, OrganizationConflict, Scope
from keyturn.cli import main
from keyturn.stores import open_database, redact_url
from keyturn.stores._schema import SCHEMA_VERSION
from keyturn.stores.memory import MemoryMembership
from keyturn.stores.sqlite import SQLiteDatabase

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


def create(
    url: str, name: str, *, tenant: str | None = None, org: str | None = None, lifetime: str = "30d"
) -> tuple[str, str]:
    """Create a key for alice as the console does (the command creates none); return its id
    and its secret.
    """
    with SQLiteDatabase(url.removeprefix("sqlite:///")) as db:
        manager = KeyManager(db.keys, db.membership)
        scope = {"organization": org} if org is not None else {"scope": Scope.tenant(tenant or "")}
        created = manager.create("alice", name=name, expiry=Lifetime.parse(lifetime), **scope)
    return created.info.key_id, created.secret


def rotate(url: str, key_id: str, *, revoke_old_on_first_use: bool = False) -> tuple[str, str]:
    """Rotate one of alice's keys as the console does; return the new key's id and secret."""
    with SQLiteDatabase(url.removeprefix("sqlite:///")) as db:
        created = KeyManager(db.keys, db.membership).rotate(
            "alice", key_id, revoke_old_on_first_use=revoke_old_on_first_use
        )
    return created.info.key_id, created.secret


def revoke(run: Run, account: str, key_id: str) -> tuple[int, str, str]:
    return run("keys", "revoke", "--as", account, key_id, "--reason", "a test")


def test_help_shows_every_command_and_examples(capsys: pytest.CaptureFixture[str]) -> None:
    """--help lists the commands, store URLs, exit statuses and worked examples."""
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for text in ("db", "org", "member", "keys", "examples:", "store URLs:", "exit status:"):
        assert text in out
    assert "keys create" not in out and "keys rotate" not in out
    assert "created and rotated in the key console only" in out


@pytest.mark.parametrize(
    "command",
    [
        ("keys", "create", "--as", "alice", "--name", "CI", "--tenant", "acme"),
        ("keys", "create", "--as", "alice", "--name", "CI", "--tenant", "acme", "--json"),
        ("keys", "rotate", "--as", "alice", "3fZk8QmPx2Lw"),
    ],
    ids=["create", "create --json", "rotate"],
)
def test_the_command_creates_no_key(ready: Run, url: str, command: tuple[str, ...]) -> None:
    """Keys are created only in the console, by the signed-in user: the command has no way
    to make a key for an account, nor to hand anyone a secret. It says where keys are made:
    the console, or the host's code with KeyManager for a signed-in user.
    """
    status, out, err = ready(*command)

    assert (status, out) == (2, "")
    assert err.startswith("keyturn: error: this command makes no keys: keys are ")
    assert "in the key console" in err and f"KeyManager.{command[1]}(account_id" in err
    assert "invalid choice" not in err and "rma_" not in err
    with SQLiteDatabase(url.removeprefix("sqlite:///")) as db:
        assert KeyManager(db.keys, db.membership).list("alice") == []


def test_list_never_shows_a_secret(ready: Run, url: str) -> None:
    """The list shows the hint, never the secret, as text and as JSON."""
    _, secret = create(url, "CI", tenant="acme")
    for args in ((), ("--json",)):
        status, listing, _ = ready("keys", "list", "--as", "alice", *args)
        assert status == 0
        assert secret[-4:] in listing  # in the hint
        assert secret not in listing and secret[16:44] not in listing


def test_list_filters_by_status_and_scope(ready: Run, url: str) -> None:
    """--status and --scope (tenant, organization, or an organization id) filter the list."""
    tenant, _ = create(url, "tenant", tenant="acme", lifetime="3h")
    research, _ = create(url, "research", org="org_research")
    default, _ = create(url, "default", org="org_default", lifetime="90d")
    assert revoke(ready, "alice", default)[0] == 0

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
    assert (status, out.strip()) == (0, "alice has no key that matches.")
    status, out, _ = ready("keys", "list", "--as", "alice")
    assert out.splitlines()[0].split()[:3] == ["KEY", "ID", "HINT"]
    assert len(out.splitlines()) == 4


def test_json_output_describes_each_key(ready: Run, url: str) -> None:
    """keys list --json gives ids, hints, statuses, scopes and UTC instants."""
    key_id, secret = create(url, "research", org="org_research")
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


def test_revoke_then_revoke_again(ready: Run, url: str) -> None:
    """A revoke succeeds once; the second one is refused with status 1."""
    key_id, _ = create(url, "ci", tenant="acme")
    status, out, _ = revoke(ready, "alice", key_id)
    assert status == 0 and f"Revoked key {key_id}" in out
    status, _, err = revoke(ready, "alice", key_id)
    assert status == 1 and "already Revoked" in err


def test_member_remove(ready: Run) -> None:
    """member remove takes a role away; removing it again is an error."""
    assert ready("member", "remove", "alice", "org_research")[0] == 0
    status, _, err = ready("member", "remove", "alice", "org_research")
    assert status == 1 and "no role" in err


FAILURES = [
    # (command, exit status, text in stderr)
    (("keys", "list", "--as", "alice", "--status", "lost"), 2, "invalid choice"),
    (("keys", "revoke", "--as", "alice", "NoSuchKey123", "--reason", "r"), 1, "no key with id"),
    (("keys", "revoke", "--as", "alice", "NoSuchKey123"), 2, "--reason"),
    (("keys", "revoke", "--as", "alice", "NoSuchKey123", "--reason", " "), 2, "say why"),
    (("keys", "revoke", "--as", "alice", "NoSuchKey123", "--reason", "rma_x"), 2,
     "must not hold a key"),
    (("org", "add", "org_second", "--tenant", "acme", "--default"), 1, "already has a default"),
    (("org", "add", "org_x", "--tenant", "initech"), 1, "has no default organization yet"),
    (("org", "add", "org_research", "--tenant", "globex"), 1, "already exists in tenant 'acme'"),
    (("org", "add", "org_x", "--tenant", " "), 2, "must not be empty"),
    (("keys", "revoke", "--as", "alice", "rma_" + "x" * 46, "--reason", "r"), 2, "not the key"),
    (("keys", "list", "--as", ""), 2, "must not be empty"),
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


def test_another_user_s_key_is_not_found(ready: Run, url: str) -> None:
    """A user cannot revoke or even see a key created by someone else."""
    key_id, _ = create(url, "ci", tenant="acme")
    assert ready("member", "add", "bob", "org_default", "--role", "admin")[0] == 0
    status, _, err = revoke(ready, "bob", key_id)
    assert status == 1 and "no key with id" in err
    assert json.loads(ready("keys", "list", "--as", "bob", "--json")[1]) == []


def test_an_uninitialized_store_is_not_created_by_accident(keyturn: Run, tmp_path: Path) -> None:
    """Every command but db init refuses a store that does not exist yet, and creates nothing."""
    status, _, err = keyturn("keys", "list", "--as", "alice")
    assert status == 1 and "keyturn db init" in err
    assert f"there is no store at {tmp_path / 'keyturn.sqlite3'}" in err  # the absolute path
    assert list(tmp_path.iterdir()) == []
    status, out, _ = keyturn("db", "init")
    assert status == 0 and f"schema version {SCHEMA_VERSION}" in out


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
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The pool's connection errors become one error line, with the reason, password hidden."""
    pytest.importorskip("psycopg_pool")
    with socket.socket() as sock:  # a port nothing listens on: the connection is refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"postgresql://app:hunter2@127.0.0.1:{port}/app"
    with caplog.at_level(logging.DEBUG, logger="psycopg.pool"):
        assert main(["--store", url, "keys", "list", "--as", "alice"]) == 1
    assert caplog.records == []  # refused at once: no pool was left retrying until its timeout
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hunter2" not in err
    assert f"cannot connect to the store postgresql://app:***@127.0.0.1:{port}/app" in err
    assert "refused" in err


SECRET = "hun@ter 2/x'?"  # a password as awkward as libpq allows


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:{q}@127.0.0.1:5432/keys", "postgresql://app:***@127.0.0.1:5432/keys"),
        ("postgres://app:{raw}@h/db", "postgres://app:***@h/db"),
        ("postgresql://app@h/db?sslmode=require&password={q}", "postgresql://app@h/db?sslmode=require&password=***"),
        ("postgresql://h1:1,h2:2/db?pass%77ord={q}", "postgresql://h1:1,h2:2/db?pass%77ord=***"),
        ("postgresql:///db?host=/run/pg&sslpassword={q}", "postgresql:///db?host=/run/pg&sslpassword=***"),
        ("host=h password={escaped} dbname=keys", "host=h password=*** dbname=keys"),
        ("host=h password = '{quoted}' user=app", "host=h password = *** user=app"),
        ("sslpassword='{quoted}'", "sslpassword=***"),
        ("dbname='postgresql://app:{q}@h/db' host=h", "dbname='postgresql://app:***@h/db' host=h"),
        ("host=h dbname=postgresql://app:{q}@h/db", "host=h dbname='postgresql://app:***@h/db'"),
        ("sqlite:///keyturn.sqlite3", "sqlite:///keyturn.sqlite3"),
        ("postgresql://app@127.0.0.1:5432/keys", "postgresql://app@127.0.0.1:5432/keys"),
    ],
)  # fmt: skip
def test_every_credential_form_libpq_accepts_is_redacted(url: str, shown: str) -> None:
    """Passwords in a URL's user info or query, or in key/value connection strings, are hidden."""
    forms = {
        "q": quote(SECRET, safe=""),
        "raw": SECRET.replace("/", "%2F").replace(" ", "%20"),
        "escaped": SECRET.replace("\\", "\\\\").replace(" ", "\\ ").replace("'", "\\'"),
        "quoted": SECRET.replace("\\", "\\\\").replace("'", "\\'"),
    }
    assert redact_url(url.format(**forms)) == shown


@given(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\0"), min_size=1))
def test_no_password_survives_redaction(password: str) -> None:
    """Whatever the password, no form of it is left in the redacted URL or connection string."""
    quoted = password.replace("\\", "\\\\").replace("'", "\\'")
    for url in (
        f"postgresql://app:{quote(password, safe='')}@h/db",
        f"postgresql://h/db?password={quote(password, safe='')}",
        f"host=h password='{quoted}' port=5432",
    ):
        redacted = redact_url(url)
        assert "***" in redacted
        left = redacted.replace("password", "")  # the parameter's own name is no leak
        for kept in (quote(password, safe=""), f"'{quoted}'"):
            assert len(kept) < 4 or kept not in left


def test_the_command_runs_as_a_program(url: str) -> None:
    """`python -m keyturn` works, and exits 2 on a usage error with argparse's message."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603 -- our own interpreter and arguments
            [sys.executable, "-m", "keyturn", "--store", url, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert run("db", "init").returncode == 0
    done = run("keys", "list")
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
    with open_database(url) as db:
        secret = (
            KeyManager(db.keys, db.membership)
            .create("alice", name="ci", scope=Scope.tenant("acme"))
            .secret
        )
    capsys.readouterr()
    assert main(["--store", url, "keys", "list", "--as", "alice"]) == 0
    listing = capsys.readouterr().out
    assert "Active" in listing and secret not in listing


def test_version_and_python_m_keyturn() -> None:
    """`python -m keyturn --version` names the installed version."""
    done = subprocess.run(
        [sys.executable, "-m", "keyturn", "--version"], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, f"keyturn {version('keyturn')}\n")


def test_list_json_speaks_utf8_to_scripts(url: str) -> None:
    """keys list --json prints JSON in UTF-8 whatever the locale."""
    main(["--store", url, "db", "init"])
    main(["--store", url, "org", "add", "org_default", "--tenant", "acme", "--default"])
    main(["--store", url, "member", "add", "alice", "org_default", "--role", "admin"])
    create(url, "déploiement", tenant="acme")
    done = subprocess.run(  # noqa: S603 -- our own interpreter and arguments
        [sys.executable, "-m", "keyturn", "--store", url, "keys", "list", "--as", "alice",
         "--json"],
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONIOENCODING": "latin-1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert b"\\u" not in done.stdout and "déploiement".encode() in done.stdout
    (listed,) = json.loads(done.stdout.decode("utf-8"))
    assert listed["name"] == "déploiement" and listed["status"] == "Active"


def test_a_file_name_as_store_suggests_the_url(
    keyturn: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    """--store keys.db is refused with the sqlite:/// URL it probably means."""
    assert main(["--store", "keys.db", "keys", "list", "--as", "alice"]) == 2
    assert "sqlite:///keys.db" in capsys.readouterr().err


def test_org_list_and_member_list(ready: Run) -> None:
    """org list shows organizations by tenant; member list shows an organization's roles."""
    assert ready("org", "add", "org_globex", "--tenant", "globex", "--default")[0] == 0
    status, out, _ = ready("org", "list")
    assert status == 0
    assert [line.split() for line in out.splitlines()] == [
        ["ORG", "TENANT", "DEFAULT"],
        ["org_default", "acme", "yes"],
        ["org_research", "acme", "-"],
        ["org_globex", "globex", "yes"],
    ]
    assert json.loads(ready("org", "list", "--tenant", "globex", "--json")[1]) == [
        {"id": "org_globex", "tenant_id": "globex", "default": True}
    ]
    assert ready("member", "add", "bob", "org_research", "--role", "viewer")[0] == 0
    status, out, _ = ready("member", "list", "org_research")
    assert [line.split() for line in out.splitlines()] == [
        ["ACCOUNT", "ROLE"],
        ["alice", "member"],
        ["bob", "viewer"],
    ]
    assert json.loads(ready("member", "list", "org_globex", "--json")[1]) == []
    status, _, err = ready("member", "list", "org_nope")
    assert status == 1 and "there is no organization 'org_nope'" in err


def test_removing_a_role_or_an_organization_names_the_keys_made_inactive(
    ready: Run, url: str
) -> None:
    """member remove and org remove list the keys that became Inactive, and only those."""
    research, research_secret = create(url, "research", org="org_research")
    tenant, _ = create(url, "tenant", tenant="acme")
    status, out, _ = ready("member", "remove", "alice", "org_research")
    assert status == 0
    assert "alice no longer has a role in org_research." in out
    assert "now Inactive" in out and tenant not in out
    assert out.splitlines()[-1].split()[:3] == [
        research,
        "rma_\u2026" + research_secret[-4:],
        "Inactive",
    ]
    status, _, err = ready("org", "remove", "org_default")  # the default goes last
    assert status == 1 and "remove those first" in err
    assert ready("org", "remove", "org_research")[0] == 0
    status, out, _ = ready("org", "remove", "org_default")
    assert status == 0 and "with 1 member(s)" in out
    assert tenant in out  # alice reaches no organization of acme any more
    assert json.loads(ready("org", "list", "--json")[1]) == []
    status, _, err = ready("org", "remove", "org_default")
    assert status == 1 and "there is no organization 'org_default'" in err


def test_messages_name_the_account(ready: Run) -> None:
    """Errors speak to an operator about the account, not to 'you'."""
    status, _, err = revoke(ready, "alice", "NoSuchKey123")
    assert (status, err) == (1, "keyturn: error: alice has no key with id 'NoSuchKey123'\n")


def test_a_bug_shows_its_traceback(ready: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception that is not keyturn's own error is not turned into a one-line message."""

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("a bug")

    monkeypatch.setattr("keyturn.manager.KeyManager.list", broken)
    with pytest.raises(ValueError, match="a bug"):
        ready("keys", "list", "--as", "alice")


def test_a_password_in_the_query_is_not_printed_either(capsys: pytest.CaptureFixture[str]) -> None:
    """A connection error hides ?password= as well as user:password@."""
    pytest.importorskip("psycopg")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"postgresql://app@127.0.0.1:{port}/app?password=hunter2"
    assert main(["--store", url, "db", "init"]) == 1
    err = capsys.readouterr().err
    assert "hunter2" not in err and "password=***" in err


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", "-journal"])
def test_sqlite_files_and_their_side_files_are_ignored_by_git(suffix: str) -> None:
    """keyturn.sqlite3 and SQLite's -wal, -shm and -journal files are never committed."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(  # noqa: S603 -- fixed arguments
        ["git", "check-ignore", "--no-index", "-q", f"keyturn-demo.sqlite3{suffix}"],  # noqa: S607
        cwd=root,
        check=False,
    )
    assert done.returncode == 0


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_membership_lists_and_removes_organizations(kind: str, tmp_path: Path) -> None:
    """organizations(), members_of() and remove_organization() agree in memory and in SQL."""
    db = SQLiteDatabase(tmp_path / "k.sqlite3") if kind == "sqlite" else None
    membership = db.membership if db is not None else MemoryMembership()
    membership.add_organization("org_b", tenant_id="acme", default=True)
    membership.add_organization("org_a", tenant_id="acme")
    membership.add_organization("org_c", tenant_id="globex", default=True)
    membership.add_member("bob", "org_b", role="viewer")
    membership.add_member("alice", "org_b", role="admin")
    membership.add_member("alice", "org_a", role="admin")
    assert [o.id for o in membership.organizations()] == ["org_a", "org_b", "org_c"]
    assert membership.members_of("org_b") == [("alice", "admin"), ("bob", "viewer")]
    with pytest.raises(OrganizationConflict, match="remove those first"):
        membership.remove_organization("org_b")  # acme's default goes last
    assert membership.get_default_organization("acme").id == "org_b"
    membership.remove_organization("org_a")
    membership.add_member("alice", "org_c", role="admin")
    assert membership.remove_organization("org_b") is True
    assert membership.remove_organization("org_b") is False
    assert membership.get_default_organization("acme") is None
    assert membership.members_of("org_b") == []
    assert membership.get_role("bob", "org_b") is None
    assert not membership.reaches_tenant("bob", "acme")
    assert membership.reaches_tenant("alice", "globex")  # through org_c
    membership.add_organization("org_b", tenant_id="globex")  # the id is free again
    assert membership.members_of("org_b") == []
    if db is not None:
        db.close()


def test_keys_expiring_lists_the_working_keys_that_expire_soon(ready: Run, url: str) -> None:
    """`keys expiring` lists Active keys expiring that soon, soonest first, as text or JSON."""
    day, _ = create(url, "day", tenant="acme", lifetime="1d")
    week, _ = create(url, "week", tenant="acme", lifetime="7d")
    create(url, "month", tenant="acme", lifetime="30d")
    gone, _ = create(url, "gone", tenant="acme", lifetime="1d")
    assert revoke(ready, "alice", gone)[0] == 0
    status, out, err = ready("keys", "expiring", "--as", "alice")
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == "Expiring within 14d, soonest first:"
    assert [line.split()[0] for line in lines[2:]] == [day, week]
    status, out, _ = ready("keys", "expiring", "--as", "alice", "--within", "48h", "--json")
    assert status == 0
    assert [(key["key_id"], key["status"]) for key in json.loads(out)] == [(day, "Active")]
    status, out, _ = ready("keys", "expiring", "--as", "alice", "--within", "0d")
    assert (status, out) == (0, "alice has no key expiring within 0d.\n")
    assert json.loads(ready("keys", "expiring", "--as", "bob", "--json")[1]) == []


@pytest.mark.parametrize("span", ["2w", "-1d", "d", "14", "99999d"])
def test_keys_expiring_refuses_a_span_it_cannot_read(ready: Run, span: str) -> None:
    """A span other than days or hours (14d, 12h) is a usage error, exit 2, with an example."""
    status, out, err = ready("keys", "expiring", "--as", "alice", f"--within={span}")
    assert status == 2 and out == ""
    assert "like 14d or 12h" in err


def _use(url: str, secret: str, *organization: str) -> None:
    """One accepted request with *secret*; closing the Authenticator writes its use."""
    from keyturn import Authenticator, AuthRequest, Principal

    with SQLiteDatabase(url.removeprefix("sqlite:///")) as db:
        auth = Authenticator(db.keys, db.membership, usage_interval=0)
        try:
            request = AuthRequest(authorization=(f"Bearer {secret}",), organization=organization)
            assert isinstance(auth.authenticate(request), Principal)
        finally:
            auth.close()


def test_list_tracks_a_rotation_made_in_the_console(ready: Run, url: str) -> None:
    """keys list pairs an old key with its replacement and says when the new key was first
    used, until the old key is revoked.
    """
    old_id, _ = create(url, "CI deploys", org="org_research", lifetime="7d")
    new_id, new_secret = rotate(url, old_id)
    listing = ready("keys", "list", "--as", "alice")[1]
    assert f"{old_id} -> {new_id}  new key not used yet: keep {old_id}" in listing
    assert new_secret not in listing

    _use(url, new_secret)
    listing = ready("keys", "list", "--as", "alice")[1]
    items = {
        i["key_id"]: i for i in json.loads(ready("keys", "list", "--as", "alice", "--json")[1])
    }
    old, new = items[old_id], items[new_id]
    assert old["replaced_by"] == new_id and old["status"] == "Active"
    assert old["replacement_first_used_at"] == new["first_used_at"] == new["last_used_at"]
    first = datetime.fromisoformat(new["first_used_at"]).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f"{old_id} -> {new_id}  new key first used at {first}; revoke the old one" in listing
    assert revoke(ready, "alice", old_id)[0] == 0
    assert "Rotations" not in ready("keys", "list", "--as", "alice")[1]  # done


def test_list_tracks_a_revoke_on_first_use(ready: Run, url: str) -> None:
    """A rotation that revokes the old key at the new key's first use says so, then shows
    the old key revoked at that use.
    """
    old_id, _ = create(url, "deploys", tenant="acme")
    new_id, new_secret = rotate(url, old_id, revoke_old_on_first_use=True)
    listing = ready("keys", "list", "--as", "alice")[1]
    assert f"new key not used yet; {old_id} is revoked at its first use" in listing
    _use(url, new_secret, "default")
    listed = json.loads(ready("keys", "list", "--as", "alice", "--json")[1])
    items = {item["key_id"]: item for item in listed}
    assert items[old_id]["status"] == "Revoked"
    # At the instant of that use: the first, written before it was answered (the usage
    # write that follows may move last_used_at on).
    assert items[old_id]["revoked_at"] == items[new_id]["first_used_at"]


def test_revoke_says_what_to_do_and_never_echoes_a_secret(ready: Run, url: str) -> None:
    """Not the id, not the account's: one line, the right exit status, no secret."""
    key_id, secret = create(url, "ci", tenant="acme")
    status, _, err = revoke(ready, "alice", secret)
    assert status == 2 and "KEY_ID is the key's id" in err and secret not in err
    assert ready("member", "add", "bob", "org_default", "--role", "admin")[0] == 0
    status, _, err = revoke(ready, "bob", key_id)
    assert status == 1 and f"bob has no key with id {key_id!r}" in err
    body = secret.removeprefix("rma_")  # not an id, and perhaps part of a secret: not echoed
    status, _, err = revoke(ready, "alice", body)
    assert status == 1 and "alice has no key with that id" in err and body not in err


def test_an_emergency_revoke_logs_who_and_why(
    ready: Run, url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's revoke needs a reason; who ran it and why are logged and printed, with
    control characters escaped.
    """
    key_id, _ = create(url, "ci", tenant="acme")
    monkeypatch.setenv("LOGNAME", "oncall")
    monkeypatch.setenv("USER", "oncall")
    with caplog.at_level(logging.WARNING, logger="keyturn.cli"):
        status, out, _ = ready(
            "keys", "revoke", "--as", "alice", key_id, "--reason", "leaked in\x1b[2J a log"
        )

    assert status == 0
    assert "Revoked by oncall: leaked in\\x1b[2J a log" in out
    (record,) = [r for r in caplog.records if r.name == "keyturn.cli"]
    assert record.getMessage() == (
        f"operator oncall revoked key {key_id} of alice: leaked in\\x1b[2J a log"
    )


@pytest.mark.parametrize(
    "store",
    [
        "host=127.0.0.1 password=hunter2 dbname=app user=app",
        "dbname=app password='hun ter2'",
        "password=hunter2",
    ],
)
def test_a_key_value_connection_string_is_refused_unechoed(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A libpq key=value string is no store URL: refused with the URL form to use, and
    never printed back, since it may hold a password.
    """
    assert main(["--store", store, "org", "list"]) == 2
    err = capsys.readouterr().err
    assert "hun" not in err and "ter2" not in err
    assert "postgresql://USER@HOST:PORT/DBNAME" in err


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:hun%zzter2@127.0.0.1:{port}/app",
        "postgresql://app@127.0.0.1:{port}/app?password=hun%zzter2",
        "postgresql://app@127.0.0.1:{port}/app?sslmode=disable&password=hun%zzter2",
    ],
    ids=["in the user info", "in the query", "in the query, second"],
)
def test_libpq_quoting_a_password_in_its_error_is_not_printed(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """libpq's own error on a bad %-escape quotes the password: the command says what kind
    of error it is, and prints no part of the password.
    """
    pytest.importorskip("psycopg")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["--store", url.format(port=port), "org", "list"]) == 1
    err = capsys.readouterr().err
    assert "zzter" not in err and "hun%" not in err
    assert "invalid percent-encoded token" in err


def test_ids_are_printed_escaped_in_tables(ready: Run) -> None:
    """An organization or account id holding terminal control sequences is shown escaped
    in org list and member list: nothing reaches the operator's terminal raw.
    """
    assert ready("org", "add", "org_\x1b[2J\x1b]0;pwned\x07", "--tenant", "acme")[0] == 0
    assert ready("member", "add", "eve\x1b[31m\u009b1m", "org_default", "--role", "admin")[0] == 0

    orgs = ready("org", "list")[1]
    members = ready("member", "list", "org_default")[1]

    for out in (orgs, members):
        assert "\x1b" not in out and "\x07" not in out and "\u009b" not in out
    assert "org_\\x1b[2J\\x1b]0;pwned\\x07" in orgs
    assert "eve\\x1b[31m\\x9b1m" in members
