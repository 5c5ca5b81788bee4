"""Whether one more request of a principal fits its rate limits, right now.

Rules of this file:

1. The algorithm is a sliding window counter: a policy of *quota* requests per *window*
   seconds keeps one count per aligned window, and a request fits while
   ``floor(quota - previous x (1 - elapsed fraction)) - current >= 1``. The previous
   window's count weighs less as the current window goes on, so the quota is never spent
   twice across a window's edge.
2. The counts live in an engine (:class:`RateEngine`). The limiter takes budget from it in
   slices (a *lease*): the engine adds the slice to the window's count at once, capped so
   the count never passes the quota, and the limiter spends the slice locally. A warm
   request reads and writes only this process's memory; one request in *slice* asks the
   engine. A lease belongs to one window: what is left of it when the window turns goes
   back to that window's count with the next lease (forgotten if that lease fails, so
   never returned twice; counted meanwhile, which only makes the next window stricter).
3. A request is checked against every policy first and charged to all of them only when
   all have room: a refused request consumes nothing.
4. After the engine fails (an error or its deadline), the limiter does not ask it again for
   *cooldown* seconds: requests are let through (fail open, the default) or answered
   :attr:`Outcome.UNAVAILABLE` (fail closed, a 503 with ``Retry-After``), each counted, and
   one log line per cooldown says why. Nothing here waits longer than the engine's deadline.
5. No secret reaches this file: subjects are key ids, account ids and organization ids.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, NamedTuple

import attrs

from keyturn._core.fork import renew_in_child
from keyturn._run.capabilities import is_coroutine_function
from keyturn.ratelimits._counts import ROUNDING, Grant, RateEngine, weight_at
from keyturn.ratelimits.inprocess import InProcessEngine

if TYPE_CHECKING:
    from keyturn._core.model import Principal

__all__ = [
    "Admission",
    "FaultPolicy",
    "Outcome",
    "Rate",
    "RateLimiter",
    "RateLimits",
    "RateStats",
    "RateUse",
]

log: Final = logging.getLogger("keyturn.ratelimits")


@attrs.frozen
class Rate:
    """At most *quota* requests per *window* seconds (whole seconds, as the headers say)."""

    quota: int = attrs.field(validator=[attrs.validators.instance_of(int), attrs.validators.ge(0)])
    window: int = attrs.field(validator=[attrs.validators.instance_of(int), attrs.validators.ge(1)])


def _rate_or_none(
    _instance: object, attribute: attrs.Attribute[Rate | None], value: object
) -> None:
    if value is not None and not isinstance(value, Rate):
        raise TypeError(f"{attribute.name} must be a Rate or None, not {type(value).__name__}")


class _Step(NamedTuple):
    """One policy of a :class:`RateLimits`, as the warm path reads it."""

    name: str  # key, account, organization
    attribute: str  # the principal's field naming the subject
    prefix: str  # the subject is prefix + that field
    rate: Rate


@attrs.frozen
class RateLimits:
    """The limits of one principal: per key, per account (all its keys share one pool), and
    per organization. ``None`` leaves that level unlimited."""

    key: Rate | None = attrs.field(default=None, kw_only=True, validator=_rate_or_none)
    account: Rate | None = attrs.field(default=None, kw_only=True, validator=_rate_or_none)
    organization: Rate | None = attrs.field(default=None, kw_only=True, validator=_rate_or_none)
    # Made once per RateLimits: the policies in order, and the RateLimit-Policy field.
    _plan: tuple[_Step, ...] = attrs.field(init=False, repr=False, eq=False)
    policy_field: tuple[str, str] = attrs.field(init=False, repr=False, eq=False)

    @_plan.default
    def _make_plan(self) -> tuple[_Step, ...]:
        named = (
            ("key", "key_id", "k:", self.key),
            ("account", "account_id", "a:", self.account),
            ("organization", "organization_id", "o:", self.organization),
        )
        # isinstance: this runs before the validators do
        return tuple(_Step(*step[:3], step[3]) for step in named if isinstance(step[3], Rate))

    @policy_field.default
    def _make_policy_field(self) -> tuple[str, str]:
        value = ", ".join(f'"{s.name}";q={s.rate.quota};w={s.rate.window}' for s in self._plan)
        return ("RateLimit-Policy", value)


@attrs.frozen
class RateUse:
    """One policy of a principal and how much of it is in use now (what the console shows).

    *used* is the sliding window's count: the current window's requests plus the previous
    window's, weighted by the share of it still inside the last *window* seconds (rounded
    up), the figure the limiter compares with the quota; ``quota - used`` is the
    ``RateLimit`` field's ``r``.
    """

    policy: str  # key, account, organization
    rate: Rate
    used: int

    @property
    def remaining(self) -> int:
        """How many more requests fit right now."""
        return max(0, self.rate.quota - self.used)


class Outcome(enum.Enum):
    """What the limiter answers for one request."""

    ALLOWED = "allowed"
    REFUSED = "rate_limited"  # 429
    UNAVAILABLE = "service_unavailable"  # 503: the engine failed and the limiter fails closed


class FaultPolicy(enum.Enum):
    """What a request gets while the engine is down or slow."""

    OPEN = "open"  # let it through (counted, logged)
    CLOSED = "closed"  # refuse it with 503 service_unavailable and Retry-After


class Admission(NamedTuple):
    """The answer for one request, and the header fields the response carries.

    *headers* holds ``RateLimit-Policy`` and ``RateLimit`` (draft-ietf-httpapi-ratelimit-
    headers-11) on every answer of a limited principal, and ``Retry-After`` when the
    request is refused. *policy* names the policy that refused it (``key``, ``account``,
    ``organization``), or ``engine`` when the engine failed.
    """

    outcome: Outcome
    headers: tuple[tuple[str, str], ...] = ()
    retry_after: int | None = None
    policy: str | None = None

    @property
    def allowed(self) -> bool:
        """Whether the request may go on."""
        return self.outcome is Outcome.ALLOWED


UNLIMITED: Final = Admission(Outcome.ALLOWED)
ALLOWED: Final = Outcome.ALLOWED
_new_admission: Final = tuple.__new__  # an Admission without NamedTuple's Python-level __new__


@attrs.define
class RateStats:
    """What one limiter counted since it was made: requests by outcome, the round trips to
    the engine, and the engine's faults (with the requests let through because of them)."""

    allowed: int = 0
    refused: int = 0
    unavailable: int = 0
    leases: int = 0
    faults: int = 0
    failed_open: int = 0


