"""Daily request counts per key: added up by every store, kept 90 days, read per account.

Each contract test runs against memory, SQLite, PostgreSQL and async PostgreSQL.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from keyturn import KeyManager, Principal, Reason, Refusal, Scope
from keyturn._core import token as _token
from keyturn.stores import open_database
from keyturn.usage import ACCEPTED, KEPT_DAYS, DailyUsage
from tests.stores.conftest import Backend
from tests.stores.test_contract import RESEARCH, bearer, make_key, world
from tests.world import Clock

DAY = date(2026, 11, 21)
NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]


def close(backend: Backend, auth: object) -> None:
    """Close the authenticator the way its store needs: aclose() on the async store's loop."""
    if backend.runner is not None:
        backend.runner.run(auth.aclose())  # type: ignore[attr-defined]
    else:
        auth.close()  # type: ignore[attr-defined]


def test_counts_add_up_and_are_read_per_account(backend: Backend) -> None:
    """Two writes for the same key, day and outcome add up; each account reads only the
    counts of its own keys, from the day asked on, ordered by key, day and outcome."""
    mine, other, theirs = make_key("k1"), make_key("k2"), make_key("k3", account_id="bob")
    for key in (mine, other, theirs):
        backend.keys.add_key(key)
    backend.keys.count_usage(DAY, {("k1", ACCEPTED): 3, ("k1", "revoked"): 1, ("k3", ACCEPTED): 9})
    backend.keys.count_usage(DAY, {("k1", ACCEPTED): 4, ("k2", ACCEPTED): 0})
    backend.keys.count_usage(DAY - timedelta(days=1), {("k2", ACCEPTED): 5})

    assert backend.keys.usage_of("alice", DAY - timedelta(days=1)) == [
        DailyUsage(key_id="k1", day=DAY, outcome=ACCEPTED, requests=7),
        DailyUsage(key_id="k1", day=DAY, outcome="revoked", requests=1),
        DailyUsage(key_id="k2", day=DAY - timedelta(days=1), outcome=ACCEPTED, requests=5),
    ]
    assert [row.key_id for row in backend.keys.usage_of("alice", DAY)] == ["k1", "k1"]
    assert backend.keys.usage_of("bob", DAY) == [
        DailyUsage(key_id="k3", day=DAY, outcome=ACCEPTED, requests=9)
    ]
    assert backend.keys.usage_of("carol", DAY - timedelta(days=400)) == []


def test_counts_are_kept_ninety_days(backend: Backend) -> None:
    """A write forgets the days more than 89 days before its own; the 90th stays."""
    backend.keys.add_key(make_key("k1"))
    first_kept = DAY - timedelta(days=KEPT_DAYS - 1)
    for day in (first_kept - timedelta(days=1), first_kept, DAY - timedelta(days=1)):
        backend.keys.count_usage(day, {("k1", ACCEPTED): 1})
    backend.keys.count_usage(DAY, {("k1", ACCEPTED): 1})

    days = [row.day for row in backend.keys.usage_of("alice", DAY - timedelta(days=400))]
    assert days == [first_kept, DAY - timedelta(days=1), DAY]


def test_the_authenticator_counts_accepted_and_refused_requests(backend: Backend) -> None:
    """Requests through the Authenticator land as counts at close: accepted ones, and
    refusals of a key the store holds by reason; a made-up key id is counted nowhere."""
    world(backend)
    clock = Clock(NOW)
    manager = KeyManager(backend.keys, backend.membership, clock=clock)
    good = manager.create("alice", name="research", scope=RESEARCH)
    tenant = manager.create("alice", name="tenant", scope=Scope.tenant("acme"))
    gone = manager.create("alice", name="gone", scope=RESEARCH)
    manager.revoke("alice", gone.info.key_id)
    unknown = _token.generate().token  # a well-formed key the store does not hold
    auth = backend.authenticator(clock=clock, usage_interval=3600)
    outcomes = []
    try:
        for _ in range(5):
            outcomes.append(backend.decide(auth, bearer(good.secret)))
        for _ in range(2):
            outcomes.append(backend.decide(auth, bearer(tenant.secret)))  # no organization
        outcomes.append(backend.decide(auth, bearer(gone.secret)))
        outcomes.append(backend.decide(auth, bearer(unknown)))
    finally:
        close(backend, auth)
    assert [isinstance(o, Principal) for o in outcomes] == [True] * 5 + [False] * 4
    assert [o.reason for o in outcomes if isinstance(o, Refusal)] == [
        Reason.ORG_HEADER_MISSING,
        Reason.ORG_HEADER_MISSING,
        Reason.REVOKED,
        Reason.UNKNOWN_KEY,
    ]

    counted = {
        (row.key_id, row.day, row.outcome): row.requests
        for row in backend.keys.usage_of("alice", DAY - timedelta(days=1))
    }
    assert counted == {
        (good.info.key_id, DAY, ACCEPTED): 5,
        (tenant.info.key_id, DAY, "org_header_missing"): 2,
        (gone.info.key_id, DAY, "revoked"): 1,
    }


