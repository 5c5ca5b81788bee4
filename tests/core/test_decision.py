"""The authentication decision (D3-D10, D14, D15), through the sync and the async driver."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs
import pytest

from keyturn import (
    AuditEvent,
    Authenticator,
    AuthRequest,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    Principal,
    Reason,
    Refusal,
    ServiceUnavailable,
    Unauthorized,
)
from keyturn._core import token as _token
from keyturn._core.hashing import hash_secret
from tests.core.conftest import Decide
from tests.legacy import legacy_hash, legacy_runs
from tests.world import MAIN_SCOPE, RESEARCH_SCOPE, TENANT_SCOPE, World, bearer

MakeDecide = Callable[..., Decide]


def passes(outcome: Principal | Refusal) -> Principal:
    assert isinstance(outcome, Principal), outcome
    return outcome


def refused(outcome: Principal | Refusal, kind: type[Refusal], reason: Reason) -> Refusal:
    assert isinstance(outcome, kind), outcome
    assert outcome.reason is reason, outcome
    return outcome


def forge(key_id: str, secret: str) -> str:
    """A well-formed key string (valid checksum) for any id and secret."""
    body = _token.PREFIX + key_id + secret
    return body + _token._checksum(body)


# --- what passes --------------------------------------------------------------------------


def test_organization_key_without_header_runs_in_its_organization(
    world: World, decide: Decide
) -> None:
    """An organization-scoped key needs no header and yields the caller, org, tenant and role."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    principal = passes(decide(bearer(created.secret)))
    assert principal == Principal(
        account_id="alice",
        key_id=created.info.key_id,
        key_name="bot",
        scope=RESEARCH_SCOPE,
        organization_id="org_research",
        tenant_id="acme",
        role="member",
        expires_at=created.info.expires_at,  # when the key stops working
    )


def test_organization_key_accepts_its_own_organization_id(world: World, decide: Decide) -> None:
    """If sent, x-organization-id may name the key's own organization."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    assert passes(decide(bearer(created.secret, "org_research"))).organization_id == "org_research"


def test_organization_key_of_the_default_org_accepts_default(world: World, decide: Decide) -> None:
    """D9: `default` names an org-scoped key's organization when that is the default one."""
    created = world.manager.create("alice", name="bot", scope=MAIN_SCOPE)
    assert passes(decide(bearer(created.secret, "default"))).organization_id == "org_main"


@pytest.mark.parametrize(
    ("header", "organization", "role"),
    [
        ("org_research", "org_research", "member"),
        ("default", "org_main", "admin"),
        ("org_main", "org_main", "admin"),
        ("  default\t", "org_main", "admin"),  # D8: trimmed of spaces and tabs
    ],
)
def test_tenant_key_runs_in_the_named_organization(
    world: World, decide: Decide, header: str, organization: str, role: str
) -> None:
    """A tenant-scoped key works in any organization of its tenant its creator reaches."""
    created = world.manager.create("alice", name="ci", scope=TENANT_SCOPE)
    principal = passes(decide(bearer(created.secret, header)))
    assert (principal.organization_id, principal.tenant_id, principal.role) == (
        organization,
        "acme",
        role,
    )


# --- 401: the credential ------------------------------------------------------------------


def test_two_authorization_headers_are_refused(world: World, decide: Decide) -> None:
    """D5: two Authorization headers are refused even when both carry the valid key."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    value = f"Bearer {created.secret}"
    refused(
        decide(AuthRequest(authorization=(value, value))),
        Unauthorized,
        Reason.AUTHORIZATION_REPEATED,
    )


def test_extra_parts_after_the_token_are_refused(world: World, decide: Decide) -> None:
    """A token followed by anything else is malformed."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    refused(
        decide(AuthRequest(authorization=(f"Bearer {created.secret} extra",))),
        Unauthorized,
        Reason.MALFORMED,
    )
    merged = f"Bearer {created.secret}, Bearer {created.secret}"
    refused(decide(AuthRequest(authorization=(merged,))), Unauthorized, Reason.MALFORMED)


