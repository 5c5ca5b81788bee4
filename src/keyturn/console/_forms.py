"""What the console reads from a visit: its forms' values, and where a sign-in may send the
browser next.

The rules about names, lifetimes and dates are the library's (:mod:`keyturn._core.lifecycle`,
:class:`~keyturn.Lifetime`): this module labels the lifetime choices
(:data:`LIFETIME_CHOICES`), asks the library for a custom date's bounds and a choice's
expiry, and sets no bound of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode, urlsplit, urlunsplit
from zoneinfo import TZPATH, ZoneInfo, available_timezones

import attrs

from keyturn._core.lifecycle import custom_date_bounds, expiry_for
from keyturn._core.model import CustomDate, Lifetime, Organization, Scope
from keyturn.console._visit import fields
from keyturn.errors import InvalidExpiry


def _spoken(lifetime: Lifetime) -> str:
    """A lifetime's short form in words: ``3h`` is "3 hours", ``1d`` "1 day"."""
    amount, unit = int(lifetime.label[:-1]), {"h": "hour", "d": "day"}[lifetime.label[-1]]
    return f"{amount} {unit}" + ("" if amount == 1 else "s")


# The library's lifetimes, each under its short form and in words, then a custom date.
LIFETIME_CHOICES: Final[Sequence[tuple[str, str, Lifetime | None]]] = (
    *((lifetime.label, _spoken(lifetime), lifetime) for lifetime in Lifetime),
    ("custom", "Custom date", None),
)
_LIFETIMES: Final = {code: lifetime for code, _, lifetime in LIFETIME_CHOICES}


def _links() -> frozenset[str]:
    """The zone names that are aliases (``L`` lines of ``tzdata.zi``), from the system's time
    zone data or the ``tzdata`` package; none where neither has that file."""
    places: list[Any] = [Path(folder, "tzdata.zi") for folder in TZPATH]
    with contextlib.suppress(ModuleNotFoundError):
        places.append(resources.files("tzdata.zoneinfo").joinpath("tzdata.zi"))
    for index in places:
        if index.is_file():
            lines = index.read_text(encoding="utf-8").splitlines()
            return frozenset(line.split()[2] for line in lines if line.startswith("L "))
    return frozenset()


KNOWN_ZONES: Final = frozenset(z for z in available_timezones() if "/" in z or z == "UTC")
# The time zone list offers canonical zones only (no aliases such as Asia/Calcutta or
# US/Pacific, nor the sign-inverted Etc/GMT+5); a browser that names an alias still gets
# it, first in the list, and the server accepts every zone it knows.
ZONES: Final = tuple(
    sorted({"UTC", *(z for z in KNOWN_ZONES - _links() if not z.startswith("Etc/"))})
)


def safe_next(target: object, default: str = "/") -> str:
    """*target* if it is a path on this site (``/console/rotate?key=...``), else *default*.

    For the ``next`` parameter a sign-in page redirects to: anything that could take a
    browser to another site gives *default* -- a scheme (``https:``, ``javascript:``), a
    network path (``//host``), a backslash (browsers read it as a slash), or a character
    that is not printable (browsers drop tabs and line breaks: a tab between two slashes is
    ``//host`` to them).
    """
    if (
        isinstance(target, str)
        and target.startswith("/")
        and not target.startswith("//")
        and "\\" not in target
        and target.isprintable()
    ):
        return target
    return default


def from_own_origin(headers: Mapping[str, str], origin: str) -> bool:
    """Whether a form POST says it comes from *origin* (``Origin``, ``Sec-Fetch-Site``;
    *headers* with lower-case names). A POST with neither header is refused: fail closed.
    """
    sent = headers.get("origin")
    site = headers.get("sec-fetch-site")
    if sent is None and site is None:
        return False
    # Under Referrer-Policy: no-referrer a browser sends "Origin: null" with its own forms,
    # so "null" is accepted only where Sec-Fetch-Site vouches for the origin.
    if sent is not None and sent not in (origin, "null"):
        return False
    if sent == "null" and site is None:
        return False
    return site is None or site in ("same-origin", "none")