# --- several processes, one store -------------------------------------------------------------

WRITER = """
import sys
from keyturn import Authenticator, AuthRequest, Principal
from keyturn.stores import open_database

url, secret, requests, interval = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
db = open_database(url)
with db, Authenticator(db.keys, db.membership, usage_interval=interval) as auth:
    for number in range(requests):
        organization = ("default",) if number % 5 else ()  # every fifth: a 400, counted too
        outcome = auth.authenticate(AuthRequest((f"Bearer {secret}",), organization))
        assert isinstance(outcome, Principal) == bool(number % 5), outcome
"""


def run_writers(url: str, secret: str, processes: int, requests: int) -> None:
    """*processes* real processes authenticating *requests* times each with one key, half
    of them writing on every request (interval 0), half once a minute and at close."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = [
        subprocess.Popen(  # noqa: S603 -- our own interpreter and script
            [sys.executable, "-c", WRITER, url, secret, str(requests), str(number % 2 * 60)],
            env=env,
            stderr=subprocess.PIPE,
        )
        for number in range(processes)
    ]
    failures = []
    for process in started:
        try:
            _, err = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, 9)
            process.communicate()
            failures.append(f"{process.pid} hung")
            continue
        if process.returncode:
            failures.append(err.decode(errors="replace")[-2000:])
    assert not failures, failures


def counts_of(url: str, key_id: str) -> dict[str, int]:
    with open_database(url) as db:
        rows = db.keys.usage_of("alice", date.today() - timedelta(days=2))
    totals: dict[str, int] = {}
    for row in rows:
        if row.key_id == key_id:
            totals[row.outcome] = totals.get(row.outcome, 0) + row.requests
    return totals


def seeded(url: str) -> tuple[str, str]:
    """Tenant acme with alice, and her tenant key: its id and secret."""
    with open_database(url) as db:
        db.create_schema()
        db.membership.add_organization("org_main", tenant_id="acme", default=True)
        db.membership.add_member("alice", "org_main", role="admin")
        created = KeyManager(db.keys, db.membership).create(
            "alice", name="shared", scope=Scope.tenant("acme")
        )
    return created.info.key_id, created.secret


PROCESSES, REQUESTS = 4, 50


def test_processes_sharing_a_sqlite_file_lose_no_count(tmp_path: Path) -> None:
    """Four processes counting the same key into one SQLite file: the counts add up exactly."""
    url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    key_id, secret = seeded(url)
    run_writers(url, secret, PROCESSES, REQUESTS)
    refused = PROCESSES * REQUESTS // 5
    assert counts_of(url, key_id) == {
        ACCEPTED: PROCESSES * REQUESTS - refused,
        "org_header_missing": refused,
    }


@pytest.mark.postgres
def test_processes_sharing_a_postgresql_database_lose_no_count(
    make_postgres_schema: Callable[[], str],
) -> None:
    """Four processes counting the same key into one PostgreSQL database add up exactly."""
    url = make_postgres_schema()
    key_id, secret = seeded(url)
    run_writers(url, secret, PROCESSES, REQUESTS)
    refused = PROCESSES * REQUESTS // 5
    assert counts_of(url, key_id) == {
        ACCEPTED: PROCESSES * REQUESTS - refused,
        "org_header_missing": refused,
    }
