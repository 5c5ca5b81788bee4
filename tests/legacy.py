"""Hashes as keyturn stored them before SHA-256: argon2id, with the profile it used then.

A test that needs an old database (``tests/stores/test_legacy_hashes.py``) or one old key
makes its hash here, with argon2-cffi, exactly as the released versions did.
"""

from __future__ import annotations

from typing import Final

from argon2 import PasswordHasher, Type

from keyturn._core import hashing as _hashing

__all__ = ["OLD_PROFILE", "legacy_hash", "legacy_runs"]

# keyturn's argon2id profile up to the move to SHA-256: 8 MiB, one pass, one lane.
OLD_PROFILE: Final = PasswordHasher(
    time_cost=1, memory_cost=8 * 1024, parallelism=1, hash_len=32, salt_len=16, type=Type.ID
)


def legacy_hash(secret: str) -> str:
    """The argon2id hash an old version stored for *secret*."""
    return OLD_PROFILE.hash(secret)


def legacy_runs() -> int:
    """Argon2 verifications run in this process so far (the process-wide counter)."""
    return _hashing.legacy_verifications
