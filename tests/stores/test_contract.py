"""The store contract: every store keyturn ships behaves like the memory store.

Each test runs against memory, SQLite, PostgreSQL and async PostgreSQL (see ``backend``).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyturn import (
    ApiKey,
    AsyncKeyManager,
    AuthRequest,
    CreatedKey,
    DuplicateKey,
    KeyAlreadyReplaced,
    KeyManager,
    Leaked,
    Organization,
    OrganizationConflict,
    Principal,
    Reason,
    Refusal,
    Scope,
    Status,
    UnknownOrganization,
)
from keyturn.activity import Action, Channel
from tests.stores.conftest import Backend
from tests.world import Clock

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
TENANT = Scope.tenant("acme")
RESEARCH = Scope.organization("org_research", tenant_id="acme")
HASH = "sha256$" + "5e" * 32  # the shape of a stored hash; no key's secret behind it


def make_key(
    key_id: str | None = None,
    *,
    account_id: str = "alice",
    created_at: datetime = NOW,
    scope: Scope = TENANT,
    **fields: Any,
) -> ApiKey:
    values: dict[str, Any] = {
        "key_id": key_id or secrets.token_hex(6),
        "secret_hash": HASH,
        "hint": "rma_\u2026abcd",
        "name": "CI deploys",
        "account_id": account_id,
        "scope": scope,
        "created_at": created_at,
        "expires_at": created_at + timedelta(days=30),
    }
    return ApiKey(**{**values, **fields})


def wait_until(backend: Backend, condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll *condition* (giving an async store's loop time to run) until true or timeout."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        settle(backend, 0.01)
    return True


def settle(backend: Backend, seconds: float) -> None:
    """Wait a moment, letting an async store's loop run its pending writes meanwhile."""
    if backend.runner is not None:
        backend.runner.run(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)


def world(backend: Backend) -> None:
    """Tenant acme (org_default, org_research) and globex; alice is in both acme ones."""
    membership = backend.membership
    membership.add_organization("org_default", tenant_id="acme", default=True)
    membership.add_organization("org_research", tenant_id="acme")
    membership.add_organization("org_globex", tenant_id="globex", default=True)
    membership.add_member("alice", "org_default", role="admin")
    membership.add_member("alice", "org_research", role="member")


def clock_now() -> Clock:
    """The test clock, set to now, with microseconds a store must keep."""
    return Clock(datetime.now(UTC).replace(microsecond=123456))


# --- keys ---------------------------------------------------------------------------------


def test_get_key_returns_the_key_that_was_added(backend: Backend) -> None:
    """A key reads back with every field equal, including an organization scope and Unicode."""
    key = make_key(
        scope=RESEARCH,
        name="d\u00e9ploiement \u2014 \u2713",
        revoked_at=NOW + timedelta(hours=1),
        last_used_at=NOW + timedelta(minutes=5, microseconds=7),
        first_used_at=NOW + timedelta(minutes=1),
    )
    backend.keys.add_key(key)
    assert backend.keys.get_key(key.key_id) == key


def test_unknown_key_is_none(backend: Backend) -> None:
    """Asking for an id nobody added answers None, not an error."""
    assert backend.keys.get_key("NoSuchKey123") is None


def test_duplicate_key_id_is_refused(backend: Backend) -> None:
    """Adding an id twice raises DuplicateKey and keeps the first key untouched."""
    first = make_key("SameKeyId123")
    backend.keys.add_key(first)
    with pytest.raises(DuplicateKey):
        backend.keys.add_key(make_key("SameKeyId123", account_id="mallory"))
    assert backend.keys.get_key("SameKeyId123") == first


def test_keys_of_lists_the_account_s_keys_newest_first(backend: Backend) -> None:
    """keys_of gives only that account's keys, the most recently created first."""
    oldest = make_key(created_at=NOW)
    middle = make_key(created_at=NOW + timedelta(microseconds=1))
    newest = make_key(created_at=NOW + timedelta(days=1))
    for key in (middle, newest, make_key(account_id="bob"), oldest):
        backend.keys.add_key(key)
    assert [k.key_id for k in backend.keys.keys_of("alice")] == [
        newest.key_id,
        middle.key_id,
        oldest.key_id,
    ]
    assert list(backend.keys.keys_of("carol")) == []


def test_revoke_succeeds_once(backend: Backend) -> None:
    """The first revoke returns True and sets revoked_at; a second one, or an unknown id, False."""
    key = make_key()
    backend.keys.add_key(key)
    assert backend.keys.revoke_key(key.key_id, NOW + timedelta(hours=1)) is True
    assert backend.keys.revoke_key(key.key_id, NOW + timedelta(hours=2)) is False
    assert backend.keys.revoke_key("NoSuchKey123", NOW) is False
    stored = backend.keys.get_key(key.key_id)
    assert stored is not None
    assert stored.revoked_at == NOW + timedelta(hours=1)