def test_mistyped_key_is_refused_without_a_store_lookup(
    world: World, make_decide: MakeDecide
) -> None:
    """A checksum failure never reaches the key store."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    store = CountingStore(world.store)
    decide = make_decide(world, store=store)
    typo = created.secret[:10] + ("b" if created.secret[10] == "a" else "a") + created.secret[11:]
    refused(decide(bearer(typo)), Unauthorized, Reason.BAD_CHECKSUM)
    assert store.calls == 0


def test_unknown_key_id_is_401(decide: Decide) -> None:
    """A well-formed key whose id is not in the store is 401."""
    refused(decide(bearer(forge("Z" * 12, "z" * 28))), Unauthorized, Reason.UNKNOWN_KEY)


def test_id_of_one_key_with_secret_of_another_is_401(world: World, decide: Decide) -> None:
    """Key A's id with key B's secret (checksum recomputed) fails the secret check."""
    a = world.manager.create("alice", name="a", scope=RESEARCH_SCOPE)
    b = world.manager.create("alice", name="b", scope=RESEARCH_SCOPE)
    spliced = forge(a.info.key_id, _token.parse(b.secret).secret)  # type: ignore[union-attr]
    refused(decide(bearer(spliced)), Unauthorized, Reason.WRONG_SECRET)


def test_expired_key_is_401_from_the_instant_of_expiry(world: World, decide: Decide) -> None:
    """D12: valid while now < expires_at; at expires_at the key stops working."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    world.clock.now = created.info.expires_at - timedelta(microseconds=1)
    passes(decide(bearer(created.secret)))
    world.clock.now = created.info.expires_at
    refused(decide(bearer(created.secret)), Unauthorized, Reason.EXPIRED)


def test_revoked_key_is_401_on_the_very_next_request(world: World, decide: Decide) -> None:
    """A revoke acts on the next request although the key sits in the verified cache."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    passes(decide(bearer(created.secret)))
    world.manager.revoke("alice", created.info.key_id)
    refused(decide(bearer(created.secret)), Unauthorized, Reason.REVOKED)


def test_lost_membership_makes_an_organization_key_inactive(world: World, decide: Decide) -> None:
    """D11: without a role in its organization an org-scoped key is inactive (401) ..."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    world.membership.remove_member("alice", "org_research")
    refused(decide(bearer(created.secret)), Unauthorized, Reason.INACTIVE)
    world.membership.add_member("alice", "org_research", role="member")
    passes(decide(bearer(created.secret)))  # ... and active again when access returns


def test_tenant_key_is_inactive_only_when_no_organization_is_reached(
    world: World, decide: Decide
) -> None:
    """A tenant key whose creator left every organization of the tenant is 401, any header."""
    created = world.manager.create("alice", name="ci", scope=TENANT_SCOPE)
    world.membership.remove_member("alice", "org_research")
    passes(decide(bearer(created.secret, "default")))  # still reaches org_main
    world.membership.remove_member("alice", "org_main")
    for header in (None, "default", "org_research", "bad header!"):
        refused(decide(bearer(created.secret, header)), Unauthorized, Reason.INACTIVE)


def test_invalid_key_with_malformed_organization_header_is_401(decide: Decide) -> None:
    """D4: authentication comes first; a bad key with a bad org header is 401, not 400."""
    refused(decide(bearer("rma_nope", "bad header!")), Unauthorized, Reason.MALFORMED)


def test_challenge_carries_invalid_token_only_when_a_key_was_sent(decide: Decide) -> None:
    """D6: WWW-Authenticate names the realm, and invalid_token only if a credential came."""
    missing = decide(AuthRequest())
    assert isinstance(missing, Refusal)
    assert missing.headers() == [("www-authenticate", 'Bearer realm="agents-api"')]
    wrong = decide(bearer("rma_nope"))
    assert isinstance(wrong, Refusal)
    assert wrong.headers(realm="x") == [
        ("www-authenticate", 'Bearer realm="x", error="invalid_token"')
    ]


def test_every_401_looks_the_same_to_the_client(world: World, decide: Decide) -> None:
    """Missing, mistyped, unknown, expired, revoked, inactive: one status, code and body."""
    revoked = world.manager.create("alice", name="r", scope=RESEARCH_SCOPE)
    world.manager.revoke("alice", revoked.info.key_id)
    requests = [
        AuthRequest(),
        bearer("rma_x"),
        bearer(forge("Q" * 12, "q" * 28)),
        bearer(revoked.secret),
    ]
    bodies = set()
    for request in requests:
        outcome = decide(request)
        assert isinstance(outcome, Unauthorized)
        bodies.add((outcome.status, str(outcome.body())))
    assert len(bodies) == 1


