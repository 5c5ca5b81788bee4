"""The rate limit contract, the same for every engine: in process, Redis and PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from keyturn.ratelimits import (
    Admission,
    InProcessEngine,
    Outcome,
    Rate,
    RateEngine,
    RateLimiter,
    RateLimits,
)
from tests.ratelimits.conftest import principal

START = 600.0  # the start of a 60-second window (index 10)


def run(limiter: RateLimiter, count: int, now: float, **who: str) -> list[Admission]:
    return [limiter.admit(principal(**who), now) for _ in range(count)]


def allowed(admissions: list[Admission]) -> int:
    return sum(admission.allowed for admission in admissions)


def test_the_quota_is_admitted_then_refused_with_retry_after(engine: RateEngine) -> None:
    """Ten of fifteen requests fit ten per minute; the rest get 429's answer and a
    Retry-After after which one request fits again."""
    limiter = RateLimiter(RateLimits(key=Rate(10, 60)), engine=engine)

    answers = run(limiter, 15, START)

    assert [a.outcome for a in answers] == [Outcome.ALLOWED] * 10 + [Outcome.REFUSED] * 5
    refused = answers[-1]
    assert refused.policy == "key"
    # Next window, the previous count (10) weighs 10 x (1 - f): one fits from f = 0.1.
    assert refused.retry_after == 66
    assert dict(refused.headers)["Retry-After"] == "66"
    # The refusing policy's effective window ends when room is back, not before.
    assert dict(refused.headers)["RateLimit"] == '"key";r=0;t=66'
    assert not limiter.admit(principal(), START + 65.9).allowed
    assert limiter.admit(principal(), START + 66.0).allowed
    assert (limiter.stats.allowed, limiter.stats.refused) == (11, 6)


def test_the_fields_follow_the_ratelimit_draft(engine: RateEngine) -> None:
    """RateLimit-Policy lists each policy's quota and window; RateLimit each one's room and
    the seconds until its window turns (structured-field lists)."""
    limiter = RateLimiter(RateLimits(key=Rate(10, 60), account=Rate(100, 3600)), engine=engine)

    headers = dict(limiter.admit(principal(), START).headers)

    assert headers == {
        "RateLimit-Policy": '"key";q=10;w=60, "account";q=100;w=3600',
        "RateLimit": '"key";r=9;t=60, "account";r=99;t=3000',
    }


def test_an_account_pool_covers_all_its_keys(engine: RateEngine) -> None:
    """Minting keys buys no quota: the account's pool is one over all its keys."""
    limiter = RateLimiter(RateLimits(key=Rate(10, 60), account=Rate(6, 60)), engine=engine)

    first = run(limiter, 4, START, key="key1")
    second = run(limiter, 4, START, key="key2")

    assert (allowed(first), allowed(second)) == (4, 2)
    assert second[-1].policy == "account"
    assert allowed(run(limiter, 3, START, account="bob", key="key3")) == 3  # bob's own pool


def test_a_refused_request_consumes_nothing(engine: RateEngine) -> None:
    """A request refused by its key's limit takes nothing from its account's pool, and one
    refused by the account takes nothing from its key."""
    limiter = RateLimiter(RateLimits(key=Rate(2, 60), account=Rate(5, 60)), engine=engine)

    assert allowed(run(limiter, 6, START, key="key1")) == 2  # four refused by the key
    assert allowed(run(limiter, 6, START, key="key2")) == 2  # the account had 3, key2 takes 2
    assert allowed(run(limiter, 6, START, key="key3")) == 1  # the account's last one
    assert limiter.stats.refused == 13


def test_an_organization_limit_is_optional(engine: RateEngine) -> None:
    """Per organization, when set: two accounts in one organization share its pool."""
    limiter = RateLimiter(RateLimits(organization=Rate(3, 60)), engine=engine)

    assert allowed(run(limiter, 2, START, account="alice")) == 2
    answers = run(limiter, 2, START, account="bob", key="key2")
    assert allowed(answers) == 1
    assert answers[-1].policy == "organization"


def test_the_window_slides(engine: RateEngine) -> None:
    """Half-way through the next window, the previous window's count weighs half."""
    limiter = RateLimiter(RateLimits(key=Rate(10, 60)), engine=engine)
    assert allowed(run(limiter, 10, START)) == 10

    answers = run(limiter, 8, START + 90)  # f = 0.5: room = floor(10 - 10 x 0.5) = 5

    assert allowed(answers) == 5
    assert answers[-1].retry_after == 6  # 6 of 10 fit from f = 1 - (10 - 5 - 1) / 10 = 0.6


