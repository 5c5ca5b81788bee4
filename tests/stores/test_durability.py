"""Durability across processes: what one process commits, the next request of another sees."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from keyturn import Authenticator, AuthRequest, KeyManager, Principal, Reason, Refusal, Scope
from keyturn.cli import main
from keyturn.stores import open_database

# Authenticates the secret read from stdin against the store named by argv[1]; prints the
# organization it reached, or the refusal's status and reason.
AUTHENTICATE = """
import sys
from keyturn import Authenticator, AuthRequest, Principal
from keyturn.stores import open_database

db = open_database(sys.argv[1])
auth = Authenticator(db.keys, db.membership)
secret = sys.stdin.readline().strip()
outcome = auth.authenticate(
    AuthRequest(authorization=("Bearer " + secret,), organization=("default",))
)
if isinstance(outcome, Principal):
    print("passed", outcome.organization_id)
else:
    print("refused", outcome.status, outcome.reason.value)
auth.close()
db.close()
"""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL for SQLite (a file in a temporary membership) or PostgreSQL, set up."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/keyturn.sqlite3"
    else:
        url = request.getfixturevalue("postgres_url")
    for command in (
        ["db", "init"],
        ["org", "add", "org_default", "--tenant", "acme", "--default"],
        ["member", "add", "alice", "org_default", "--role", "admin"],
    ):
        assert main(["--store", url, *command]) == 0
    return url


def run(*args: str, stdin: str = "") -> str:
    done = subprocess.run(  # noqa: S603 -- our own interpreter and arguments
        [sys.executable, *args], input=stdin, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def cli(store_url: str, *args: str) -> str:
    """Run the keyturn command in a process of its own."""
    return run("-m", "keyturn.cli", "--store", store_url, *args)


def test_a_key_created_here_authenticates_in_a_fresh_process(store_url: str) -> None:
    """A key created by this process is accepted by a new process reading the same store."""
    db = open_database(store_url)
    try:
        created = KeyManager(db.keys, db.membership).create(
            "alice", name="deploys", scope=Scope.tenant("acme")
        )
    finally:
        db.close()
    output = run("-c", AUTHENTICATE, store_url, stdin=created.secret + "\n")
    assert output.split() == ["passed", "org_default"]


def test_a_revoke_in_another_process_refuses_the_next_request_here(store_url: str) -> None:
    """A key works here; its revoke by the command, in another process, refuses it here at once."""
    with open_database(store_url) as db:
        created = KeyManager(db.keys, db.membership).create(
            "alice", name="ci", scope=Scope.tenant("acme")
        )
    secret, key_id = created.secret, created.info.key_id
    request = AuthRequest(authorization=(f"Bearer {secret}",), organization=("default",))

    db = open_database(store_url)
    auth = Authenticator(db.keys, db.membership)
    try:
        assert isinstance(auth.authenticate(request), Principal)
        assert isinstance(auth.authenticate(request), Principal)  # warm: verified-token cache
        cli(store_url, "keys", "revoke", "--as", "alice", key_id, "--reason", "a drill")
        refused = auth.authenticate(request)
        assert isinstance(refused, Refusal)
        assert (refused.status, refused.reason) == (401, Reason.REVOKED)
    finally:
        auth.close()
        db.close()
    output = run("-c", AUTHENTICATE, store_url, stdin=secret + "\n")
    assert output.split() == ["refused", "401", "revoked"]