# --- 400: x-organization-id ---------------------------------------------------------------


def test_tenant_key_without_organization_header_is_400(world: World, decide: Decide) -> None:
    """The spec: a tenant-scoped key that sent no x-organization-id gets 400 invalid_request."""
    created = world.manager.create("alice", name="ci", scope=TENANT_SCOPE)
    error = refused(decide(bearer(created.secret)), InvalidRequest, Reason.ORG_HEADER_MISSING)
    assert error.body() == {"error": {"code": "invalid_request", "message": error.message}}
    assert "x-organization-id" in error.message


def test_two_organization_headers_are_400(world: World, decide: Decide) -> None:
    """Two x-organization-id headers are refused, even if both name the same organization."""
    created = world.manager.create("alice", name="ci", scope=TENANT_SCOPE)
    request = AuthRequest(
        authorization=(f"Bearer {created.secret}",), organization=("default", "default")
    )
    refused(decide(request), InvalidRequest, Reason.ORG_HEADER_REPEATED)


def test_organization_key_with_a_malformed_header_is_400(world: World, decide: Decide) -> None:
    """A value that cannot be an organization id is 400 for org-scoped keys as well."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    refused(decide(bearer(created.secret, "a,b")), InvalidRequest, Reason.ORG_HEADER_INVALID)


def test_custom_organization_pattern(world: World, make_decide: MakeDecide) -> None:
    """The pattern of a valid organization id is configurable."""
    decide = make_decide(world, organization_pattern=r"org_[a-z]+")
    created = world.manager.create("alice", name="ci", scope=TENANT_SCOPE)
    passes(decide(bearer(created.secret, "org_research")))
    refused(decide(bearer(created.secret, "ORG1")), InvalidRequest, Reason.ORG_HEADER_INVALID)


# --- 404: organizations -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ("org_unknown", Reason.ORG_NOT_FOUND),
        ("DEFAULT", Reason.ORG_NOT_FOUND),  # D8: the literal is exact and lower-case
        ("0012", Reason.ORG_NOT_FOUND),
        ("org_globex", Reason.ORG_NOT_FOUND),  # another tenant's organization
        ("org_secret", Reason.ORG_NOT_REACHABLE),  # alice has no role there
    ],
)
def test_tenant_key_aimed_at_an_unreachable_organization_is_404(
    world: World, decide: Decide, header: str, reason: Reason
) -> None:
    """D10: unknown, another tenant's or unreached: one identical 404 not_found."""
    created = world.manager.create("alice", name="ci", scope=TENANT_SCOPE)
    error = refused(decide(bearer(created.secret, header)), NotFound, reason)
    assert error.body() == NotFound(Reason.ORG_NOT_FOUND).body()
    assert error.headers() == []


@pytest.mark.parametrize("header", ["org_main", "org_secret", "org_unknown", "default"])
def test_organization_key_aimed_elsewhere_is_404(world: World, decide: Decide, header: str) -> None:
    """An org-scoped key naming another organization (or `default`, not its own) is 404."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    refused(decide(bearer(created.secret, header)), NotFound, Reason.ORG_NOT_KEYS_OWN)


# --- 403: the application's policy --------------------------------------------------------


def test_policy_refusal_is_403_and_sees_the_principal_and_route(
    world: World, make_decide: MakeDecide
) -> None:
    """D14: a policy returning False refuses with 403 permission_denied."""
    seen: list[tuple[str, str]] = []

    def admins_may_delete(principal: Principal, request: AuthRequest) -> bool:
        seen.append((principal.role, request.method))
        return request.method != "DELETE" or principal.role == "admin"

    decide = make_decide(world, policy=admins_may_delete)
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    delete = AuthRequest(authorization=(f"Bearer {created.secret}",), method="DELETE", path="/x")
    error = refused(decide(delete), PermissionDenied, Reason.POLICY)
    assert (error.status, error.code) == (403, "permission_denied")
    passes(decide(bearer(created.secret)))
    assert seen == [("member", "DELETE"), ("member", "GET")]


# --- the hash at rest: SHA-256, and legacy argon2id hashes upgraded -------------------------


def test_a_new_key_is_stored_as_its_sha256_and_verified_without_argon2(world: World) -> None:
    """D2: a key made now holds ``sha256$<hex>`` of its secret; its requests run no argon2."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    stored = world.store.get_key(created.info.key_id)
    assert stored is not None
    secret = _token.split(created.secret)[1]
    assert stored.secret_hash == "sha256$" + hashlib.sha256(secret.encode()).hexdigest()
    runs = legacy_runs()
    auth = Authenticator(world.store, world.membership, clock=world.clock)
    for _ in range(3):
        passes(auth.authenticate(bearer(created.secret)))
    passes(asyncio.run(auth.authenticate_async(bearer(created.secret))))
    assert legacy_runs() == runs
    auth.close()


