"""The benchmarks' world: tenant ``acme``, organization ``org_main`` (its default), user
``alice`` (admin there), an organization-scoped and a tenant-scoped key; and the tokens of
each refusal path, and fast fake keys for the scale section.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from argon2 import PasswordHasher, Type

from keyturn import ApiKey, KeyManager, Scope
from keyturn._core import token as _token
from keyturn._core.hashing import hash_secret
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership

__all__ = [
    "ACCOUNT",
    "JUNK",
    "ORGANIZATION",
    "OTHER_ORGANIZATION",
    "TENANT",
    "CountingKeyStore",
    "CountingMembership",
    "FakeKeys",
    "Keys",
    "fake_keys",
    "fake_records",
    "fill_membership",
    "key_ids",
    "legacy_key",
    "memory_world",
    "mistype",
    "new_key",
    "seed",
    "unknown_token",
    "wrong_secret",
]

TENANT: Final = "acme"
ORGANIZATION: Final = "org_main"
OTHER_ORGANIZATION: Final = "org_research"
ACCOUNT: Final = "alice"
JUNK: Final = "not-a-key"  # the wrong length: refused before anything else


@dataclass(frozen=True)
class Keys:
    """Full key strings of the world's two keys."""

    organization: str  # scoped to org_main
    tenant: str  # scoped to tenant acme; names its organization in x-organization-id


class CountingKeyStore(MemoryKeyStore):
    """The memory store, counting every key read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get_key(self, key_id: str) -> ApiKey | None:
        self.reads += 1
        return super().get_key(key_id)


class CountingMembership(MemoryMembership):
    """The memory membership, counting every question put to it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def get_organization(self, organization_id: str) -> Any:
        self.calls += 1
        return super().get_organization(organization_id)

    def get_default_organization(self, tenant_id: str) -> Any:
        self.calls += 1
        return super().get_default_organization(tenant_id)

    def get_role(self, account_id: str, organization_id: str) -> str | None:
        self.calls += 1
        return super().get_role(account_id, organization_id)

    def reaches_tenant(self, account_id: str, tenant_id: str) -> bool:
        self.calls += 1
        return super().reaches_tenant(account_id, tenant_id)


def fill_membership(membership: Any) -> None:
    """Tenant acme, its organizations, and alice's roles (any membership with add_*)."""
    membership.add_organization(ORGANIZATION, tenant_id=TENANT, default=True)
    membership.add_organization(OTHER_ORGANIZATION, tenant_id=TENANT)
    membership.add_member(ACCOUNT, ORGANIZATION, role="admin")
    membership.add_member(ACCOUNT, OTHER_ORGANIZATION, role="member")


def seed(store: Any, membership: Any, *, tenant_key: bool = True) -> Keys:
    """Fill *membership* and create alice's keys in *store* (one SHA-256 hash per key)."""
    fill_membership(membership)
    manager = KeyManager(store, membership)
    organization = manager.create(
        ACCOUNT,
        name="bench: organization",
        scope=Scope.organization(ORGANIZATION, tenant_id=TENANT),
    ).secret
    tenant = (
        manager.create(ACCOUNT, name="bench: tenant", scope=Scope.tenant(TENANT)).secret
        if tenant_key
        else ""
    )
    return Keys(organization=organization, tenant=tenant)


def memory_world(*, counting: bool = False) -> tuple[MemoryKeyStore, MemoryMembership, Keys]:
    store = CountingKeyStore() if counting else MemoryKeyStore()
    membership = CountingMembership() if counting else MemoryMembership()
    return store, membership, seed(store, membership)


def new_key(store: Any, membership: Any) -> str:
    """One more organization-scoped key for alice: a key no process has verified yet."""
    manager = KeyManager(store, membership)
    scope = Scope.organization(ORGANIZATION, tenant_id=TENANT)
    return manager.create(ACCOUNT, name="bench: fresh", scope=scope).secret


# keyturn's argon2id profile before SHA-256 (8 MiB, one pass, one lane).
OLD_PROFILE: Final = PasswordHasher(
    time_cost=1, memory_cost=8 * 1024, parallelism=1, hash_len=32, salt_len=16, type=Type.ID
)


def legacy_key(store: Any, membership: Any) -> str:
    """One more key for alice whose store holds an argon2id hash of its secret, as keyturn
    stored it before SHA-256: its first use runs argon2 once and replaces the hash."""
    token = new_key(store, membership)
    key_id, secret = _token.split(token)
    stored = store.get_key(key_id)
    store.upgrade_hash(key_id, stored.secret_hash, OLD_PROFILE.hash(secret))
    return token


# --- the refusal paths --------------------------------------------------------------------


def _with_checksum(body: str) -> str:
    return body + _token._checksum(body)


def mistype(token: str) -> str:
    """*token* with one character of its secret changed: the checksum no longer matches."""
    position = len(_token.PREFIX) + _token.ID_LENGTH + 3
    replacement = "b" if token[position] == "a" else "a"
    return token[:position] + replacement + token[position + 1 :]


def unknown_token() -> str:
    """A well-formed key with a right checksum, whose id no store holds."""
    return _token.generate().token


def wrong_secret(token: str) -> str:
    """The key id of *token* with another secret and a right checksum: its hash says no."""
    id_end = len(_token.PREFIX) + _token.ID_LENGTH
    other = _token.generate().secret
    return _with_checksum(token[:id_end] + other)


# --- many keys, fast ----------------------------------------------------------------------


@dataclass(frozen=True)
class FakeKeys:
    """Keys that all share one secret, so one hash serves them all."""

    secret_hash: str
    secret: str

    def token(self, key_id: str) -> str:
        return _with_checksum(_token.PREFIX + key_id + self.secret)


def fake_keys() -> FakeKeys:
    secret = _token.generate().secret
    return FakeKeys(secret_hash=hash_secret(secret), secret=secret)


def key_ids(count: int, seed: int) -> Iterator[str]:
    """*count* distinct random key ids (base62, 12 characters), reproducibly."""
    rng = random.Random(seed)
    seen: set[str] = set()
    while len(seen) < count:
        key_id = "".join(rng.choices(_token.ALPHABET, k=_token.ID_LENGTH))
        if key_id not in seen:
            seen.add(key_id)
            yield key_id


def fake_records(fakes: FakeKeys, ids: Iterator[str]) -> Iterator[ApiKey]:
    """Organization-scoped keys of alice in org_main, one per id, sharing *fakes*' hash."""
    now = datetime.now(UTC)
    expires = now + timedelta(days=30)
    scope = Scope.organization(ORGANIZATION, tenant_id=TENANT)
    hint = _token.PREFIX + "\u2026" + fakes.secret[-4:]
    for key_id in ids:
        yield ApiKey(
            key_id=key_id,
            secret_hash=fakes.secret_hash,
            hint=hint,
            name="bench: fake",
            account_id=ACCOUNT,
            scope=scope,
            created_at=now,
            expires_at=expires,
        )
