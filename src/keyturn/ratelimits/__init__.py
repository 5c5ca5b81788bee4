"""
Rate limits
===========

Per key, per account (one pool over all of an account's keys) and per organization, from
a host function of the principal; a sliding window counter whose budget is leased in
slices from an engine, so a warm request touches no network. See ``docs/rate-limits.md``.

::

    from keyturn.ratelimits import Rate, RateLimiter, RateLimits

    def limits(principal):
        return RateLimits(key=Rate(100, 60), account=Rate(1000, 60))

    limiter = RateLimiter(limits)
    admission = limiter.admit(principal)  # once per request, after authentication
    uses = limiter.use_of(principal)  # the limits and their use now, nothing taken (the console)

Engines: :class:`InProcessEngine` (default, exact in one process),
:class:`keyturn.ratelimits.redis.RedisEngine` and
:class:`keyturn.ratelimits.postgres.PostgresEngine`.
"""

from keyturn.ratelimits._counts import Grant, RateEngine
from keyturn.ratelimits._limiter import (
    Admission,
    FaultPolicy,
    Outcome,
    Rate,
    RateLimiter,
    RateLimits,
    RateStats,
    RateUse,
)
from keyturn.ratelimits.inprocess import InProcessEngine

__all__ = [
    "Admission",
    "FaultPolicy",
    "Grant",
    "InProcessEngine",
    "Outcome",
    "Rate",
    "RateEngine",
    "RateLimiter",
    "RateLimits",
    "RateStats",
    "RateUse",
]