def test_a_wrong_secret_is_refused_with_one_hash(world: World, decide: Decide) -> None:
    """A forged secret for a real id is refused (wrong_secret), and runs no argon2."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    runs = legacy_runs()
    for _ in range(3):
        guess = forge(created.info.key_id, "g" * 28)
        refused(decide(bearer(guess)), Unauthorized, Reason.WRONG_SECRET)
    assert legacy_runs() == runs


def test_a_replaced_hash_refuses_the_old_secret(world: World, decide: Decide) -> None:
    """If the stored hash changes under the same id, the old secret no longer passes."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    passes(decide(bearer(created.secret)))
    old = world.store.get_key(created.info.key_id)
    assert old is not None
    world.store.edit(attrs.evolve(old, secret_hash=hash_secret("x" * 28)))
    refused(decide(bearer(created.secret)), Unauthorized, Reason.WRONG_SECRET)


def test_revoked_stays_revoked_for_a_new_authenticator(world: World) -> None:
    """A new process refuses a key revoked earlier."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    world.manager.revoke("alice", created.info.key_id)
    auth = Authenticator(world.store, world.membership, clock=world.clock)
    refused(auth.authenticate(bearer(created.secret)), Unauthorized, Reason.REVOKED)
    auth.close()


def make_legacy(world: World, scope: Any = RESEARCH_SCOPE) -> tuple[str, str]:
    """A key as an old version made it (an argon2id hash stored): its string and id."""
    created = world.manager.create("alice", name="old", scope=scope)
    key_id, secret = _token.split(created.secret)
    stored = world.store.get_key(key_id)
    assert stored is not None
    # The store's own conditional write puts the old hash in place of the new one.
    assert world.store.upgrade_hash(key_id, stored.secret_hash, legacy_hash(secret))
    return created.secret, key_id


def test_a_legacy_hash_is_verified_once_and_replaced_at_first_use(
    world: World, decide: Decide
) -> None:
    """D2: a key holding an argon2id hash passes, runs argon2 once, and holds the SHA-256
    hash of its secret from its first use on; later requests run no argon2."""
    token, key_id = make_legacy(world)
    runs = legacy_runs()
    passes(decide(bearer(token)))
    stored = world.store.get_key(key_id)
    assert stored is not None
    assert stored.secret_hash == hash_secret(_token.split(token)[1])
    for _ in range(3):
        passes(decide(bearer(token)))
    assert legacy_runs() == runs + 1


def test_a_wrong_secret_for_a_legacy_key_upgrades_nothing(world: World, decide: Decide) -> None:
    """A forged secret against a legacy hash is refused after its argon2 run, and the key
    keeps its old hash: only the right secret replaces it."""
    token, key_id = make_legacy(world)
    before = world.store.get_key(key_id)
    runs = legacy_runs()
    refused(decide(bearer(forge(key_id, "g" * 28))), Unauthorized, Reason.WRONG_SECRET)
    assert world.store.get_key(key_id) == before
    assert legacy_runs() == runs + 1
    passes(decide(bearer(token)))


def test_a_legacy_key_of_a_store_without_upgrades_runs_argon2_once_per_process(
    world: World, make_decide: MakeDecide
) -> None:
    """A host store without ``upgrade_hash`` keeps its argon2id hash, and its key works:
    argon2 verified it once, and the process compares the secret's SHA-256 from then on."""
    token, key_id = make_legacy(world)
    legacy = world.store.get_key(key_id)

    class HostStore:  # a host's store: reads only
        def get_key(self, wanted: str) -> Any:
            return legacy if wanted == key_id else None

    decide = make_decide(world, store=HostStore())
    runs = legacy_runs()
    for _ in range(3):
        passes(decide(bearer(token)))
    refused(decide(bearer(forge(key_id, "g" * 28))), Unauthorized, Reason.WRONG_SECRET)
    assert legacy_runs() == runs + 1