class _Lease:
    """This process's view of one subject's current window."""

    __slots__ = (
        "end",
        "head",
        "index",
        "left",
        "previous",
        "retry_at",
        "room",
        "start",
        "tail",
        "tick",
        "window",
    )

    def __init__(
        self, name: str, rate: Rate, index: int, left: int, grant: Grant, retry_at: float
    ) -> None:
        self.index = index  # the window the lease belongs to: [start, end)
        self.window = rate.window
        self.start = float(index * rate.window)
        self.end = float((index + 1) * rate.window)
        self.left = left  # leased here, not yet spent
        # The room everyone had after the last lease, less what is left here and the
        # previous window's weighted count: quota - used.
        self.room = rate.quota - grant.used
        self.previous = grant.previous  # the previous window's count at the last lease
        self.retry_at = retry_at  # when the engine may have room again (after a refusal)
        self.head = f'"{name}";r='  # the RateLimit item, up to its room
        # The item's ";t=<seconds to the turn>", good while the clock reads before tick.
        self.tail = ""
        self.tick = self.start

    def item(self, now: float) -> str:
        """This policy's RateLimit item at *now*: its room, and the seconds to the turn."""
        room = self.room + self.left
        if self.previous:
            room -= math.ceil(self.previous * (self.end - now) / self.window - ROUNDING)
        return f"{self.head}{room if room > 0 else 0};t={math.ceil(self.end - now)}"


LimitsSource = RateLimits | Callable[["Principal"], RateLimits | None] | None


