"""A real key found where it must not be: what is recorded, and what is said.

The leak responder (a code host's report) and the payload guard (a key in a request body)
find keys, check them as the decision does, and record each real one with
:func:`record_leak`: the leak on the key (its first report's place and time), the revoke if
asked for, both in the record of key actions of a store that keeps one, and one warning in
the log, naming the key by id, never by its secret. No I/O: it yields steps.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from datetime import datetime
from typing import Any

import attrs

from keyturn._core.events import Action, By, new_event
from keyturn._core.model import ApiKey
from keyturn._core.steps import RecordEvent, ReportLeak, RevokeKey, Step

__all__ = ["Finder", "record_leak"]


@attrs.frozen
class Finder:
    """Who finds leaked keys: as the record of key actions names it, and where it logs."""

    by: By
    revoked_because: str  # the detail of the revoke it makes, in the record
    log: logging.Logger


def record_leak(
    key: ApiKey,
    place: str,
    where: str,
    now: datetime,
    finder: Finder,
    *,
    revoke: bool,
    events: bool,
) -> Generator[Step, Any, tuple[bool, bool]]:
    """Record *key* as leaked at *place* (kept on the key), and revoke it if *revoke*;
    *events*: the store keeps the record of key actions. *where*: how the log line names
    where it was found. Returns whether this was the key's first report, and whether it
    revoked the key.
    """
    first = bool((yield ReportLeak(key.key_id, place, now)))
    revoked = bool(revoke and (yield RevokeKey(key.key_id, now)))
    if events:
        # Every report is recorded, a batch sent again after a 503 too: never lost.
        recorded = [new_event(key, Action.LEAK_REPORTED, now, finder.by, detail=place)]
        if revoked:
            recorded.append(
                new_event(key, Action.AUTO_REVOKED, now, finder.by, detail=finder.revoked_because)
            )
        for event in recorded:
            yield RecordEvent(event)
    finder.log.warning(
        "key %s of account %r was found in %s and is recorded as leaked%s%s",
        key.key_id,
        key.account_id,
        where,
        "" if first else " (it already was)",
        "; revoked" if revoked else "",
    )
    return first, revoked
