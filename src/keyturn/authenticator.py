"""The :class:`Authenticator`: runs the decision against your store and provider.

It holds what lives as long as the process (the verified-token cache, the argon2 pool, the
rules) and two drivers for the one decision in ``_decision.py``: :meth:`~Authenticator.
authenticate` (sync, for WSGI and scripts) and :meth:`~Authenticator.authenticate_async`
(for ASGI). Neither driver decides anything; each only answers the decision's questions,
and turns a failing store or provider into 503 (D15), never into 401.

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

import asyncio
import contextvars
import enum
import functools
import inspect
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Final

import attrs

from keyturn._decision import (
    DEFAULT_ORGANIZATION_PATTERN,
    AuthRequest,
    Policy,
    PrincipalMemo,
    Rules,
    Step,
    VerifySecret,
    decide,
)
from keyturn._hashing import Overloaded, SecretVerifier, VerifiedTokenCache
from keyturn._model import Principal
from keyturn._usage import UsageRecorder
from keyturn.errors import AuthError, Reason, ServiceUnavailable
from keyturn.protocols import AsyncKeyStore, AsyncMembershipProvider, KeyStore, MembershipProvider

__all__ = ["AuditEvent", "AuditHook", "Authenticator", "Clock", "utc_now"]

log: Final = logging.getLogger("keyturn")

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


@attrs.frozen(kw_only=True)
class AuditEvent:
    """One decision, for an audit trail: who, where, and the precise reason of a refusal."""

    at: datetime
    method: str
    path: str
    principal: Principal | None  # set when the request passed
    error: AuthError | None  # set when it was refused; error.reason says exactly why

    @property
    def allowed(self) -> bool:
        return self.error is None


AuditHook = Callable[[AuditEvent], None]


class _Mode(enum.Enum):
    INLINE = "inline"  # a sync object that never blocks: call it on the loop
    THREAD = "thread"  # a sync object that may block: call it in a worker thread
    AWAIT = "await"  # an async object


def _mode_of(obj: object, probe: str) -> _Mode:
    if inspect.iscoroutinefunction(getattr(obj, probe, None)):
        return _Mode.AWAIT
    return _Mode.INLINE if getattr(obj, "nonblocking", False) else _Mode.THREAD


_DIRECTORY_METHODS: Final = (
    "get_organization",
    "get_default_organization",
    "get_role",
    "reaches_tenant",
)


def _require(obj: object, name: str, kind: str, methods: tuple[str, ...]) -> None:
    # Said now, not as a 503 on every request later.
    missing = [method for method in methods if not callable(getattr(obj, method, None))]
    if missing:
        hint = ""
        if hasattr(obj, "keys") and hasattr(obj, "membership"):  # a whole SQL database
            hint = "; pass db.keys as the store and db.membership as the membership"
        raise TypeError(
            f"{name} must be {kind} (see keyturn.protocols); {type(obj).__name__} "
            f"lacks {', '.join(missing)}{hint}"
        )


def _watched(obj: object, mode: _Mode, timeout: float | None) -> bool:
    return (
        timeout is not None and mode is _Mode.THREAD and not getattr(obj, "enforces_timeout", False)
    )


def _loggable(text: str, limit: int = 200) -> str:
    """Request text for a log line: quoted and escaped, so one line, and never unbounded."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


