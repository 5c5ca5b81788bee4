"""The memo of the decision (``_run/memo.py``) answers exactly as ``decide()`` alone would.

A state machine drives random histories -- requests with several keys and organization
headers, revocations, rotations and their first use, membership and organization changes,
clock moves past expiry, a policy that changes its mind, writes elsewhere (keys, accounts
and organizations no judged answer read, which the memo keeps its answers through), and on
SQLite plain SQL by another connection (an organization moved to another tenant) --
through an Authenticator (its memo on, both drivers) and through ``decide()`` alone over a
second view of the same data that keeps nothing (the memory objects themselves; SQLite and
PostgreSQL opened again with ``replica=False``). Every answer must be the same principal
or the same refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from keyturn import (
    Authenticator,
    AuthRequest,
    KeyManager,
    KeyturnError,
    Lifetime,
    Principal,
    Refusal,
    Scope,
)
from keyturn._core.decision import Rules, decide
from keyturn._core.model import utc_now
from keyturn._core.steps import STORE
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from keyturn.stores.sqlite import SQLiteDatabase
from tests.world import START, Clock, WorldKeyStore, WorldMembership, mistype, seed

ACCOUNTS = ("alice", "bob")
ROLES = ("admin", "member", "viewer")
TENANTS = ("acme", "globex")
ORGANIZATIONS = ("org_main", "org_research", "org_secret", "org_globex", "org_new")
SCOPES = (
    Scope.tenant("acme"),
    Scope.tenant("globex"),
    Scope.organization("org_main", tenant_id="acme"),
    Scope.organization("org_research", tenant_id="acme"),
    Scope.organization("org_globex", tenant_id="globex"),
    Scope.organization("org_new", tenant_id="acme"),
)
HEADERS = (
    (),
    ("default",),
    *((organization,) for organization in ORGANIZATIONS),
    ("org_unknown",),
    ("not an id!",),
    ("org_main", "org_main"),
    (" org_research\t",),
)
# Most requests name what a key of alice's may reach; the rest, anything.
HEADER = st.one_of(
    st.sampled_from([(), ("default",), ("org_main",), ("org_research",)]), st.sampled_from(HEADERS)
)
SPELLINGS = ("Bearer {}", "bearer  {}")
# Elsewhere: a tenant, its organizations and accounts that no key of alice's or bob's reads.
ELSEWHERE_ACCOUNTS = ("carol", "dave")
ELSEWHERE_ORGANIZATIONS = ("org_i1", "org_i2", "org_i3")
MOVABLE = ("org_research", "org_secret", "org_new", "org_i2", "org_i3")
REPLAYED = 6  # requests replayed after every step
# Bounded: each example is about 30 steps and 200 requests, each decided twice. The
# databases' examples cost round trips (the oracle reads through), so they run fewer.
EXAMPLES = settings(max_examples=200, stateful_step_count=30, deadline=None)
SQLITE_EXAMPLES = settings(EXAMPLES, max_examples=100)
POSTGRES_EXAMPLES = settings(EXAMPLES, max_examples=50)


def _stranger() -> str:
    """A well-formed key with its checksum right, from another store: unknown everywhere."""
    membership = MemoryMembership()
    membership.add_organization("org_x", tenant_id="x", default=True)
    membership.add_member("eve", "org_x", role="admin")
    manager = KeyManager(MemoryKeyStore(), membership)
    return manager.create("eve", name="x", scope=Scope.tenant("x")).secret


STRANGER = _stranger()


def decide_alone(
    request: AuthRequest,
    now: Any,
    rules: Rules,
    store: Any,
    membership: Any,
) -> Principal | Refusal:
    """The decision, driven step by step over *store* and *membership*: no memo, no replica."""
    flow = decide(request, now, rules)
    answer: Any = None
    for _ in range(100):  # a decision asks a handful of questions
        try:
            step = flow.send(answer)
        except StopIteration as done:
            outcome: Principal | Refusal = done.value
            return outcome
        answer = step.ask(store if step.via == STORE else membership)
    raise AssertionError("the decision asked more than 100 questions")


def same(memo: Principal | Refusal, alone: Principal | Refusal) -> bool:
    if isinstance(memo, Principal) or isinstance(alone, Principal):
        return memo == alone
    return (type(memo), memo.reason, memo.key_id, memo.principal) == (
        type(alone),
        alone.reason,
        alone.key_id,
        alone.principal,
    )


class MemoAgrees(RuleBasedStateMachine):
    """One history on one backend; subclasses say which (``open``)."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock(START)
        self.strict = False  # the policy's mind, changed by a rule
        self.closing: list[Any] = []
        store, membership, self.truth_store, self.truth_membership = self.open()
        self.store, self.membership = store, membership
        seed(membership)
        self.manager = KeyManager(store, membership, clock=self.clock)
        self.auth = Authenticator(
            store, membership, clock=self.clock, policy=self.policy, usage_interval=None
        )
        assert self.auth.memo.enabled
        self.decision_rules = Rules(policy=self.policy)
        self.runner = asyncio.Runner()
        self.tokens: list[tuple[str, str]] = []  # (key id, full key)
        self.elsewhere: list[str] = []  # ids of keys made elsewhere, not yet revoked
        # The last requests sent, replayed after every step: a change is followed at once
        # by the requests whose answers the memo may hold.
        self.sent: dict[AuthRequest, None] = {}
        self.requests = self.principals = 0
        for account, scope in (("alice", SCOPES[2]), ("alice", SCOPES[0]), ("bob", SCOPES[4])):
            self.create(account, scope, Lifetime.DAYS_1)
        membership.add_organization("org_i1", tenant_id="initech", default=True)
        membership.add_member("carol", "org_i1", role="admin")
        self.create("carol", Scope.tenant("initech"), Lifetime.DAYS_1)

    def open(self) -> tuple[Any, Any, Any, Any]:
        raise NotImplementedError

    def teardown(self) -> None:
        self.auth.close()
        self.runner.close()
        for close in reversed(self.closing):
            close()

    def policy(self, principal: Principal, request: AuthRequest) -> bool:
        if request.method == "DELETE" and principal.role != "admin":
            return False
        return not (self.strict and principal.role == "viewer")

    # --- requests ------------------------------------------------------------------------

    @rule(
        pick=st.integers(0, 63),
        kind=st.sampled_from(["key"] * 6 + ["typo", "stranger", "none"]),
        header=HEADER,
        spelling=st.sampled_from(SPELLINGS),
        method=st.sampled_from(["GET", "GET", "DELETE"]),
        in_loop=st.booleans(),
    )
    def request(
        self,
        pick: int,
        kind: str,
        header: tuple[str, ...],
        spelling: str,
        method: str,
        in_loop: bool,
    ) -> None:
        key = self.tokens[pick % len(self.tokens)][1]
        token = {"key": key, "typo": mistype(key), "stranger": STRANGER, "none": ""}[kind]
        lines = (spelling.format(token),) if token else ()
        request = AuthRequest(lines, header, method, "/managed-agents/v1/models")
        self.check(request, in_loop)
        self.sent.pop(request, None)
        self.sent[request] = None
        if len(self.sent) > REPLAYED:
            del self.sent[next(iter(self.sent))]

    @invariant()
    def replay(self) -> None:
        for number, request in enumerate(self.sent):
            self.check(request, in_loop=number % 2 == 1)

    def check(self, request: AuthRequest, in_loop: bool) -> None:
        if in_loop:
            memo = self.runner.run(self.auth.authenticate_async(request))
        else:
            memo = self.auth.authenticate(request)
        now = self.clock()
        alone = decide_alone(
            request, now, self.decision_rules, self.truth_store, self.truth_membership
        )
        assert same(memo, alone), (request, now, memo, alone)
        self.requests += 1
        self.principals += isinstance(alone, Principal)

    # --- keys --------------------------------------------------------------------------------

    @rule(
        account=st.sampled_from(ACCOUNTS),
        scope=st.sampled_from(SCOPES),
        lifetime=st.sampled_from([Lifetime.HOURS_3, Lifetime.DAYS_1, Lifetime.DAYS_7]),
    )
    def create(self, account: str, scope: Scope, lifetime: Lifetime) -> None:
        try:
            created = self.manager.create(account, name="k", scope=scope, expiry=lifetime)
        except KeyturnError:
            return  # the creator does not reach the scope: the console's refusal
        self.tokens.append((created.info.key_id, created.secret))

    @precondition(lambda self: self.tokens)
    @rule(pick=st.integers(0, 63))
    def revoke(self, pick: int) -> None:
        self.store.revoke_key(self.tokens[pick % len(self.tokens)][0], self.clock())

    @precondition(lambda self: self.tokens)
    @rule(pick=st.integers(0, 63), account=st.sampled_from(ACCOUNTS), later=st.booleans())
    def rotate(self, pick: int, account: str, later: bool) -> None:
        key_id = self.tokens[pick % len(self.tokens)][0]
        try:
            created = self.manager.rotate(account, key_id, revoke_old_on_first_use=later)
        except KeyturnError:
            return
        self.tokens.append((created.info.key_id, created.secret))

    @precondition(lambda self: self.tokens)
    @rule(pick=st.integers(0, 63))
    def first_use(self, pick: int) -> None:
        """A use recorded: a rotation's replacement revokes the key it replaces."""
        self.store.mark_used(self.tokens[pick % len(self.tokens)][0], self.clock())

    # --- membership and organizations ------------------------------------------------------

    @rule(
        account=st.sampled_from(ACCOUNTS),
        organization=st.sampled_from(ORGANIZATIONS),
        role=st.sampled_from((None, *ROLES)),
    )
    def membership_changes(self, account: str, organization: str, role: str | None) -> None:
        if role is None:
            self.membership.remove_member(account, organization)
            return
        with contextlib.suppress(KeyturnError):  # no such organization
            self.membership.add_member(account, organization, role=role)

    @rule(organization=st.sampled_from(ORGANIZATIONS))
    def remove_organization(self, organization: str) -> None:
        with contextlib.suppress(KeyturnError):  # a tenant's default goes last
            self.membership.remove_organization(organization)

    @rule(
        organization=st.sampled_from(ORGANIZATIONS),
        tenant=st.sampled_from(TENANTS),
        default=st.booleans(),
    )
    def add_organization(self, organization: str, tenant: str, default: bool) -> None:
        """Back, perhaps in another tenant, perhaps as its tenant's default."""
        # Refused where it exists differently, or the tenant's default is taken.
        with contextlib.suppress(KeyturnError):
            self.membership.add_organization(organization, tenant_id=tenant, default=default)

    # --- time and policy ---------------------------------------------------------------------

    @rule(half_hours=st.one_of(st.integers(-1, 6), st.just(48)))
    def clock_moves(self, half_hours: int) -> None:
        self.clock.advance(timedelta(minutes=30 * half_hours))

    @rule()
    def policy_changes_its_mind(self) -> None:
        self.strict = not self.strict

    # --- writes elsewhere -----------------------------------------------------------------

    @rule(
        what=st.sampled_from(["key", "revoke", "member", "leaves", "organization", "gone"]),
        account=st.sampled_from(ELSEWHERE_ACCOUNTS),
        organization=st.sampled_from(ELSEWHERE_ORGANIZATIONS),
        role=st.sampled_from(ROLES),
    )
    def write_elsewhere(self, what: str, account: str, organization: str, role: str) -> None:
        """A write to a key, an account or an organization of initech's."""
        with contextlib.suppress(KeyturnError):  # refused: not reached, default goes last
            if what == "key":
                created = self.manager.create(account, name="x", scope=Scope.tenant("initech"))
                self.elsewhere.append(created.info.key_id)
            elif what == "revoke" and self.elsewhere:
                self.store.revoke_key(self.elsewhere.pop(), self.clock())
            elif what == "member":
                self.membership.add_member(account, organization, role=role)
            elif what == "leaves":
                self.membership.remove_member(account, organization)
            elif what == "organization":
                self.membership.add_organization(organization, tenant_id="initech")
            elif what == "gone":
                self.membership.remove_organization(organization)

    def plain_sql(self, statement: str, params: tuple[str, ...]) -> None:
        """Run *statement* on a connection of its own, as another process would."""
        raise NotImplementedError

    @precondition(lambda self: self.has_plain_sql)
    @rule(organization=st.sampled_from(MOVABLE), tenant=st.sampled_from((*TENANTS, "initech")))
    def moved_by_plain_sql(self, organization: str, tenant: str) -> None:
        """An organization moved to another tenant, members and all, by plain SQL."""
        self.plain_sql(
            "UPDATE keyturn_organizations SET tenant_id = ? WHERE id = ? AND NOT is_default",
            (tenant, organization),
        )

    has_plain_sql = False

    @invariant()
    def memo_is_bounded(self) -> None:
        assert len(self.auth.memo) <= self.auth.memo.max_size