def test_limits_come_from_a_function_of_the_principal() -> None:
    """The host's function picks each principal's limits; None means no limit and no
    header; no limits at all is the default."""
    plans = {"alice": RateLimits(key=Rate(1, 60))}
    limiter = RateLimiter(lambda p: plans.get(p.account_id))

    assert [a.allowed for a in run(limiter, 2, START)] == [True, False]
    unlimited = run(limiter, 3, START, account="bob")
    assert all(a.allowed and a.headers == () for a in unlimited)
    assert RateLimiter().admit(principal(), START).headers == ()
    with pytest.raises(TypeError, match="returned dict"):
        RateLimiter(lambda p: {}).admit(principal(), START)  # type: ignore[arg-type,return-value]


def test_admit_async_answers_as_admit_does(engine_factory: Callable[[], RateEngine]) -> None:
    """The event loop's path gives the same answers, leases included."""
    limits = RateLimits(key=Rate(7, 60), account=Rate(9, 60))
    sync = RateLimiter(limits, engine=engine_factory())
    expected = [a.outcome for a in run(sync, 12, START, account="sync")]

    async def main() -> list[Outcome]:
        limiter = RateLimiter(limits, engine=engine_factory())
        return [
            (await limiter.admit_async(principal(account="async", key="key2"), START)).outcome
            for _ in range(12)
        ]

    assert asyncio.run(main()) == expected


def test_leases_never_pass_the_quota_under_concurrency(
    engine_factory: Callable[[], RateEngine],
) -> None:
    """Eight threads, each on an engine of its own, leasing until there is no room: all
    they took adds up to the quota exactly."""
    taken = [0] * 8
    engines = [engine_factory() for _ in taken]

    def lease(slot: int) -> None:
        for _ in range(200):  # bounded: 100 / 8 threads x 3 is far fewer
            grant = engines[slot].lease("k:hot", quota=100, window=60, index=10, weight=1.0, want=3)
            if not grant.granted:
                return
            taken[slot] += grant.granted

    threads = [threading.Thread(target=lease, args=(slot,)) for slot in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sum(taken) == 100


def test_what_a_lease_left_unspent_goes_back(engine: RateEngine) -> None:
    """A lease's unspent part, returned in the next window, leaves the previous count."""
    first = engine.lease("k:x", quota=50, window=60, index=10, weight=1.0, want=20)
    assert (first.granted, first.used, first.previous) == (20, 20, 0)

    second = engine.lease("k:x", quota=50, window=60, index=11, weight=0.5, want=5, returned=8)

    assert (second.granted, second.used, second.previous) == (5, 5, 12)


def test_instances_share_one_quota(engine_factory: Callable[[], RateEngine]) -> None:
    """Four limiters (four instances) on one engine's counts admit the quota between them,
    no more, and refuse none until all but their leases' slack is spent."""
    first = engine_factory()
    if not first.shared:
        pytest.skip("the in-process engine is one process's: one limiter per process")
    limiters = [
        RateLimiter(RateLimits(key=Rate(400, 60)), engine=engine_factory()) for _ in range(4)
    ]

    answers = [limiters[n % 4].admit(principal(), START + n * 0.01) for n in range(800)]

    admitted = allowed(answers)
    first_refusal = next(n for n, a in enumerate(answers) if not a.allowed)
    slack = 4 * limiters[0].slice_of(Rate(400, 60))  # instances x slice
    assert admitted <= 400
    assert first_refusal >= 400 - slack


def test_a_warm_request_seldom_asks_the_engine(engine_factory: Callable[[], RateEngine]) -> None:
    """At steady state under the quota, four instances ask the shared engine for at most
    one request in twenty (counted)."""
    instances = 4 if engine_factory().shared else 1  # in process: one limiter per process
    limiters = [
        RateLimiter(
            RateLimits(key=Rate(100_000, 60), account=Rate(200_000, 60)), engine=engine_factory()
        )
        for _ in range(instances)
    ]
    requests = 8000

    answers = [
        limiters[n % instances].admit(principal(), START + n * 0.015) for n in range(requests)
    ]

    assert allowed(answers) == requests
    leases = sum(limiter.stats.leases for limiter in limiters)
    assert leases / requests <= 0.05
    if engine_factory().shared:
        assert leases >= 8  # one per instance, policy and window at least: it did ask


def test_bad_settings_are_refused_at_construction() -> None:
    """Settings that cannot work fail when the limiter is made."""
    with pytest.raises(TypeError):
        RateLimiter("100/minute")  # type: ignore[arg-type]

    async def limits(_p: object) -> RateLimits:
        return RateLimits()

    with pytest.raises(TypeError, match="plain function"):
        RateLimiter(limits)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="slack"):
        RateLimiter(slack=0)
    with pytest.raises(ValueError, match=">= 0"):
        Rate(-1, 60)
    with pytest.raises(TypeError, match="Rate or None"):
        RateLimits(key=100)  # type: ignore[arg-type]


