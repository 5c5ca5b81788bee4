"""Argon2id for key secrets, and the verified-token cache that keeps it off the hot path (D2, D3).

The profile: secrets carry about 166 random bits, so no hash speed makes guessing them
feasible; argon2id is defence in depth for a stolen database, not the main barrier. We take
its cheapest sensible setting (8 MiB, one pass, one lane, about 5 ms on a 2-core machine) so
a cold verification and a burst of wrong guesses stay cheap. Stored hashes with parameters
beyond :data:`HASH_LIMITS` are refused before argon2 allocates anything.

The cache maps a keyed BLAKE2b digest of the whole presented token (per-process random key)
to a fingerprint of the stored hash it was verified against. It holds no secret and nothing
that helps guess one. Only successful verifications are added, so failed guesses can neither
evict nor block a real key. A hit skips argon2 only: the key record is still read on every
request (or known unchanged, by the memo's change numbers: ``_memo.py``), so revocation and
expiry act on the very next one.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final

import attrs
from argon2 import PasswordHasher, Type, extract_parameters
from argon2.exceptions import InvalidHashError, VerificationError
from argon2.low_level import verify_secret

from keyturn._fork import renew_in_child
from keyturn.errors import Reason

__all__ = [
    "HASH_LIMITS",
    "KEY_PROFILE",
    "Overloaded",
    "SecretVerifier",
    "VerifiedTokenCache",
    "fingerprint",
    "hash_secret",
]

KEY_PROFILE: Final = PasswordHasher(
    time_cost=1, memory_cost=8 * 1024, parallelism=1, hash_len=32, salt_len=16, type=Type.ID
)


@attrs.frozen
class HashLimits:
    """The largest argon2 parameters a stored hash may ask for before we refuse to run it."""

    max_memory_kib: int = 64 * 1024
    max_time_cost: int = 8
    max_parallelism: int = 4


HASH_LIMITS: Final = HashLimits()


def hash_secret(secret: str) -> str:
    """The encoded argon2id hash that is stored in place of *secret*."""
    return KEY_PROFILE.hash(secret)


def check_secret(secret_hash: str, secret: str, limits: HashLimits = HASH_LIMITS) -> Reason | None:
    """``None`` when *secret* matches; otherwise why not. Runs argon2: call off the event loop."""
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
    try:
        verify_secret(secret_hash.encode("ascii"), secret.encode("ascii"), Type.ID)
    except VerificationError:  # includes VerifyMismatchError
        return Reason.WRONG_SECRET
    except (InvalidHashError, UnicodeEncodeError):
        return Reason.UNVERIFIABLE
    return None


def fingerprint(secret_hash: str) -> str:
    """The tail of the encoded argon2 output: enough to notice that a stored hash changed."""
    return secret_hash[-16:]


class VerifiedTokenCache:
    """A bounded map of tokens that verified, keyed so that it never holds a secret.

    Reads take no lock (a dict lookup is atomic in CPython); writes, which happen once per
    key per process, do. When full, the oldest entry goes first: evicting a key still in use
    costs it one more argon2 run, never a refusal.
    """

    def __init__(self, max_size: int = 100_000) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, got {max_size}")
        self.max_size = max_size
        # Keyed once per process; each digest copies the keyed state instead of re-keying.
        self._keyed = hashlib.blake2b(key=secrets.token_bytes(32), digest_size=16)
        self._entries: dict[bytes, str] = {}
        self._lock = threading.Lock()
        renew_in_child(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"VerifiedTokenCache(size={len(self)}, max_size={self.max_size})"

    def digest(self, token: str) -> bytes:
        keyed = self._keyed.copy()
        keyed.update(token.encode("ascii"))
        return keyed.digest()

    def lookup(self, digest: bytes) -> str | None:
        """The fingerprint the token behind *digest* was verified against, if it ever was."""
        return self._entries.get(digest)

    def add(self, digest: bytes, secret_hash: str) -> None:
        with self._lock:
            self._entries[digest] = fingerprint(secret_hash)
            while len(self._entries) > self.max_size:
                del self._entries[next(iter(self._entries))]  # dicts keep insertion order

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class Overloaded(Exception):
    """More secret verifications are pending than the verifier accepts (overall, for the
    key, or for its account).
    """


class SecretVerifier:
    """Runs argon2 on a small thread pool: bounded, fair, shed past the bounds, single-flight.

    Anyone can mint well-formed keys with wrong secrets for a key id they know, and each
    costs an argon2 run. So the checks in flight are bounded three ways, and a check past a
    bound raises ``Overloaded`` at once (a 503) instead of queueing:

    - at most *max_pending_per_key* (default 2) distinct checks against one stored hash (one
      key);
    - at most *max_pending_per_account* (default 8) for the keys of one account;
    - at most *max_pending* in all.

    A flood aimed at one key or one account thus sheds only its own excess: it holds at most
    its share of the pool, and every other key's first request still finds room. Concurrent
    checks of the same token against the same hash share one argon2 run and one slot. Every
    queue is bounded: the pool's queue by *max_pending*, the counters by the checks in flight.
    """

    def __init__(
        self,
        *,
        max_workers: int | None = None,
        max_pending: int = 64,
        max_pending_per_key: int | None = None,
        max_pending_per_account: int | None = None,
        limits: HashLimits = HASH_LIMITS,
    ) -> None:
        self.max_workers = max_workers or min(4, os.cpu_count() or 1)
        if max_pending < self.max_workers:
            raise ValueError(
                f"max_pending ({max_pending}) must be at least max_workers ({self.max_workers})"
            )
        # Defaults: 2 per key, 8 per account, never more than max_pending.
        if max_pending_per_key is None:
            max_pending_per_key = min(2, max_pending)
        if max_pending_per_account is None:
            max_pending_per_account = min(max(8, max_pending_per_key), max_pending)
        if not 1 <= max_pending_per_key <= max_pending_per_account <= max_pending:
            raise ValueError(
                "need 1 <= max_pending_per_key <= max_pending_per_account <= max_pending, got "
                f"{max_pending_per_key}, {max_pending_per_account}, {max_pending}"
            )
        self.max_pending = max_pending
        self.max_pending_per_key = max_pending_per_key
        self.max_pending_per_account = max_pending_per_account
        self.limits = limits
        self.runs = 0  # argon2 runs started: the benchmarks and tests count them
        self.shed = 0  # checks refused past a bound
        self._after_fork()  # what a forked child makes anew: the pool and its bookkeeping
        renew_in_child(self)

    def _after_fork(self) -> None:
        # The parent's argon2 threads are not in a child, nor will its checks in flight land.
        self._executor = ThreadPoolExecutor(self.max_workers, thread_name_prefix="keyturn-argon2")
        self._in_flight: dict[tuple[bytes, str], Future[Reason | None]] = {}
        self._per_key: dict[str, int] = {}
        self._per_account: dict[str, int] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"SecretVerifier(max_workers={self.max_workers}, max_pending={self.max_pending}, "
            f"in_flight={len(self._in_flight)})"
        )

    def in_flight(self) -> list[str]:
        """The stored hash of each check queued or running now (what the bounds count)."""
        with self._lock:
            return [secret_hash for _, secret_hash in self._in_flight]

    def submit(
        self,
        cache: VerifiedTokenCache,
        digest: bytes,
        secret_hash: str,
        secret: str,
        account: str | None = None,
    ) -> Future[Reason | None]:
        """Start (or join) the check of *secret* against *secret_hash* (a key of *account*).

        A success is added to *cache* before the future resolves, so no later request with
        the same token starts another run.

        :raises Overloaded: a bound is reached (see the class); nothing was queued.
        """
        flight = (digest, secret_hash)
        with self._lock:
            future = self._in_flight.get(flight)
            if future is not None:
                return future
            # A run that landed since the caller looked at the cache already filled it.
            if cache.lookup(digest) == fingerprint(secret_hash):
                future = Future()
                future.set_result(None)
                return future
            if (
                len(self._in_flight) >= self.max_pending
                or self._per_key.get(secret_hash, 0) >= self.max_pending_per_key
                or (
                    account is not None
                    and self._per_account.get(account, 0) >= self.max_pending_per_account
                )
            ):
                self.shed += 1
                raise Overloaded
            future = self._executor.submit(self._check, cache, digest, secret_hash, secret)
            self._in_flight[flight] = future
            _count(self._per_key, secret_hash, 1)
            if account is not None:
                _count(self._per_account, account, 1)
            self.runs += 1
        future.add_done_callback(lambda _: self._land(flight, account))
        return future

    def _check(
        self, cache: VerifiedTokenCache, digest: bytes, secret_hash: str, secret: str
    ) -> Reason | None:
        failure = check_secret(secret_hash, secret, self.limits)
        if failure is None:
            cache.add(digest, secret_hash)
        return failure

    def _land(self, flight: tuple[bytes, str], account: str | None) -> None:
        with self._lock:
            if self._in_flight.pop(flight, None) is not None:
                _count(self._per_key, flight[1], -1)
                if account is not None:
                    _count(self._per_account, account, -1)

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def _count(counts: dict[str, int], name: str, step: int) -> None:
    """Add *step* to the count of *name*; a count back to zero leaves (the dict stays small)."""
    count = counts.get(name, 0) + step
    if count:
        counts[name] = count
    else:
        del counts[name]