class OnMemory(MemoAgrees):
    def open(self) -> tuple[Any, Any, Any, Any]:
        store, membership = MemoryKeyStore(), MemoryMembership()
        return store, membership, store, membership


class OnSQLite(MemoAgrees):
    has_plain_sql = True

    def open(self) -> tuple[Any, Any, Any, Any]:
        folder = tempfile.mkdtemp(prefix="keyturn-memo-")
        self.closing.append(lambda: shutil.rmtree(folder, ignore_errors=True))
        path = self.path = Path(folder) / "keys.sqlite3"
        db = SQLiteDatabase(path)
        truth = SQLiteDatabase(path, replica=False)
        self.closing.extend([db.close, truth.close])
        return db.keys, db.membership, truth.keys, truth.membership

    def plain_sql(self, statement: str, params: tuple[str, ...]) -> None:
        connection = sqlite3.connect(self.path, isolation_level=None)
        try:
            connection.execute(statement, params)
        except sqlite3.IntegrityError:  # a tenant left without its default: refused
            pass
        finally:
            connection.close()


class OnPostgres(MemoAgrees):
    """One schema and two databases for every example (a new listener per example is slow)."""

    url: ClassVar[str] = ""
    databases: ClassVar[tuple[Any, Any] | None] = None

    def open(self) -> tuple[Any, Any, Any, Any]:
        import psycopg

        from tests.stores.conftest import TABLES

        assert self.databases is not None
        db, truth = self.databases
        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute(f"TRUNCATE {', '.join(TABLES)}")
        db.replica.reset(current=True)  # TRUNCATE fires no trigger: the listener hears nothing
        return db.keys, db.membership, truth.keys, truth.membership


