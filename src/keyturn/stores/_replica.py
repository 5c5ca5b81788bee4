"""The replica: what the decision reads, kept in the process and fed by the database.

Rules of this file:

1. The replica answers a lookup (:class:`~keyturn.Found`) only while it is provably
   current: its feed says so (SQLite: checked on every lookup; PostgreSQL: the listener is
   connected and has been since the replica was last emptied). Otherwise, and on any miss,
   the store reads through, in one statement, and keeps what it read.
2. A change the feed reports drops what it touches before the next lookup can read it; a
   write through a store of this process drops it before the write returns. Each change
   is numbered in :attr:`Replica.versions` (``_versions.py``) with the names it touched,
   *after* what it drops is gone: whoever reads the number and then the replica (the memo,
   ``_run/memo.py``, through :meth:`Replica.changes`) reads every change the number counts.
   What a read-through found is kept only if nothing it names changed while it ran, so a
   read that raced a change never outlives it.
3. A change drops only what it touches: a key; an account's roles and reach; an
   organization; a tenant's default (the feed names an organization's tenants and, when it
   appears, goes or moves, its members: schema version 8). Only a reset (the feed may have
   missed changes) empties the replica.
4. Bounded: each table keeps its most recently used entries; ids that name no key are
   kept apart, in a table of their own, and never evict a key.
5. One replica per database per process (:func:`shared`), whichever store objects read
   it: a sync console beside an async API sees one replica. A database is known by what
   it is (the server, the database, the schema keyturn's tables resolve to), never by how
   a URL spells it. A forked child starts empty and not current, with locks of its own.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, TypeVar

from keyturn._core.model import ApiKey, Found, Organization
from keyturn.stores._sql import EVERYTHING, KEY, MEMBERSHIP, ORGANIZATION, TENANT
from keyturn.stores._versions import Name, Versions

__all__ = ["Replica", "shared"]

F = TypeVar("F")
V = TypeVar("V")
_MISSING: Final = object()
MAX_ENTRIES: Final = 100_000


class _Recent(OrderedDict[str, V]):
    """A table that keeps its *size* most recently used entries."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def used(self, name: str, default: object = _MISSING) -> V | object:
        """The entry of *name*, marked as just used; *default* when there is none."""
        try:
            self.move_to_end(name)
        except KeyError:
            return default
        return self.get(name, default)

    def put(self, name: str, value: V) -> None:
        self[name] = value
        self.move_to_end(name)
        while len(self) > self.size:
            self.popitem(last=False)


def read(key_id: str, found: Found) -> tuple[Name, ...]:
    """The names of what a lookup of *key_id* read, as :class:`~keyturn.Found` says."""
    key = found.key
    if key is None:
        return ((KEY, key_id),)
    names = [(KEY, key_id), (MEMBERSHIP, key.account_id), (TENANT, key.scope.tenant_id)]
    if found.asked is not None:
        names.append((ORGANIZATION, found.asked))
    return tuple(names)


