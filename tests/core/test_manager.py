"""KeyManager: the console's create, list and revoke (spec sections 2-3, D12, D13, D18)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from keyturn import (
    CustomDate,
    InvalidExpiry,
    InvalidKeyName,
    KeyManager,
    KeyNotFound,
    KeyNotRevocable,
    Lifetime,
    Scope,
    ScopeKind,
    ScopeNotReachable,
    Status,
)
from keyturn._core import token as _token
from keyturn._core.hashing import check_secret
from tests.world import RESEARCH_SCOPE, TENANT_SCOPE, World


def test_create_returns_the_secret_once_and_stores_only_a_hash(world: World) -> None:
    """The created secret parses, its hash verifies, and the store never holds the secret."""
    created = world.manager.create("alice", name="  CI deploys ", scope=TENANT_SCOPE)
    parsed = _token.parse(created.secret)
    assert isinstance(parsed, _token.ParsedToken)
    stored = world.store.get_key(parsed.key_id)
    assert stored is not None
    assert check_secret(stored.secret_hash, parsed.secret) is None
    assert stored.secret_hash.startswith("sha256$")
    assert parsed.secret not in repr(stored) and parsed.secret not in stored.secret_hash
    assert created.info.name == "CI deploys"
    assert created.info.hint == "rma_\u2026" + created.secret[-4:]
    assert created.info.status is Status.ACTIVE
    assert created.secret not in repr(created) and created.secret not in str(created)


def test_default_lifetime_is_30_days(world: World) -> None:
    """Without a choice, a key expires 30 days after its creation."""
    created = world.manager.create("alice", name="x", scope=TENANT_SCOPE)
    assert created.info.expires_at - created.info.created_at == timedelta(days=30)
    assert created.info.created_at == world.clock.now


def test_instants_are_stored_in_utc_whatever_the_zone_of_the_clock(world: World) -> None:
    """D12: with a clock in a local zone, a one-day key lasts 24 hours and is stored in UTC."""
    now = datetime(2026, 3, 28, 12, 0, tzinfo=ZoneInfo("Europe/Paris"))  # spring-forward eve
    manager = KeyManager(world.store, world.membership, clock=lambda: now)
    created = manager.create("alice", name="x", scope=TENANT_SCOPE, expiry=Lifetime.DAYS_1)
    revoked = manager.revoke("alice", created.info.key_id)
    assert revoked.revoked_at is not None
    for instant in (revoked.created_at, revoked.expires_at, revoked.revoked_at):
        assert instant.utcoffset() == timedelta(0)
    assert revoked.expires_at == now.astimezone(UTC) + timedelta(hours=24)


def test_custom_date_expiry(world: World) -> None:
    """A custom date expires at the end of that day in the user's zone."""
    created = world.manager.create(
        "alice",
        name="x",
        scope=TENANT_SCOPE,
        expiry=CustomDate(date(2026, 12, 31), "America/New_York"),
    )
    assert created.info.expires_at.isoformat() == "2027-01-01T05:00:00+00:00"


def test_invalid_inputs_raise_typed_errors(world: World) -> None:
    """Bad names, dates, scopes and accounts raise typed errors and store nothing."""
    with pytest.raises(InvalidKeyName):
        world.manager.create("alice", name=" ", scope=TENANT_SCOPE)
    with pytest.raises(InvalidExpiry):
        world.manager.create(
            "alice", name="x", scope=TENANT_SCOPE, expiry=CustomDate(date(2026, 11, 21), "UTC")
        )
    with pytest.raises(TypeError, match=r"Scope\.tenant"):
        world.manager.create("alice", name="x", scope="acme")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="signed-in account"):
        world.manager.create("", name="x", scope=TENANT_SCOPE)
    assert len(world.store) == 0


