"""How a store or a provider is asked a step: one caller each, chosen once.

The owner of a store or provider (the :class:`~keyturn.Authenticator`, the usage recorder,
the managers, the leak responder) picks its caller when it is built, with
:func:`caller_for`, which holds keyturn's one "is it async" check (:func:`is_async`):

- :class:`InPlace`: a sync object that says it never blocks (``nonblocking = True``) is
  asked where the driver runs: no thread hop, no timer;
- :class:`Blocking`: a sync object that may block runs on a pool of threads under an async
  driver, and under a sync one in place -- on the pool too when a deadline must be enforced
  for it (it does not say ``enforces_timeout = True``);
- :class:`Awaited`: an async object is awaited under the deadline.

A caller answers with :meth:`Caller.call` (sync drivers) or :meth:`Caller.call_async`
(async drivers), always checked against the step's ``answers``. (The warm path rarely gets
here: a request the memo answers, ``_memo.py``, asks no one.) What to
ask, and what an answer means, is decided elsewhere: this module only carries the question.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import time
from concurrent.futures import Executor
from typing import Any

from keyturn._steps import Step, WrongAnswer

__all__ = [
    "Awaited",
    "Blocking",
    "Caller",
    "InPlace",
    "caller_for",
    "checked",
    "is_async",
    "remaining",
]


def is_async(target: object, probe: str) -> bool:
    """Whether *target* is an async store or provider: its method *probe* is ``async def``."""
    return inspect.iscoroutinefunction(getattr(target, probe, None))


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


def caller_for(
    target: object, probe: str, pool: Executor | None = None, timeout: float | None = None
) -> Caller:
    """The caller of *target*, a store or provider whose method *probe* tells sync from async.

    *timeout*: the deadline a sync driver must enforce on a blocking *target* with *pool*'s
    threads (``None``: none; a target with ``enforces_timeout = True`` bounds its own calls).
    """
    if is_async(target, probe):
        return Awaited(target)
    if getattr(target, "nonblocking", False):
        return InPlace(target)
    bounded = (
        pool is not None and timeout is not None and not getattr(target, "enforces_timeout", False)
    )
    return Blocking(target, pool, bounded=bounded)
