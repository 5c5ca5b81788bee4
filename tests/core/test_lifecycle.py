"""Creation rules (D12, D13) and status derivation (D11), with no store involved."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import attrs
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from keyturn import ApiKey, CustomDate, InvalidExpiry, InvalidKeyName, Lifetime, Scope, Status
from keyturn._core.lifecycle import custom_date_bounds, derive_status, expiry_for, validate_name

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
# Zones chosen for their quirks: DST on both hemispheres, midnight inside a DST gap
# (Sao Paulo until 2019, Havana), half-hour and 45-minute offsets, +14 and -11, 30-minute DST.
ZONES = [
    "UTC",
    "Europe/Paris",
    "America/New_York",
    "America/Sao_Paulo",
    "America/Havana",
    "Asia/Kolkata",
    "Asia/Kathmandu",
    "Australia/Lord_Howe",
    "Pacific/Kiritimati",
    "Pacific/Pago_Pago",
    "America/St_Johns",
    "Asia/Tokyo",
]


# --- names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "kept"),
    [
        ("  CI deploys  ", "CI deploys"),
        ("x", "x"),
        ("é" * 100, "é" * 100),
        ("🔑" * 100, "🔑" * 100),
    ],
)
def test_names_are_trimmed_and_counted_in_characters(raw: str, kept: str) -> None:
    """Names are trimmed, and 100 code points are allowed whatever their UTF-8 size."""
    assert validate_name(raw) == kept


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("", "required"),
        ("   \t ", "required"),
        ("x" * 101, "101 characters long; the maximum is 100"),
        ("line\nbreak", "U+000A"),
        ("nul\x00byte", "U+0000"),
        ("bell\x07", "U+0007"),
        ("sep\u2028arator", "U+2028"),
        (None, "must be a string"),
        (b"bytes", "must be a string"),
    ],
)
def test_bad_names_say_what_to_fix(raw: object, says: str) -> None:
    """Empty, too long, control characters or not a string: InvalidKeyName with the fix."""
    with pytest.raises(InvalidKeyName, match=re.escape(says)) as caught:
        validate_name(raw)
    assert isinstance(caught.value, ValueError)


@given(st.text(max_size=120))
def test_a_valid_name_is_short_trimmed_and_printable(raw: str) -> None:
    """Whatever is accepted is trimmed, 1-100 characters, and free of control characters."""
    try:
        name = validate_name(raw)
    except InvalidKeyName:
        return
    assert name == raw.strip()
    assert 1 <= len(name) <= 100
    assert not any(ord(c) < 32 or c == "\x7f" for c in name)


# --- fixed lifetimes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lifetime", "delta"),
    [
        (Lifetime.HOURS_3, timedelta(hours=3)),
        (Lifetime.DAYS_1, timedelta(days=1)),
        (Lifetime.DAYS_7, timedelta(days=7)),
        (Lifetime.DAYS_30, timedelta(days=30)),
        (Lifetime.DAYS_90, timedelta(days=90)),
    ],
)
def test_fixed_lifetimes_are_exact_durations(lifetime: Lifetime, delta: timedelta) -> None:
    """3h, 1d, 7d, 30d and 90d are exact durations from the moment of creation."""
    assert expiry_for(lifetime, NOW) == NOW + delta


@pytest.mark.parametrize("lifetime", list(Lifetime))
def test_lifetimes_stay_exact_when_now_is_in_a_local_zone(lifetime: Lifetime) -> None:
    """D12: from a local time just before a DST change, a lifetime is still exact, in UTC."""
    now = datetime(2026, 3, 28, 12, 0, tzinfo=ZoneInfo("Europe/Paris"))  # spring-forward eve
    expires = expiry_for(lifetime, now)
    assert expires.utcoffset() == timedelta(0)
    assert expires == now.astimezone(UTC) + lifetime.value
    custom = expiry_for(CustomDate(date(2027, 3, 28), "Europe/Paris"), now)
    assert custom == now.astimezone(UTC) + timedelta(days=365)


def test_not_a_lifetime_is_refused() -> None:
    """An expiry that is neither a Lifetime nor a CustomDate gets a typed error."""
    with pytest.raises(InvalidExpiry, match="Lifetime or a CustomDate"):
        expiry_for(timedelta(days=3), NOW)  # type: ignore[arg-type]


# --- custom dates ----------------------------------------------------------------------------


def test_custom_date_expires_at_the_end_of_that_local_day() -> None:
    """A custom date ends at the next local midnight in the user's zone, as UTC."""
    expires = expiry_for(CustomDate(date(2026, 12, 24), "Europe/Paris"), NOW)
    assert expires == datetime(2026, 12, 24, 23, 0, tzinfo=UTC)  # midnight CET = 23:00 UTC