def test_upgrade_hash_replaces_only_the_hash_it_was_given(backend: Backend) -> None:
    """``upgrade_hash`` is a conditional write: it replaces the hash only while the key
    still holds the old one (a second upgrade, a wrong old hash or an unknown id change
    nothing), and touches no other field: a revoke made before it stays."""
    old, new = "$argon2id$v=19$m=8192,t=1,p=1$c2FsdHNhbHRz$aGFzaGhhc2g", "sha256$" + "0a" * 32
    key = make_key(secret_hash=old)
    backend.keys.add_key(key)
    assert backend.keys.revoke_key(key.key_id, NOW + timedelta(hours=1)) is True
    assert backend.keys.upgrade_hash(key.key_id, HASH, new) is False
    assert backend.keys.upgrade_hash("NoSuchKey123", old, new) is False
    assert backend.keys.upgrade_hash(key.key_id, old, new) is True
    assert backend.keys.upgrade_hash(key.key_id, old, HASH) is False
    assert backend.keys.get_key(key.key_id) == attrs.evolve(
        key, secret_hash=new, revoked_at=NOW + timedelta(hours=1)
    )


def test_mark_used_never_moves_backwards(backend: Backend) -> None:
    """last_used_at only moves forward; first_used_at is set by the first use and never moves
    after; marking an unknown key is a no-op."""
    key = make_key()
    backend.keys.add_key(key)

    def used() -> tuple[datetime | None, datetime | None]:
        stored = backend.keys.get_key(key.key_id)
        assert stored is not None
        return stored.first_used_at, stored.last_used_at

    assert used() == (None, None)
    first = NOW + timedelta(minutes=2)
    backend.keys.mark_used(key.key_id, first)
    assert used() == (first, first)
    backend.keys.mark_used(key.key_id, NOW + timedelta(minutes=1))
    assert used() == (first, first)
    backend.keys.mark_used(key.key_id, NOW + timedelta(minutes=3, microseconds=1))
    assert used() == (first, NOW + timedelta(minutes=3, microseconds=1))
    backend.keys.mark_used(key.key_id, NOW + timedelta(hours=1))
    assert used() == (first, NOW + timedelta(hours=1))
    backend.keys.mark_used("NoSuchKey123", NOW)
    assert backend.keys.get_key("NoSuchKey123") is None


# Offsets to the second, and real zones (DST, historical local mean time).
ZONES = st.one_of(
    st.integers(min_value=-86_399, max_value=86_399).map(
        lambda seconds: timezone(timedelta(seconds=seconds))
    ),
    st.timezones(),
)
INSTANTS = st.datetimes(
    min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31), timezones=ZONES
)
PROPERTY = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@PROPERTY
@given(created=INSTANTS, expires=INSTANTS, revoked=INSTANTS, used=INSTANTS)
def test_instants_round_trip_exactly(
    backend: Backend, created: datetime, expires: datetime, revoked: datetime, used: datetime
) -> None:
    """Any aware instant, in any zone, reads back as the same instant to the microsecond."""
    key = attrs.evolve(
        make_key(created_at=created, revoked_at=revoked, last_used_at=used, first_used_at=used),
        expires_at=expires,
    )
    backend.keys.add_key(key)
    stored = backend.keys.get_key(key.key_id)
    assert stored is not None
    for sent, back in [
        (created, stored.created_at),
        (expires, stored.expires_at),
        (revoked, stored.revoked_at),
        (used, stored.last_used_at),
        (used, stored.first_used_at),
    ]:
        assert back is not None
        assert back.astimezone(UTC) == sent.astimezone(UTC)
        if backend.persistent:
            assert back.tzinfo is UTC


@PROPERTY
@given(first=INSTANTS, second=INSTANTS)
def test_mark_used_keeps_the_later_instant(
    backend: Backend, first: datetime, second: datetime
) -> None:
    """Whatever the order and zones of two uses, the later instant is the one kept."""
    key = make_key()
    backend.keys.add_key(key)
    backend.keys.mark_used(key.key_id, first)
    backend.keys.mark_used(key.key_id, second)
    stored = backend.keys.get_key(key.key_id)
    assert stored is not None
    assert stored.last_used_at is not None
    assert stored.last_used_at.astimezone(UTC) == max(first, second).astimezone(UTC)


