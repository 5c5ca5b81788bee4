"""Usage you can see: per key and UTC day, how many requests were accepted and refused.

The :class:`~keyturn.Authenticator` counts every request it decides for a key of your store
in its own process (one dict increment) and adds the counts to the store with its throttled
``last_used_at`` write (``_run/usage.py``): no store write per request. keyturn's stores keep
them 90 days (:data:`KEPT_DAYS`); the console draws them as a chart per key, and
``keyturn keys list`` as a sparkline of the last seven days.

What is counted against a key:

- every accepted request, as :data:`ACCEPTED`;
- every refusal made once the key's record was found, by its reason
  (:class:`~keyturn.Reason` value: ``wrong_secret``, ``revoked``, ``expired``,
  ``inactive``, ``org_header_missing``, ``org_not_found``, ``policy``, ...), a refusal by
  a rate limit as :data:`RATE_LIMITED` (the console charts those apart).

A refusal made before that names no key of yours: no header, not a key, a mistyped
checksum, an id the store does not hold. Such requests are in the log and the audit hook,
never in a key's counts, so nobody can fill your chart by sending made-up keys.

Read them back with :meth:`~keyturn.UsageStore.usage_of` and summarize them per
key with :func:`by_key`::

    from datetime import UTC, datetime, timedelta
    from keyturn.usage import by_key, sparkline

    today = datetime.now(UTC).date()
    rows = db.keys.usage_of("alice", since=today - timedelta(days=6))
    for key_id, usage in by_key(rows, last_day=today, days=7).items():
        print(key_id, sparkline(usage.accepted), usage.total_accepted)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import date, timedelta
from typing import Final

import attrs

__all__ = [
    "ACCEPTED",
    "KEPT_DAYS",
    "RATE_LIMITED",
    "DailyUsage",
    "KeyUsage",
    "by_key",
    "sparkline",
]

ACCEPTED: Final = "accepted"  # the outcome of a request that passed
RATE_LIMITED: Final = "rate_limited"  # the outcome of a request a rate limit refused (429)
KEPT_DAYS: Final = 90  # days of counts a store keeps, today included
# The levels of a sparkline, lowest first, and what a day without requests shows.
BLOCKS: Final = "▁▂▃▄▅▆▇█"
ASCII_BLOCKS: Final = "_-~=+*#@"
NONE: Final = "·"
ASCII_NONE: Final = "."


@attrs.frozen(kw_only=True)
class DailyUsage:
    """How many requests with one key had one outcome on one UTC day."""

    key_id: str
    day: date
    outcome: str  # ACCEPTED, or the value of the refusal's Reason
    requests: int


@attrs.frozen(kw_only=True)
class KeyUsage:
    """One key's counts over consecutive days, oldest first: what a chart draws."""

    key_id: str
    days: tuple[date, ...]
    accepted: tuple[int, ...]  # per day
    refused: tuple[int, ...]  # per day, every reason together
    reasons: Mapping[str, int] = attrs.field(factory=dict)  # reason -> refusals, all days
    # Per day, the part of refused that a rate limit refused (RATE_LIMITED).
    rate_limited: tuple[int, ...] = attrs.field(
        default=attrs.Factory(lambda self: (0,) * len(self.days), takes_self=True)
    )

    @property
    def total_accepted(self) -> int:
        return sum(self.accepted)

    @property
    def total_refused(self) -> int:
        return sum(self.refused)

    @property
    def total_rate_limited(self) -> int:
        return sum(self.rate_limited)


def by_key(
    rows: Iterable[DailyUsage], *, last_day: date, days: int, key_ids: Iterable[str] = ()
) -> dict[str, KeyUsage]:
    """Each key's counts over the *days* days ending on *last_day*; days outside are left
    out, and a day without a row counts zero. A key without a row in the window is absent,
    unless *key_ids* names it: then it is there with zeros.
    """
    if days < 1:
        raise ValueError(f"days must be at least 1, got {days}")
    first_day = last_day - timedelta(days=days - 1)
    window = tuple(first_day + timedelta(days=n) for n in range(days))
    accepted: dict[str, list[int]] = {}
    refused: dict[str, list[int]] = {}
    limited: dict[str, list[int]] = {}
    reasons: dict[str, dict[str, int]] = {}
    for key_id in key_ids:
        accepted[key_id], refused[key_id], reasons[key_id] = [0] * days, [0] * days, {}
        limited[key_id] = [0] * days
    for row in rows:
        if not first_day <= row.day <= last_day:
            continue
        index = (row.day - first_day).days
        if row.key_id not in accepted:
            accepted[row.key_id], refused[row.key_id] = [0] * days, [0] * days
            limited[row.key_id], reasons[row.key_id] = [0] * days, {}
        if row.outcome == ACCEPTED:
            accepted[row.key_id][index] += row.requests
        else:
            refused[row.key_id][index] += row.requests
            if row.outcome == RATE_LIMITED:
                limited[row.key_id][index] += row.requests
            counted = reasons[row.key_id]
            counted[row.outcome] = counted.get(row.outcome, 0) + row.requests
    return {
        key_id: KeyUsage(
            key_id=key_id,
            days=window,
            accepted=tuple(accepted[key_id]),
            refused=tuple(refused[key_id]),
            reasons=dict(sorted(reasons[key_id].items())),
            rate_limited=tuple(limited[key_id]),
        )
        for key_id in accepted
    }


def sparkline(values: Sequence[int], *, ascii: bool = False) -> str:
    """One character per value, its height relative to the largest: ``·▁▃█``.

    A zero shows as ``·`` (``.`` in ASCII); any count above zero is at least the lowest
    block, so a day with one request never looks like a day with none. With *ascii*, the
    levels are ``_-~=+*#@``, for a terminal that cannot show the blocks.
    """
    levels, none = (ASCII_BLOCKS, ASCII_NONE) if ascii else (BLOCKS, NONE)
    top = max(values, default=0)
    if top <= 0:
        return none * len(values)
    steps = len(levels) - 1  # the largest value reaches the top level, and only it
    return "".join(none if value <= 0 else levels[value * steps // top] for value in values)