@pytest.mark.parametrize(
    ("account", "scope", "says"),
    [
        ("alice", Scope.tenant("globex"), "reaches no organization of tenant 'globex'"),
        (
            "alice",
            Scope.organization("org_secret", tenant_id="acme"),
            "no role in organization 'org_secret'",
        ),
        (
            "alice",
            Scope.organization("org_research", tenant_id="globex"),
            "no organization 'org_research' in tenant",
        ),
        ("alice", Scope.organization("org_nope", tenant_id="acme"), "no organization 'org_nope'"),
        ("mallory", Scope.tenant("acme"), "reaches no organization"),
    ],
)
def test_create_refuses_scopes_the_account_cannot_reach(
    world: World, account: str, scope: Scope, says: str
) -> None:
    """Keys can only be created for a tenant or organization the user reaches."""
    with pytest.raises(ScopeNotReachable, match=says):
        world.manager.create(account, name="x", scope=scope)


def test_list_shows_only_own_keys_newest_first(world: World) -> None:
    """The list holds the signed-in user's keys only, newest first, with no secret."""
    first = world.manager.create("alice", name="first", scope=TENANT_SCOPE)
    world.clock.advance(timedelta(minutes=1))
    second = world.manager.create("alice", name="second", scope=RESEARCH_SCOPE)
    world.manager.create("bob", name="bob's", scope=Scope.tenant("globex"))
    listed = world.manager.list("alice")
    assert [k.name for k in listed] == ["second", "first"]
    for info, created in zip(listed, [second, first], strict=True):
        assert created.secret not in repr(info)


def test_list_filters_by_status_and_scope(world: World) -> None:
    """Filters: status, scope kind, or one exact scope."""
    tenant = world.manager.create("alice", name="t", scope=TENANT_SCOPE)
    research = world.manager.create("alice", name="r", scope=RESEARCH_SCOPE)
    short = world.manager.create("alice", name="s", scope=RESEARCH_SCOPE, expiry=Lifetime.HOURS_3)
    world.manager.revoke("alice", tenant.info.key_id)
    world.clock.advance(timedelta(hours=4))

    def names(**filters: object) -> set[str]:
        return {k.name for k in world.manager.list("alice", **filters)}  # type: ignore[arg-type]

    assert names(status=Status.ACTIVE) == {"r"}
    assert names(status=Status.REVOKED) == {"t"}
    assert names(status=Status.EXPIRED) == {"s"}
    assert names(scope=ScopeKind.TENANT) == {"t"}
    assert names(scope=ScopeKind.ORGANIZATION) == {"r", "s"}
    assert names(scope=RESEARCH_SCOPE, status=Status.ACTIVE) == {"r"}
    world.membership.remove_member("alice", "org_research")
    assert names(status=Status.INACTIVE) == {"r"}
    assert research.info.key_id in {k.key_id for k in world.manager.list("alice")}
    assert short.info.key_id


def test_revoke_is_immediate_and_irreversible(world: World) -> None:
    """Revoke marks the key Revoked; a second revoke is refused as already Revoked."""
    created = world.manager.create("alice", name="x", scope=TENANT_SCOPE)
    info = world.manager.revoke("alice", created.info.key_id)
    assert info.status is Status.REVOKED and info.revoked_at == world.clock.now
    with pytest.raises(KeyNotRevocable, match="already Revoked"):
        world.manager.revoke("alice", created.info.key_id)


def test_inactive_keys_can_be_revoked_but_expired_cannot(world: World) -> None:
    """The spec's transitions: Inactive -> Revoked is allowed; Expired is final."""
    inactive = world.manager.create("alice", name="i", scope=RESEARCH_SCOPE)
    expired = world.manager.create("alice", name="e", scope=RESEARCH_SCOPE, expiry=Lifetime.HOURS_3)
    world.membership.remove_member("alice", "org_research")
    assert world.manager.revoke("alice", inactive.info.key_id).status is Status.REVOKED
    world.clock.advance(timedelta(hours=3))
    with pytest.raises(KeyNotRevocable, match="already Expired"):
        world.manager.revoke("alice", expired.info.key_id)