def test_reprs_hold_no_secret() -> None:
    """An engine's repr leaves out its URL's password."""
    from keyturn.ratelimits.postgres import PostgresEngine
    from keyturn.ratelimits.redis import RedisEngine

    redis_engine = RedisEngine("redis://:hunter2@127.0.0.1:1/0")
    assert "hunter2" not in repr(redis_engine)
    redis_engine.close()
    assert "hunter2" not in repr(PostgresEngine("postgresql://u:hunter2@127.0.0.1:1/x"))
    assert "InProcessEngine" in repr(InProcessEngine())


def test_an_engine_reads_counts_without_taking_any(engine: RateEngine) -> None:
    """``read`` answers each window's count and the previous one's, as a lease sees them,
    and changes nothing: a fresh engine reads zeros, and the lease after a read takes what
    it would have taken without it."""
    assert engine.read([("k:x", 10), ("k:y", 11)]) == [(0, 0), (0, 0)]
    engine.lease("k:x", quota=50, window=60, index=10, weight=1.0, want=20)

    assert engine.read([("k:x", 10), ("k:x", 11), ("k:x", 12), ("k:y", 11)]) == [
        (20, 0),
        (0, 20),
        (0, 0),
        (0, 0),
    ]
    assert engine.read([("k:x", 10)]) == [(20, 0)]
    grant = engine.lease("k:x", quota=50, window=60, index=10, weight=1.0, want=40)
    assert (grant.granted, grant.used) == (30, 50)


def test_use_is_what_the_limiter_counts_and_takes_nothing(engine: RateEngine) -> None:
    """``use_of`` says each policy's rate and how much of it is in use, this process's
    unspent lease left out; reading it admits nothing, and it agrees with RateLimit's r."""
    limiter = RateLimiter(RateLimits(key=Rate(10, 60), account=Rate(20, 60)), engine=engine)
    assert [(u.policy, u.used, u.remaining) for u in limiter.use_of(principal(), START)] == [
        ("key", 0, 10),
        ("account", 0, 20),
    ]

    last = run(limiter, 4, START + 1)[-1]

    uses = limiter.use_of(principal(), START + 2)
    assert [(u.policy, u.rate, u.used, u.remaining) for u in uses] == [
        ("key", Rate(10, 60), 4, 6),
        ("account", Rate(20, 60), 4, 16),
    ]
    assert dict(last.headers)["RateLimit"] == '"key";r=6;t=59, "account";r=16;t=59'
    assert limiter.use_of(principal(), START + 2) == uses  # reading took nothing
    assert allowed(run(limiter, 8, START + 3)) == 6
    assert [u.used for u in limiter.use_of(principal(), START + 4)] == [10, 10]
    assert limiter.use_of(principal(key="key2"), START + 4)[1].used == 10  # one account pool


def test_use_slides_with_the_window(engine: RateEngine) -> None:
    """Half-way through the next window the previous window's ten count five: five fit."""
    limiter = RateLimiter(RateLimits(key=Rate(10, 60)), engine=engine)
    assert allowed(run(limiter, 10, START)) == 10

    (use,) = limiter.use_of(principal(), START + 90)

    assert (use.used, use.remaining) == (5, 5)
    assert allowed(run(limiter, 8, START + 90)) == use.remaining
    assert limiter.use_of(principal(), START + 90)[0].used == 10


def test_another_instance_reads_the_shared_counts(
    engine_factory: Callable[[], RateEngine],
) -> None:
    """A console in another process, with a limiter of its own on the shared engine, reads
    what the serving instances admitted, plus at most their unspent slices."""
    first = engine_factory()
    if not first.shared:
        pytest.skip("the in-process engine is one process's: the console shares its limiter")
    limits = RateLimits(key=Rate(400, 60), account=Rate(800, 60))
    serving = [RateLimiter(limits, engine=engine_factory()) for _ in range(2)]
    console = RateLimiter(limits, engine=first)
    assert allowed([serving[n % 2].admit(principal(), START + n * 0.01) for n in range(100)]) == 100

    uses = console.use_of(principal(), START + 2)

    slack = [2 * serving[0].slice_of(use.rate) for use in uses]
    assert [use.policy for use in uses] == ["key", "account"]
    assert all(100 <= use.used <= 100 + most for use, most in zip(uses, slack, strict=True))
    assert console.stats.leases == 0 and console.stats.allowed == 0


def test_no_limit_has_no_use() -> None:
    """A principal with no limits has nothing to show, and the engine is not asked."""
    limiter = RateLimiter(lambda p: None if p.account_id == "bob" else RateLimits(key=Rate(1, 1)))

    assert limiter.use_of(principal(account="bob"), START) == ()
    assert RateLimiter().uses_of([principal(), principal(key="k2")], START) == [(), ()]
