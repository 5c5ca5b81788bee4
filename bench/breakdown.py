"""Profile: where the warm ASGI request's time goes (``python -m bench --only profile``).

Two views of the same path (Starlette + keyturn, organization-scoped key, warm):

- cProfile over a batch of requests: the functions with the most own time, per request.
  The profiler inflates small calls, so read it for the shape, not for the microseconds.
- Each step of the path timed alone in a tight loop (no profiler), minus the cost of an
  empty call: a budget to hold against the floor's whole overhead.
"""

from __future__ import annotations

import asyncio
import cProfile
import hashlib
import pstats
import re
import statistics
import time
from collections.abc import Callable
from typing import Any, Final

from starlette.middleware import Middleware

from bench._apps import MODELS, FloorASGI, Who, asgi_batch, http_scope, sha256_keys, starlette_app
from bench._core import Report, Settings, Table, paired, run_batch, us
from bench._world import ACCOUNT, ORGANIZATION, TENANT, memory_world
from keyturn import Authenticator, AuthRequest, Principal
from keyturn import asgi as keyturn_asgi
from keyturn._decision import bearer_token, decide, organization_header
from keyturn._lifecycle import derive_status
from keyturn._model import utc_now
from keyturn._web import service_headers

__all__ = ["run"]

NAME: Final = "profile"
TITLE: Final = "Profile: the warm ASGI path (organization key), function by function"
TOP: Final = 18
_LOCATION: Final = re.compile(r".*?(?:site-packages|src|lib/python[\d.]+)/")


def _where(filename: str, line: int, function: str) -> str:
    """A profiler location without machine paths: ``package/module.py:line(function)``."""
    if filename == "~":
        return function  # a built-in
    return f"{_LOCATION.sub('', filename)}:{line}({function})"