def test_no_secret_is_stored(backend: Backend) -> None:
    """Nothing the store keeps -- rows, columns, file bytes -- contains a secret or its part."""
    world(backend)
    manager = KeyManager(backend.keys, backend.membership)
    created = [
        manager.create("alice", name="tenant", scope=TENANT),
        manager.create("alice", name="research", scope=RESEARCH),
    ]
    backend.keys.mark_used(created[0].info.key_id, datetime.now(UTC))
    manager.revoke("alice", created[1].info.key_id)
    stored = backend.dump()
    for key in created:
        assert key.info.key_id in stored and key.info.hint in stored  # the dump sees the data
        assert key.secret not in stored
        assert key.secret[16:44] not in stored  # the secret part on its own
        assert key.secret[-20:] not in stored


# --- the membership ------------------------------------------------------------------------


def test_organizations_and_the_default_one(backend: Backend) -> None:
    """Organizations read back; each tenant's default is found; unknown ones are None."""
    world(backend)
    membership = backend.membership
    assert membership.get_organization("org_research") == Organization(
        id="org_research", tenant_id="acme", is_default=False
    )
    assert membership.get_default_organization("acme") == Organization(
        id="org_default", tenant_id="acme", is_default=True
    )
    assert membership.get_default_organization("globex").id == "org_globex"
    assert membership.get_organization("org_nope") is None
    assert membership.get_default_organization("initech") is None


def test_a_tenant_s_first_organization_is_its_default_one(backend: Backend) -> None:
    """A tenant comes into being with its default organization: a first one that is not the
    default is refused and nothing is stored; after the default, others are welcome."""
    membership = backend.membership
    with pytest.raises(OrganizationConflict, match="no default organization yet"):
        membership.add_organization("org_initech", tenant_id="initech")
    assert membership.get_organization("org_initech") is None
    assert membership.organizations() == []
    membership.add_organization("org_hq", tenant_id="initech", default=True)
    membership.add_organization("org_initech", tenant_id="initech")
    assert [o.id for o in membership.organizations()] == ["org_hq", "org_initech"]


def test_the_default_organization_goes_last(backend: Backend) -> None:
    """The default organization cannot be removed while its tenant has others; once it is
    the last one, it can (and the tenant is gone with it)."""
    world(backend)
    membership = backend.membership
    with pytest.raises(OrganizationConflict, match="remove those first"):
        membership.remove_organization("org_default")
    assert membership.get_default_organization("acme").id == "org_default"
    assert membership.get_role("alice", "org_default") == "admin"
    assert membership.remove_organization("org_research") is True
    assert membership.remove_organization("org_default") is True
    assert membership.get_default_organization("acme") is None
    assert [o.id for o in membership.organizations()] == ["org_globex"]


def test_a_key_has_at_most_one_live_replacement(backend: Backend) -> None:
    """The store refuses a second replacement of a key while the first is not revoked, names
    the first, and takes another once that one is revoked."""
    old = make_key("old")
    first = make_key("first", replaces="old")
    backend.keys.add_key(old)
    backend.keys.add_key(first)
    with pytest.raises(KeyAlreadyReplaced) as refused:
        backend.keys.add_key(make_key("second", replaces="old"))
    assert refused.value.replacement_id == "first"
    assert backend.keys.get_key("second") is None
    with pytest.raises(DuplicateKey):  # the id is checked first, as before
        backend.keys.add_key(make_key("first", replaces="old"))
    assert backend.keys.revoke_key("first", NOW)
    backend.keys.add_key(make_key("second", replaces="old"))
    assert backend.keys.get_key("second").replaces == "old"


def test_concurrent_rotations_make_one_replacement(backend: Backend) -> None:
    """Eight rotations of one key at once: exactly one succeeds, the others are refused
    with KeyAlreadyReplaced naming the winner, and the store holds one live replacement."""
    world(backend)
    manager = KeyManager(backend.keys, backend.membership)
    old = manager.create("alice", name="CI", scope=TENANT)
    start = threading.Barrier(8)

    def rotate() -> object:
        start.wait()
        try:
            return manager.rotate("alice", old.info.key_id)
        except KeyAlreadyReplaced as refused:
            return refused

    if backend.runner is None:
        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(lambda _: rotate(), range(8)))
    else:  # an async store: eight rotations interleaved on its loop
        amanager = AsyncKeyManager(backend.native_keys, backend.native_membership)

        async def rotate_async() -> object:
            try:
                return await amanager.rotate("alice", old.info.key_id)
            except KeyAlreadyReplaced as refused:
                return refused

        async def all_at_once() -> list[object]:
            return list(await asyncio.gather(*(rotate_async() for _ in range(8))))

        outcomes = backend.runner.run(all_at_once())
    created = [o for o in outcomes if isinstance(o, CreatedKey)]
    refused = [o for o in outcomes if isinstance(o, KeyAlreadyReplaced)]
    assert (len(created), len(refused)) == (1, 7)
    assert {r.replacement_id for r in refused} == {created[0].info.key_id}
    live = [
        key
        for key in backend.keys.keys_of("alice")
        if key.replaces == old.info.key_id and key.revoked_at is None
    ]
    assert [key.key_id for key in live] == [created[0].info.key_id]


