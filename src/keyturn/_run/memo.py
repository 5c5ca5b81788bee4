"""The memo: the decision's last answer for a request, given back while it provably holds.

Rules of this file (keep them):

1. The memo decides nothing. It keeps the :class:`~keyturn.Principal` that
   :func:`~keyturn._core.decision.decide` answered for one ``Authorization`` line (by a keyed
   digest: it holds no secret) and one set of ``x-organization-id`` values, and gives it
   back only while every input the decision read is unchanged:

   - what it read from the store and the membership provider. To answer a principal the
     decision reads the key; the creator's memberships (its role where the principal is:
     the account); the organization the principal is in (the key's own, or the one the
     header named, whose tenant it checks); and, when the header says ``default``, the
     tenant's default organization. Those are the answer's *names*. Each feed (the
     store's, and the membership's when another database answers for it) says, by
     ``changes()`` (``stores/_versions.py``), when each name last changed, once caught up
     with its change feed (SQLite: on every call; PostgreSQL: as its listener hears of it,
     the replica's lag; the memory stores: on every write). An answer is kept with the
     feed's change number read *before* the decision read anything; it holds while none of
     its names changed after that number and no reset came in (a reset, or a name
     forgotten past the feed's bound, raises the floor past it). So a write elsewhere
     leaves it alone, and an answer that raced a change of what it read is never given
     back. Once checked against a later number, an answer is kept as if read then (it
     provably was the same), so an answer in use stays far above the floor;
   - the clock: a kept answer is an Active key's, and a key's status moves with time only
     at its expiry, so it holds while ``now < expires_at``. With the default clock the memo
     reads ``time.time()`` against the expiry less a millisecond (the decision's
     ``datetime.now(UTC)`` is that time, rounded to the microsecond): it stops answering
     just before the decision would, never after.

   The application's role policy is no input: it runs on every request the memo answers
   (:func:`~keyturn._core.decision.police`, the decision's own step 4).
2. Only principals are kept (and the principal the policy refused). Refusals are decided
   afresh: a flood of bad keys costs the memo nothing and evicts nothing.
3. Used only where both the store and the provider have a change feed keyturn can trust:
   keyturn's own classes, answering the decision's questions with their own methods
   (:func:`~keyturn._run.capabilities.shortcuts`, the one rule, decides). A subclass that answers
   one its own way (a host's rule, a test double) or a host provider: every request is
   decided, since its answers can change unseen.
4. Bounded: past its size, the least recently used answer goes, by a second chance (the
   CLOCK approximation of LRU): a hit sets a flag on its answer, and the oldest answer
   goes round once more instead of going if its flag is set. Moving an answer to the
   newest end on every hit would cost the warm path more than the rest of its look. The
   memo is emptied whole only in a forked child.
5. The warm path is a few dict lookups and no call when nothing changed anywhere; a
   helper runs only when a feed moved. Counters, read by the benchmark: ``hits`` (answers
   given back) and ``redecided`` (kept answers decided afresh because one of their names
   changed, or a reset came in).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Final

from keyturn._core.decision import DEFAULT_ORGANIZATION, AuthRequest
from keyturn._core.fork import renew_in_child
from keyturn._core.model import Clock, Principal, utc_now
from keyturn._run.capabilities import Changes
from keyturn.errors import PermissionDenied, Reason, Refusal
from keyturn.stores._sql import KEY, MEMBERSHIP, ORGANIZATION, TENANT
from keyturn.stores._versions import Name, Versions

__all__ = ["Memo", "Ticket"]

# Where a request's answer is kept: the keyed digest of its Authorization line, and its
# organization values (a tuple, as the adapters build it).
Where = tuple[bytes, Sequence[str]]
# What the memo needs to keep the answer to one request: where, and the change numbers of
# the store's feed and of the membership's (``None``: the store's answers for both), read
# before the decision ran.
Ticket = tuple[Where, int, int | None]
# A kept answer: the principal, when it stops holding by Memo._now, per feed its ticket
# (moved on as it is checked) and its names, and whether it was used since it last came to
# the oldest end. Lists: the tickets and the flag are updated in place.
_PRINCIPAL, _UNTIL, _MINE, _THEIRS, _USED = 0, 1, 2, 4, 6

# Before a key's expiry, by the wall clock, that the memo stops answering (rule 1).
_MARGIN: Final = 0.001  # seconds
_HTTP_WHITESPACE: Final = " \t"


def _unknown() -> None:
    return None


def _still(entry: list[Any], at: int, versions: Versions) -> bool:
    """Whether none of the names *entry* read from *versions* (at ``at + 1``) changed after
    its ticket (at *at*); if so, the ticket moves to the number read first (rule 1)."""
    seq = versions.seq  # first: every change it counts is in place (_versions.py, rule 4)
    if not versions.unchanged(entry[at + 1], entry[at]):
        return False
    entry[at] = seq
    return True


def _names(principal: Principal, organization: Sequence[str]) -> tuple[Name, ...]:
    """What the decision read to answer *principal* (rule 1): the key first, then what the
    membership provider answered."""
    names: list[Name] = [
        (KEY, principal.key_id),
        (MEMBERSHIP, principal.account_id),
        (ORGANIZATION, principal.organization_id),
    ]
    if any(value.strip(_HTTP_WHITESPACE) == DEFAULT_ORGANIZATION for value in organization):
        names.append((TENANT, principal.tenant_id))
    return tuple(names)


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
        # The store's feed, and the membership's when another database answers for it
        # (``_run/capabilities.py`` says which feeds may be trusted; none: the memo is off).
        self.enabled = feeds is not None
        self._store, self._membership = feeds if feeds is not None else (_unknown, None)
        # Keyed once per process: the digests name no secret.
        self._keyed = hashlib.blake2s(key=secrets.token_bytes(32), digest_size=16)
        # Where -> [principal, until, ticket, names, their ticket, their names, used]; in
        # the order kept, or sent round again (rule 4).
        self._entries: OrderedDict[Where, list[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0  # answers given back
        self.redecided = 0  # kept answers decided afresh: something they read changed
        renew_in_child(self)

    def _after_fork(self) -> None:
        # A lock held at the fork stays held; and a child's stores may count their changes
        # afresh, so a number kept here could come round again meaning another state.
        self._lock = threading.Lock()
        self._entries = OrderedDict()

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
        # The feeds now (read here, not in a helper: the warm path counts calls). A feed
        # that cannot say, or fails, leaves the request to the decision, which then meets
        # the failure itself and answers it.
        try:
            mine = self._store()
            if mine is None:
                return None
            theirs = None
            if self._membership is not None:
                theirs = self._membership()
                if theirs is None:
                    return None
        except Exception:
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
        if entry is not None and self._now() < entry[_UNTIL]:
            # Nothing changed anywhere since it was last checked, or nothing it read did.
            if (entry[_MINE] == mine.seq or _still(entry, _MINE, mine)) and (
                theirs is None or entry[_THEIRS] == theirs.seq or _still(entry, _THEIRS, theirs)
            ):
                self.hits += 1
                entry[_USED] = True  # rule 4: a flag, where moving the entry costs 900 instr
                return entry[_PRINCIPAL]  # type: ignore[no-any-return]
            self.redecided += 1
            self._forget(where, entry)
        return (where, mine.seq, None if theirs is None else theirs.seq)

    def _forget(self, where: Where, entry: list[Any]) -> None:
        # A kept answer that no longer holds never will: it goes (unless a newer one took
        # its place meanwhile), so a refusal decided next leaves nothing behind.
        with self._lock:
            if self._entries.get(where) is entry:
                del self._entries[where]

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
        where, mine, theirs = ticket
        names = _names(principal, where[1])
        if theirs is None:  # one database answers for both
            entry = [principal, until, mine, names, None, (), False]
        else:
            entry = [principal, until, mine, names[:1], theirs, names[1:], False]
        with self._lock:
            entries = self._entries
            entries[where] = entry
            entries.move_to_end(where)
            while len(entries) > self.max_size:
                # The oldest goes, unless it was used since it came to this end: then it
                # goes round once more (a second chance; each hit's flag is spent once).
                oldest, kept = entries.popitem(last=False)
                if kept[_USED]:
                    kept[_USED] = False
                    entries[oldest] = kept
