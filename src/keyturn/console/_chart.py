"""The usage chart of a key in the console's list: view data for an inline SVG.

The page draws it on the server (``_usage.html``): no script, no inline style (the console's
CSP forbids both), colours from ``console.css`` by class. One bar per day, oldest on the
left: accepted requests from the baseline up, refusals stacked above them, and the
requests a rate limit refused (``rate_limited``) on top, a series of their own. The chart
is an image with a text name (its ``<title>``) that says what it shows in words; each bar
has a ``<title>`` of its own, the tooltip of that day.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, timedelta
from typing import Final

import attrs

from keyturn.usage import RATE_LIMITED, KeyUsage

__all__ = ["CHART_DAYS", "Bar", "Chart", "chart", "window"]

CHART_DAYS: Final = 30
HEIGHT: Final = 28  # the SVG's height, pixels
STEP: Final = 4  # pixels per day: a 3-pixel bar and a 1-pixel gap


@attrs.frozen(kw_only=True)
class Bar:
    """One day: where its three stacked rectangles are, and its tooltip."""

    x: int
    accepted_y: int
    accepted_height: int
    refused_y: int
    refused_height: int
    limited_y: int
    limited_height: int
    label: str  # "2026-11-20: 310 accepted, 2 refused"


@attrs.frozen(kw_only=True)
class Chart:
    """What ``_usage.html`` draws for one key."""

    width: int
    height: int
    bars: Sequence[Bar]
    title: str  # the chart's text name
    accepted: int
    refused: int  # refused for any reason but a rate limit
    rate_limited: int
    reasons: str  # "revoked 2, org_not_found 1", or "": the reasons of *refused*


def window(today: date, days: int = CHART_DAYS) -> tuple[date, date]:
    """The first and last day a chart of *days* days ending *today* shows."""
    return today - timedelta(days=days - 1), today


def _height(value: int, top: int, room: int) -> int:
    # Any request at all is at least one pixel high: a quiet day is not an empty one.
    return 0 if value <= 0 else max(1, round(value * room / top))


def _split(values: Sequence[int], height: int, top: int, room: int) -> list[int]:
    """The heights of a bar's stacked parts (*values*, lowest first), adding up to
    *height*: each part with requests at least a pixel when there are pixels enough (else
    the largest parts have them), the lowest such part taking what rounding leaves."""
    heights = [0] * len(values)
    shown = [index for index, value in enumerate(values) if value > 0]
    if height < len(shown):
        for index in sorted(shown, key=lambda index: -values[index])[:height]:
            heights[index] = 1
        return heights
    left = height
    for below, index in reversed(list(enumerate(shown))[1:]):
        # Leaves a pixel to each part with requests below this one.
        heights[index] = min(_height(values[index], top, room), left - below)
        left -= heights[index]
    if shown:
        heights[shown[0]] = left
    return heights


def chart(name: str, usage: KeyUsage) -> Chart:
    """The chart of *usage*, the counts of the key named *name*: accepted requests from
    the baseline up, then the refusals, then the requests a rate limit refused."""
    limited = usage.rate_limited
    refused = [r - n for r, n in zip(usage.refused, limited, strict=True)]
    totals = [a + r for a, r in zip(usage.accepted, usage.refused, strict=True)]
    top = max(totals, default=0)
    room = HEIGHT - 1  # the baseline stays visible
    any_limited = any(limited)
    bars = []
    for index, day in enumerate(usage.days):
        parts = (usage.accepted[index], refused[index], limited[index])
        # The bar's height follows the day's total, so a busier day is never lower.
        accepted_height, refused_height, limited_height = _split(
            parts, _height(totals[index], top, room), top, room
        )
        accepted_y = HEIGHT - 1 - accepted_height
        refused_y = accepted_y - refused_height
        label = f"{day.isoformat()}: {parts[0]:,} accepted, {parts[1]:,} refused"
        bars.append(
            Bar(
                x=index * STEP,
                accepted_y=accepted_y,
                accepted_height=accepted_height,
                refused_y=refused_y,
                refused_height=refused_height,
                limited_y=refused_y - limited_height,
                limited_height=limited_height,
                label=label + (f", {parts[2]:,} rate limited" if any_limited else ""),
            )
        )
    days = len(usage.days)
    total_limited = usage.total_rate_limited
    total_refused = usage.total_refused - total_limited
    title = (
        f"Requests with “{name}” in the last {days} days: {usage.total_accepted:,} accepted, "
        f"{total_refused:,} refused"
    )
    if total_limited:
        title += f", {total_limited:,} rate limited"
    if top:
        busiest = usage.days[totals.index(top)]
        title += f"; busiest day {busiest.isoformat()} with {top:,}"
    return Chart(
        width=days * STEP,
        height=HEIGHT,
        bars=bars,
        title=title + ".",
        accepted=usage.total_accepted,
        refused=total_refused,
        rate_limited=total_limited,
        reasons=", ".join(
            f"{reason} {n:,}" for reason, n in usage.reasons.items() if reason != RATE_LIMITED
        ),
    )
