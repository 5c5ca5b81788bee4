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
     at its expiry, so it holds while ``now < expires_at``. With the default clock the memo
     reads ``time.time()`` against the expiry less a millisecond (the decision's
     ``datetime.now(UTC)`` is that time, rounded to the microsecond): it stops answering
     just before the decision would, never after.

   The application's role policy is no input: it runs on every request the memo answers
   (:func:`~keyturn._decision.police`, the decision's own step 4).
2. Only principals are kept (and the principal the policy refused). Refusals are decided
   afresh: a flood of bad keys costs the memo nothing and evicts nothing.
3. Used only where both the store and the provider have a change feed keyturn can trust:
   keyturn's own classes, answering the decision's questions with their own methods
   (:func:`~keyturn._shortcuts.shortcuts`, the one rule, decides). A subclass that answers
   one its own way (a host's rule, a test double) or a host provider: every request is
   decided, since its answers can change unseen.
4. Bounded: past its size, the oldest answer goes.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Final

from keyturn._decision import AuthRequest
from keyturn._fork import renew_in_child
from keyturn._model import Clock, Principal, utc_now
from keyturn._shortcuts import Changes
from keyturn.errors import PermissionDenied, Reason, Refusal

__all__ = ["Memo", "Ticket"]

# Where a request's answer is kept: the keyed digest of its Authorization line, and its
# organization values (a tuple, as the adapters build it).
Where = tuple[bytes, Sequence[str]]
# What the memo needs to keep the answer to one request: where, and the change numbers
# read before the decision ran.
Ticket = tuple[Where, object]

# Before a key's expiry, by the wall clock, that the memo stops answering (rule 1).
_MARGIN: Final = 0.001  # seconds


def _unknown() -> None:
    return None


class Memo:
    """The decision's answers by request, for one :class:`~keyturn.Authenticator`."""

    def __init__(
        self,
        feeds: tuple[Changes, Changes | None] | None,
        clock: Clock = utc_now,
        max_size: int = 100_000,
    ) -> None:
        self.max_size = max_size
        # The clock the decision reads, or (the default) the wall clock it rounds: cheaper.
        self._wall = clock is utc_now
        self._now: Callable[[], float | datetime] = time.time if self._wall else clock
        # The store's change number, and the membership's when another database answers
        # for it (``_shortcuts.py`` says which feeds may be trusted; none: the memo is off).
        self.enabled = feeds is not None
        self._store, self._membership = feeds if feeds is not None else (_unknown, None)
        # Keyed once per process: the digests name no secret.
        self._keyed = hashlib.blake2s(key=secrets.token_bytes(32), digest_size=16)
        # Where -> (the principal, the change numbers, when it stops holding by self._now)
        self._entries: dict[Where, tuple[Principal, object, Any]] = {}
        self._lock = threading.Lock()
        self.hits = 0  # answers given back: the tests count them
        renew_in_child(self)

    def _after_fork(self) -> None:
        # A lock held at the fork stays held; and a child's stores may count their changes
        # afresh, so a number kept here could come round again meaning another state.
        self._lock = threading.Lock()
        self._entries = {}

    def __repr__(self) -> str:
        return f"Memo(enabled={self.enabled}, size={len(self._entries)})"

    def __len__(self) -> int:
        return len(self._entries)

    def recall(self, request: AuthRequest) -> Principal | Ticket | None:
        """The principal the decision last answered *request*, if it still holds (the
        policy not yet run); else the ticket to :meth:`keep` its answer with, or ``None``
        when the memo cannot serve this request."""
        if not self.enabled:
            return None
        # The change numbers now (read here, not in a helper: the warm path counts calls).
        # A feed that cannot say, or fails, leaves the request to the decision, which then
        # meets the failure itself and answers it.
        try:
            changes: object = self._store()
            if self._membership is not None and changes is not None:
                theirs = self._membership()
                changes = None if theirs is None else (changes, theirs)
        except Exception:
            return None
        if changes is None:
            return None
        try:
            (line,) = request.authorization
            keyed = self._keyed.copy()
            keyed.update(line.encode("ascii"))
            where = (keyed.digest(), request.organization)
            entry = self._entries.get(where)
        except (ValueError, TypeError, AttributeError, UnicodeError):
            # Not the usual request (one ASCII Authorization line, the organization values
            # in a tuple), as the adapters build it: the decision alone answers it.
            return None
        if entry is not None and entry[1] == changes and self._now() < entry[2]:
            self.hits += 1
            return entry[0]
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
        expires_at = principal.expires_at
        if expires_at is None:  # a principal built by hand: it cannot be told to hold
            return
        until = expires_at.timestamp() - _MARGIN if self._wall else expires_at
        where, changes = ticket
        with self._lock:
            self._entries.pop(where, None)  # a kept answer moves to the newest end
            self._entries[where] = (principal, changes, until)
            while len(self._entries) > self.max_size:
                del self._entries[next(iter(self._entries))]  # dicts keep insertion order
