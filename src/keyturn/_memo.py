"""The memo: the decision's last answer for a request, given back while it provably holds.

Rules of this file (keep them):

1. The memo decides nothing. It keeps the :class:`~keyturn.Principal` that
   :func:`~keyturn._decision.decide` answered for one ``Authorization`` line (by a keyed
   digest: it holds no secret) and one set of ``x-organization-id`` values, and gives it
   back only while every input the decision read is unchanged:

   - the key record, the creator's roles and reach, the organizations: the store and the
     membership provider each say a number, ``changes()``, that moves with every change of
     what the decision reads from them, once caught up with their change feed (SQLite: on
     every call; PostgreSQL: as its listener hears of it, the replica's lag; the memory
     stores: on every write). An answer is kept with the numbers read *before* the
     decision read anything, so an answer that raced a change is never given back;
   - the clock: a kept answer is an Active key's, and a key's status moves with time only
     at its expiry, so it holds while ``now < expires_at``.

   The application's role policy is no input: it runs on every request the memo answers
   (:func:`~keyturn._decision.police`, the decision's own step 4).
2. Only principals are kept (and the principal the policy refused). Refusals are decided
   afresh: a flood of bad keys costs the memo nothing and evicts nothing.
3. Used only where both the store and the provider have a change feed: keyturn's own
   stores, answering the decision's questions themselves (a subclass that answers one its
   own way, as a test double may, has no feed of its own). With a host provider, every
   request is decided: its answers can change unseen.
4. Bounded: past its size, the oldest answer goes.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Final

from keyturn._decision import AuthRequest
from keyturn._model import Principal
from keyturn.errors import PermissionDenied, Reason, Refusal

__all__ = ["Memo", "Ticket"]

Changes = Callable[[], "int | None"]
# What the memo needs to keep the answer to one request: where, and the change numbers
# read before the decision ran.
Ticket = tuple[tuple[bytes, tuple[str, ...]], object]

# The questions the decision may put to each: a change feed counts only its own answers.
_STORE_READS: Final = ("get_key", "lookup", "lookup_cached")
_MEMBERSHIP_READS: Final = (
    "get_organization",
    "get_default_organization",
    "get_role",
    "reaches_tenant",
)


def _changes_of(target: object, reads: tuple[str, ...]) -> Changes | None:
    """*target*'s ``changes``, if it is a keyturn store's and *target* answers every read
    of *reads* with that store's own methods."""
    kind = type(target)
    owner = next((klass for klass in kind.__mro__ if "changes" in vars(klass)), None)
    if owner is None or not owner.__module__.startswith("keyturn.stores."):
        return None  # a host's method of that name may mean anything
    if any(getattr(kind, read, None) is not getattr(owner, read, None) for read in reads):
        return None
    if any(read in getattr(target, "__dict__", ()) for read in (*reads, "changes")):
        return None  # patched on the object itself
    changes: Changes = getattr(target, "changes")  # noqa: B009 - typed here
    return changes


class Memo:
    """The decision's answers by request, for one :class:`~keyturn.Authenticator`."""

    def __init__(self, store: object, membership: object, max_size: int = 100_000) -> None:
        self.max_size = max_size
        database = getattr(store, "database", None)
        shared = database is not None and getattr(membership, "database", None) is database
        self._store = _changes_of(store, _STORE_READS)
        # One database answers for both: its number counts both.
        self._membership = None if shared else _changes_of(membership, _MEMBERSHIP_READS)
        self.enabled = self._store is not None and (shared or self._membership is not None)
        # Keyed once per process, like the verified-token cache: the digests name no secret.
        self._keyed = hashlib.blake2b(key=secrets.token_bytes(32), digest_size=16)
        self._entries: dict[tuple[bytes, tuple[str, ...]], tuple[Principal, object]] = {}
        self._lock = threading.Lock()
        self.hits = 0  # answers given back: the tests count them

    def __repr__(self) -> str:
        return f"Memo(enabled={self.enabled}, size={len(self._entries)})"

    def __len__(self) -> int:
        return len(self._entries)

    def _changes(self) -> object:
        """The change numbers now, or ``None`` when a feed cannot say (or fails: the
        decision then meets the failure itself, and answers it)."""
        assert self._store is not None
        try:
            mine = self._store()
            if self._membership is None:
                return mine
            theirs = self._membership()
        except Exception:
            return None
        return None if mine is None or theirs is None else (mine, theirs)

    def recall(self, request: AuthRequest, now: datetime) -> Principal | Ticket | None:
        """The principal the decision last answered *request*, if it still holds (the
        policy not yet run); else the ticket to :meth:`keep` its answer with, or ``None``
        when the memo cannot serve this request."""
        if not self.enabled:
            return None
        values, organization = request.authorization, request.organization
        # The usual request, as the adapters build it; anything else is simply decided.
        if type(values) is not tuple or len(values) != 1 or type(organization) is not tuple:
            return None
        line = values[0]
        if type(line) is not str or not line.isascii():
            return None
        changes = self._changes()
        if changes is None:
            return None
        keyed = self._keyed.copy()
        keyed.update(line.encode("ascii"))
        where = (keyed.digest(), organization)
        entry = self._entries.get(where)
        if entry is not None:
            principal, kept = entry
            expires_at = principal.expires_at
            if kept == changes and expires_at is not None and now < expires_at:
                self.hits += 1
                return principal
        return (where, changes)

    def keep(self, ticket: Principal | Ticket | None, outcome: Principal | Refusal) -> None:
        """Keep the decision's *outcome* for the request of *ticket* (rule 2)."""
        if not isinstance(ticket, tuple):
            return
        principal: object = outcome
        if isinstance(outcome, PermissionDenied) and outcome.reason is Reason.POLICY:
            principal = outcome.principal  # refused by the policy, which runs every time
        if not isinstance(principal, Principal):
            return
        where, changes = ticket
        with self._lock:
            self._entries.pop(where, None)  # a kept answer moves to the newest end
            self._entries[where] = (principal, changes)
            while len(self._entries) > self.max_size:
                del self._entries[next(iter(self._entries))]  # dicts keep insertion order
