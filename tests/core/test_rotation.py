"""KeyManager.rotate: a replacement with the old key's name, scope and lifetime, confirmed by use.

Spec section 5: create a new key with the same scope, deploy it, confirm it works, then
revoke the old key. The memory store here; every shipped store in tests/stores.
"""

from __future__ import annotations

from datetime import date, timedelta

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyturn import (
    ApiKey,
    CustomDate,
    KeyAlreadyReplaced,
    KeyManager,
    KeyNotFound,
    KeyNotRotatable,
    Lifetime,
    Principal,
    Reason,
    Refusal,
    ScopeNotReachable,
    Status,
)
from keyturn.stores.memory import MemoryKeyStore
from tests.world import RESEARCH_SCOPE, TENANT_SCOPE, World, bearer, make_world


def infos(world: World) -> dict[str, object]:
    return {info.key_id: info for info in world.manager.list("alice")}


def use(world: World, secret: str) -> Principal | Refusal:
    """One request with *secret*; the memory store records its use at once."""
    auth = world.authenticator(usage_interval=0)
    return auth.authenticate(bearer(secret, "org_research"))


def test_the_replacement_keeps_name_scope_and_lifetime_and_links_both_ways(world: World) -> None:
    """The new key: same name, scope and fixed lifetime from now; each key names the other."""
    old = world.manager.create("alice", name="CI deploys", scope=RESEARCH_SCOPE)
    world.clock.advance(timedelta(days=20))
    new = world.manager.rotate("alice", old.info.key_id)
    assert new.secret != old.secret and new.info.key_id != old.info.key_id
    assert (new.info.name, new.info.scope, new.info.status) == (
        "CI deploys",
        RESEARCH_SCOPE,
        Status.ACTIVE,
    )
    assert new.info.created_at == world.clock.now
    assert new.info.expires_at - new.info.created_at == Lifetime.DAYS_30.value
    assert new.info.replaces == old.info.key_id
    assert new.info.revoke_old_on_first_use is False
    assert new.secret not in repr(new)
    listed = world.manager.list("alice")
    assert [info.key_id for info in listed] == [new.info.key_id, old.info.key_id]
    new_info, old_info = listed
    assert (new_info.replaces, new_info.replaced_by) == (old.info.key_id, None)
    assert (old_info.replaces, old_info.replaced_by) == (None, new.info.key_id)
    assert old_info.replacement_first_used_at is None and not old_info.replacement_confirmed
    assert old_info.status is Status.ACTIVE  # both keys work while the new one is deployed


def test_a_custom_date_becomes_the_same_span_from_now(world: World) -> None:
    """A key made to end on a chosen day is replaced by one with the same span from now."""
    old = world.manager.create(
        "alice",
        name="laptop",
        scope=TENANT_SCOPE,
        expiry=CustomDate(date(2027, 2, 1), "Europe/Paris"),
    )
    span = old.info.expires_at - old.info.created_at
    world.clock.advance(timedelta(days=3, hours=5))
    new = world.manager.rotate("alice", old.info.key_id)
    assert new.info.expires_at == world.clock.now + span


@settings(max_examples=40, deadline=None)
@given(days=st.integers(min_value=1, max_value=3 * 365), hours=st.integers(0, 23))
def test_a_replacement_never_outlives_the_longest_lifetime(days: int, hours: int) -> None:
    """Whatever span a stored key has (a custom store may hold anything), the replacement
    lasts that span, at most 365 days."""
    world = make_world()
    created = world.manager.create("alice", name="x", scope=TENANT_SCOPE)
    stored = world.store.get_key(created.info.key_id)
    assert stored is not None
    span = timedelta(days=days, hours=hours)
    world.store.add_key(
        attrs.evolve(stored, key_id="LongLived123", expires_at=stored.created_at + span)
    )
    new = world.manager.rotate("alice", "LongLived123")
    assert new.info.expires_at - new.info.created_at == min(span, timedelta(days=365))