def test_custom_date_before_a_spring_forward() -> None:
    """The day before Paris springs forward still ends at its own midnight (CET, UTC+1)."""
    now = datetime(2027, 3, 1, tzinfo=UTC)
    expires = expiry_for(CustomDate(date(2027, 3, 27), "Europe/Paris"), now)
    assert expires == datetime(2027, 3, 27, 23, 0, tzinfo=UTC)
    expires = expiry_for(CustomDate(date(2027, 3, 28), "Europe/Paris"), now)
    assert expires == datetime(2027, 3, 28, 22, 0, tzinfo=UTC)  # now CEST, UTC+2


def test_midnight_in_a_dst_gap_ends_at_the_first_instant_of_the_next_day() -> None:
    """Sao Paulo skipped 2018-11-04 00:00; the day before ends when 01:00 begins."""
    now = datetime(2018, 10, 1, tzinfo=UTC)
    expires = expiry_for(CustomDate(date(2018, 11, 3), "America/Sao_Paulo"), now)
    assert expires == datetime(2018, 11, 4, 3, 0, tzinfo=UTC)
    assert expires.astimezone(ZoneInfo("America/Sao_Paulo")).hour == 1


def test_tomorrow_is_the_users_tomorrow() -> None:
    """At 23:30 UTC it is already tomorrow in Tokyo: the earliest date moves with the zone."""
    now = datetime(2026, 11, 21, 23, 30, tzinfo=UTC)
    assert custom_date_bounds(now, "UTC")[0] == date(2026, 11, 22)
    assert custom_date_bounds(now, "Asia/Tokyo")[0] == date(2026, 11, 23)
    with pytest.raises(InvalidExpiry, match="2026-11-23 to 2027-11-22"):
        expiry_for(CustomDate(date(2026, 11, 22), "Asia/Tokyo"), now)
    assert expiry_for(CustomDate(date(2026, 11, 22), "UTC"), now) == datetime(
        2026, 11, 23, tzinfo=UTC
    )


@pytest.mark.parametrize(
    "day", [date(2026, 11, 21), date(2026, 11, 20), date(2027, 11, 22), date(1999, 1, 1)]
)
def test_custom_date_outside_tomorrow_to_one_year_is_refused(day: date) -> None:
    """Today, the past and beyond one year from today are refused, naming the range."""
    with pytest.raises(InvalidExpiry, match="2026-11-22 to 2027-11-21 \\(in UTC\\)"):
        expiry_for(CustomDate(day, "UTC"), NOW)


def test_one_year_from_today_is_capped_at_365_days_from_now() -> None:
    """The last allowed date ends at now + 365 days when its midnight would come later."""
    assert expiry_for(CustomDate(date(2027, 11, 21), "UTC"), NOW) == NOW + timedelta(days=365)


def test_one_year_from_a_leap_day() -> None:
    """From 29 February the latest date is 28 February next year."""
    now = datetime(2028, 2, 29, 12, tzinfo=UTC)
    assert custom_date_bounds(now, "UTC") == (date(2028, 3, 1), date(2029, 2, 28))


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "../../etc/passwd", 42])
def test_unknown_time_zone_says_what_to_use(zone: object) -> None:
    """A zone that is not an IANA name is refused with a hint of what is expected."""
    with pytest.raises(InvalidExpiry, match="IANA"):
        expiry_for(CustomDate(date(2026, 12, 1), zone), NOW)  # type: ignore[arg-type]


def test_a_datetime_is_not_a_custom_date() -> None:
    """A custom expiry is a calendar date; a datetime is refused rather than truncated."""
    with pytest.raises(InvalidExpiry, match="calendar date"):
        expiry_for(CustomDate(datetime(2026, 12, 1, tzinfo=UTC), "UTC"), NOW)


