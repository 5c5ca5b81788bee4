"""The limiter against a reference model of the sliding window counter (hypothesis).

The model keeps every admitted request's time and admits one more while, for each policy,
``floor(quota - previous window's count x weight) - this window's count >= 1``. The
in-process limiter, leases and all, must answer every request as the model does, with
the same room in its RateLimit field; limiters sharing an engine must never admit more
than the model's bound.
"""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from keyturn.ratelimits import InProcessEngine, Rate, RateLimiter, RateLimits
from keyturn.ratelimits._counts import ROUNDING, weight_at
from tests.ratelimits.conftest import principal


class Model:
    """The sliding window counter, computed from the admitted requests themselves."""

    def __init__(self, limits: dict[str, Rate]) -> None:
        self.limits = limits
        self.counts: dict[str, Counter[int]] = {name: Counter() for name in limits}

    def room(self, name: str, subject: str, now: float) -> int:
        rate = self.limits[name]
        index = int(now // rate.window)
        counts = self.counts[name]
        previous, current = counts[(subject, index - 1)], counts[(subject, index)]  # type: ignore[index]
        weight = weight_at(now, rate.window, index)
        return math.floor(rate.quota - previous * weight + ROUNDING) - current

    def admit(self, subjects: dict[str, str], now: float) -> bool:
        if any(self.room(name, subjects[name], now) < 1 for name in self.limits):
            return False
        for name, rate in self.limits.items():
            self.counts[name][(subjects[name], int(now // rate.window))] += 1  # type: ignore[index]
        return True


rates = st.builds(Rate, st.integers(0, 12), st.sampled_from([1, 2, 5, 60]))
steps = st.lists(
    st.tuples(st.floats(0, 3, allow_nan=False), st.sampled_from(["key1", "key2", "key3"])),
    max_size=120,
)


@settings(max_examples=300)
@given(key=rates, account=rates, steps=steps)
def test_the_limiter_answers_as_the_model(
    key: Rate, account: Rate, steps: list[tuple[float, str]]
) -> None:
    """Request by request, the same answer as the model, and the room the model counts."""
    limiter = RateLimiter(RateLimits(key=key, account=account), engine=InProcessEngine())
    model = Model({"key": key, "account": account})
    now = 1000.0
    for gap, key_id in steps:
        now += gap
        expected = model.admit({"key": f"k:{key_id}", "account": "a:alice"}, now)
        admission = limiter.admit(principal(key=key_id), now)
        assert admission.allowed == expected, (now, key_id)
        fields = dict(admission.headers)
        if "RateLimit" in fields and admission.allowed:
            rooms = {
                part.split(";")[0].strip('" '): int(part.split(";r=")[1].split(";")[0])
                for part in fields["RateLimit"].split(", ")
            }
            assert rooms == {
                "key": model.room("key", f"k:{key_id}", now),
                "account": model.room("account", "a:alice", now),
            }


@settings(max_examples=150)
@given(
    quota=st.integers(1, 40),
    window=st.sampled_from([1, 5, 60]),
    steps=st.lists(st.tuples(st.floats(0, 2, allow_nan=False), st.integers(0, 3)), max_size=150),
)
def test_instances_never_admit_past_the_bound(
    quota: int, window: int, steps: list[tuple[float, int]]
) -> None:
    """Four limiters leasing slices from one shared engine: in every window, admitted
    requests never pass the model's count of room (leases only ever hold back)."""

    class Shared(InProcessEngine):
        shared = True  # as Redis or PostgreSQL are: other instances take from the counts

    engine = Shared()
    limiters = [RateLimiter(RateLimits(key=Rate(quota, window)), engine=engine) for _ in range(4)]
    admitted: Counter[int] = Counter()
    now = 1000.0
    for gap, instance in steps:
        now += gap
        index = int(now // window)
        previous = admitted[index - 1]
        bound = math.floor(quota - previous * weight_at(now, window, index) + ROUNDING)
        if limiters[instance].admit(principal(), now).allowed:
            admitted[index] += 1
            assert admitted[index] <= bound