def test_the_memo_agrees_with_the_decision_on_memory() -> None:
    run_state_machine_as_test(OnMemory, settings=EXAMPLES)


def test_the_memo_agrees_with_the_decision_on_sqlite() -> None:
    run_state_machine_as_test(OnSQLite, settings=SQLITE_EXAMPLES)


@pytest.mark.postgres
def test_the_memo_agrees_with_the_decision_on_postgres(postgres_url: str) -> None:
    from keyturn.stores.postgres import PostgresDatabase

    with (
        PostgresDatabase(postgres_url) as db,
        PostgresDatabase(postgres_url, replica=False) as truth,
    ):
        # The first read through finds which database this is and starts the listener;
        # until the replica is current the memo is not used.
        db.keys.lookup("NoSuchKey000", None)
        deadline = time.monotonic() + 10
        while db.changes() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert db.replica.current, "the change feed's listener did not connect within 10 s"
        OnPostgres.url, OnPostgres.databases = postgres_url, (db, truth)
        try:
            run_state_machine_as_test(OnPostgres, settings=POSTGRES_EXAMPLES)
        finally:
            OnPostgres.databases = None


# --- the memo is used, and only where it may be ----------------------------------------------


def _world_of(store: Any, membership: Any) -> tuple[Authenticator, str, str]:
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    scope = Scope.organization("org_main", tenant_id="acme")
    created = KeyManager(store, membership).create("alice", name="k", scope=scope)
    auth = Authenticator(store, membership, usage_interval=None)
    return auth, created.secret, created.info.key_id