def test_a_tenant_has_at_most_one_default(backend: Backend) -> None:
    """A second default in a tenant is refused; re-adding the same one is harmless."""
    world(backend)
    membership = backend.membership
    with pytest.raises(OrganizationConflict, match="default"):
        membership.add_organization("org_second", tenant_id="acme", default=True)
    assert membership.get_organization("org_second") is None
    membership.add_organization("org_default", tenant_id="acme", default=True)
    assert membership.get_default_organization("acme").id == "org_default"


def test_an_organization_cannot_change_on_re_adding(backend: Backend) -> None:
    """Adding an existing id with another tenant or default flag is refused."""
    world(backend)
    with pytest.raises(OrganizationConflict, match="differently"):
        backend.membership.add_organization("org_research", tenant_id="globex")
    assert backend.membership.get_organization("org_research").tenant_id == "acme"


def test_roles(backend: Backend) -> None:
    """A member has one role per organization, replaced on re-adding; none elsewhere."""
    world(backend)
    membership = backend.membership
    assert membership.get_role("alice", "org_research") == "member"
    membership.add_member("alice", "org_research", role="admin")
    assert membership.get_role("alice", "org_research") == "admin"
    assert membership.get_role("alice", "org_globex") is None
    assert membership.get_role("bob", "org_research") is None
    with pytest.raises(UnknownOrganization):
        membership.add_member("alice", "org_nope", role="admin")
    with pytest.raises(ValueError, match="role"):
        membership.add_member("alice", "org_research", role="")


def test_reaches_tenant_and_remove_member(backend: Backend) -> None:
    """An account reaches a tenant while it holds a role in any of its organizations."""
    world(backend)
    membership = backend.membership
    assert membership.reaches_tenant("alice", "acme")
    assert not membership.reaches_tenant("alice", "globex")
    assert not membership.reaches_tenant("bob", "acme")
    membership.remove_member("alice", "org_default")
    assert membership.get_role("alice", "org_default") is None
    assert membership.reaches_tenant("alice", "acme")
    membership.remove_member("alice", "org_research")
    assert not membership.reaches_tenant("alice", "acme")
    membership.remove_member("alice", "org_research")  # not a member any more: no error


# --- KeyManager and Authenticator on each store ---------------------------------------------


def bearer(secret: str, organization: str | None = None) -> AuthRequest:
    return AuthRequest(
        authorization=(f"Bearer {secret}",),
        organization=() if organization is None else (organization,),
    )


def test_console_and_authentication_end_to_end(backend: Backend) -> None:
    """Create, authenticate, revoke and lose access on a real store, with the real checks."""
    world(backend)
    manager = KeyManager(backend.keys, backend.membership)
    tenant_key = manager.create("alice", name="tenant", scope=TENANT)
    research_key = manager.create("alice", name="research", scope=RESEARCH)
    auth = backend.authenticator()
    try:
        principal = backend.decide(auth, bearer(tenant_key.secret, "default"))
        assert isinstance(principal, Principal)
        assert (principal.organization_id, principal.role) == ("org_default", "admin")
        principal = backend.decide(auth, bearer(research_key.secret))
        assert isinstance(principal, Principal)
        assert (principal.organization_id, principal.tenant_id) == ("org_research", "acme")

        manager.revoke("alice", tenant_key.info.key_id)
        refused = backend.decide(auth, bearer(tenant_key.secret, "default"))
        assert isinstance(refused, Refusal)
        assert (refused.status, refused.reason) == (401, Reason.REVOKED)

        backend.membership.remove_member("alice", "org_research")
        refused = backend.decide(auth, bearer(research_key.secret))
        assert isinstance(refused, Refusal)
        assert (refused.status, refused.reason) == (401, Reason.INACTIVE)
    finally:
        auth.close()
    statuses = {info.name: info.status for info in manager.list("alice")}
    assert statuses == {"tenant": Status.REVOKED, "research": Status.INACTIVE}


