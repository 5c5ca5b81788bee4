"""What the key list shows of rate limits: each Active key's limits and their use now, read
from the host's :class:`~keyturn.ratelimits.RateLimiter` without taking anything; and the
organization the console takes a key to be used in (:func:`works_in`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs

from keyturn._core.model import KeyInfo, Organization, Principal, Scope, Status
from keyturn.ratelimits import Rate, RateLimiter

_log = logging.getLogger("keyturn.console")
_POLICY_LABELS: Final = {"key": "Key", "account": "Account", "organization": "Organization"}


@attrs.frozen(kw_only=True)
class Limits:
    """What the key list shows of rate limits: per Active key id, its limits (an empty
    list: none applies; no entry: no limiter, or a key that makes no request), and
    whether their use could be read and whose requests it counts."""

    rows: Mapping[str, list[dict[str, Any]]] = attrs.field(factory=dict)
    unread: bool = False  # the engine did not answer: limits without their use
    shared: bool = False  # the counts are every instance's, not this process's
    slack: str = ""  # how far a shared count may run ahead of the requests served: "5%"


def works_in(scope: Scope, organizations: Sequence[Organization]) -> Organization | None:
    """The organization the console takes a key of *scope* to be used in (its ``curl``
    line's, its limits'): an organization key's own; for a tenant key, whose requests name
    theirs, the tenant's default organization when the account reaches it, else the
    account's first one there. ``None``: the account reaches none of them."""
    reached = [o for o in organizations if o.tenant_id == scope.tenant_id]
    if scope.organization_id is not None:
        return next((o for o in reached if o.id == scope.organization_id), None)
    return next((o for o in reached if o.is_default), reached[0] if reached else None)


def limits_of(
    limiter: RateLimiter | None,
    account_id: str,
    infos: Sequence[KeyInfo],
    organizations: Sequence[Organization],
    role_of: Callable[[str, str], str | None],
) -> Limits:
    """The limits of the Active keys among *infos* and their use now, as the rows show
    them; nothing without a limiter. Each key is read as the principal of a request in
    the organization it works in by default (:func:`works_in`)."""
    if limiter is None:
        return Limits()
    roles: dict[str, str | None] = {}
    principals: dict[str, Principal] = {}
    for info in infos:
        home = works_in(info.scope, organizations)
        if info.status is not Status.ACTIVE or home is None:
            continue
        if home.id not in roles:
            roles[home.id] = role_of(account_id, home.id)
        role = roles[home.id]
        if role is not None:
            principals[info.key_id] = Principal(
                account_id=account_id,
                key_id=info.key_id,
                key_name=info.name,
                scope=info.scope,
                organization_id=home.id,
                tenant_id=home.tenant_id,
                role=role,
                expires_at=info.expires_at,
            )
    try:
        uses = limiter.uses_of(list(principals.values()))
    except Exception as exc:  # the engine is down or slow: the limits, without their use
        _log.warning(
            "the key console could not read rate limit use from %s (%s)",
            type(limiter.engine).__name__,
            type(exc).__name__,
        )
        rows = {
            key_id: [
                _limit(name, rate, None, principal) for name, rate in _rates(limiter, principal)
            ]
            for key_id, principal in principals.items()
        }
        return Limits(rows=rows, unread=True, shared=limiter.engine.shared)
    rows = {
        key_id: [_limit(use.policy, use.rate, use.used, principal) for use in used]
        for (key_id, principal), used in zip(principals.items(), uses, strict=True)
    }
    return Limits(rows=rows, shared=limiter.engine.shared, slack=f"{limiter.slack:.0%}")


def _rates(limiter: RateLimiter, principal: Principal) -> list[tuple[str, Rate]]:
    limits = limiter.limits_of(principal)
    if limits is None:
        return []
    named = (
        ("key", limits.key),
        ("account", limits.account),
        ("organization", limits.organization),
    )
    return [(name, rate) for name, rate in named if rate is not None]


def _limit(name: str, rate: Rate, used: int | None, principal: Principal) -> dict[str, Any]:
    """One policy as a row shows it: "Key: 37 of 100 a minute"."""
    label = _POLICY_LABELS[name]
    if name == "organization":
        label += f" {principal.organization_id}"
    return {
        "label": label,
        "quota": rate.quota,
        "per": per_window(rate.window),
        "used": used,
        "high": math.ceil(rate.quota * 0.8),  # the meter turns from "fine" to "nearly spent"
    }


def per_window(seconds: int) -> str:
    """A window in words: ``a minute``, ``per 5 minutes``, ``per 90 seconds``."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds % size == 0:
            count = seconds // size
            if count == 1:
                return ("an " if unit == "hour" else "a ") + unit
            return f"per {count:,} {unit}s"
    raise AssertionError("every whole number of seconds is whole seconds")