@attrs.frozen(kw_only=True)
class Preview:
    """What the create form shows for a lifetime choice: date bounds, expiry, or a problem."""

    first_day: date | None  # the custom date bounds in the zone, when the zone is known
    last_day: date | None
    expires: str | None  # the resulting expiry, in the zone (else in UTC)
    problem: str | None

    def as_json(self) -> dict[str, str | None]:
        return {
            "min": self.first_day.isoformat() if self.first_day else None,
            "max": self.last_day.isoformat() if self.last_day else None,
            "expires": self.expires,
            "problem": self.problem,
        }


def zone_named(name: str) -> ZoneInfo | None:
    return ZoneInfo(name) if name in KNOWN_ZONES else None


def local_time(at: datetime, zone: ZoneInfo | None) -> str:
    """*at* as the console shows it, in *zone* or else in UTC: ``2026-03-09 08:30 PDT``, and
    a midnight as the end of the day before, ``2027-01-15, end of day CET`` (a custom date
    expires at the end of the day the user picked, which is the next day's first instant)."""
    local = at.astimezone(zone or UTC)
    if (local.hour, local.minute, local.second, local.microsecond) == (0, 0, 0, 0):
        return f"{local.date() - timedelta(days=1)}, end of day {local.strftime('%Z')}"
    return local.strftime("%Y-%m-%d %H:%M %Z")


def expiry_choice(lifetime: str, day: str, zone: ZoneInfo | None) -> Lifetime | CustomDate | str:
    """The expiry the create form's raw values choose, or what is missing from them."""
    if lifetime not in _LIFETIMES:
        return "Choose a lifetime."
    fixed = _LIFETIMES[lifetime]
    if fixed is not None:
        return fixed
    if zone is None:
        return "Choose your time zone: a custom date ends at midnight there."
    if not day:
        return "Choose the custom expiry date."
    try:
        return CustomDate(date.fromisoformat(day), zone)
    except ValueError:
        return "Enter the custom date as YYYY-MM-DD."


def preview(lifetime: str, day: str, time_zone: str, now: datetime) -> Preview:
    """The view data of the create form's lifetime part, from the form's raw values."""
    zone = zone_named(time_zone)
    first, last = custom_date_bounds(now, zone) if zone else (None, None)
    choice = expiry_choice(lifetime, day, zone)
    if isinstance(choice, str):
        return Preview(first_day=first, last_day=last, expires=None, problem=choice)
    try:
        expires = local_time(expiry_for(choice, now), zone)
    except InvalidExpiry:
        problem = f"Choose a date from {first} to {last}."
        return Preview(first_day=first, last_day=last, expires=None, problem=problem)
    return Preview(first_day=first, last_day=last, expires=expires, problem=None)


def scope_value(scope: Scope) -> str:
    return f"{scope.kind.value}:{scope.organization_id or scope.tenant_id}"


def scope_label(scope: Scope) -> str:
    return f"{scope.kind.value.title()} {scope.organization_id or scope.tenant_id}"


def scope_choices(organizations: Sequence[Organization]) -> list[tuple[str, str, Scope]]:
    """Tenants first, each followed by its organizations: ``(value, label, scope)``."""
    choices: list[tuple[str, str, Scope]] = []
    for tenant in dict.fromkeys(org.tenant_id for org in organizations):
        scope = Scope.tenant(tenant)
        choices.append((scope_value(scope), f"Tenant {tenant} (every organization)", scope))
        for org in organizations:
            if org.tenant_id == tenant:
                scope = Scope.organization(org.id, tenant_id=tenant)
                label = f"Organization {org.id}" + (" (default)" if org.is_default else "")
                choices.append((scope_value(scope), label, scope))
    return choices


def with_next(url: str, back: str) -> str:
    """*url* with ``next`` set to *back*, a page of this console: left out if the mount point
    makes it no local path (:func:`safe_next`) or *url* names its own ``next``."""
    parts = urlsplit(url)
    if safe_next(back, "") != back or "next" in fields(parts.query.encode()):
        return url
    query = "&".join(filter(None, (parts.query, urlencode({"next": back}))))
    return urlunsplit(parts._replace(query=query))
