"""The record of key actions and the notice claims: the same on every store keyturn ships.

Each test runs against memory, SQLite, PostgreSQL and async PostgreSQL (see ``backend``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyturn import ApiKey, KeyManager, Status
from keyturn.activity import Action, ActivityNotKept, By, Channel, KeyEvent, new_event
from keyturn.stores.memory import MemoryMembership
from tests.stores.conftest import Backend
from tests.stores.test_contract import RESEARCH, TENANT, make_key, world
from tests.world import Clock

START = datetime(2026, 11, 21, 12, 0, 0, 123456, tzinfo=UTC)


def set_hook(backend: Backend, hook: Any) -> None:
    """Give the store's database (or the memory store) an ``on_event`` hook."""
    native = backend.native_keys
    getattr(native, "database", native).on_event = hook


def manager_at(backend: Backend, clock: Clock) -> KeyManager:
    world(backend)
    return KeyManager(backend.keys, backend.membership, clock=clock)


def test_every_console_action_is_recorded_with_who_and_through_what(backend: Backend) -> None:
    """Create, rotate and revoke each append one event: actor, channel, client, time."""
    clock = Clock(START)
    manager = manager_at(backend, clock)
    by = By.console("alice", client_address="203.0.113.7", user_agent="Mozilla/5.0 (X11)")
    created = manager.create("alice", name="deploys", scope=TENANT, by=by)
    clock.advance(timedelta(minutes=1))
    new = manager.rotate("alice", created.info.key_id, by=by)
    clock.advance(timedelta(minutes=1))
    manager.revoke("alice", created.info.key_id)  # from host code: the library channel
    events = manager.activity("alice")
    assert [(e.action, e.key_id, e.channel, e.actor) for e in events] == [
        (Action.REVOKED, created.info.key_id, Channel.LIBRARY, "alice"),
        (Action.ROTATED, new.info.key_id, Channel.CONSOLE, "alice"),
        (Action.CREATED, created.info.key_id, Channel.CONSOLE, "alice"),
    ]
    assert [e.at for e in events] == [START + timedelta(minutes=m) for m in (2, 1, 0)]
    rotated = events[1]
    assert (rotated.client_address, rotated.user_agent) == ("203.0.113.7", "Mozilla/5.0 (X11)")
    assert rotated.detail == f"replaces {created.info.hint} (key {created.info.key_id})"
    assert (rotated.hint, rotated.name) == (new.info.hint, "deploys")
    assert events[0].client_address is None


def test_an_operator_revoke_names_the_operator_and_the_reason(backend: Backend) -> None:
    """The creator sees on their own record who revoked the key, through the CLI, and why."""
    manager = manager_at(backend, Clock(START))
    created = manager.create("alice", name="deploys", scope=TENANT)
    manager.revoke("alice", created.info.key_id, by=By.operator("root", reason="in a log"))
    revoked = manager.activity("alice")[0]
    assert (revoked.action, revoked.actor, revoked.channel, revoked.detail) == (
        Action.REVOKED,
        "operator root",
        Channel.CLI,
        "in a log",
    )


def test_the_record_shows_only_the_account_s_own_keys(backend: Backend) -> None:
    """alice's record holds alice's keys' events and none of bob's."""
    manager = manager_at(backend, Clock(START))
    backend.membership.add_member("bob", "org_default", role="member")
    manager.create("alice", name="alice's", scope=TENANT)
    bobs = manager.create("bob", name="bob's", scope=TENANT)
    manager.revoke("bob", bobs.info.key_id)
    assert {e.name for e in manager.activity("alice")} == {"alice's"}
    assert [e.action for e in manager.activity("bob")] == [Action.REVOKED, Action.CREATED]


def test_the_record_outlives_the_key_s_revocation_and_expiry(backend: Backend) -> None:
    """Revoked and expired keys keep their events; nothing done to a key removes one."""
    clock = Clock(START)
    manager = manager_at(backend, clock)
    created = manager.create("alice", name="deploys", scope=RESEARCH)
    manager.revoke("alice", created.info.key_id)
    clock.advance(timedelta(days=400))
    assert manager.list("alice")[0].status is Status.REVOKED
    assert [e.action for e in manager.activity("alice")] == [Action.REVOKED, Action.CREATED]


def test_a_revoke_at_the_replacement_s_first_use_is_recorded(backend: Backend) -> None:
    """The store's usage write that revokes the old key records that, as automatic."""
    clock = Clock(START)
    manager = manager_at(backend, clock)
    old = manager.create("alice", name="deploys", scope=TENANT)
    new = manager.rotate("alice", old.info.key_id, revoke_old_on_first_use=True)
    used = START + timedelta(hours=1)
    backend.keys.mark_used(new.info.key_id, used)
    backend.keys.mark_used(new.info.key_id, used + timedelta(hours=1))  # no second revoke
    automatic = [e for e in manager.activity("alice") if e.action is Action.AUTO_REVOKED]
    assert [(e.key_id, e.at, e.actor) for e in automatic] == [
        (old.info.key_id, used, "keyturn (rotation)")
    ]
    assert automatic[0].detail == f"its replacement, key {new.info.key_id}, was first used"


