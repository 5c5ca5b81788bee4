"""The one test world of the core, web and adversarial suites, with the one settable clock.

Tenant ``acme``: ``org_main`` (its default), ``org_research``, ``org_secret``; tenant
``globex``: ``org_globex`` (its default). alice is admin in org_main and member in
org_research; bob is admin in org_globex and viewer in org_secret, where alice has no role.
``make_world(keys=True)`` also creates alice's three keys the web tests send.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from keyturn import ApiKey, Authenticator, AuthRequest, KeyManager, Principal, Scope
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership

START = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
TENANT_SCOPE = Scope.tenant("acme")
RESEARCH_SCOPE = Scope.organization("org_research", tenant_id="acme")
MAIN_SCOPE = Scope.organization("org_main", tenant_id="acme")


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: datetime = START) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


class WorldKeyStore(MemoryKeyStore):
    """The memory store, whose records a test may rewrite in place, as a custom store might,
    and with a switch that makes every read fail like a dropped database."""

    broken = False

    def __init__(self) -> None:
        super().__init__()
        self.edits: dict[str, ApiKey] = {}

    def edit(self, key: ApiKey) -> None:
        """From now on, answer *key* for its id, whatever was stored."""
        self.edits[key.key_id] = key

    def get_key(self, key_id: str) -> ApiKey | None:
        if self.broken:
            raise ConnectionError("key store unreachable")
        return self.edits.get(key_id) or super().get_key(key_id)


class WorldMembership(MemoryMembership):
    """The in-memory membership, with a switch that makes role lookups fail."""

    broken = False

    def get_role(self, account_id: str, organization_id: str) -> str | None:
        if self.broken:
            raise ConnectionError("membership provider unreachable")
        return super().get_role(account_id, organization_id)


Policy = Callable[[Principal, AuthRequest], bool]


@attrs.define
class World:
    clock: Clock
    store: WorldKeyStore
    membership: WorldMembership
    manager: KeyManager
    policy: Policy | None = None  # the policy of world.authenticator()
    keys: dict[str, str] = attrs.Factory(dict)  # name -> full key string
    key_ids: dict[str, str] = attrs.Factory(dict)
    calls: list[str] = attrs.Factory(list)  # paths that reached a test app
    audit: list[Any] = attrs.Factory(list)
    authenticators: list[Authenticator] = attrs.Factory(list)

    def authenticator(self, **options: Any) -> Authenticator:
        """An Authenticator over this world; *options* replace its arguments (``store=`` too)."""
        options = {
            "store": self.store,
            "membership": self.membership,
            "clock": self.clock,
            "policy": self.policy,
            "audit": self.audit.append,
            **options,
        }
        authenticator = Authenticator(options.pop("store"), options.pop("membership"), **options)
        self.authenticators.append(authenticator)
        return authenticator


def mistype(key: str) -> str:
    """*key* with one letter of its secret changed: the checksum no longer matches."""
    position = 20
    replacement = "b" if key[position] == "a" else "a"
    return key[:position] + replacement + key[position + 1 :]


def seed(membership: Any) -> None:
    """The world's organizations and roles: tenants acme and globex, alice and bob."""
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_organization("org_research", tenant_id="acme")
    membership.add_organization("org_secret", tenant_id="acme")
    membership.add_organization("org_globex", tenant_id="globex", default=True)
    membership.add_member("alice", "org_main", role="admin")
    membership.add_member("alice", "org_research", role="member")
    membership.add_member("bob", "org_globex", role="admin")
    membership.add_member("bob", "org_secret", role="viewer")


def make_world(*, keys: bool = False, policy: Policy | None = None) -> World:
    clock = Clock()
    store, membership = WorldKeyStore(), WorldMembership()
    seed(membership)
    world = World(clock, store, membership, KeyManager(store, membership, clock=clock), policy)
    if keys:
        scopes = {"tenant": TENANT_SCOPE, "research": RESEARCH_SCOPE, "main": MAIN_SCOPE}
        for name, scope in scopes.items():
            created = world.manager.create("alice", name=name, scope=scope)
            world.keys[name], world.key_ids[name] = created.secret, created.info.key_id
        world.keys["tenant_typo"] = mistype(world.keys["tenant"])
        # Well formed, checksum right, but from another store: unknown here.
        elsewhere = MemoryMembership()
        elsewhere.add_organization("org_x", tenant_id="x", default=True)
        elsewhere.add_member("eve", "org_x", role="admin")
        stranger = KeyManager(MemoryKeyStore(), elsewhere)
        world.keys["unknown"] = stranger.create("eve", name="x", scope=Scope.tenant("x")).secret
    return world


def bearer(secret: str, organization: str | None = None) -> AuthRequest:
    return AuthRequest(
        authorization=(f"Bearer {secret}",),
        organization=() if organization is None else (organization,),
    )