class Authenticator:
    """Authenticates requests against a key store and a membership provider.

    :param store: a :class:`~keyturn.protocols.KeyStore` or its async twin.
    :param membership: a :class:`~keyturn.protocols.MembershipProvider` or its async twin.
    :param organization_pattern: what a valid organization id looks like (D8).
    :param policy: ``policy(principal, request) -> bool``; ``False`` refuses with 403.
    :param audit: called with an :class:`AuditEvent` after every decision; its failures are
        logged and never change the outcome.
    :param timeout: seconds the store and provider may take to answer before the request
        gets 503: per call, or per request where a blocking store answers the whole decision
        in one worker-thread trip (``authenticate_async`` over a sync store).
    :param retry_after: the ``Retry-After`` seconds sent with a 503.
    :param clock: returns the current UTC time; injectable for tests.
    :param usage_interval: seconds between two ``last_used_at`` writes for one key, made
        off the request's path (see ``_usage.py``); ``None`` never writes it.
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
        cache: VerifiedTokenCache | None = None,
        verifier: SecretVerifier | None = None,
        usage_interval: float | None = 60.0,
    ) -> None:
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive seconds or None, got {timeout!r}")
        _require(store, "store", "a KeyStore", ("get_key",))
        _require(membership, "membership", "a MembershipProvider", _DIRECTORY_METHODS)
        self.store = store
        self.membership = membership
        self.rules = Rules(organization_pattern=organization_pattern, policy=policy)
        self.audit = audit
        self.timeout = timeout
        self.retry_after = retry_after
        self.clock = clock
        self.cache = cache if cache is not None else VerifiedTokenCache()
        self.verifier = verifier if verifier is not None else SecretVerifier()
        self._store_mode = _mode_of(store, "get_key")
        self._directory_mode = _mode_of(membership, "get_role")
        # The sync driver bounds a blocking call with a watchdog thread, unless the object
        # bounds its own calls (``enforces_timeout = True``, as the SQLite store does).
        self._store_watched = _watched(store, self._store_mode, timeout)
        self._directory_watched = _watched(membership, self._directory_mode, timeout)
        modes = {self._store_mode, self._directory_mode}
        self._hop = _Mode.THREAD in modes and _Mode.AWAIT not in modes
        self._principals: PrincipalMemo = {}
        # A store without mark_used (a read-only double) simply has no usage recorded.
        self.usage = (
            UsageRecorder(store, interval=usage_interval, clock=clock)
            if usage_interval is not None and hasattr(store, "mark_used")
            else None
        )
        # Blocking store and provider calls run on threads of our own (started on first use):
        # calls stuck in a hung backend must not starve the event loop's default executor,
        # which the application and the loop itself rely on.
        self._calls = ThreadPoolExecutor(16, thread_name_prefix="keyturn-call")
        self._closed = False

    def __repr__(self) -> str:
        return f"Authenticator(store={self.store!r}, membership={self.membership!r})"

    # --- the sync driver -------------------------------------------------------------------

    def authenticate(self, request: AuthRequest) -> Principal | AuthError:
        """Decide *request*, calling the store and provider in this thread."""
        if _Mode.AWAIT in (self._store_mode, self._directory_mode):
            raise TypeError(
                "this Authenticator has an async store or provider: use authenticate_async()"
            )
        if self._closed:
            return self._finish(request, self._shutting_down())
        return self._finish(request, self._run(request, watch=True))

    def _run(self, request: AuthRequest, watch: bool) -> Principal | AuthError:
        """The decision, its questions answered in this thread (*watch*: bound blocking ones)."""
        flow = decide(request, self.clock(), self.cache, self.rules, self._principals)
        answer: Any = None
        try:
            while True:
                step = flow.send(answer)
                try:
                    answer = self._answer(step, watch)
                except Exception as exc:
                    flow.close()
                    return self._failure(exc)
        except StopIteration as done:
            outcome: Principal | AuthError = done.value
            return outcome

    def _answer(self, step: Step, watch: bool) -> Any:
        if type(step) is VerifySecret:
            return self._verify(step).result()
        if not (watch and (self._store_watched if step.uses_store else self._directory_watched)):
            return step.ask(self.store, self.membership)
        call = self._calls.submit(step.ask, self.store, self.membership)
        try:
            return call.result(self.timeout)
        except TimeoutError:
            call.cancel()  # if still queued, it must not hit the store once that is back
            raise

    # --- the async driver ------------------------------------------------------------------

    async def authenticate_async(self, request: AuthRequest) -> Principal | AuthError:
        """Decide *request* without blocking the event loop (argon2 runs in threads)."""
        if self._closed:
            return self._finish(request, self._shutting_down())
        if self._hop:
            return await self._authenticate_in_thread(request)
        flow = decide(request, self.clock(), self.cache, self.rules, self._principals)
        answer: Any = None
        try:
            while True:
                step = flow.send(answer)
                try:
                    # A step that never blocks is answered right here: no coroutine, no await.
                    if type(step) is VerifySecret:
                        answer = await self._verify_async(step)
                    elif (
                        self._store_mode if step.uses_store else self._directory_mode
                    ) is _Mode.INLINE:
                        answer = step.ask(self.store, self.membership)
                    else:
                        answer = await self._call_async(step)
                except Exception as exc:
                    flow.close()
                    return self._finish(request, self._failure(exc))
        except StopIteration as done:
            return self._finish(request, done.value)

    async def _authenticate_in_thread(self, request: AuthRequest) -> Principal | AuthError:
        # Blocking sync store or provider, no async one: the whole decision takes one trip
        # to a worker thread instead of one per question. The timeout bounds the trip; a
        # trip cut by it is cancelled too, if it is still queued. The outcome is audited here,
        # so a trip that ends after its request got 503 is neither audited nor counted a use.
        call = functools.partial(contextvars.copy_context().run, self._run, request, False)
        try:
            async with asyncio.timeout(self.timeout):
                outcome = await asyncio.get_running_loop().run_in_executor(self._calls, call)
        except TimeoutError as exc:
            outcome = self._failure(exc)
        return self._finish(request, outcome)

    async def _verify_async(self, step: VerifySecret) -> Any:
        # shield: a cancelled request must not cancel a verification others are waiting on
        return await asyncio.shield(asyncio.wrap_future(self._verify(step)))

    async def _call_async(self, step: Step) -> Any:
        mode = self._store_mode if step.uses_store else self._directory_mode
        async with asyncio.timeout(self.timeout):
            if mode is _Mode.AWAIT:
                return await step.ask(self.store, self.membership)
            # A wait cut by the timeout cancels the call too, if it is still queued.
            call = functools.partial(
                contextvars.copy_context().run, step.ask, self.store, self.membership
            )
            return await asyncio.get_running_loop().run_in_executor(self._calls, call)

    # --- shared by both drivers ------------------------------------------------------------

    def _verify(self, step: VerifySecret) -> Any:
        return self.verifier.submit(
            self.cache, step.digest, step.secret_hash, step.secret, step.account_id
        )

    def _shutting_down(self) -> ServiceUnavailable:
        # Requests still arriving during a graceful shutdown: retry, on another instance.
        return ServiceUnavailable(Reason.CLOSED, retry_after=self.retry_after)

    def _failure(self, exc: Exception) -> ServiceUnavailable:
        if isinstance(exc, Overloaded):
            reason = Reason.OVERLOADED
            log.warning("shedding a request: too many secret verifications in flight")
        elif isinstance(exc, TimeoutError):
            reason = Reason.BACKEND_TIMEOUT
            log.warning("key store or membership provider timed out after %ss", self.timeout)
        else:
            reason = Reason.BACKEND_ERROR
            log.error(
                "key store or membership provider failed: %s", type(exc).__name__, exc_info=exc
            )
        return ServiceUnavailable(reason, retry_after=self.retry_after)

    def _finish(
        self, request: AuthRequest, outcome: Principal | AuthError
    ) -> Principal | AuthError:
        principal: Principal | None
        error: AuthError | None
        if isinstance(outcome, AuthError):
            principal, error = None, outcome
            if log.isEnabledFor(logging.INFO):
                log.info(
                    "refused %s %s with %d: %s (key id %s)",
                    _loggable(request.method),
                    _loggable(request.path),
                    outcome.status,
                    outcome.reason.value,
                    outcome.key_id,
                )
        else:
            principal, error = outcome, None
            if self.usage is not None:
                self.usage.seen(outcome.key_id)  # a dict lookup unless a write is due
        if self.audit is not None:
            event = AuditEvent(
                at=self.clock(),
                method=request.method,
                path=request.path,
                principal=principal,
                error=error,
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
        """Stop the worker threads (argon2, bounded calls, pending ``last_used_at`` writes).

        Requests decided after this get 503 ``service_unavailable`` with ``Retry-After``.
        """
        self._closed = True
        self.verifier.close()
        if self.usage is not None:
            self.usage.close()
        self._calls.shutdown(wait=False, cancel_futures=True)