class RateLimiter:
    """Decide, once per request after authentication, whether the principal may go on.

    ::

        from keyturn.ratelimits import Rate, RateLimiter, RateLimits

        limiter = RateLimiter(RateLimits(key=Rate(100, 60), account=Rate(1000, 3600)))
        admission = limiter.admit(principal)
        if not admission.allowed:
            ...  # 429 rate_limited (or 503) with admission.headers

    :param limits: a :class:`RateLimits` for everyone, or a function of the principal that
        returns one (or ``None``: no limit for that principal). ``None`` (the default):
        no limits, every request allowed with no header.
    :param engine: where the counts live; default, this process's memory (exact).
    :param faults: what requests get while the engine fails: :attr:`FaultPolicy.OPEN`
        (default) or :attr:`FaultPolicy.CLOSED`.
    :param instances: how many processes share a shared engine; with *slack* it sets the
        slice a lease takes: ``max(1, floor(slack x quota / instances))``.
    :param slack: the share of a quota that may sit unspent in other processes' leases.
    :param cooldown: seconds the engine is left alone after it failed.
    :param clock: seconds since the epoch (instances sharing an engine need synchronised
        clocks).
    """

    def __init__(
        self,
        limits: LimitsSource = None,
        *,
        engine: RateEngine | None = None,
        faults: FaultPolicy = FaultPolicy.OPEN,
        instances: int = 4,
        slack: float = 0.05,
        cooldown: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if limits is not None and not isinstance(limits, RateLimits) and not callable(limits):
            raise TypeError("limits must be a RateLimits, a function of the principal, or None")
        if is_coroutine_function(limits):
            raise TypeError("limits must be a plain function: it runs on every request")
        if not isinstance(faults, FaultPolicy):
            raise TypeError("faults must be FaultPolicy.OPEN or FaultPolicy.CLOSED")
        if not (isinstance(instances, int) and instances >= 1):
            raise ValueError("instances must be a whole number >= 1")
        if not 0 < slack <= 1:
            raise ValueError("slack must be in (0, 1]")
        if cooldown <= 0:
            raise ValueError("cooldown must be > 0 seconds")
        self._limits = limits
        self._static = limits if isinstance(limits, RateLimits) else None
        self.engine: RateEngine = InProcessEngine() if engine is None else engine
        self.faults = faults
        self.instances = instances
        self.slack = slack
        self.cooldown = cooldown
        self._clock = clock
        self.stats = RateStats()
        self._leases: dict[str, _Lease] = {}
        # The warm path's one look-up: a key id -> the limits, account and organization its
        # last admission was for, and the leases that admitted it (rule 2: a lease replaced
        # in _leases is empty or of another window, so a stale one here only sends the
        # request to _admit, which refills this).
        self._held: dict[str, tuple[RateLimits, str, str | None, tuple[_Lease, ...]]] = {}
        self._down_until = 0.0  # the engine failed: left alone until then
        self._lock = threading.Lock()
        renew_in_child(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._leases = {}  # the parent's leases are the parent's to spend
        self._held = {}

    def __repr__(self) -> str:
        return f"RateLimiter(engine={type(self.engine).__name__}, faults={self.faults.value})"

    def limits_of(self, principal: Principal) -> RateLimits | None:
        """The limits that apply to *principal* (what the console shows)."""
        limits = self._limits
        if limits is None or isinstance(limits, RateLimits):
            return limits
        answer = limits(principal)
        if answer is not None and not isinstance(answer, RateLimits):
            raise TypeError(f"the limits function returned {type(answer).__name__}")
        return answer

    def slice_of(self, rate: Rate) -> int:
        """How much one lease takes for *rate*: the whole room in process, else a slice."""
        if not self.engine.shared:
            return max(rate.quota, 1)
        return max(1, math.floor(self.slack * rate.quota / self.instances))

    def use_of(self, principal: Principal, now: float | None = None) -> tuple[RateUse, ...]:
        """*principal*'s limits and their use right now, read from the engine without
        taking anything; empty when no limit applies. See :meth:`uses_of`."""
        return self.uses_of([principal], now)[0]

    def uses_of(
        self, principals: Sequence[Principal], now: float | None = None
    ) -> list[tuple[RateUse, ...]]:
        """:meth:`use_of` for each of *principals*, in one read of the engine.

        A shared engine's counts are every instance's, budget leased but not yet spent
        included: they may run ahead of the requests admitted by at most ``instances x
        slice`` per policy (this process's own unspent leases are left out). The in-process
        engine knows this process's requests only. Raises what the engine raises.
        """
        when = self._clock() if now is None else now
        plans = []
        for principal in principals:
            limits = self.limits_of(principal)
            plans.append(
                [
                    (
                        step,
                        step.prefix + getattr(principal, step.attribute),
                        int(when // step.rate.window),
                    )
                    for step in (() if limits is None else limits._plan)
                ]
            )
        windows = list(
            dict.fromkeys((subject, index) for plan in plans for _, subject, index in plan)
        )
        if not windows:
            return [() for _ in principals]
        if self.engine.shared:
            with self._lock:
                unspent = self._unspent(windows)
            counts = self.engine.read(windows)  # never a round trip under the lock
        else:
            with self._lock:  # no lease between the two: exact
                unspent = self._unspent(windows)
                counts = self.engine.read(windows)
        found = {}
        for window, (used, previous), (left, left_before) in zip(
            windows, counts, unspent, strict=True
        ):
            found[window] = (max(0, used - left), max(0, previous - left_before))
        answers = []
        for plan in plans:
            uses = []
            for step, subject, index in plan:
                used, previous = found[subject, index]
                weight = weight_at(when, step.rate.window, index)
                if previous:
                    used += max(0, math.ceil(previous * weight - ROUNDING))
                uses.append(RateUse(step.name, step.rate, used))
            answers.append(tuple(uses))
        return answers

    def _unspent(self, windows: Sequence[tuple[str, int]]) -> list[tuple[int, int]]:
        """What this process leased and has not spent, in each window and the one before."""
        unspent = []
        for subject, index in windows:
            lease = self._leases.get(subject)
            left = 0 if lease is None else lease.left
            unspent.append(
                (
                    left if lease is not None and lease.index == index else 0,
                    left if lease is not None and lease.index == index - 1 else 0,
                )
            )
        return unspent

    def admit(self, principal: Principal, now: float | None = None) -> Admission:
        """Admit one request of *principal*, or refuse it; charge it only when admitted.

        Runs once per request, after the authentication decision. Blocks at most the
        engine's deadline, and only on one request in a slice.
        """
        limits = self._static or self.limits_of(principal)
        if limits is None or not limits._plan:
            return UNLIMITED
        when = self._clock() if now is None else now
        lock = self._lock
        lock.acquire()  # cheaper than a with statement, on every request
        try:
            return self._warm(limits, principal, when) or self._admit(limits, principal, when)
        finally:
            lock.release()

    def try_admit(self, principal: Principal) -> Admission | None:
        """:meth:`admit`, answered now from this process's leases, or ``None`` when the
        answer needs the engine or another thread holds the lock (then await
        :meth:`admit_async`). Never blocks: what an event loop calls first."""
        limits = self._static or self.limits_of(principal)
        if limits is None or not limits._plan:
            return UNLIMITED
        lock = self._lock
        if not lock.acquire(False):  # positional: cheaper than the keyword, on every request
            return None
        try:
            return self._warm(limits, principal, self._clock())
        finally:
            lock.release()

    async def admit_async(self, principal: Principal, now: float | None = None) -> Admission:
        """:meth:`admit` for an event loop: a request that needs no round trip is answered
        at once; one that does asks the engine on a worker thread."""
        limits = self._static or self.limits_of(principal)
        if limits is None or not limits._plan:
            return UNLIMITED
        when = self._clock() if now is None else now
        if self._lock.acquire(blocking=False):
            try:
                answer = self._warm(limits, principal, when)
                if answer is None and not self._needs_engine(limits, principal, when):
                    answer = self._admit(limits, principal, when)
                if answer is not None:
                    return answer
            finally:
                self._lock.release()
        return await asyncio.to_thread(self._admit_locked, limits, principal, when)

    def _admit_locked(self, limits: RateLimits, principal: Principal, now: float) -> Admission:
        with self._lock:
            return self._warm(limits, principal, now) or self._admit(limits, principal, now)

    # --- the work, under the lock ---------------------------------------------------------

    def _warm(self, limits: RateLimits, principal: Principal, now: float) -> Admission | None:
        """The request admitted from this process's leases, or ``None`` when one of them is
        empty or of another window (then :meth:`_admit` decides). Kept flat: it runs on
        every request."""
        held = self._held.get(principal.key_id)
        if (
            held is None
            or (held[0] is not limits and held[0] != limits)
            or held[1] != principal.account_id
            or held[2] != principal.organization_id
        ):
            return None
        leases = held[3]
        for lease in leases:
            if not lease.left or not lease.start <= now < lease.end:
                return None
        items = []
        for lease in leases:
            lease.left = left = lease.left - 1
            room = lease.room + left
            if lease.previous:
                room -= math.ceil(lease.previous * (lease.end - now) / lease.window - ROUNDING)
            if not lease.tick - 1.0 <= now < lease.tick:  # the seconds to the turn changed
                seconds = math.ceil(lease.end - now)
                lease.tick = lease.end - seconds + 1
                lease.tail = f";t={seconds}"
            items.append(f"{lease.head}{room if room > 0 else 0}{lease.tail}")
        self.stats.allowed += 1
        return _new_admission(
            Admission, (ALLOWED, (limits.policy_field, ("RateLimit", ", ".join(items))), None, None)
        )

    def _needs_engine(self, limits: RateLimits, principal: Principal, now: float) -> bool:
        """Whether admitting a request now may ask the engine (it never does while it is
        left alone after a fault)."""
        if now < self._down_until:
            return False
        for step in limits._plan:
            lease = self._leases.get(step.prefix + getattr(principal, step.attribute))
            if (
                lease is None
                or lease.index != int(now // step.rate.window)
                or (lease.left == 0 and now >= lease.retry_at)
            ):
                return True
        return False

    def _admit(self, limits: RateLimits, principal: Principal, now: float) -> Admission:
        held: list[_Lease] = []
        for step in limits._plan:
            lease = self._room(step, step.prefix + getattr(principal, step.attribute), now)
            if lease is None:  # the engine failed
                return self._fault(limits, now)
            if lease.left == 0:
                return self._refuse(limits, [*held, lease], step.name, lease, now)
            held.append(lease)
        for lease in held:
            lease.left -= 1
        self.stats.allowed += 1
        self._held[principal.key_id] = (
            limits,
            principal.account_id,
            principal.organization_id,
            tuple(held),
        )
        status = ", ".join([lease.item(now) for lease in held])
        return Admission(Outcome.ALLOWED, (limits.policy_field, ("RateLimit", status)))

    def _room(self, step: _Step, subject: str, now: float) -> _Lease | None:
        """The subject's lease, with at least one request in it if the engine had room;
        ``None`` if the engine failed."""
        rate = step.rate
        index = int(now // rate.window)
        lease = self._leases.get(subject)
        if lease is not None and lease.index == index and (lease.left or now < lease.retry_at):
            return lease
        if now < self._down_until:
            return None
        want = self.slice_of(rate)
        weight = weight_at(now, rate.window, index)
        # What the last window's lease left unspent goes back: the count stays exact.
        returned = lease.left if lease is not None and lease.index == index - 1 else 0
        self.stats.leases += 1
        try:
            grant = self.engine.lease(
                subject,
                quota=rate.quota,
                window=rate.window,
                index=index,
                weight=weight,
                want=want,
                returned=returned,
            )
        except Exception as exc:  # any engine failure is a fault, handled by policy
            # The lease may have been applied: what it held is forgotten, never returned twice.
            self._leases.pop(subject, None)
            self._down_until = now + self.cooldown
            self.stats.faults += 1
            log.warning(
                "rate limit engine %s failed (%s); %s requests for %.1f s",
                type(self.engine).__name__,
                type(exc).__name__,
                "allowing" if self.faults is FaultPolicy.OPEN else "refusing",
                self.cooldown,
            )
            return None
        left = (lease.left if lease is not None and lease.index == index else 0) + grant.granted
        # Room comes back as the previous window's weight falls; a shared engine is asked
        # again once a slice fits (one round trip per slice), the own memory once one does.
        need = 1 if not self.engine.shared else want
        retry_at = _room_at(rate, index, grant.used, grant.previous, need) if not left else 0.0
        lease = _Lease(step.name, rate, index, left, grant, retry_at)
        self._leases[subject] = lease
        return lease

    def _refuse(
        self, limits: RateLimits, seen: list[_Lease], name: str, lease: _Lease, now: float
    ) -> Admission:
        self.stats.refused += 1
        retry_after = max(1, math.ceil(lease.retry_at - now))
        # The refusing policy's effective window ends when room is back: Retry-After never
        # points before it (draft-ietf-httpapi-ratelimit-headers-11, section 6).
        items = [seen_lease.item(now) for seen_lease in seen[:-1]]
        items.append(f"{lease.head}0;t={retry_after}")
        return Admission(
            Outcome.REFUSED,
            (
                limits.policy_field,
                ("RateLimit", ", ".join(items)),
                ("Retry-After", str(retry_after)),
            ),
            retry_after,
            name,
        )

    def _fault(self, limits: RateLimits, now: float) -> Admission:
        if self.faults is FaultPolicy.OPEN:
            self.stats.failed_open += 1
            self.stats.allowed += 1
            return Admission(Outcome.ALLOWED, (limits.policy_field,))
        self.stats.unavailable += 1
        retry_after = max(1, math.ceil(self._down_until - now))
        return Admission(
            Outcome.UNAVAILABLE, (("Retry-After", str(retry_after)),), retry_after, "engine"
        )


# Asking a moment early costs a round trip that finds no room; a moment late, a refusal
# the counts would not make.
_EARLY: Final = 1e-6


def _room_at(rate: Rate, index: int, used: int, previous: int, need: int) -> float:
    """When ``floor(quota - previous x weight) - used >= need`` holds again, if no one else
    takes from the subject: later in this window, or in the next one."""
    quota, window = rate.quota, rate.window
    need = min(need, max(quota, 1))
    if previous and used + need <= quota:
        # quota - previous x (1 - f) >= used + need  <=>  f >= 1 - (quota - used - need) / previous
        fraction = 1.0 - (quota - used - need) / previous
        return (index + max(fraction, 0.0)) * window - _EARLY
    # Next window: the previous count is what this window holds.
    fraction = 1.0 - (quota - need) / used if used else 0.0
    return (index + 1 + max(fraction, 0.0)) * window - _EARLY