def test_the_hook_sees_each_event_and_its_failure_loses_nothing(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """on_event gets every recorded event; a hook that raises is logged, and the action
    and its event stand."""
    seen: list[KeyEvent] = []
    set_hook(backend, seen.append)
    manager = manager_at(backend, Clock(START))
    created = manager.create("alice", name="deploys", scope=TENANT)
    assert [e.action for e in seen] == [Action.CREATED]

    def broken(event: KeyEvent) -> None:
        raise RuntimeError("the SIEM is down")

    set_hook(backend, broken)
    with caplog.at_level(logging.ERROR, logger="keyturn.activity"):
        revoked = manager.revoke("alice", created.info.key_id)
    assert revoked.status is Status.REVOKED
    assert [e.action for e in manager.activity("alice")] == [Action.REVOKED, Action.CREATED]
    assert "the on_event hook failed on revoked" in caplog.text


def test_events_since_is_every_account_s_record_oldest_first(backend: Backend) -> None:
    """The export's read: from an instant on, across accounts, oldest first, bounded."""
    keys = [make_key(account_id=a) for a in ("alice", "bob", "carol")]
    for minutes, key in enumerate(keys):
        backend.keys.record_event(
            new_event(key, Action.CREATED, START + timedelta(minutes=minutes))
        )
    assert [e.account_id for e in backend.keys.events_since(None)] == ["alice", "bob", "carol"]
    since = backend.keys.events_since(START + timedelta(minutes=1))
    assert [e.account_id for e in since] == ["bob", "carol"]
    assert [e.account_id for e in backend.keys.events_since(None, 2)] == ["alice", "bob"]
    assert len(backend.keys.events_of("alice", 1)) == 1


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    actor=TEXT.filter(bool),
    address=st.none() | TEXT,
    agent=st.none() | st.text(max_size=700),
    detail=st.none() | TEXT,
    at=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    ),
)
def test_an_event_reads_back_as_it_was_recorded(
    backend: Backend,
    actor: str,
    address: str | None,
    agent: str | None,
    detail: str | None,
    at: datetime,
) -> None:
    """Any actor, client and detail text (clipped and made printable once, on the way in)
    and any instant round-trips exactly."""
    key = make_key()
    by = By(channel=Channel.CONSOLE, actor=actor, client_address=address, user_agent=agent)
    event = new_event(key, Action.REVOKED, at, by, detail=detail)
    backend.keys.record_event(event)
    assert event in backend.keys.events_of("alice", 1000)
    if agent is not None:
        assert len(event.user_agent or "") <= 500


def test_a_notice_is_claimed_once_until_released(backend: Backend) -> None:
    """claim_notice is insert-if-absent per key and notice; a release lets it be claimed again."""
    assert backend.keys.claim_notice("k1", "expires_7d", START) is True
    assert backend.keys.claim_notice("k1", "expires_7d", START) is False
    assert backend.keys.claim_notice("k1", "expires_1d", START) is True
    assert backend.keys.claim_notice("k2", "expires_7d", START) is True
    backend.keys.release_notice("k1", "expires_7d")
    assert backend.keys.claim_notice("k1", "expires_7d", START) is True


def test_unrevoked_keys_are_every_account_s_keys_a_notice_may_concern(backend: Backend) -> None:
    """Not revoked, and not expired before the instant given; every account's."""
    live = make_key(account_id="bob")
    long_gone = make_key(created_at=START - timedelta(days=100))
    revoked = make_key(revoked_at=START)
    for key in (live, long_gone, revoked):
        backend.keys.add_key(key)
    found = backend.keys.unrevoked_keys(START - timedelta(days=30))
    assert [key.key_id for key in found] == [live.key_id]


class HostStore:
    """A host's key store written before the record existed: the four required methods."""

    def __init__(self) -> None:
        self.keys: dict[str, ApiKey] = {}

    def get_key(self, key_id: str) -> ApiKey | None:
        return self.keys.get(key_id)

    def add_key(self, key: ApiKey) -> None:
        self.keys[key.key_id] = key

    def keys_of(self, account_id: str) -> Sequence[ApiKey]:
        return [k for k in self.keys.values() if k.account_id == account_id]

    def revoke_key(self, key_id: str, at: datetime) -> bool:
        return True

    def mark_used(self, key_id: str, at: datetime) -> None:
        pass


def test_a_host_store_without_the_record_works_until_the_record_is_asked_for() -> None:
    """The manager creates and revokes on such a store; only activity() fails, typed."""
    membership = MemoryMembership()
    membership.add_organization("org_default", tenant_id="acme", default=True)
    membership.add_member("alice", "org_default", role="admin")
    manager = KeyManager(HostStore(), membership)
    created = manager.create("alice", name="deploys", scope=TENANT)
    assert manager.list("alice")[0].key_id == created.info.key_id
    with pytest.raises(ActivityNotKept, match="HostStore has no record_event, events_of"):
        manager.activity("alice")