def test_only_the_creator_rotates(world: World) -> None:
    """Another user's key is 'not found', exactly as revoke says; nothing is created."""
    created = world.manager.create("alice", name="x", scope=TENANT_SCOPE)
    with pytest.raises(KeyNotFound, match="no key with id"):
        world.manager.rotate("bob", created.info.key_id)
    with pytest.raises(KeyNotFound, match="no key with that id"):
        world.manager.rotate("alice", created.secret)  # a pasted key is never echoed
    with pytest.raises(KeyNotFound):
        world.manager.rotate("alice", "")
    with pytest.raises(TypeError):
        world.manager.rotate("alice", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="True or False"):
        world.manager.rotate("alice", created.info.key_id, revoke_old_on_first_use="yes")  # type: ignore[arg-type]
    assert len(world.store) == 1


def test_revoked_and_expired_keys_cannot_be_rotated(world: World) -> None:
    """Nothing uses a Revoked or Expired key: the error says to create a new one."""
    revoked = world.manager.create("alice", name="gone", scope=TENANT_SCOPE)
    world.manager.revoke("alice", revoked.info.key_id)
    with pytest.raises(KeyNotRotatable, match=r"Revoked.*create a new key instead"):
        world.manager.rotate("alice", revoked.info.key_id)
    short = world.manager.create("alice", name="short", scope=TENANT_SCOPE, expiry=Lifetime.HOURS_3)
    world.clock.advance(timedelta(hours=3))
    with pytest.raises(KeyNotRotatable, match="Expired"):
        world.manager.rotate("alice", short.info.key_id)
    assert len(world.store) == 2


def test_an_inactive_key_is_not_rotated(world: World) -> None:
    """A creator who no longer reaches the scope could not create its replacement either."""
    created = world.manager.create("alice", name="x", scope=RESEARCH_SCOPE)
    world.membership.remove_member("alice", "org_research")
    with pytest.raises(ScopeNotReachable):
        world.manager.rotate("alice", created.info.key_id)
    assert len(world.store) == 1


def test_one_working_replacement_at_a_time(world: World) -> None:
    """A second rotation names the first replacement; once that one is revoked, it works."""
    old = world.manager.create("alice", name="x", scope=TENANT_SCOPE)
    first = world.manager.rotate("alice", old.info.key_id)
    with pytest.raises(KeyAlreadyReplaced, match=first.info.key_id) as raised:
        world.manager.rotate("alice", old.info.key_id)
    assert raised.value.replacement_id == first.info.key_id
    assert isinstance(raised.value, KeyNotRotatable)
    world.manager.revoke("alice", first.info.key_id)
    world.clock.advance(timedelta(seconds=1))
    second = world.manager.rotate("alice", old.info.key_id)
    assert infos(world)[old.info.key_id].replaced_by == second.info.key_id  # the newest
    # A replacement can itself be rotated: a chain, each link its own pair.
    third = world.manager.rotate("alice", second.info.key_id)
    assert infos(world)[second.info.key_id].replaced_by == third.info.key_id


def test_the_first_use_of_the_replacement_is_its_confirmation(world: World) -> None:
    """Until the new key is used the old one says so; after, it carries the first use's
    instant, which later uses never move. Without the creator's choice nothing is revoked."""
    old = world.manager.create("alice", name="x", scope=TENANT_SCOPE)
    new = world.manager.rotate("alice", old.info.key_id)
    world.clock.advance(timedelta(minutes=5))
    assert isinstance(use(world, old.secret), Principal)  # the old key's use confirms nothing
    assert infos(world)[old.info.key_id].replacement_first_used_at is None
    world.clock.advance(timedelta(minutes=5))
    assert isinstance(use(world, new.secret), Principal)
    first = world.clock.now
    old_info = infos(world)[old.info.key_id]
    assert old_info.replacement_first_used_at == first and old_info.replacement_confirmed
    assert old_info.status is Status.ACTIVE
    assert isinstance(use(world, old.secret), Principal)
    world.clock.advance(timedelta(minutes=10))
    assert isinstance(use(world, new.secret), Principal)
    new_info = infos(world)[new.info.key_id]
    assert (new_info.first_used_at, new_info.last_used_at) == (first, world.clock.now)
    assert infos(world)[old.info.key_id].replacement_first_used_at == first


