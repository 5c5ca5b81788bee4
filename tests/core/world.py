"""A small world for the core tests: one tenant with three organizations, a second tenant,
two users and a settable clock (the one clock of the whole test suite)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import attrs

from keyturn import ApiKey, AuthRequest, KeyManager, Scope
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership

START = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
TENANT_SCOPE = Scope.tenant("acme")
RESEARCH_SCOPE = Scope.organization("org_research", tenant_id="acme")
DEFAULT_SCOPE = Scope.organization("org_default", tenant_id="acme")


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: datetime = START) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


class EditableKeyStore(MemoryKeyStore):
    """The memory store, whose records a test may rewrite in place, as a custom store might."""

    def __init__(self) -> None:
        super().__init__()
        self.edits: dict[str, ApiKey] = {}

    def edit(self, key: ApiKey) -> None:
        """From now on, answer *key* for its id, whatever was stored."""
        self.edits[key.key_id] = key

    def get_key(self, key_id: str) -> ApiKey | None:
        return self.edits.get(key_id) or super().get_key(key_id)


@attrs.define
class World:
    clock: Clock
    store: EditableKeyStore
    membership: MemoryMembership
    manager: KeyManager


def make_world() -> World:
    clock = Clock()
    store, membership = EditableKeyStore(), MemoryMembership()
    membership.add_organization("org_default", tenant_id="acme", default=True)
    membership.add_organization("org_research", tenant_id="acme")
    membership.add_organization("org_sales", tenant_id="acme")
    membership.add_organization("org_other_default", tenant_id="globex", default=True)
    membership.add_member("alice", "org_default", role="admin")
    membership.add_member("alice", "org_research", role="member")
    membership.add_member("bob", "org_other_default", role="admin")
    membership.add_member("bob", "org_sales", role="viewer")
    return World(clock, store, membership, KeyManager(store, membership, clock=clock))


def bearer(secret: str, organization: str | None = None) -> AuthRequest:
    return AuthRequest(
        authorization=(f"Bearer {secret}",),
        organization=() if organization is None else (organization,),
    )