def _warm_hits(auth: Authenticator, key: str, n: int = 5) -> int:
    request = AuthRequest((f"Bearer {key}",))
    before = auth.memo.hits
    for _ in range(n):
        assert isinstance(auth.authenticate(request), Principal)
    return auth.memo.hits - before


def test_warm_requests_are_the_memos_on_memory() -> None:
    auth, key, _ = _world_of(MemoryKeyStore(), MemoryMembership())
    with auth:
        assert _warm_hits(auth, key) == 4  # the first request of all was decided


def test_warm_requests_are_the_memos_on_sqlite(tmp_path: Path) -> None:
    with SQLiteDatabase(tmp_path / "k.sqlite3") as db:
        auth, key, key_id = _world_of(db.keys, db.membership)
        with auth:
            assert _warm_hits(auth, key) == 4  # the first read the file: the replica filled
            db.keys.revoke_key(key_id, START)  # through the store: seen at once
            refused = auth.authenticate(AuthRequest((f"Bearer {key}",)))
            assert isinstance(refused, Refusal) and refused.reason.value == "revoked"


def test_with_the_default_clock_a_remembered_answer_ends_at_expiry() -> None:
    """The memo reads the wall clock, not the decision's: a key about to expire is the
    memo's until then, and its next request after is the decision's 401 ``expired``."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    scope = Scope.organization("org_main", tenant_id="acme")
    probe = KeyManager(store, membership, clock=lambda: START).create(
        "alice", name="p", scope=scope
    )
    lifetime = probe.info.expires_at - START
    expiry = utc_now() + timedelta(seconds=2)
    created = KeyManager(store, membership, clock=lambda: expiry - lifetime).create(
        "alice", name="k", scope=scope
    )
    assert created.info.expires_at == expiry
    with Authenticator(store, membership, usage_interval=None) as auth:  # the default clock
        assert _warm_hits(auth, created.secret, n=3) == 2
        time.sleep(max(0.0, (expiry - utc_now()).total_seconds()) + 0.01)
        hits = auth.memo.hits
        refused = auth.authenticate(AuthRequest((f"Bearer {created.secret}",)))
        assert isinstance(refused, Refusal) and refused.reason.value == "expired"
        assert auth.memo.hits == hits


def test_a_revoke_by_another_connection_is_seen_by_the_next_request(tmp_path: Path) -> None:
    """SQLite: a commit by any connection (another process's, here another database object
    without a replica) moves the change number the memo reads first."""
    path = tmp_path / "k.sqlite3"
    with SQLiteDatabase(path) as db, SQLiteDatabase(path, replica=False) as other:
        auth, key, key_id = _world_of(db.keys, db.membership)
        with auth:
            assert _warm_hits(auth, key) == 4
            other.keys.revoke_key(key_id, START)
            refused = auth.authenticate(AuthRequest((f"Bearer {key}",)))
            assert isinstance(refused, Refusal) and refused.reason.value == "revoked"


def test_a_host_provider_without_a_change_feed_gets_no_memo() -> None:
    """A subclass that answers a read its own way (a custom store, a test double) is asked
    on every request: its answers can change without the counted writes."""
    assert not Authenticator(WorldKeyStore(), MemoryMembership()).memo.enabled
    assert not Authenticator(MemoryKeyStore(), WorldMembership()).memo.enabled
    assert Authenticator(MemoryKeyStore(), MemoryMembership()).memo.enabled


def test_a_policy_runs_on_every_request_the_memo_answers() -> None:
    store, membership = MemoryKeyStore(), MemoryMembership()
    seen: list[str] = []

    def policy(principal: Principal, request: AuthRequest) -> bool:
        seen.append(request.method)
        assert request.authorization == ()  # the policy never sees the key
        return request.method != "DELETE"

    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    scope = Scope.organization("org_main", tenant_id="acme")
    key = KeyManager(store, membership).create("alice", name="k", scope=scope).secret
    with Authenticator(store, membership, policy=policy, usage_interval=None) as auth:
        for method in ("GET", "DELETE", "GET", "DELETE"):
            outcome = auth.authenticate(AuthRequest((f"Bearer {key}",), (), method))
            assert isinstance(outcome, Principal) == (method == "GET")
        assert seen == ["GET", "DELETE", "GET", "DELETE"]
        assert auth.memo.hits == 3


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("in_loop", [False, True], ids=["sync", "async"])
def test_no_frame_holds_the_key_when_the_policy_raises_on_a_remembered_answer(
    in_loop: bool,
) -> None:
    """The memo's answer goes through the policy as the decision's does: a policy that
    raises leaves no keyturn frame of the traceback holding the key."""
    from keyturn._core.token import split
    from tests.web.test_frames import traceback_frames_holding

    broken = False

    def policy(principal: Principal, request: AuthRequest) -> bool:
        if broken:
            raise Boom("a bug in the host's policy")
        return True

    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    scope = Scope.organization("org_main", tenant_id="acme")
    key = KeyManager(store, membership).create("alice", name="k", scope=scope).secret
    request = AuthRequest((f"Bearer {key}",))
    with Authenticator(store, membership, policy=policy, usage_interval=None) as auth:
        assert isinstance(auth.authenticate(request), Principal)  # decided, and kept
        broken = True

        def again() -> object:
            if in_loop:
                return asyncio.run(auth.authenticate_async(request))
            return auth.authenticate(request)

        with pytest.raises(Boom) as raised:
            again()
        assert auth.memo.hits == 1
    assert traceback_frames_holding(raised.value, split(key)[1]) == []
    assert traceback_frames_holding(raised.value, key) == []