def test_authenticator_records_last_use_at_most_once_per_interval(backend: Backend) -> None:
    """The first request writes last_used_at; another within the interval writes nothing."""
    world(backend)
    clock = clock_now()
    manager = KeyManager(backend.keys, backend.membership, clock=clock)
    created = manager.create("alice", name="research", scope=RESEARCH)
    first_use = clock.now
    auth = backend.authenticator(clock=clock, usage_interval=3600)

    def last_used() -> datetime | None:
        return manager.list("alice")[0].last_used_at

    try:
        assert isinstance(backend.decide(auth, bearer(created.secret)), Principal)
        assert wait_until(backend, lambda: last_used() == first_use)
        clock.now += timedelta(minutes=5)
        assert isinstance(backend.decide(auth, bearer(created.secret)), Principal)
    finally:
        auth.close()  # waits for queued writes
    settle(backend, 0.05)  # an async write, had there been one, would land meanwhile
    assert last_used() == first_use


# --- leaks ----------------------------------------------------------------------------------


def test_a_leak_report_is_recorded_once_and_shown_on_the_key(backend: Backend) -> None:
    """The first report of a leak stands; a later one changes nothing and says so."""
    world(backend)
    clock = clock_now()
    manager = KeyManager(backend.keys, backend.membership, clock=clock)
    created = manager.create("alice", name="deploys", scope=TENANT)
    key_id = created.info.key_id
    first = "https://github.com/acme/app/blob/0123abc/.env"
    assert backend.keys.report_leak(key_id, first, NOW) is True
    later = NOW + timedelta(days=1)
    assert backend.keys.report_leak(key_id, "https://example.com/paste", later) is False
    assert backend.keys.report_leak("NoSuchKey123", first, NOW) is False
    (info,) = manager.list("alice")
    assert info.leaked == Leaked(url=first, at=NOW)
    assert info.status is Status.ACTIVE  # reported, not revoked: only the creator revokes
    assert backend.keys.get_key(key_id).leaked == Leaked(url=first, at=NOW)


def test_leaked_keys_lists_reported_keys_most_recent_first(backend: Backend) -> None:
    """leaked_keys gives every account's reported keys and no other, latest report first."""
    older, newer, clean = make_key(), make_key(account_id="bob"), make_key()
    for key in (older, newer, clean):
        backend.keys.add_key(key)
    backend.keys.report_leak(older.key_id, "https://a.example/1", NOW)
    backend.keys.report_leak(newer.key_id, "https://b.example/2", NOW + timedelta(seconds=1))
    assert [key.key_id for key in backend.keys.leaked_keys()] == [newer.key_id, older.key_id]


def test_a_leaked_key_round_trips_through_add_key(backend: Backend) -> None:
    """A key added with a leak report (an import, a restore) reads back with it, exactly."""
    at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone(timedelta(hours=-5)))
    key = make_key(leaked=Leaked(url="https://gist.example/\u00e9", at=at))
    backend.keys.add_key(key)
    assert backend.keys.get_key(key.key_id) == key


def test_a_signed_leak_report_is_answered_and_recorded_on_every_store(backend: Backend) -> None:
    """The secret-scanning responder over each real store: true positive recorded, not revoked."""
    import base64
    import json

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from keyturn.leaks import LeakResponder

    world(backend)
    manager = KeyManager(backend.keys, backend.membership)
    created = manager.create("alice", name="deploys", scope=TENANT)
    host = ec.generate_private_key(ec.SECP256R1())
    pem = host.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    url = "https://github.com/acme/app/blob/0123abc/.env"
    body = json.dumps([{"token": created.secret, "type": "keyturn", "url": url}]).encode()
    headers = {
        "github-public-key-identifier": ["k1"],
        "github-public-key-signature": [
            base64.b64encode(host.sign(body, ec.ECDSA(hashes.SHA256()))).decode()
        ],
    }
    responder = LeakResponder(backend.native_keys, public_keys={"k1": pem}, clock=lambda: NOW)
    if backend.runner is None:
        response = responder.respond("POST", headers, body)
    else:
        response = backend.runner.run(responder.respond_async("POST", headers, body))
    assert response.status == 200
    assert json.loads(response.body)[0]["label"] == "true_positive"
    (info,) = manager.list("alice")
    assert (info.leaked, info.status) == (Leaked(url=url, at=NOW), Status.ACTIVE)
    assert [key.key_id for key in backend.keys.leaked_keys()] == [created.info.key_id]
    events = backend.keys.events_of("alice")
    reported = next(event for event in events if event.action is Action.LEAK_REPORTED)
    assert (reported.action, reported.channel, reported.detail) == (
        Action.LEAK_REPORTED,
        Channel.LEAK_ENDPOINT,
        url,
    )
