"""The one sync driver and the one async driver: how a flow of steps is run to its end.

A flow (the decision, a manager's operation, the leak responder's, the payload guard's
recording, a usage write) is a generator of steps (``_core/steps.py``), in the style of httpx's
``auth_flow``. A driver sends each step to the caller its ``via`` names and the answer back
into the flow, until the flow returns. The two drivers are the same loop, one awaiting; what
differs between owners is data, their :class:`Conduct`:

- what a failed step does: raised into the flow where it asked (the managers), or the flow
  is closed and the owner's ``fail(step, error)`` is the answer (the decision, whose frame
  holds the key and must never be in a traceback a hook sees; the leak responder; the
  payload guard; the usage recorder);
- how long a step may take: the run's one *deadline*, or, for the callers in ``timeouts``,
  each step its own (the leak responder's store, under the async driver).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, Generic, TypeVar, cast

import attrs

from keyturn._core.steps import Step
from keyturn._run.capabilities import Caller

__all__ = ["Conduct", "Flow", "drive", "drive_async"]

T = TypeVar("T")
R = TypeVar("R", covariant=True)
Flow = Generator[Step, Any, T]
# The callers, by Step.via.
Callers = Sequence[Caller] | Mapping[int, Caller]


@attrs.frozen
class Conduct(Generic[R]):
    """How one owner's flows are driven."""

    # The flow's answer once a step failed and the flow is closed; None: the error is
    # raised into the flow where it asked.
    fail: Callable[[Step, Exception], R] | None = None
    # Seconds each step of these callers (by Step.via) may take, from its own start.
    timeouts: Mapping[int, float] = attrs.field(factory=dict)

    def deadline(self, step: Step, deadline: float | None) -> float | None:
        """*step*'s deadline, in a run due by *deadline*."""
        timeout = self.timeouts.get(step.via)
        return deadline if timeout is None else time.monotonic() + timeout


def drive(flow: Flow[T], callers: Callers, conduct: Conduct[T], deadline: float | None) -> T:
    """Run *flow* to its answer, each step asked in this thread."""
    answer: Any = None
    error: Exception | None = None
    while True:
        try:
            step = flow.send(answer) if error is None else flow.throw(error)
        except StopIteration as done:
            return cast(T, done.value)
        try:
            answer, error = callers[step.via].call(step, conduct.deadline(step, deadline)), None
        except Exception as exc:
            if conduct.fail is not None:
                flow.close()
                return conduct.fail(step, exc)
            answer, error = None, exc


async def drive_async(
    flow: Flow[T], callers: Callers, conduct: Conduct[T], deadline: float | None
) -> T:
    """Run *flow* to its answer, each step awaited (a blocking one in a thread)."""
    answer: Any = None
    error: Exception | None = None
    while True:
        try:
            step = flow.send(answer) if error is None else flow.throw(error)
        except StopIteration as done:
            return cast(T, done.value)
        caller = callers[step.via]
        try:
            answer, error = await caller.call_async(step, conduct.deadline(step, deadline)), None
        except Exception as exc:
            if conduct.fail is not None:
                flow.close()
                return conduct.fail(step, exc)
            answer, error = None, exc
