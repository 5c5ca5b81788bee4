"""How a console page is drawn: the Jinja2 templates and what they are given (a key as a
row, :func:`row`), and the texts of the message pages.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

import jinja2
import markupsafe

from keyturn._core.lifecycle import MAX_NAME_LENGTH
from keyturn._core.model import KeyInfo, Status
from keyturn.activity import Action, Channel
from keyturn.console._chart import chart
from keyturn.console._forms import LIFETIME_CHOICES, ZONES, local_time, scope_label
from keyturn.console._visit import HEADERS, Page, Visit
from keyturn.usage import KeyUsage

Header = tuple[str, str]
# A key that still works, older than this and not used for as long: "revoke it?"
UNUSED_FOR: Final = timedelta(days=30)


_STATUS_MARKS: Final = {
    Status.ACTIVE: "✓",
    Status.INACTIVE: "‖",
    Status.EXPIRED: "○",
    Status.REVOKED: "✕",
}
_TEXTS: Final = {  # the message pages' texts, by title
    "API keys cannot manage keys": (
        "An API key can only call the agents API. Sign in to this console to create, list or "
        "revoke keys."
    ),
    "Not found": "There is no such console page.",
    "Method not allowed": "Use the console's forms.",
    "Refused: another site sent this form": (
        "The console only accepts forms sent from its own pages."
    ),
    "Form too large": "That form is too large.",
    "Unsupported form": "Send the console's form.",
    "This form has expired": "Nothing was changed. Go back to your keys and send the form again.",
    "No such key": "You have no key with that id.",
    "No activity is kept": "This service's key store keeps no record of key actions.",
    "Try again in a moment": (
        "Your keys cannot be reached right now. If you were creating a key, look for it in "
        "your list before creating it again."
    ),
}


_AGENT_BROWSERS: Final = (
    ("Edg/", "Edge"),
    ("OPR/", "Opera"),
    ("Firefox/", "Firefox"),
    ("Chrome/", "Chrome"),
    ("Version/", "Safari"),
)
_AGENT_SYSTEMS: Final = (
    ("Android", "Android"),
    ("iPhone", "iOS"),
    ("iPad", "iPadOS"),
    ("Windows", "Windows"),
    ("Mac OS X", "macOS"),
    ("CrOS", "ChromeOS"),
    ("Linux", "Linux"),
)


def short_agent(agent: str) -> str:
    """A ``User-Agent`` as a person names it: ``Firefox 132 on Linux`` for a browser, the first
    product (``curl/8.5.0``) for anything else, at most 60 characters."""
    if agent.startswith("Mozilla/"):
        browser = next(
            ((name, marker) for marker, name in _AGENT_BROWSERS if marker in agent), None
        )
        system = next((name for marker, name in _AGENT_SYSTEMS if marker in agent), None)
        if browser is not None:
            name, marker = browser
            version = re.match(r"\d+", agent.split(marker, 1)[1])
            shown = f"{name} {version[0]}" if version else name
            return f"{shown} on {system}" if system else shown
    first = agent.split(" ", 1)[0]
    return first if len(first) <= 60 else first[:59] + "…"


@jinja2.pass_context
def _time(context: jinja2.runtime.Context, at: datetime) -> markupsafe.Markup:
    """*at* as a ``<time>`` element: the exact instant, shown in the page's ``zone``."""
    element = markupsafe.Markup('<time datetime="{}">{}</time>')
    return element.format(at.isoformat(), local_time(at, context["zone"]))


_TEMPLATES: Final = jinja2.Environment(
    loader=jinja2.PackageLoader("keyturn.console", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_TEMPLATES.globals.update(
    lifetimes=[(code, label) for code, label, _ in LIFETIME_CHOICES],
    zones=ZONES,
    max_name=MAX_NAME_LENGTH,
    statuses=[status.value for status in Status],
    marks=_STATUS_MARKS,
    time=_time,
    action_labels={
        Action.CREATED: "Created",
        Action.ROTATED: "Created by rotation",
        Action.REVOKED: "Revoked",
        Action.AUTO_REVOKED: "Revoked automatically",
        Action.LEAK_REPORTED: "Reported leaked",
        Action.NOTICE_SENT: "Notice sent",
    },
    channel_labels={
        Channel.CONSOLE: "console",
        Channel.CLI: "keyturn command",
        Channel.LEAK_ENDPOINT: "secret scanning",
        Channel.LIBRARY: "this service",
    },
)
_TEMPLATES.filters["scope_label"] = scope_label
_TEMPLATES.filters["short_agent"] = short_agent


def render(
    visit: Visit, template: str, status: int, context: dict[str, Any], *extra: Header
) -> Page:
    """*template* with *context*, and *extra* headers; the header bar names the signed-in
    account unless *context* sets ``account`` to ``None``."""
    html = _TEMPLATES.get_template(template).render(
        {
            "base": visit.base,
            "account": visit.account_id,
            "form_fields": visit.form_fields,
            **context,
        }
    )
    headers = (*HEADERS, ("Content-Type", "text/html; charset=utf-8"), *extra)
    return Page(status, headers, html.encode())


def message(visit: Visit, status: int, title: str, *extra: Header, **context: Any) -> Page:
    """A message page: *title*, and its text from :data:`_TEXTS` unless *context* has one."""
    context = {"title": title, "text": _TEXTS.get(title), **context}
    return render(visit, "message.html", status, context, *extra)


def paired(infos: Sequence[KeyInfo]) -> list[KeyInfo]:
    """*infos* in their order, except that an old key follows its replacement: a rotation
    reads as one pair of rows."""
    shown = {info.key_id for info in infos}
    old_of = {info.replaced_by: info for info in infos if info.replaced_by in shown}
    moved = {old.key_id for old in old_of.values()}
    placed: list[KeyInfo] = []
    for info in infos:
        next_row: KeyInfo | None = None if info.key_id in moved else info
        while next_row is not None:
            placed.append(next_row)
            next_row = old_of.get(next_row.key_id)
    return placed


def time_left(left: timedelta) -> str:
    """``3 days``, ``5 hours``, ``12 minutes``: the largest whole unit, rounded down."""
    seconds = max(int(left.total_seconds()), 0)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return "less than a minute"


def row(
    info: KeyInfo,
    now: datetime,
    keys: Mapping[str, KeyInfo],
    usage: Mapping[str, KeyUsage] | None = None,
    *,
    expiring_within: timedelta,
) -> dict[str, Any]:
    """One key as the templates show it: with its expiry warning (within *expiring_within*),
    its usage chart (from *usage*, when given) and, from *keys* (the account's keys by id),
    the other key of its rotation."""
    new = keys.get(info.replaced_by or "")
    left = info.expires_at - now
    expiring = info.status in (Status.ACTIVE, Status.INACTIVE) and left <= expiring_within
    counts = None if usage is None else usage.get(info.key_id)
    if counts is not None and not counts.total_accepted + counts.total_refused:
        counts = None  # nothing to draw: "Last used" says enough
    return {
        "info": info,
        "old": keys.get(info.replaces or ""),
        "new": new,
        "expiring": f"expires in {time_left(left)}" if expiring else None,
        "chart": None if counts is None else chart(info.name, counts),
        # Still works, has existed long enough to have been used, and nobody used it.
        "unused": info.status.revocable
        and now - info.created_at >= UNUSED_FOR
        and (info.last_used_at is None or now - info.last_used_at >= UNUSED_FOR),
        # Only hides the Rotate button the library would refuse: an Active key whose
        # replacement, if any, no longer works.
        "rotatable": info.status is Status.ACTIVE and (new is None or not new.status.revocable),
    }
