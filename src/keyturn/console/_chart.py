"""The usage chart of a key in the console's list: view data for an inline SVG.

The page draws it on the server (``_usage.html``): no script, no inline style (the console's
CSP forbids both), colours from ``console.css`` by class. One bar per day, oldest on the
left: accepted requests from the baseline up, refusals stacked above them. The chart is an
image with a text name (its ``<title>``) that says what it shows in words; each bar has a
``<title>`` of its own, the tooltip of that day.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, timedelta
from typing import Final

import attrs

from keyturn.usage import KeyUsage

__all__ = ["CHART_DAYS", "Bar", "Chart", "chart", "window"]

CHART_DAYS: Final = 30
HEIGHT: Final = 28  # the SVG's height, pixels
STEP: Final = 4  # pixels per day: a 3-pixel bar and a 1-pixel gap


@attrs.frozen(kw_only=True)
class Bar:
    """One day: where its two stacked rectangles are, and its tooltip."""

    x: int
    accepted_y: int
    accepted_height: int
    refused_y: int
    refused_height: int
    label: str  # "2026-11-20: 310 accepted, 2 refused"


@attrs.frozen(kw_only=True)
class Chart:
    """What ``_usage.html`` draws for one key."""

    width: int
    height: int
    bars: Sequence[Bar]
    title: str  # the chart's text name
    accepted: int
    refused: int
    reasons: str  # "revoked 2, org_not_found 1", or ""


def window(today: date, days: int = CHART_DAYS) -> tuple[date, date]:
    """The first and last day a chart of *days* days ending *today* shows."""
    return today - timedelta(days=days - 1), today


def _height(value: int, top: int, room: int) -> int:
    # Any request at all is at least one pixel high: a quiet day is not an empty one.
    return 0 if value <= 0 else max(1, round(value * room / top))


def chart(name: str, usage: KeyUsage) -> Chart:
    """The chart of *usage*, the counts of the key named *name*."""
    totals = [a + r for a, r in zip(usage.accepted, usage.refused, strict=True)]
    top = max(totals, default=0)
    room = HEIGHT - 1  # the baseline stays visible
    bars = []
    for index, (day, accepted, refused) in enumerate(
        zip(usage.days, usage.accepted, usage.refused, strict=True)
    ):
        # The bar's height follows the day's total, so a busier day is never lower; the
        # refusals take their share of it, at least a pixel, leaving one to the accepted.
        height = _height(accepted + refused, top, room)
        refused_height = min(_height(refused, top, room), height - (1 if accepted else 0))
        if height == 1 and refused > accepted:  # one pixel: the larger count has it
            refused_height = 1
        accepted_height = height - refused_height
        accepted_y = HEIGHT - 1 - accepted_height
        bars.append(
            Bar(
                x=index * STEP,
                accepted_y=accepted_y,
                accepted_height=accepted_height,
                refused_y=accepted_y - refused_height,
                refused_height=refused_height,
                label=f"{day.isoformat()}: {accepted:,} accepted, {refused:,} refused",
            )
        )
    days = len(usage.days)
    title = (
        f"Requests with “{name}” in the last {days} days: {usage.total_accepted:,} accepted, "
        f"{usage.total_refused:,} refused"
    )
    if top:
        busiest = usage.days[totals.index(top)]
        title += f"; busiest day {busiest.isoformat()} with {top:,}"
    return Chart(
        width=days * STEP,
        height=HEIGHT,
        bars=bars,
        title=title + ".",
        accepted=usage.total_accepted,
        refused=usage.total_refused,
        reasons=", ".join(f"{reason} {n:,}" for reason, n in usage.reasons.items()),
    )