class Replica:
    """Keys by id, each account's roles and reach, organizations and tenants' defaults.

    Each table keeps its most recently used entries (:data:`MAX_ENTRIES`); ids that name no
    key (a checksum-valid forgery, a key deleted) are kept in a table of their own, so a
    flood of them never evicts a key in use. The counters are read by the benchmark:
    ``read_throughs`` (lookups the replica could not answer, read from the database) and
    ``resets`` (the replica emptied whole, or every answer kept before made void: the feed
    lost, restarted or behind).
    """

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self.current = False  # set by the feed
        self.versions = Versions()  # what changed when, as this replica heard it
        self.read_throughs = 0
        self.resets = 0
        self._lock = threading.Lock()
        self._empty()

    def _empty(self) -> None:
        size = self.max_entries
        self._keys: _Recent[ApiKey] = _Recent(size)
        self._unknown: _Recent[None] = _Recent(max(1, size // 10))  # ids that name no key
        self._organizations: _Recent[Organization | None] = _Recent(size)
        self._defaults: _Recent[Organization | None] = _Recent(size)  # by tenant
        self._roles: _Recent[dict[str, str | None]] = _Recent(size)  # account -> org -> role
        self._reach: _Recent[dict[str, bool]] = _Recent(size)  # account -> tenant -> reaches

    def __repr__(self) -> str:
        return f"Replica(current={self.current}, keys={len(self._keys)})"

    @property
    def epoch(self) -> int:
        """The number of the last change or reset heard."""
        return self.versions.seq

    def found(self, key_id: str, organization: str | None) -> Found | None:
        """What a lookup of *key_id* naming *organization* would read, or ``None`` when the
        replica cannot say (not current, or something is missing)."""
        if not self.current:
            return None
        key = self._keys.used(key_id)
        if key is _MISSING:
            return Found(key=None, asked=organization) if key_id in self._unknown else None
        assert isinstance(key, ApiKey)
        account, tenant = key.account_id, key.scope.tenant_id
        default = self._defaults.used(tenant)
        reach = self._reach.used(account, {})
        named = None if organization is None else self._organizations.used(organization)
        reaches = reach.get(tenant) if isinstance(reach, dict) else None
        if default is _MISSING or reaches is None or named is _MISSING:
            return None
        assert default is None or isinstance(default, Organization)
        assert named is None or isinstance(named, Organization)
        known = self._roles.used(account, {})
        assert isinstance(known, dict)
        roles: dict[str, str | None] = {}
        for place in (key.scope.organization_id, named and named.id, default and default.id):
            if place:
                role = known.get(place, _MISSING)
                if role is _MISSING:
                    return None
                roles[place] = role
        return Found(
            key=key, asked=organization, named=named, default=default, roles=roles, reaches=reaches
        )

    def changes(self) -> Versions | None:
        """What this replica heard of changes, while it is current; ``None`` while it
        cannot say."""
        versions = self.versions  # first: a reset that makes it current resets it before
        return versions if self.current else None

    def keep(self, key_id: str, found: Found, epoch: int) -> None:
        """Keep what a read-through lookup *found*, unless something it read changed since
        *epoch* (:attr:`epoch` read before the lookup)."""
        self.read_throughs += 1
        with self._lock:
            if not self.current or not self.versions.unchanged(read(key_id, found), epoch):
                return
            key = found.key
            if key is None:
                self._unknown.put(key_id, None)
                return
            self._unknown.pop(key_id, None)
            self._keys.put(key_id, key)
            tenant = key.scope.tenant_id
            if found.asked is not None:
                self._organizations.put(found.asked, found.named)
            self._defaults.put(tenant, found.default)
            roles = self._roles.get(key.account_id) or {}
            self._roles.put(key.account_id, {**roles, **found.roles})
            reach = self._reach.get(key.account_id) or {}
            self._reach.put(key.account_id, {**reach, tenant: found.reaches})

    def changed(self, kind: str, changed_id: str) -> None:
        """Drop what a change of *kind* (``_sql.KEY``, ``MEMBERSHIP``, ``ORGANIZATION``,
        ``TENANT``, ``EVERYTHING``) to *changed_id* touches."""
        if kind == EVERYTHING:  # a table emptied, a log started anew
            self.reset(current=self.current)
            return
        with self._lock:
            if kind == KEY:
                self._keys.pop(changed_id, None)
                self._unknown.pop(changed_id, None)
            elif kind == MEMBERSHIP:
                self._roles.pop(changed_id, None)
                self._reach.pop(changed_id, None)
            elif kind == ORGANIZATION:
                # Its tenant's default and its members' reach come as changes of their own
                # (TENANT, MEMBERSHIP: rule 3); the roles kept for it stay true.
                self._organizations.pop(changed_id, None)
            elif kind == TENANT:
                self._defaults.pop(changed_id, None)
            else:  # a kind this version does not know: it may touch anything
                self._empty()
                self.resets += 1
                self.versions.reset()
                return
            self.versions.moved(((kind, changed_id),))  # last (rule 2)

    def moved(self) -> None:
        """Make every answer kept before void: the caller is about to read the database
        past the feed (PostgreSQL's listener behind), and no answer may outlive what it
        reads. What the replica holds stays: it answers only once the feed caught up."""
        with self._lock:
            self.resets += 1
            self.versions.reset()

    def reset(self, *, current: bool) -> None:
        """Empty the replica (the feed may have missed changes) and say whether it is current."""
        with self._lock:
            self._empty()
            self.current = current
            self.resets += 1
            self.versions.reset()  # last (rule 2)


# --- one replica per database per process ---------------------------------------------------

_lock = threading.Lock()
_shared: dict[tuple[str, ...], tuple[Replica, object, int]] = {}


def shared(database: tuple[str, ...], feed: Callable[[Replica], F]) -> tuple[Replica, F]:
    """The process's replica of *database* (its kind and identity) and its feed, made by
    *feed* on first use; :func:`release` it once per call."""
    with _lock:
        entry = _shared.get(database)
        if entry is None:
            replica = Replica()
            entry = (replica, feed(replica), 0)
        replica, fed, users = entry
        _shared[database] = (replica, fed, users + 1)
        return replica, fed  # type: ignore[return-value]


def release(database: tuple[str, ...], stop: Callable[[F], None]) -> None:
    """One user of *database*'s replica is gone; the last one stops its feed with *stop*."""
    with _lock:
        entry = _shared.get(database)
        if entry is None:
            return
        replica, fed, users = entry
        if users > 1:
            _shared[database] = (replica, fed, users - 1)
            return
        del _shared[database]
    stop(fed)  # type: ignore[arg-type]


def _forget_in_child() -> None:
    # A forked child has none of its parent's threads, and must not use its connections:
    # its replicas start empty and not current, each with a new lock (another thread may
    # have held the old one at the fork); each feed restarts on its next use.
    global _lock
    _lock = threading.Lock()
    for replica, feed, _ in _shared.values():
        replica._lock = threading.Lock()
        replica.versions.renew_lock()
        replica.reset(current=False)
        feed.after_fork()  # type: ignore[attr-defined]


os.register_at_fork(after_in_child=_forget_in_child)