def _per_call(fn: Callable[[], object], n: int, reps: int = 5) -> float:
    """Median nanoseconds per call of *fn* over *reps* loops of *n* calls."""

    def batch(count: int) -> int:
        start = time.perf_counter_ns()
        for _ in range(count):
            fn()
        return time.perf_counter_ns() - start

    run_batch(batch, max(1, n // 4))
    return statistics.median(run_batch(batch, n) for _ in range(reps))


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    store, membership, keys = memory_world()
    authenticator = Authenticator(store, membership)
    who = Who(ACCOUNT, ORGANIZATION, TENANT)
    table = sha256_keys({keys.organization: who})
    scope = http_scope([("authorization", f"Bearer {keys.organization}")])
    bare = starlette_app()
    floor = starlette_app(Middleware(FloorASGI, keys=table))
    guarded = starlette_app(Middleware(keyturn_asgi.ApiKeyMiddleware, authenticator=authenticator))
    loop = asyncio.new_event_loop()
    n = settings.batch * 2
    try:
        request = AuthRequest(authorization=(f"Bearer {keys.organization}",), path=MODELS)
        if not isinstance(authenticator.authenticate(request), Principal):
            raise RuntimeError("the organization key was refused")
        # The whole overheads, for scale.
        whole = paired(
            {
                "bare": asgi_batch(loop.run_until_complete, bare, scope),
                "floor": asgi_batch(loop.run_until_complete, floor, scope),
                "keyturn": asgi_batch(loop.run_until_complete, guarded, scope),
            },
            reps=max(3, settings.reps // 2),
            n=settings.batch,
        )

        # cProfile over n warm requests.
        batch = asgi_batch(loop.run_until_complete, guarded, scope)
        batch(max(1, n // 4))
        profiler = cProfile.Profile()
        profiler.enable()
        batch(n)
        profiler.disable()
        stats = pstats.Stats(profiler)
        rows: list[tuple[float, float, float, str]] = []
        for (filename, line, function), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
            rows.append((own, cumulative, calls, _where(filename, line, function)))
        rows.sort(reverse=True)
        total_own = sum(row[0] for row in rows)

        # Each step alone.
        key = store.get_key(request.authorization[0][len("Bearer rma_") :][:12])
        assert key is not None
        cache = authenticator.cache
        token = keys.organization
        digest = cache.digest(token)
        now = utc_now()
        principal = authenticator.authenticate(request)
        assert isinstance(principal, Principal)
        usage = authenticator.usage
        pattern = authenticator.rules.organization_pattern
        headers_list = [(b"content-length", b"53"), (b"content-type", b"application/json")]
        names = keyturn_asgi._SERVICE_NAMES

        def drive() -> object:
            flow = decide(request, now, cache, authenticator.rules)
            answer: Any = None
            try:
                while True:
                    step = flow.send(answer)
                    answer = step.ask(store if step.method == "get_key" else membership)
            except StopIteration as done:
                return done.value

        paths = keyturn_asgi.ApiKeyMiddleware(bare, authenticator=authenticator).paths

        async def authenticate_many(count: int) -> int:
            start = time.perf_counter_ns()
            for _ in range(count):
                await authenticator.authenticate_async(request)
            return time.perf_counter_ns() - start

        steps: dict[str, Callable[[], object]] = {
            "(empty call, subtracted from the others)": lambda: None,
            "asgi: _route_path + Paths.guarded": lambda: paths.guarded(
                keyturn_asgi._route_path(scope)
            ),
            "asgi: _read (header scan, AuthRequest)": lambda: keyturn_asgi._read(scope, MODELS),
            "AuthRequest(...) alone": lambda: AuthRequest(
                authorization=request.authorization, organization=(), method="GET", path=MODELS
            ),
            "bearer_token": lambda: bearer_token(request.authorization),
            "cache.digest (keyed blake2b)": lambda: cache.digest(token),
            "cache.lookup (lock + move_to_end)": lambda: cache.lookup(digest),
            "utc_now()": utc_now,
            "store.get_key (memory)": lambda: store.get_key(key.key_id),
            "membership.get_role (memory)": lambda: membership.get_role(ACCOUNT, ORGANIZATION),
            "derive_status": lambda: derive_status(key, now, reaches_scope=True),
            "organization_header (absent)": lambda: organization_header((), pattern),
            "Principal(...)": lambda: Principal(
                account_id=ACCOUNT,
                key_id=key.key_id,
                key_name=key.name,
                scope=key.scope,
                organization_id=ORGANIZATION,
                tenant_id=TENANT,
                role="admin",
            ),
            "usage.seen (not due)": (
                (lambda: usage.seen(key.key_id)) if usage is not None else (lambda: None)
            ),
            "service headers, encoded": lambda: [
                (k.encode("latin-1"), v.encode("latin-1")) for k, v in service_headers(principal)
            ],
            "send wrapper: filter + copy start message": lambda: {
                "type": "http.response.start",
                "headers": [(k, v) for k, v in headers_list if k.lower() not in names],
            },
            "decide() driven inline (no Authenticator)": drive,
            "Authenticator.authenticate (sync driver)": lambda: authenticator.authenticate(request),
            "floor: sha256 + dict lookup": lambda: table.get(
                hashlib.sha256(token.encode("ascii")).digest()
            ),
        }

        step_ns = {name: _per_call(fn, settings.batch * 5) for name, fn in steps.items()}
        async_ns = run_batch(
            lambda count: loop.run_until_complete(authenticate_many(count)), settings.batch * 5
        )
    finally:
        loop.close()
        authenticator.close()

    overview = Table(
        "whole overhead over bare Starlette (for scale)",
        ["variant", "median us/req", "overhead us"],
    )
    for name in ("bare", "floor", "keyturn"):
        overhead = "-" if name == "bare" else us(whole.overhead(name, "bare"))
        overview.add(name, us(whole.median(name)), overhead)
    report.tables.append(overview)

    profile = Table(
        f"cProfile, {n} warm requests: top {TOP} by own time (profiler-inflated)",
        ["function", "calls/req", "own us/req", "cumulative us/req", "own %"],
    )
    for own, cumulative, calls, where in rows[:TOP]:
        profile.add(
            where,
            f"{calls / n:g}",
            f"{own * 1e6 / n:.2f}",
            f"{cumulative * 1e6 / n:.2f}",
            f"{own / total_own:.1%}",
        )
    report.tables.append(profile)
    ours = [row for row in rows if row[3].startswith("keyturn/")]
    own_total = sum(row[0] for row in ours)
    mine = Table(
        f"cProfile: keyturn's own functions ({own_total / total_own:.0%} of all own time)",
        ["function", "calls/req", "own us/req", "cumulative us/req", "own %"],
    )
    for own, cumulative, calls, where in ours:
        mine.add(
            where,
            f"{calls / n:g}",
            f"{own * 1e6 / n:.2f}",
            f"{cumulative * 1e6 / n:.2f}",
            f"{own / total_own:.1%}",
        )
    report.tables.append(mine)
    report.facts["keyturn_own_share"] = own_total / total_own

    empty = step_ns.pop("(empty call, subtracted from the others)")
    budget = Table(
        f"each step alone, tight loop, minus an empty call ({empty:.0f} ns)",
        ["step", "ns/call"],
    )
    for name, ns in step_ns.items():
        budget.add(name, f"{max(0.0, ns - empty):.0f}")
    budget.add("Authenticator.authenticate_async (async driver)", f"{async_ns - empty:.0f}")
    report.tables.append(budget)
    report.facts["keyturn_overhead_ns"] = whole.overhead("keyturn", "bare")
    report.facts["floor_overhead_ns"] = whole.overhead("floor", "bare")
    report.facts["profiled_functions"] = len(rows)
    return report
