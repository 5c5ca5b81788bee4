"""Key secrets at rest: SHA-256, and the one-time upgrade of argon2id hashes (D2, D3, D22).

A secret is 28 random base62 characters (about 166 bits): no offline search reaches it,
whatever the hash, so a slow password hash buys nothing and costs a CPU-bound step per key
and process. A key's secret is stored as ``sha256$<hex>`` (:func:`hash_secret`) and checked
with one SHA-256 and a constant-time comparison (:func:`check_secret`): no thread, no cache,
no bound to keep.

Keys made before that hold an argon2id hash. :func:`check_secret` still verifies one, with
argon2-cffi, refusing parameters beyond :data:`HASH_LIMITS` before argon2 allocates
anything (a hostile stored hash cannot make it spend memory or time). The decision then
replaces the stored hash with the SHA-256 one at the key's first successful use, by a
conditional write (the store's ``upgrade_hash``: only while the old hash is still there, so
a concurrent revoke or rotation wins). The legacy path is bounded: one argon2 run at a time
in a process, and a legacy hash that verified is remembered with the SHA-256 hash of its
secret, so that a key is verified by argon2 at most once per process even before (or
without) its upgrade landing. :data:`legacy_verifications` counts the argon2 runs.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from typing import Final

import attrs
from argon2 import Type, extract_parameters
from argon2.exceptions import InvalidHashError, VerificationError
from argon2.low_level import verify_secret

from keyturn._core.fork import renew_in_child
from keyturn.errors import Reason

__all__ = [
    "HASH_LIMITS",
    "PREFIX",
    "HashLimits",
    "check_secret",
    "hash_secret",
    "is_legacy",
    "legacy_verifications",
]

PREFIX: Final = "sha256$"
_LEGACY_PREFIX: Final = "$argon2id$"

# Argon2 verifications run in this process (legacy hashes only): the benchmarks and the
# tests read it as ``keyturn._core.hashing.legacy_verifications``.
legacy_verifications = 0


@attrs.frozen
class HashLimits:
    """The largest argon2 parameters a stored legacy hash may ask for before we refuse to run it."""

    max_memory_kib: int = 64 * 1024
    max_time_cost: int = 8
    max_parallelism: int = 4


HASH_LIMITS: Final = HashLimits()


def hash_secret(secret: str) -> str:
    """What is stored in place of *secret*: ``sha256$`` and the hex SHA-256 of its ASCII."""
    return PREFIX + hashlib.sha256(secret.encode("ascii")).hexdigest()


def is_legacy(secret_hash: str) -> bool:
    """Whether *secret_hash* is an argon2id hash, to be replaced at the key's next use."""
    return secret_hash.startswith(_LEGACY_PREFIX)


def check_secret(secret_hash: str, secret: str) -> Reason | None:
    """``None`` when *secret* matches *secret_hash*; otherwise why not.

    One SHA-256 for a ``sha256$`` hash; a legacy argon2id hash runs argon2 at most once per
    process. Any other stored text is unverifiable, never a match.
    """
    if not secret.isascii():  # no key's secret: never hashed, never a match
        return Reason.WRONG_SECRET
    if secret_hash.startswith(PREFIX):
        return None if _same(hash_secret(secret), secret_hash) else Reason.WRONG_SECRET
    if is_legacy(secret_hash):
        return _LEGACY.check(secret_hash, secret)
    return Reason.UNVERIFIABLE


def _same(computed: str, stored: str) -> bool:
    # Both ASCII: compared in constant time (a stored hash with other characters never matches).
    return stored.isascii() and hmac.compare_digest(computed.encode(), stored.encode())


def _argon2(secret_hash: str, secret: str, limits: HashLimits) -> Reason | None:
    """Verify a legacy argon2id hash, its parameters within *limits* first (counted only
    when argon2 runs)."""
    global legacy_verifications  # the one process-wide counter
    try:
        params = extract_parameters(secret_hash)
    except InvalidHashError:
        return Reason.UNVERIFIABLE
    if (
        params.type is not Type.ID
        or params.memory_cost > limits.max_memory_kib
        or params.time_cost > limits.max_time_cost
        or params.parallelism > limits.max_parallelism
    ):
        return Reason.UNVERIFIABLE
    legacy_verifications += 1
    try:
        verify_secret(secret_hash.encode("ascii"), secret.encode("ascii"), Type.ID)
    except VerificationError:  # includes VerifyMismatchError
        return Reason.WRONG_SECRET
    except (InvalidHashError, UnicodeEncodeError):
        return Reason.UNVERIFIABLE
    return None


class _LegacyHashes:
    """Argon2id hashes verified in this process, each at most once, one run at a time.

    A legacy hash that verified maps to the SHA-256 hash of its secret until its upgrade is
    read back (bounded: past *max_size*, the oldest goes; it costs that key one more argon2
    run, never a refusal). It holds no secret: only what the store will hold.
    """

    def __init__(self, limits: HashLimits = HASH_LIMITS, max_size: int = 10_000) -> None:
        self.limits = limits
        self.max_size = max_size
        self._verified: dict[str, str] = {}  # legacy hash -> hash_secret(its secret)
        self._lock = threading.Lock()
        renew_in_child(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork

    def check(self, secret_hash: str, secret: str) -> Reason | None:
        known = self._verified.get(secret_hash)
        if known is None:
            with self._lock:  # one argon2 run at a time; a concurrent first use waits for it
                known = self._verified.get(secret_hash)
                if known is None:
                    failure = _argon2(secret_hash, secret, self.limits)
                    if failure is not None:
                        return failure
                    known = self._verified[secret_hash] = hash_secret(secret)
                    while len(self._verified) > self.max_size:
                        del self._verified[next(iter(self._verified))]  # oldest first
                    return None
        return None if _same(hash_secret(secret), known) else Reason.WRONG_SECRET


_LEGACY: Final = _LegacyHashes()
