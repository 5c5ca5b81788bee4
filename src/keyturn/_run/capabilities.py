"""What a store, a provider or a hook can do, read once: keyturn's only look at them.

Whether an object is async, never blocks or bounds its own calls, which of keyturn's
optional methods it has, and whether keyturn may take a shortcut past asking it step by
step: each is read here, once, into a frozen :class:`Capabilities` its owner (the
:class:`~keyturn.Authenticator`, the managers, the leak responder, the usage recorder)
computes when it is built and hands on to what it builds (the payload guard, the usage
recorder, the notifier, the console). Nothing else in keyturn asks a store, a provider or
a hook what it is (``tests/hygiene/test_capabilities.py`` holds it).

How a step is asked follows from it, with one caller per store or provider
(:meth:`Capabilities.caller`):

- :class:`InPlace`: a sync object that says it never blocks (``nonblocking = True``) is
  asked where the driver runs: no thread hop, no timer;
- :class:`Blocking`: a sync object that may block runs on a pool of threads under an async
  driver, and under a sync one in place -- on the pool too when a deadline must be enforced
  for it (it does not say ``enforces_timeout = True``);
- :class:`Awaited`: an async object is awaited under the deadline.

A caller answers with :meth:`Caller.call` (sync drivers) or :meth:`Caller.call_async`
(async drivers), always checked against the step's ``answers``.

The shortcuts (:func:`shortcuts`) follow one rule: host code is never bypassed. keyturn's
own stores offer a *combined read* (``lookup``/``lookup_cached``: every question of a
request answered from the tables at once, membership included) and *change numbers*
(``changes()``, ``stores/_versions.py``, which let the memo give an answer back while
nothing it read has changed). Both read keyturn's tables, not the methods: a host that
overrides ``get_role`` in a subclass, wraps keyturn's provider in one of its own, or patches
``get_key`` on the object would never be asked. So both are taken only from keyturn's own
classes answering with their own methods; anything else is asked step by step.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import Any, Final

import attrs

from keyturn._core.steps import Step, WrongAnswer
from keyturn.errors import ActivityNotKept
from keyturn.stores._async import AsyncSQLKeyStore, AsyncSQLMembership
from keyturn.stores._sync import SQLKeyStore, SQLMembership
from keyturn.stores._versions import Versions
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership

__all__ = [
    "RECORD",
    "Awaited",
    "Blocking",
    "Caller",
    "Capabilities",
    "Changes",
    "InPlace",
    "Shortcuts",
    "capabilities",
    "checked",
    "is_async_hook",
    "is_coroutine_function",
    "remaining",
    "shortcuts",
]

# Every method keyturn may ask of a key store or a membership provider.
_METHODS: Final = (
    "get_key",
    "lookup",
    "lookup_cached",
    "keys_of",
    "add_key",
    "revoke_key",
    "report_leak",
    "mark_used",
    "count_usage",
    "upgrade_hash",
    "record_event",
    "events_of",
    "events_since",
    "usage_of",
    "unrevoked_keys",
    "claim_notice",
    "release_notice",
    "leaked_keys",
    "changes",
    "get_organization",
    "get_default_organization",
    "get_role",
    "reaches_tenant",
    "organizations_of",
)
# The method whose kind tells an async object from a sync one: the first of these it has.
_PROBES: Final = ("get_key", "get_role", "add_key", "mark_used")
# The record of key actions (keyturn.activity).
RECORD: Final = ("record_event", "events_of", "events_since")

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

# A feed's change numbers, caught up with every write made before the call; ``None`` while
# it cannot say.
Changes = Callable[[], Versions | None]


def is_coroutine_function(function: object) -> bool:
    """Whether calling *function* makes a coroutine: an ``async def`` one (a host's hook)."""
    return inspect.iscoroutinefunction(function)


def is_async_hook(hook: object) -> bool:
    """Whether *hook* is an ``async def`` function, or an object whose ``__call__`` is."""
    return inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(
        getattr(hook, "__call__", None)  # noqa: B004 - its kind, not whether it is callable
    )


@attrs.frozen(eq=False)
class Capabilities:
    """What one store or provider is and can do, read once (:func:`capabilities`)."""

    target: object
    is_async: bool  # its methods are ``async def``
    nonblocking: bool  # a sync object that says it never blocks
    enforces_timeout: bool  # it bounds its own calls
    methods: frozenset[str]  # which of the methods keyturn may ask it has
    # The class of keyturn's it is, if it answers with that class's own methods (none
    # overridden in a subclass, none set on the object): only then are shortcuts taken.
    own: type | None
    database: object | None  # the database it answers from, if it says
    whole_database: bool  # a database (its .keys and .membership), not one of them

    @property
    def name(self) -> str:
        """Its class's name, for messages."""
        return type(self.target).__name__

    def has(self, method: str) -> bool:
        """Whether it has *method*."""
        return method in self.methods

    def missing(self, methods: Iterable[str]) -> list[str]:
        """Those of *methods* it lacks, in their order."""
        return [method for method in methods if method not in self.methods]

    def caller(self, pool: Executor | None = None, timeout: float | None = None) -> Caller:
        """Its caller. *timeout*: the deadline a sync driver must enforce on a blocking
        target with *pool*'s threads (``None``: none; a target with
        ``enforces_timeout = True`` bounds its own calls)."""
        if self.is_async:
            return Awaited(self.target)
        if self.nonblocking:
            return InPlace(self.target)
        bounded = pool is not None and timeout is not None and not self.enforces_timeout
        return Blocking(self.target, pool, bounded=bounded)

    def require_record(self, what: str, also: Iterable[str] = ()) -> None:
        """Raise :class:`~keyturn.activity.ActivityNotKept` unless it keeps the record of
        key actions (and has the methods *also*), which *what* needs."""
        missing = self.missing((*RECORD, *also))
        if missing:
            raise ActivityNotKept(
                f"{what} needs a key store that keeps the record of key actions; "
                f"{self.name} has no {', '.join(missing)}: use one of keyturn's stores, "
                "or add those methods to yours (see keyturn.protocols.RecordKeepingStore)"
            )


def capabilities(target: object) -> Capabilities:
    """What *target*, a store or a provider, is and can do."""
    probe = next((method for method in _PROBES if hasattr(target, method)), None)
    return Capabilities(
        target=target,
        is_async=probe is not None and inspect.iscoroutinefunction(getattr(target, probe)),
        nonblocking=bool(getattr(target, "nonblocking", False)),
        enforces_timeout=bool(getattr(target, "enforces_timeout", False)),
        methods=frozenset(m for m in _METHODS if callable(getattr(target, m, None))),
        own=_own(target, _STORES, _STORE_READS) or _own(target, _MEMBERSHIPS, _MEMBERSHIP_READS),
        database=getattr(target, "database", None),
        whole_database=hasattr(target, "keys") and hasattr(target, "membership"),
    )


def _own(target: object, classes: tuple[type, ...], reads: tuple[str, ...]) -> type | None:
    """The one of keyturn's *classes* *target* is of, if it answers each of *reads* with
    that class's own method."""
    kind = type(target)
    base = next((klass for klass in kind.__mro__ if klass in classes), None)
    if base is None or kind.__getattribute__ is not object.__getattribute__:
        return None
    if any(
        inspect.getattr_static(kind, read, None) is not inspect.getattr_static(base, read, None)
        for read in reads
    ):
        return None  # overridden by a subclass: the host's own answer
    if any(read in getattr(target, "__dict__", {}) for read in reads):
        return None  # patched on the object
    return base


@attrs.frozen
class Shortcuts:
    """What may stand in for asking step by step."""

    # The store's combined read answers for the membership too (one database, both own).
    lookup: bool
    # The change numbers the memo reads: the store's, and the membership's when it is not
    # the same database's; ``None``: no feed to trust, so the memo is off.
    feeds: tuple[Changes, Changes | None] | None


def shortcuts(store: object, membership: object) -> Shortcuts:
    """The shortcuts the decision and the memo may take with *store* and *membership*
    (each the object or its :class:`Capabilities`)."""
    mine = store if isinstance(store, Capabilities) else capabilities(store)
    theirs = membership if isinstance(membership, Capabilities) else capabilities(membership)
    if mine.own not in _STORES or theirs.own not in _MEMBERSHIPS:
        return Shortcuts(lookup=False, feeds=None)
    changes: Changes = getattr(mine.target, "changes")  # noqa: B009 - typed here
    if mine.database is not None and theirs.database is mine.database:
        # One database answers for both: its number counts both.
        return Shortcuts(lookup=mine.has("lookup"), feeds=(changes, None))
    other: Changes = getattr(theirs.target, "changes")  # noqa: B009 - typed here
    return Shortcuts(lookup=False, feeds=(changes, other))


# --- callers -------------------------------------------------------------------------------


def checked(step: Step, answer: Any) -> Any:
    """*answer*, if its type is one *step* may be answered with."""
    if isinstance(answer, step.answers):
        return answer
    raise WrongAnswer(step, answer)


def remaining(deadline: float | None) -> float | None:
    """Seconds left until *deadline* (on the monotonic clock), or ``None`` for no deadline."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class Caller:
    """Asks one object the steps sent its way."""

    is_async = False

    def __init__(self, target: object) -> None:
        self.target = target

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.target!r})"

    def call(self, step: Step, deadline: float | None) -> Any:
        """The checked answer to *step*, from this thread."""
        return checked(step, step.ask(self.target))

    async def call_async(self, step: Step, deadline: float | None) -> Any:
        """The checked answer to *step*, without blocking the event loop."""
        return checked(step, step.ask(self.target))


class InPlace(Caller):
    """A sync object that never blocks: asked in place by every driver."""


class Blocking(Caller):
    """A sync object that may block: on *pool*'s threads under an async driver, and under a
    sync one when *bounded* (a deadline to enforce); in place otherwise. *pool* ``None`` is
    the event loop's default executor (so *bounded* must be false).
    """

    def __init__(self, target: object, pool: Executor | None, *, bounded: bool) -> None:
        super().__init__(target)
        self.pool = pool
        self.bounded = bounded

    def call(self, step: Step, deadline: float | None) -> Any:
        if not self.bounded or deadline is None or self.pool is None:
            return checked(step, step.ask(self.target))
        recalled = step.recall(self.target)  # held already: no thread to watch
        if recalled is not None:
            return recalled
        call = self.pool.submit(step.ask, self.target)
        try:
            return checked(step, call.result(remaining(deadline)))
        except TimeoutError:
            call.cancel()  # if still queued, it must not hit the store once that is back
            raise

    async def call_async(self, step: Step, deadline: float | None) -> Any:
        recalled = step.recall(self.target)  # held already: no thread hop
        if recalled is not None:
            return recalled
        # A wait cut by the timeout cancels the call too, if it is still queued.
        call = functools.partial(contextvars.copy_context().run, step.ask, self.target)
        async with asyncio.timeout(remaining(deadline)):
            answer = await asyncio.get_running_loop().run_in_executor(self.pool, call)
        return checked(step, answer)


class Awaited(Caller):
    """An async object: its answers are awaited, under the deadline."""

    is_async = True

    def call(self, step: Step, deadline: float | None) -> Any:
        raise TypeError(f"{type(self.target).__name__} is async: use the async driver")

    async def call_async(self, step: Step, deadline: float | None) -> Any:
        recalled = step.recall(self.target)  # held already: no coroutine, no timer
        if recalled is not None:
            return recalled
        async with asyncio.timeout(remaining(deadline)):
            return checked(step, await step.ask(self.target))