def test_concurrent_first_uses_of_a_legacy_key_run_argon2_once(world: World) -> None:
    """16 threads presenting one legacy key at once: one argon2 run, every request passes."""
    token, key_id = make_legacy(world)
    auth = Authenticator(world.store, world.membership, clock=world.clock)
    barrier = threading.Barrier(16)
    outcomes: list[object] = []
    runs = legacy_runs()

    def call() -> None:
        barrier.wait()
        outcomes.append(auth.authenticate(bearer(token)))

    threads = [threading.Thread(target=call) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(outcomes) == 16 and all(isinstance(o, Principal) for o in outcomes)
    assert legacy_runs() == runs + 1
    stored = world.store.get_key(key_id)
    assert stored is not None and stored.secret_hash.startswith("sha256$")
    auth.close()


def test_absurd_hash_parameters_are_refused_before_running_argon2(
    world: World, decide: Decide
) -> None:
    """A stored hash asking for 4 TiB of memory is refused at once, as unverifiable, and
    counts no argon2 run."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    old = world.store.get_key(created.info.key_id)
    assert old is not None
    runs = legacy_runs()
    absurd = (
        "$argon2id$v=19$m=4294967295,t=4294967295,p=255$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaA"
    )
    world.store.edit(attrs.evolve(old, secret_hash=absurd))
    # Run, argon2 with those parameters would not end (or fail to allocate): an answer at all
    # is the proof.
    refused(decide(bearer(created.secret)), Unauthorized, Reason.UNVERIFIABLE)
    assert legacy_runs() == runs


# --- faults: 503, never 401 (D15) ---------------------------------------------------------


class CountingStore:
    """Passes calls through to a real store and counts them."""

    nonblocking = True

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        def counted(*args: object) -> Any:
            self.calls += 1
            return method(*args)

        return counted


class BrokenMembership:
    nonblocking = True

    def __getattr__(self, name: str) -> Any:
        def fail(*args: object) -> None:
            raise ConnectionError("database is down")

        return fail


class SlowStore:
    """A sync store whose reads hang for a while (it may block: no `nonblocking`)."""

    def __init__(self, inner: Any, delay: float) -> None:
        self.inner, self.delay = inner, delay

    def get_key(self, key_id: str) -> Any:
        time.sleep(self.delay)
        return self.inner.get_key(key_id)


class AsyncStore:
    """The async twin of the memory store."""

    def __init__(self, inner: Any, delay: float = 0) -> None:
        self.inner, self.delay = inner, delay

    async def get_key(self, key_id: str) -> Any:
        await asyncio.sleep(self.delay)
        return self.inner.get_key(key_id)


def test_failing_store_is_503_never_401(world: World, make_decide: MakeDecide) -> None:
    """A raising store gives 503 service_unavailable with Retry-After, not a challenge."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    decide = make_decide(world, store=BrokenMembership(), retry_after=7)
    error = refused(decide(bearer(created.secret)), ServiceUnavailable, Reason.BACKEND_ERROR)
    assert (error.status, error.code) == (503, "service_unavailable")
    assert error.headers() == [("retry-after", "7")]


def test_failing_directory_is_503(world: World, make_decide: MakeDecide) -> None:
    """A raising membership provider gives 503 as well."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    decide = make_decide(world, membership=BrokenMembership())
    refused(decide(bearer(created.secret)), ServiceUnavailable, Reason.BACKEND_ERROR)


def test_hanging_store_times_out_with_503(world: World, make_decide: MakeDecide) -> None:
    """A store slower than the timeout gives 503 (it would answer, after the timeout)."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    decide = make_decide(world, store=SlowStore(world.store, delay=2), timeout=0.2)
    refused(decide(bearer(created.secret)), ServiceUnavailable, Reason.BACKEND_TIMEOUT)


class GatedStore:
    """A sync store whose reads wait for a gate, and that notes the uses it is told of."""

    def __init__(self, inner: Any, gate: threading.Event) -> None:
        self.inner, self.gate = inner, gate
        self.used: list[str] = []
        self.answered = threading.Event()

    def get_key(self, key_id: str) -> Any:
        self.gate.wait(10)
        try:
            return self.inner.get_key(key_id)
        finally:
            self.answered.set()

    def mark_used(self, key_id: str, at: Any) -> None:
        self.used.append(key_id)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_decision_cut_by_the_timeout_is_audited_once(world: World, asynchronous: bool) -> None:
    """A decision ending after its request got 503 is neither audited again nor counted a use."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    gate = threading.Event()
    store = GatedStore(world.store, gate)
    events: list[AuditEvent] = []
    auth = Authenticator(
        store,
        world.membership,
        clock=world.clock,
        timeout=0.2,
        audit=events.append,
        usage_interval=0,
    )
    request = bearer(created.secret)
    outcome = (
        asyncio.run(auth.authenticate_async(request))
        if asynchronous
        else auth.authenticate(request)
    )
    refused(outcome, ServiceUnavailable, Reason.BACKEND_TIMEOUT)
    gate.set()
    assert store.answered.wait(10)  # the abandoned call runs to its end
    auth.close()  # and any last_used_at write it queued is made
    assert [event.allowed for event in events] == [False]
    assert store.used == []


def test_async_store_is_awaited_and_timed_out(world: World) -> None:
    """An async store works with the async driver and is bounded by the timeout."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    auth = Authenticator(AsyncStore(world.store), world.membership, clock=world.clock)
    passes(asyncio.run(auth.authenticate_async(bearer(created.secret))))
    with pytest.raises(TypeError, match="authenticate_async"):
        auth.authenticate(bearer(created.secret))
    slow = Authenticator(
        AsyncStore(world.store, delay=2), world.membership, clock=world.clock, timeout=0.1
    )
    refused(
        asyncio.run(slow.authenticate_async(bearer(created.secret))),
        ServiceUnavailable,
        Reason.BACKEND_TIMEOUT,
    )
    auth.close()
    slow.close()


def test_constructor_refuses_what_is_not_a_store_or_provider(world: World) -> None:
    """Passing something that is not a store or provider fails at once, naming what lacks."""
    with pytest.raises(TypeError, match=r"store must be a KeyStore.*NoneType lacks get_key"):
        Authenticator(None, world.membership)
    with pytest.raises(TypeError, match=r"membership must be a MembershipProvider.*reaches_tenant"):
        Authenticator(world.store, world.store)


def test_constructor_refuses_a_non_positive_timeout(world: World) -> None:
    """A zero or negative timeout is a configuration error, said at construction."""
    with pytest.raises(ValueError, match="timeout must be positive"):
        Authenticator(world.store, world.membership, timeout=0)


# --- audit and logs -----------------------------------------------------------------------


def test_audit_hook_gets_every_decision_with_the_precise_reason(
    world: World, make_decide: MakeDecide
) -> None:
    """The audit hook sees successes and refusals, with the refusal's exact reason."""
    events: list[AuditEvent] = []
    decide = make_decide(world, audit=events.append)
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    passes(decide(bearer(created.secret)))
    world.manager.revoke("alice", created.info.key_id)
    decide(bearer(created.secret))
    assert [e.allowed for e in events] == [True, False]
    assert events[0].principal is not None and events[0].principal.key_id == created.info.key_id
    assert events[1].error is not None and events[1].error.reason is Reason.REVOKED


def test_failing_audit_hook_does_not_change_the_outcome(
    world: World, make_decide: MakeDecide
) -> None:
    """An audit hook that raises is logged; the request still passes."""

    def broken(event: AuditEvent) -> None:
        raise RuntimeError("audit sink down")

    decide = make_decide(world, audit=broken)
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    passes(decide(bearer(created.secret)))


def test_refusals_are_logged_with_reason_and_never_the_secret(
    world: World, decide: Decide, caplog: pytest.LogCaptureFixture
) -> None:
    """The log line names the reason and key id; the secret never appears."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    world.manager.revoke("alice", created.info.key_id)
    with caplog.at_level(logging.INFO, logger="keyturn"):
        decide(bearer(created.secret))
    assert "revoked" in caplog.text and created.info.key_id in caplog.text
    secret_part = created.secret[16:44]
    assert secret_part not in caplog.text
    assert all(secret_part not in repr(r.__dict__) for r in caplog.records)


# --- hot-path shortcuts keep their promises --------------------------------------------------


def test_principal_follows_a_role_change(world: World, decide: Decide) -> None:
    """The principal memo never hides a role change: the next request carries the new role."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    first = passes(decide(bearer(created.secret)))
    assert passes(decide(bearer(created.secret))) is first  # built once, reused
    world.membership.add_member("alice", "org_research", role="admin")
    assert passes(decide(bearer(created.secret))).role == "admin"


def test_a_str_instead_of_header_values_is_refused_loudly(world: World, decide: Decide) -> None:
    """AuthRequest fields hold one entry per header line; a bare str is a caller's bug."""
    with pytest.raises(TypeError, match="tuple of header values"):
        decide(AuthRequest(authorization="Bearer rma_x"))  # type: ignore[arg-type]
    created = world.manager.create("alice", name="ci", scope=TENANT_SCOPE)
    misuse = AuthRequest(authorization=(f"Bearer {created.secret}",), organization="default")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tuple of header values"):
        decide(misuse)


class SelfTimedStore:
    """A blocking store that bounds its own calls, and notes the thread that called it."""

    enforces_timeout = True

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.threads: set[str] = set()

    def get_key(self, key_id: str) -> Any:
        self.threads.add(threading.current_thread().name)
        return self.inner.get_key(key_id)


def test_a_store_that_bounds_itself_is_called_without_a_watchdog(world: World) -> None:
    """With enforces_timeout, the sync driver calls the store in the request's own thread."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    store = SelfTimedStore(world.store)
    auth = Authenticator(store, world.membership, clock=world.clock, timeout=1)
    passes(auth.authenticate(bearer(created.secret)))
    assert store.threads == {threading.current_thread().name}
    auth.close()


def test_principal_memo_never_hides_a_changed_record(world: World, decide: Decide) -> None:
    """A record that changes under the same key id (a custom store's doing) shows at once."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    passes(decide(bearer(created.secret)))
    old = world.store.get_key(created.info.key_id)
    assert old is not None
    world.membership.add_member("bob", "org_research", role="member")
    world.store.edit(attrs.evolve(old, account_id="bob", name="renamed"))
    principal = passes(decide(bearer(created.secret)))
    assert (principal.account_id, principal.key_name) == ("bob", "renamed")


def test_a_closed_authenticator_answers_503(world: World) -> None:
    """Requests arriving during shutdown, after close(), get 503 with Retry-After, not a 500."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    auth = Authenticator(world.store, world.membership, clock=world.clock, retry_after=3)
    auth.close()
    for outcome in (
        auth.authenticate(bearer(created.secret)),
        asyncio.run(auth.authenticate_async(bearer(created.secret))),
    ):
        error = refused(outcome, ServiceUnavailable, Reason.CLOSED)
        assert error.headers() == [("retry-after", "3")]


def test_a_whole_database_passed_as_the_store_gets_a_hint(tmp_path: Any) -> None:
    """Passing the SQLite database itself says to pass db.keys and db.membership."""
    from keyturn.stores.sqlite import SQLiteDatabase

    with SQLiteDatabase(tmp_path / "keys.sqlite3") as db:
        with pytest.raises(TypeError, match=r"pass db\.keys as the store"):
            Authenticator(db, db.membership)  # type: ignore[arg-type]
        with Authenticator(db.keys, db.membership) as auth:  # a context manager closes it
            assert not auth.closed
        assert auth.closed


class AsyncUsageStore:
    """An async store over the memory store whose writes take a moment."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def get_key(self, key_id: str) -> Any:
        return self.inner.get_key(key_id)

    async def mark_used(self, key_id: str, at: Any) -> None:
        await asyncio.sleep(0.05)
        self.inner.mark_used(key_id, at)


def test_aclose_waits_for_an_async_stores_last_used_writes(world: World) -> None:
    """The last_used_at write an async store is still running lands before aclose() returns."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)

    async def serve_then_shut_down() -> None:
        async with Authenticator(
            AsyncUsageStore(world.store), world.membership, clock=world.clock
        ) as auth:
            passes(await auth.authenticate_async(bearer(created.secret)))

    asyncio.run(serve_then_shut_down())
    assert world.manager.list("alice")[0].last_used_at == world.clock.now