@pytest.mark.parametrize("day", [None, ""])
def test_an_empty_custom_date_is_refused(day: object) -> None:
    """Spec 2: a key cannot be created with an empty custom date."""
    with pytest.raises(InvalidExpiry, match="calendar date"):
        expiry_for(CustomDate(day, "UTC"), NOW)  # type: ignore[arg-type]


@given(
    now=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2037, 12, 31), timezones=st.just(UTC)
    ),
    zone=st.sampled_from(ZONES),
    offset=st.integers(-3, 370),
)
def test_custom_expiry_properties_in_every_zone(now: datetime, zone: str, offset: int) -> None:
    """Accepted dates end at their local day's end (or now + 365 days); others are refused."""
    tz = ZoneInfo(zone)
    today = now.astimezone(tz).date()
    day = today + timedelta(days=offset)
    first, last = custom_date_bounds(now, zone)
    if not first <= day <= last:
        with pytest.raises(InvalidExpiry):
            expiry_for(CustomDate(day, zone), now)
        return
    expires = expiry_for(CustomDate(day, zone), now)
    assert expires.utcoffset() == timedelta(0)
    assert now < expires <= now + timedelta(days=365)
    tick = timedelta(microseconds=1)
    if expires < now + timedelta(days=365):
        # The last instant of validity is still on *day*, locally; expiry is the next day.
        assert (expires - tick).astimezone(tz).date() == day
        assert expires.astimezone(tz).date() == day + timedelta(days=1)
    else:
        assert (expires - tick).astimezone(tz).date() <= day


@given(
    zone=st.sampled_from(ZONES),
    now=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2037, 1, 1), timezones=st.just(UTC)
    ),
)
def test_bounds_are_tomorrow_and_one_year_from_today(zone: str, now: datetime) -> None:
    """The first allowed date is tomorrow and the last one year from today, locally."""
    today = now.astimezone(ZoneInfo(zone)).date()
    first, last = custom_date_bounds(now, zone)
    assert first == today + timedelta(days=1)
    assume(not (today.month == 2 and today.day == 29))
    assert last == today.replace(year=today.year + 1)


# --- status ------------------------------------------------------------------------------------


def key(**changes: object) -> ApiKey:
    base = ApiKey(
        key_id="AAAAAAAAAAAA",
        secret_hash="sha256$" + "0" * 64,
        hint="rma_\u2026abcd",
        name="test",
        account_id="alice",
        scope=Scope.tenant("acme"),
        created_at=NOW,
        expires_at=NOW + timedelta(days=30),
    )
    return attrs.evolve(base, **changes)


@pytest.mark.parametrize(
    ("changes", "at", "reaches", "status"),
    [
        ({}, NOW, True, Status.ACTIVE),
        ({}, NOW, False, Status.INACTIVE),
        ({}, NOW + timedelta(days=30), True, Status.EXPIRED),  # valid while now < expires_at
        ({}, NOW + timedelta(days=30) - timedelta(microseconds=1), True, Status.ACTIVE),
        ({}, NOW + timedelta(days=31), False, Status.EXPIRED),  # expiry outranks inactivity
        ({"revoked_at": NOW}, NOW, True, Status.REVOKED),
        ({"revoked_at": NOW}, NOW + timedelta(days=99), False, Status.REVOKED),  # final
    ],
)
def test_status_derivation(
    changes: dict[str, object], at: datetime, reaches: bool, status: Status
) -> None:
    """Revoked and Expired are final; Inactive only while the creator cannot reach the scope."""
    assert derive_status(key(**changes), at, reaches_scope=reaches) is status


def test_only_active_and_inactive_are_revocable() -> None:
    """The spec's revoke table: Active and Inactive can be revoked, the others cannot."""
    assert {s for s in Status if s.revocable} == {Status.ACTIVE, Status.INACTIVE}


def test_naive_datetimes_are_refused_in_records() -> None:
    """A key record with a naive datetime is refused: instants are always UTC-aware."""
    with pytest.raises(ValueError, match="timezone-aware"):
        key(expires_at=datetime(2027, 1, 1))
