"""Creation rules, expiry arithmetic and status derivation (spec sections 2, 3, 8). Pure.

- Names (D13): trimmed, 1-100 code points, no control characters.
- Expiry (D12): a fixed :class:`Lifetime` is an exact duration from now. A :class:`CustomDate`
  must lie in [tomorrow, today + 1 year] in the user's IANA time zone and expires at the
  first instant of the next local day, or at now + 365 days if that comes first.
- Status (D11): Revoked and Expired are final; Inactive while the creator does not reach the
  key's scope; Active otherwise. Derived on every use, never stored.
- Rotation (spec section 5): a replacement's recorded use revokes the key it replaces when
  its creator asked for it (:func:`revoked_by_use`), in the same write as the use; its first
  accepted request writes that use before it is answered (:func:`revokes_at_first_use`).
"""

from __future__ import annotations

import re
import unicodedata
from datetime import UTC, date, datetime, time, timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from keyturn._core.model import ApiKey, CustomDate, Lifetime, Status
from keyturn.errors import InvalidExpiry, InvalidKeyName

__all__ = [
    "DEFAULT_LIFETIME",
    "MAX_LIFETIME",
    "MAX_NAME_LENGTH",
    "custom_date_bounds",
    "derive_status",
    "expiry_for",
    "revoked_by_use",
    "revokes_at_first_use",
    "validate_name",
]

MAX_NAME_LENGTH: Final = 100
MAX_LIFETIME: Final = timedelta(days=365)
DEFAULT_LIFETIME: Final = Lifetime.DAYS_30
# Control characters, surrogates and line/paragraph separators cannot sit in a one-line
# label; format characters (zero-width, bidi overrides and isolates) make a label display as
# another text than the one stored (D26).
_FORBIDDEN_CATEGORIES: Final = {
    "Cc": "a control character",
    "Cf": "an invisible format character",
    "Cs": "a surrogate",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}
# Whitespace and Unicode's Default_Ignorable_Code_Point ranges (DerivedCoreProperties.txt),
# and the visible characters that are drawn blank (U+2800 BRAILLE PATTERN BLANK, the Khitan
# filler U+16FE4, U+1D159 MUSICAL SYMBOL NULL NOTEHEAD): characters a display may show as
# nothing. A name made only of them names nothing.
_INVISIBLE: Final = re.compile(
    "[\\s\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\u2800\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U00016fe4"
    "\U0001bca0-\U0001bca3\U0001d159\U0001d173-\U0001d17a\U000e0000-\U000e0fff]+"
)


def validate_name(name: object) -> str:
    """Return the trimmed name, or raise :class:`InvalidKeyName` saying what to fix."""
    if not isinstance(name, str):
        raise InvalidKeyName(f"the key name must be a string, got {type(name).__name__}")
    trimmed = name.strip()
    if not trimmed:
        raise InvalidKeyName("the key name is required: describe where the key is used")
    if len(trimmed) > MAX_NAME_LENGTH:
        raise InvalidKeyName(
            f"the key name is {len(trimmed)} characters long; the maximum is {MAX_NAME_LENGTH}"
        )
    for position, char in enumerate(trimmed, 1):
        kind = _FORBIDDEN_CATEGORIES.get(unicodedata.category(char))
        if kind is not None:
            raise InvalidKeyName(
                f"the key name holds {kind} (U+{ord(char):04X}) at position "
                f"{position}; use printable characters only"
            )
    if _INVISIBLE.fullmatch(trimmed):
        raise InvalidKeyName("the key name shows as nothing: use visible characters")
    return trimmed


def _zone(time_zone: ZoneInfo | str) -> ZoneInfo:
    if isinstance(time_zone, ZoneInfo):
        return time_zone
    if not isinstance(time_zone, str) or not time_zone:
        raise InvalidExpiry(f"time_zone must be an IANA zone name, got {time_zone!r}")
    try:
        return ZoneInfo(time_zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidExpiry(
            f"unknown time zone {time_zone!r}: use an IANA name such as 'Europe/Paris'"
        ) from None


def _one_year_after(day: date) -> date:
    try:
        return day.replace(year=day.year + 1)
    except ValueError:  # 29 February
        return day.replace(year=day.year + 1, day=28)


def custom_date_bounds(now: datetime, time_zone: ZoneInfo | str) -> tuple[date, date]:
    """The first and last custom expiry dates the console offers at *now* in *time_zone*."""
    today = now.astimezone(_zone(time_zone)).date()
    return today + timedelta(days=1), _one_year_after(today)


def expiry_for(choice: Lifetime | CustomDate, now: datetime) -> datetime:
    """The UTC instant at which a key created at *now* with *choice* expires."""
    if now.utcoffset() is not None:
        # In UTC: added to a time in a zone with DST, a day would be a wall-clock one.
        now = now.astimezone(UTC)
    if isinstance(choice, Lifetime):
        return now + choice.value
    if not isinstance(choice, CustomDate):
        raise InvalidExpiry(
            f"expiry must be a Lifetime or a CustomDate, got {type(choice).__name__}"
        )
    if not isinstance(choice.day, date) or isinstance(choice.day, datetime):
        raise InvalidExpiry(f"a custom expiry is a calendar date, got {choice.day!r}")
    zone = _zone(choice.time_zone)
    first, last = custom_date_bounds(now, zone)
    if not first <= choice.day <= last:
        raise InvalidExpiry(
            f"the custom expiry date {choice.day.isoformat()} is outside the allowed range "
            f"{first.isoformat()} to {last.isoformat()} (in {zone.key})"
        )
    # The first instant of the next local day; fold=0 is the earliest: where midnight falls
    # in a DST gap it maps to the transition itself, where it repeats, to the first one.
    end_of_day = datetime.combine(choice.day + timedelta(days=1), time(0), tzinfo=zone)
    return min(end_of_day.astimezone(UTC), now + MAX_LIFETIME)


def derive_status(key: ApiKey, now: datetime, *, reaches_scope: bool) -> Status:
    """The key's status at *now*, given whether its creator still reaches its scope."""
    if key.revoked_at is not None:
        return Status.REVOKED
    if now >= key.expires_at:
        return Status.EXPIRED
    return Status.ACTIVE if reaches_scope else Status.INACTIVE


def revoked_by_use(replacement: ApiKey, old: ApiKey | None, at: datetime) -> bool:
    """Whether a use of *replacement* recorded at *at* revokes *old* (revoked at *at*).

    Yes when *old* is the key *replacement* replaces, its creator asked for it at rotation
    (``revoke_old_on_first_use``), and *old* is neither Revoked nor Expired at *at*: a
    final status stays as it is. A late write (an *at* before the recorded use) is a use
    too. Every store applies this rule in the write that records the use, so both land
    together, across processes: the memory store calls this function, and the SQL stores'
    ``mark_used`` statement (``stores/_sql.py``) is its translation, held to the same
    answers by a property test.
    """
    return (
        old is not None
        and replacement.revoke_old_on_first_use
        and replacement.replaces == old.key_id
        and derive_status(old, at, reaches_scope=True).revocable
    )


def revokes_at_first_use(key: ApiKey) -> bool:
    """Whether accepting *key* now is the first use of a replacement whose creator asked for
    the old key's revoke at it: its use is then written before the request is answered, so
    the old key is refused from the next request on, never a usage write later."""
    return key.revoke_old_on_first_use and key.replaces is not None and key.first_used_at is None
