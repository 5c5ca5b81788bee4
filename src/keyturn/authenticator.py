"""The :class:`Authenticator`: runs the decision against your store and provider.

It holds what lives as long as the process (the memo, the rules, the usage recorder) and
two drivers for the one decision in ``_core/decision.py``: :meth:`~Authenticator.authenticate`
(sync, for WSGI and scripts) and :meth:`~Authenticator.authenticate_async` (for ASGI).
Neither driver decides anything: each is a loop that sends the decision the answers to its
steps (``_run/drive.py``). *How* a step is answered is chosen once, at construction, from
what the store and the provider can do (``_run/capabilities.py``): one caller each:

- a store or provider that says it never blocks (``nonblocking = True``) is called in place;
- an async one is awaited; a sync one that may block runs on a pool of threads of our own
  under ``authenticate_async``, and in place under ``authenticate`` -- on that pool too when
  the timeout must be enforced for it (it does not say ``enforces_timeout = True``).

A secret is checked in the decision itself, with one SHA-256 (D2): no thread, no cache of
verified tokens. A request the memo can answer (``_run/memo.py``: the decision's last answer for
it, while every input it read is unchanged) runs no loop at all; only the policy runs anew.
``timeout`` is a deadline per request: the store and provider together must answer within
that many seconds, or the request gets 503; a failing one gets 503 too (D15), never 401.

Usage, without any web framework::

    from keyturn import AuthRequest, Authenticator, Principal

    auth = Authenticator(store, membership)
    outcome = auth.authenticate(AuthRequest(authorization=("Bearer rma_...",)))
    if isinstance(outcome, Principal):
        ...  # outcome.account_id, outcome.organization_id, outcome.role
    else:
        ...  # outcome.status, outcome.body(), outcome.headers()
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import attrs

from keyturn._core.decision import (
    DEFAULT_ORGANIZATION_PATTERN,
    AuthRequest,
    Policy,
    Rules,
    decide,
    police,
    unavailable,
)
from keyturn._core.fork import renew_in_child
from keyturn._core.model import Clock, Principal, utc_now
from keyturn._core.steps import Step, WrongAnswer
from keyturn._run.capabilities import Capabilities, InPlace, capabilities, is_async_hook, shortcuts
from keyturn._run.drive import Conduct, drive, drive_async
from keyturn._run.memo import Memo, Ticket
from keyturn._run.usage import UsageRecorder
from keyturn.errors import RateLimited, Reason, Refusal, ServiceUnavailable, loggable
from keyturn.protocols import AsyncKeyStore, AsyncMembershipProvider, KeyStore, MembershipProvider

if TYPE_CHECKING:
    from keyturn.ratelimits import Admission, RateLimiter

__all__ = ["AuditEvent", "AuditHook", "Authenticator", "Checked", "LimitHeaders"]

log: Final = logging.getLogger("keyturn")


@attrs.frozen(kw_only=True)
class AuditEvent:
    """One decision, for an audit trail: who, where, and the precise reason of a refusal."""

    at: datetime
    method: str
    path: str
    principal: Principal | None  # set when the request passed
    error: Refusal | None  # set when it was refused; error.reason says exactly why
    # Seconds the whole decision took (store and provider waits included), on the
    # monotonic clock; None on an event built by hand.
    elapsed: float | None = None

    @property
    def allowed(self) -> bool:
        return self.error is None


AuditHook = Callable[[AuditEvent], None]


def _require(can: Capabilities, name: str, kind: str, methods: tuple[str, ...]) -> None:
    # Said now, not as a 503 on every request later.
    missing = can.missing(methods)
    if missing:
        hint = ""
        if can.whole_database:
            hint = "; pass db.keys as the store and db.membership as the membership"
        raise TypeError(
            f"{name} must be {kind} (see keyturn.protocols); {can.name} "
            f"lacks {', '.join(missing)}{hint}"
        )


def _require_sync(hook: object, name: str) -> None:
    # An async hook returns a coroutine: truthy for a policy (every request allowed), and
    # never run for an audit hook. Said now, at startup.
    if hook is not None and is_async_hook(hook):
        raise TypeError(f"{name} must be a plain function, not an async one: it is called inline")


class _Run:
    """One request on its way through the decision: where it goes, and how it ends."""

    __slots__ = ("deadline", "flow", "method", "path", "started", "ticket")

    def __init__(
        self,
        flow: Generator[Step, Any, Principal | Refusal],
        ticket: Ticket | None,  # the memo's, to keep the decision's answer with
        deadline: float | None,
        method: str,
        path: str,
        started: float | None,  # for the audit event only
    ) -> None:
        self.flow = flow
        self.ticket = ticket
        self.deadline = deadline
        self.method = method
        self.path = path
        self.started = started


# A request settled without a decision (the memo's answer, or the service closing): the
# outcome, the organization header (for the policy), method, path, and when it began. A
# plain tuple: the warm path's one object, built without a Python frame.
_Settled = tuple[Principal | Refusal, Sequence[str], str, str, float | None]

LimitHeaders = tuple[tuple[str, str], ...]
# What a middleware gets: the outcome, and the rate limit's header fields for an accepted
# request (``()`` without a limiter; a refusal carries its own).
Checked = tuple[Principal | Refusal, LimitHeaders]
_NO_HEADERS: Final[LimitHeaders] = ()


def _check_limiter(limiter: object) -> RateLimiter | None:
    if limiter is None:
        return None
    from keyturn.ratelimits import RateLimiter

    if not isinstance(limiter, RateLimiter):
        raise TypeError(
            f"rate_limiter must be a keyturn.ratelimits.RateLimiter, got {type(limiter).__name__}"
        )
    return limiter


def _allowed_outcome() -> object:
    from keyturn.ratelimits import Outcome  # imported only with a limiter

    return Outcome.ALLOWED


class Authenticator:
    """Authenticates requests against a key store and a membership provider.

    :param store: a :class:`~keyturn.protocols.KeyStore` or its async twin.
    :param membership: a :class:`~keyturn.protocols.MembershipProvider` or its async twin.
    :param organization_pattern: what a valid organization id looks like (D8).
    :param policy: ``policy(principal, request) -> bool``; ``False`` refuses with 403. A
        plain function: an ``async def`` one is refused here. *request* holds no
        ``Authorization`` lines: the key's id is on the principal.
    :param audit: called with an :class:`AuditEvent` after every decision; its failures are
        logged and never change the outcome. A plain function, like the policy.
    :param timeout: seconds the store and provider together may take to answer one request
        before it gets 503; ``None``: no bound.
    :param retry_after: the ``Retry-After`` seconds sent with a 503.
    :param clock: returns the current UTC time; injectable for tests.
    :param usage_interval: seconds between two ``last_used_at`` writes for one key, made
        off the request's path with the key's request counts (see :mod:`keyturn.usage`);
        ``None`` writes neither. One use is written on the path: a rotation's replacement
        whose creator asked for the old key's revoke at its first use, in that first
        request (``docs/rotation.md``).
    :param rate_limiter: a :class:`keyturn.ratelimits.RateLimiter`, asked once per request
        that passed the decision and the policy (a remembered answer included): no room
        refuses it with 429 ``rate_limited``, its engine down with 503
        ``service_unavailable`` when it fails closed (``docs/rate-limits.md``). ``None``
        (the default): no rate limits.
    """

    def __init__(
        self,
        store: KeyStore | AsyncKeyStore,
        membership: MembershipProvider | AsyncMembershipProvider,
        *,
        organization_pattern: str = DEFAULT_ORGANIZATION_PATTERN,
        policy: Policy | None = None,
        audit: AuditHook | None = None,
        timeout: float | None = 5.0,
        retry_after: int = 1,
        clock: Clock = utc_now,
        usage_interval: float | None = 60.0,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive seconds or None, got {timeout!r}")
        self.store_capabilities = capabilities(store)
        self._membership_capabilities = capabilities(membership)
        _require(self.store_capabilities, "store", "a KeyStore", ("get_key",))
        _require(
            self._membership_capabilities,
            "membership",
            "a MembershipProvider",
            ("get_organization", "get_default_organization", "get_role", "reaches_tenant"),
        )
        _require_sync(policy, "policy")
        _require_sync(audit, "audit")
        self.store = store
        self.membership = membership
        # A store without mark_used (a read-only double) simply has no usage recorded.
        records_use = usage_interval is not None and self.store_capabilities.has("mark_used")
        # The combined read and the memo only for keyturn's own classes: a host's code is
        # asked step by step.
        taken = shortcuts(self.store_capabilities, self._membership_capabilities)
        self.rules = Rules(
            organization_pattern=organization_pattern,
            policy=policy,
            lookup=taken.lookup,
            records_use=records_use,
            upgrades=self.store_capabilities.has("upgrade_hash"),
        )
        self.audit = audit
        self.timeout = timeout
        self.retry_after = retry_after
        self.clock = clock
        self._open_calls()
        self._is_async = any(caller.is_async for caller in self._callers)
        # No deadline to keep when no call can block: the warm path reads no clock for it.
        blocks = not all(isinstance(caller, InPlace) for caller in self._callers)
        self._timeout = timeout if blocks else None
        self.memo = Memo(taken.feeds, clock)  # the decision's answers, while they hold
        self.usage = (
            UsageRecorder(
                store,
                interval=usage_interval,
                clock=clock,
                store_capabilities=self.store_capabilities,
            )
            if records_use and usage_interval is not None
            else None
        )
        self.rate_limiter = _check_limiter(rate_limiter)
        self._allowed = _allowed_outcome() if rate_limiter is not None else None
        # A failed step: the flow is closed (never raised into: its frame holds the key), and
        # the request gets 503.
        self._conduct: Conduct[Principal | Refusal] = Conduct(fail=self._unavailable)
        self.closed = False
        renew_in_child(self)

    def __repr__(self) -> str:
        return f"Authenticator(store={self.store!r}, membership={self.membership!r})"

    def _open_calls(self) -> None:
        # Blocking calls run on threads of our own (started on first use): calls stuck in a
        # hung backend must not starve the event loop's default executor.
        self._calls = ThreadPoolExecutor(16, thread_name_prefix="keyturn-call")
        # Indexed by Step.via: MEMBERSHIP, STORE.
        self._callers = (
            self._membership_capabilities.caller(self._calls, self.timeout),
            self.store_capabilities.caller(self._calls, self.timeout),
        )

    def _after_fork(self) -> None:
        if not self.closed:  # the parent's call threads are not in this process
            self._open_calls()

    def authenticate(self, request: AuthRequest, *, final: bool = True) -> Principal | Refusal:
        """Decide *request*, calling the store and provider from this thread.

        *final* ``False``: an acceptance is not the request's last word yet (the payload
        guard reads its body next), so it is neither counted nor audited: :meth:`admit`
        does that once the request is let through, :meth:`record` for its refusal.
        """
        run = self._begin(request, True)
        del request  # only the decision holds the key now (see _begin)
        return self._drive(run, final)[0]

    async def authenticate_async(
        self, request: AuthRequest, *, final: bool = True
    ) -> Principal | Refusal:
        """Decide *request* without blocking the event loop (a blocking store runs in
        threads); *final* as for :meth:`authenticate`."""
        run = self._begin(request, False)
        del request  # only the decision holds the key now (see _begin)
        return (await self._drive_async(run, final))[0]

    def check(self, request: AuthRequest, *, final: bool = True) -> Checked:
        """:meth:`authenticate`, with the rate limit's header fields an accepted request's
        response carries (``RateLimit-Policy``, ``RateLimit``; ``()`` without a limiter)."""
        run = self._begin(request, True)
        del request  # only the decision holds the key now (see _begin)
        return self._drive(run, final)

    def _drive(self, run: _Run | _Settled, final: bool) -> Checked:
        if isinstance(run, tuple):
            outcome, method, path, started = self._recalled(run)
        else:
            decided = drive(run.flow, self._callers, self._conduct, run.deadline)
            outcome, method, path, started = self._decided(run, decided)
        # After the decision and the memo, on every request: a remembered answer never
        # skips the limit.
        limiter = self.rate_limiter
        if limiter is None or not isinstance(outcome, Principal):
            return self._close(outcome, method, path, started, final), _NO_HEADERS
        admission = limiter.admit(outcome)
        if admission[0] is self._allowed:  # the usual answer, without a call
            return self._close(outcome, method, path, started, final), admission[1]
        return self._limited(admission, outcome, method, path, started, final)

    async def check_async(self, request: AuthRequest, *, final: bool = True) -> Checked:
        """:meth:`check` without blocking the event loop."""
        run = self._begin(request, False)
        del request  # only the decision holds the key now (see _begin)
        return await self._drive_async(run, final)

    async def _drive_async(self, run: _Run | _Settled, final: bool) -> Checked:
        if isinstance(run, tuple):
            outcome, method, path, started = self._recalled(run)
        else:
            decided = await drive_async(run.flow, self._callers, self._conduct, run.deadline)
            outcome, method, path, started = self._decided(run, decided)
        limiter = self.rate_limiter
        if limiter is None or not isinstance(outcome, Principal):
            return self._close(outcome, method, path, started, final), _NO_HEADERS
        # From this process's leases without a coroutine; the engine's round trip awaited.
        admission = limiter.try_admit(outcome) or await limiter.admit_async(outcome)
        if admission[0] is self._allowed:  # the usual answer, without a call
            return self._close(outcome, method, path, started, final), admission[1]
        return self._limited(admission, outcome, method, path, started, final)

    # --- shared by both drivers ------------------------------------------------------------

    def _begin(self, request: AuthRequest, sync: bool) -> _Run | _Settled:
        """The request settled already (the service is closing, or the memo holds the
        decision's answer), else its decision started. A store, provider, policy or audit
        hook may raise, and error trackers send the locals of a traceback's frames: so
        nothing that can raise runs before the driver drops *request*, and the policy of a
        remembered answer runs in :meth:`_recalled`, after.
        """
        if sync and self._is_async:
            raise TypeError(
                "this Authenticator has an async store or provider: use authenticate_async()"
            )
        started = None if self.audit is None else time.monotonic()  # for the audit event only
        method, path = request.method, request.path
        if self.closed:
            return (self._shutting_down(), (), method, path, started)
        ticket = self.memo.recall(request)
        if isinstance(ticket, Principal):  # decide()'s answer holds: the policy runs anew
            return (ticket, request.organization, method, path, started)
        flow = decide(request, self.clock(), self.rules)
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        return _Run(flow, ticket, deadline, method, path, started)

    def _recalled(self, settled: _Settled) -> tuple[Principal | Refusal, str, str, float | None]:
        """A request settled before any decision: the memo's answer (whose policy runs
        anew, here) or the service closing."""
        outcome, organization, method, path, started = settled
        if self.rules.policy is not None and isinstance(outcome, Principal):
            outcome = police(outcome, organization, method, path, self.rules)
        return outcome, method, path, started

    def _decided(
        self, run: _Run, outcome: Principal | Refusal
    ) -> tuple[Principal | Refusal, str, str, float | None]:
        # The decision's answer, before any limit (a 503 of a failed step is not kept).
        self.memo.keep(run.ticket, outcome)
        return outcome, run.method, run.path, run.started

    def _close(
        self,
        outcome: Principal | Refusal,
        method: str,
        path: str,
        started: float | None,
        final: bool,
    ) -> Principal | Refusal:
        if isinstance(outcome, Principal):
            if not final:
                return outcome
            if self.audit is None:  # the warm path: nothing to log or audit, one use to count
                if self.usage is not None:
                    self.usage.seen(outcome.key_id)
                return outcome
        return self._finish(method, path, outcome, started)

    def _limited(
        self,
        admission: Admission,
        principal: Principal,
        method: str,
        path: str,
        started: float | None,
        final: bool,
    ) -> Checked:
        """The limiter's answer for an accepted request: the request goes on with the
        limit's header fields, or is refused (429, or 503 from a closed engine)."""
        if admission[0] is self._allowed:
            return self._close(principal, method, path, started, final), admission[1]
        refusal: Refusal
        if admission.policy == "engine":
            refusal = ServiceUnavailable(
                Reason.RATE_LIMIT_ENGINE,
                key_id=principal.key_id,
                retry_after=admission.retry_after or self.retry_after,
            )
        else:
            refusal = RateLimited(
                admission.headers,
                retry_after=admission.retry_after or 1,
                policy=admission.policy,
                key_id=principal.key_id,
                principal=principal,
            )
        return self._finish(method, path, refusal, started), _NO_HEADERS

    def _shutting_down(self) -> ServiceUnavailable:
        # Requests still arriving during a graceful shutdown: retry, on another instance.
        return ServiceUnavailable(Reason.CLOSED, retry_after=self.retry_after)

    def _unavailable(self, step: Step, exc: Exception) -> ServiceUnavailable:
        outcome = unavailable(exc, self.retry_after)
        if outcome.reason is Reason.BACKEND_TIMEOUT:
            log.warning("key store or membership provider timed out after %ss", self.timeout)
        elif isinstance(exc, WrongAnswer):
            log.error("the key store or membership provider is broken: %s", exc)
        else:
            log.error(
                "key store or membership provider failed: %s", type(exc).__name__, exc_info=exc
            )
        return outcome

    def record(
        self, request: AuthRequest, refusal: Refusal, started: float | None = None
    ) -> Refusal:
        """Log, count and audit a refusal made outside the decision (``_target``'s 400 for a
        target with no single reading, the payload guard's), as the decision's own are; the
        refusal. *started*: when the request's decision began (``time.monotonic()``).
        """
        self._finish(request.method, request.path, refusal, started)
        return refusal

    def admit(
        self, method: str, path: str, principal: Principal, started: float | None = None
    ) -> Principal:
        """Count and audit an acceptance decided with ``final=False``, now that the request
        is let through; the principal."""
        self._finish(method, path, principal, started)
        return principal

    def _finish(
        self, method: str, path: str, outcome: Principal | Refusal, started: float | None = None
    ) -> Principal | Refusal:
        if isinstance(outcome, Principal):  # the common case first
            if self.usage is not None:
                self.usage.seen(outcome.key_id)  # a dict increment unless a write is due
        else:
            if log.isEnabledFor(logging.INFO):
                log.info(
                    "refused %s %s with %d: %s (key id %s)",
                    loggable(method),
                    loggable(path),
                    outcome.status,
                    outcome.reason.value,
                    outcome.key_id,
                )
            if self.usage is not None and outcome.key_id is not None:
                self.usage.refused(outcome.key_id, outcome.reason)  # counted, if it names a key
        if self.audit is not None:
            principal = outcome if isinstance(outcome, Principal) else None
            event = AuditEvent(
                at=self.clock(),
                method=method,
                path=path,
                principal=principal,
                error=None if isinstance(outcome, Principal) else outcome,
                elapsed=None if started is None else time.monotonic() - started,
            )
            try:
                self.audit(event)
            except Exception:
                log.exception("the audit hook failed; the decision stands")
        return outcome

    def __enter__(self) -> Authenticator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Authenticator:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """:meth:`close`, once an async store's pending ``last_used_at`` writes are done.

        With an async store, call this (or use ``async with``) in the app's lifespan
        shutdown, on the loop that served the requests.
        """
        if self.usage is not None:
            await self.usage.flush()
        self.close()

    def close(self) -> None:
        """Stop the worker threads (store calls, pending ``last_used_at`` writes).

        Requests decided after this get 503 ``service_unavailable`` with ``Retry-After``.
        """
        self.closed = True
        if self.usage is not None:
            self.usage.close()
        self._calls.shutdown(wait=False, cancel_futures=True)
