"""The two shortcuts past asking a store and a provider step by step, and the one rule for both.

The decision asks its questions one by one (``get_key``, ``get_role``, ``reaches_tenant``,
...). keyturn's own stores offer two shortcuts: the store's *combined read*
(``lookup``/``lookup_cached``), which answers every question of a request from the
database's tables at once, membership included; and *change numbers* (``changes()``: when
each key, account, organization and tenant last changed, ``stores/_versions.py``), which
let the memo (``_memo.py``) give an answer back while nothing it read has changed.

Both read keyturn's tables, not the methods: a host that overrides ``get_role`` in a
subclass (to refuse suspended accounts, say), wraps keyturn's provider in one of its own,
or overrides ``get_key`` would never be asked, and its rule never applied. So both are
taken only from keyturn's own classes answering with their own methods (none overridden in
a subclass, none set on the object); anything else is asked step by step on every request.
:func:`shortcuts` is the one place that says so, for the Authenticator and its memo.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Final

import attrs

from keyturn.stores._async import AsyncSQLKeyStore, AsyncSQLMembership
from keyturn.stores._sync import SQLKeyStore, SQLMembership
from keyturn.stores._versions import Versions
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership

__all__ = ["Changes", "Shortcuts", "shortcuts"]

# A feed's change numbers, caught up with every write made before the call; ``None`` while
# it cannot say.
Changes = Callable[[], Versions | None]

_STORES: Final = (SQLKeyStore, AsyncSQLKeyStore, MemoryKeyStore)
_MEMBERSHIPS: Final = (SQLMembership, AsyncSQLMembership, MemoryMembership)
# Every method a shortcut stands in for, or reads from: each must be keyturn's own.
_STORE_READS: Final = ("get_key", "lookup", "lookup_cached", "changes")
_MEMBERSHIP_READS: Final = (
    "get_organization",
    "get_default_organization",
    "get_role",
    "reaches_tenant",
    "changes",
)


@attrs.frozen
class Shortcuts:
    """What may stand in for asking step by step."""

    # The store's combined read answers for the membership too (one database, both own).
    lookup: bool
    # The change numbers the memo reads: the store's, and the membership's when it is not
    # the same database's; ``None``: no feed to trust, so the memo is off.
    feeds: tuple[Changes, Changes | None] | None


def _own(target: object, classes: tuple[type, ...], reads: tuple[str, ...]) -> bool:
    """Whether *target* is of one of keyturn's *classes* and answers each of *reads* with
    that class's own method."""
    kind = type(target)
    base = next((klass for klass in kind.__mro__ if klass in classes), None)
    if base is None or kind.__getattribute__ is not object.__getattribute__:
        return False
    if any(
        inspect.getattr_static(kind, read, None) is not inspect.getattr_static(base, read, None)
        for read in reads
    ):
        return False  # overridden by a subclass: the host's own answer
    return not any(read in getattr(target, "__dict__", {}) for read in reads)  # patched


def shortcuts(store: object, membership: object) -> Shortcuts:
    """The shortcuts the decision and the memo may take with *store* and *membership*."""
    if not (
        _own(store, _STORES, _STORE_READS) and _own(membership, _MEMBERSHIPS, _MEMBERSHIP_READS)
    ):
        return Shortcuts(lookup=False, feeds=None)
    database = getattr(store, "database", None)
    shared = database is not None and getattr(membership, "database", None) is database
    mine: Changes = getattr(store, "changes")  # noqa: B009 - typed here
    if shared:  # one database answers for both: its number counts both
        return Shortcuts(lookup=callable(getattr(store, "lookup", None)), feeds=(mine, None))
    theirs: Changes = getattr(membership, "changes")  # noqa: B009 - typed here
    return Shortcuts(lookup=False, feeds=(mine, theirs))