def test_only_the_creator_can_revoke(world: World) -> None:
    """Another user's key is 'not found', exactly like a key that does not exist."""
    created = world.manager.create("alice", name="x", scope=TENANT_SCOPE)
    with pytest.raises(KeyNotFound, match="no key with id"):
        world.manager.revoke("bob", created.info.key_id)
    with pytest.raises(KeyNotFound):
        world.manager.revoke("alice", "doesnotexist")
    with pytest.raises(KeyNotFound):
        world.manager.revoke("alice", "")
    with pytest.raises(TypeError):
        world.manager.revoke("alice", None)  # type: ignore[arg-type]
    assert world.manager.list("alice")[0].status is Status.ACTIVE


class LooseMembership:
    """A provider that matches organization ids case-insensitively, as some memberships do."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def get_organization(self, organization_id: str) -> object:
        return self.inner.get_organization(organization_id.lower())  # type: ignore[attr-defined]

    def get_role(self, account_id: str, organization_id: str) -> object:
        return self.inner.get_role(account_id, organization_id.lower())  # type: ignore[attr-defined]


def test_created_keys_keep_the_providers_canonical_ids(world: World) -> None:
    """D16: an organization typed loosely in the console is stored as the provider names it."""
    manager = KeyManager(world.store, LooseMembership(world.membership), clock=world.clock)  # type: ignore[arg-type]
    created = manager.create(
        "alice", name="x", scope=Scope.organization("ORG_Research", tenant_id="acme")
    )
    assert created.info.scope == Scope.organization("org_research", tenant_id="acme")


@pytest.mark.parametrize(
    "filters", [{"status": "Active"}, {"scope": "tenant"}, {"status": 1}], ids=str
)
def test_list_filters_of_the_wrong_type_are_refused(
    world: World, filters: dict[str, object]
) -> None:
    """A filter that is not a Status / ScopeKind / Scope raises instead of matching nothing."""
    world.manager.create("alice", name="x", scope=TENANT_SCOPE)
    with pytest.raises(TypeError, match="must be a"):
        world.manager.list("alice", **filters)  # type: ignore[arg-type]


def test_expiring_lists_working_keys_that_expire_within_the_window(world: World) -> None:
    """Active and Inactive keys expiring within N days, soonest first; none past, none later."""
    week = world.manager.create("alice", name="week", scope=TENANT_SCOPE, expiry=Lifetime.DAYS_7)
    day = world.manager.create("alice", name="day", scope=RESEARCH_SCOPE, expiry=Lifetime.DAYS_1)
    world.manager.create("alice", name="month", scope=TENANT_SCOPE, expiry=Lifetime.DAYS_30)
    gone = world.manager.create("alice", name="gone", scope=TENANT_SCOPE, expiry=Lifetime.DAYS_1)
    world.manager.revoke("alice", gone.info.key_id)
    world.manager.create("alice", name="short", scope=TENANT_SCOPE, expiry=Lifetime.HOURS_3)
    world.manager.create("bob", name="bobs", scope=TENANT_SCOPE, expiry=Lifetime.DAYS_1)
    world.clock.advance(timedelta(hours=4))  # "short" is Expired now

    def names(within: timedelta) -> list[str]:
        return [info.name for info in world.manager.expiring("alice", within=within)]

    assert names(timedelta(days=14)) == ["day", "week"]
    assert names(timedelta(days=7) - timedelta(hours=4)) == ["day", "week"]  # the edge counts
    assert names(timedelta(days=7) - timedelta(hours=4, seconds=1)) == ["day"]
    assert names(timedelta(0)) == []
    world.membership.remove_member("alice", "org_research")
    expiring = world.manager.expiring("alice", within=timedelta(days=2))
    assert [(info.name, info.status) for info in expiring] == [("day", Status.INACTIVE)]
    assert week.info.key_id not in {info.key_id for info in expiring}
    assert day.info.key_id == expiring[0].key_id


def test_expiring_refuses_a_window_that_is_not_a_positive_timedelta(world: World) -> None:
    """A negative window or a bare number of days is a typed error that says what to give."""
    with pytest.raises(ValueError, match="must not be negative"):
        world.manager.expiring("alice", within=timedelta(days=-1))
    with pytest.raises(TypeError, match="timedelta"):
        world.manager.expiring("alice", within=14)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="account_id"):
        world.manager.expiring("", within=timedelta(days=1))