def test_the_creator_s_choice_revokes_the_old_key_at_the_replacement_s_first_use(
    world: World,
) -> None:
    """revoke_old_on_first_use is recorded on the new key; its first recorded use revokes the
    old key at that instant, and the old key is refused from then on."""
    old = world.manager.create("alice", name="x", scope=TENANT_SCOPE)
    new = world.manager.rotate("alice", old.info.key_id, revoke_old_on_first_use=True)
    stored = world.store.get_key(new.info.key_id)
    assert stored is not None and stored.revoke_old_on_first_use and stored.replaces
    assert new.info.revoke_old_on_first_use is True
    world.clock.advance(timedelta(hours=1))
    assert infos(world)[old.info.key_id].status is Status.ACTIVE  # time alone does nothing
    assert isinstance(use(world, new.secret), Principal)
    old_info = infos(world)[old.info.key_id]
    assert old_info.status is Status.REVOKED and old_info.revoked_at == world.clock.now
    refused = use(world, old.secret)
    assert isinstance(refused, Refusal) and refused.reason is Reason.REVOKED
    with pytest.raises(KeyNotRotatable):
        world.manager.rotate("alice", old.info.key_id)


def test_an_old_key_that_expired_meanwhile_stays_expired(world: World) -> None:
    """The replacement's first use never turns an Expired key into a Revoked one."""
    old = world.manager.create("alice", name="x", scope=TENANT_SCOPE, expiry=Lifetime.HOURS_3)
    world.clock.advance(timedelta(hours=2))
    new = world.manager.rotate("alice", old.info.key_id, revoke_old_on_first_use=True)
    world.clock.advance(timedelta(hours=2))  # the old key expired an hour ago; the new works
    assert isinstance(use(world, new.secret), Principal)
    old_info = infos(world)[old.info.key_id]
    assert (old_info.status, old_info.revoked_at) == (Status.EXPIRED, None)


def test_revoke_reports_the_link(world: World) -> None:
    """revoke() answers with the key's rotation, as list() shows it."""
    old = world.manager.create("alice", name="x", scope=TENANT_SCOPE)
    new = world.manager.rotate("alice", old.info.key_id)
    assert isinstance(use(world, new.secret), Principal)
    revoked = world.manager.revoke("alice", old.info.key_id)
    assert (revoked.replaced_by, revoked.replacement_first_used_at) == (
        new.info.key_id,
        world.clock.now,
    )


class ForgetfulStore(MemoryKeyStore):
    """A custom store written before rotation: it drops the link and the creator's choice."""

    def add_key(self, key: ApiKey) -> None:
        super().add_key(attrs.evolve(key, replaces=None, revoke_old_on_first_use=False))


def test_a_store_that_drops_the_rotation_is_refused_and_its_new_key_revoked() -> None:
    """The creator's choice is never silently lost: rotate() reads the new key back, and if
    the store did not keep the link, revokes the new key and says what the store lacks."""
    world = make_world()
    store = ForgetfulStore()
    manager = KeyManager(store, world.membership, clock=world.clock)
    old = manager.create("alice", name="x", scope=TENANT_SCOPE)
    with pytest.raises(KeyNotRotatable, match="ForgetfulStore does not keep rotations"):
        manager.rotate("alice", old.info.key_id, revoke_old_on_first_use=True)
    statuses = sorted(info.status.value for info in manager.list("alice"))
    assert statuses == ["Active", "Revoked"]  # the old key works; the unlinked one does not
