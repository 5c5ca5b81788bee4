"""A forked child makes anew the threads, pools and locks of keyturn's objects.

A server that loads the app before it forks its workers (gunicorn ``--preload``) copies
every object into each worker, but no thread: the workers of a pool and the usage writer's
thread run in the parent only, so a job handed to them in the child waits forever, and a
lock another thread held at the fork stays held. So each owner of a thread, a pool or a
lock outside ``stores/`` (the stores renew their own) registers with :func:`renew_in_child`,
and in every child its ``_after_fork()`` runs before anything else does. The warm path pays
nothing for it: no process id is read per request.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol

__all__ = ["Renewable", "renew_in_child"]


class Renewable(Protocol):
    def _after_fork(self) -> None:
        """Make anew, in a forked child, what did not survive the fork. Called once per
        child, with no other thread running: nothing here needs a lock."""


_owners: weakref.WeakSet[Renewable] = weakref.WeakSet()  # held weakly: they go as they may


def renew_in_child(owner: Renewable) -> None:
    """Call ``owner._after_fork()`` in every child forked from now on, while *owner* lives."""
    _owners.add(owner)


def _in_child() -> None:
    for owner in list(_owners):
        owner._after_fork()


if hasattr(os, "register_at_fork"):  # every system that forks has it
    os.register_at_fork(after_in_child=_in_child)
