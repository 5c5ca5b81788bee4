"""Section 3: what a refused request costs, and what it touches.

Four wrong credentials, each through the :class:`~keyturn.Authenticator` directly and
through the ASGI middleware: junk (not a key at all), a typo (the checksum fails), an
unknown id (well formed, no such key) and a wrong secret (a real id, its SHA-256 says no).
For each, the key store's reads and argon2's runs are *counted*: junk and typos must touch
neither, and cost less than a warm success; none runs argon2 (keys are stored as SHA-256).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Final

from starlette.middleware import Middleware

from bench._apps import MODELS, asgi_batch, asgi_call, http_scope, starlette_app
from bench._core import Batch, Report, Settings, Table, paired, run_batch, times, us
from bench._world import (
    JUNK,
    CountingKeyStore,
    CountingMembership,
    memory_world,
    mistype,
    unknown_token,
    wrong_secret,
)
from keyturn import Authenticator, AuthRequest, Principal, Refusal
from keyturn._core import hashing as _hashing
from keyturn.asgi import ApiKeyMiddleware

__all__ = ["run"]

NAME: Final = "refusals"
TITLE: Final = "3. Refusal paths: cost per request, store reads and argon2 runs"

WARM: Final = "warm success (organization key)"
JUNK_PATH: Final = "junk token"
TYPO: Final = "typo (wrong checksum)"
UNKNOWN: Final = "unknown key id"
WRONG: Final = "wrong secret"
FAST: Final = (WARM, JUNK_PATH, TYPO, UNKNOWN)
EXPECTED_STATUS: Final = {WARM: 200, JUNK_PATH: 401, TYPO: 401, UNKNOWN: 401, WRONG: 401}


def _authenticate_batch(authenticator: Authenticator, request: AuthRequest) -> Batch:
    def batch(n: int) -> int:
        start = time.perf_counter_ns()
        for _ in range(n):
            authenticator.authenticate(request)
        return time.perf_counter_ns() - start

    return batch


def _asgi_once(run: Callable[[Any], Any], app: Any, scope: dict[str, Any]) -> Any:
    return run(asgi_call(app, scope))


def _count(
    store: CountingKeyStore,
    membership: CountingMembership,
    authenticator: Authenticator,
    call: Callable[[], Any],
    n: int,
) -> tuple[float, float, float]:
    """Store reads, membership calls and argon2 runs per request over *n* calls of *call*."""
    reads, calls, runs = store.reads, membership.calls, _hashing.legacy_verifications
    for _ in range(n):
        call()
    return (
        (store.reads - reads) / n,
        (membership.calls - calls) / n,
        (_hashing.legacy_verifications - runs) / n,
    )


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    store, membership, keys = memory_world(counting=True)
    assert isinstance(store, CountingKeyStore)
    assert isinstance(membership, CountingMembership)
    authenticator = Authenticator(store, membership)
    tokens = {
        WARM: keys.organization,
        JUNK_PATH: JUNK,
        TYPO: mistype(keys.organization),
        UNKNOWN: unknown_token(),
        WRONG: wrong_secret(keys.organization),
    }
    requests = {
        name: AuthRequest(authorization=(f"Bearer {token}",), path=MODELS)
        for name, token in tokens.items()
    }
    scopes = {
        name: http_scope([("authorization", f"Bearer {token}")]) for name, token in tokens.items()
    }
    app = starlette_app(Middleware(ApiKeyMiddleware, authenticator=authenticator))
    loop = asyncio.new_event_loop()
    counts = Table(
        "what each request touches (counted, per request)",
        ["path", "outcome", "store reads", "membership calls", "argon2 runs"],
    )
    try:
        # The warm key's one cold verification, then the outcome of each path.
        outcomes: dict[str, Principal | Refusal] = {
            name: authenticator.authenticate(request) for name, request in requests.items()
        }
        for name, outcome in outcomes.items():
            status = 200 if isinstance(outcome, Principal) else outcome.status
            reply = loop.run_until_complete(asgi_call(app, scopes[name]))
            if status != EXPECTED_STATUS[name] or reply.status != EXPECTED_STATUS[name]:
                raise RuntimeError(f"{name}: got {status} / {reply.status}")

        # Counted facts, through the Authenticator and through the middleware.
        for name in (*FAST, WRONG):
            n = settings.slow_batch if name == WRONG else settings.batch
            direct = _count(
                store,
                membership,
                authenticator,
                partial(authenticator.authenticate, requests[name]),
                n,
            )
            middleware = _count(
                store,
                membership,
                authenticator,
                partial(_asgi_once, loop.run_until_complete, app, scopes[name]),
                n,
            )
            if direct != middleware:
                raise RuntimeError(f"{name}: {direct} directly but {middleware} through ASGI")
            outcome = outcomes[name]
            label = "200" if isinstance(outcome, Principal) else f"401 {outcome.reason.value}"
            reads, calls, runs = direct
            counts.add(name, label, f"{reads:g}", f"{calls:g}", f"{runs:g}")
            key = name.split(" ")[0]
            report.facts[f"{key}.store_reads"] = reads
            report.facts[f"{key}.membership_calls"] = calls
            report.facts[f"{key}.argon2_runs"] = runs

        # Timing: the fast paths paired with the warm success, both ways in.
        direct_batches: dict[str, Batch] = {
            f"authenticator: {name}": _authenticate_batch(authenticator, requests[name])
            for name in FAST
        }
        asgi_batches: dict[str, Batch] = {
            f"asgi: {name}": asgi_batch(loop.run_until_complete, app, scopes[name]) for name in FAST
        }
        result = paired({**direct_batches, **asgi_batches}, reps=settings.reps, n=settings.batch)
        # The wrong secret is decided afresh every time (the memo keeps no refusal).
        wrong_direct = [
            run_batch(_authenticate_batch(authenticator, requests[WRONG]), settings.slow_batch)
            for _ in range(3)
        ]
        wrong_asgi = [
            run_batch(asgi_batch(loop.run_until_complete, app, scopes[WRONG]), settings.slow_batch)
            for _ in range(3)
        ]
    finally:
        loop.close()
        authenticator.close()

    report.tables.append(counts)
    timing = Table(
        f"cost per request, {settings.reps} paired repetitions x {settings.batch} requests "
        f"(wrong secret: 3 x {settings.slow_batch})",
        ["path", "min us/req", "median us/req", "/ warm success (median ratio)"],
    )
    for way in ("authenticator", "asgi"):
        warm = f"{way}: {WARM}"
        for name in FAST:
            label = f"{way}: {name}"
            versus = "-" if name == WARM else times(result.ratio(label, warm))
            timing.add(label, us(result.min(label)), us(result.median(label)), versus)
        wrong = wrong_direct if way == "authenticator" else wrong_asgi
        timing.add(
            f"{way}: {WRONG}",
            us(min(wrong)),
            us(sorted(wrong)[1]),
            times(sorted(wrong)[1] / result.median(warm)),
        )
    report.tables.append(timing)

    for name in (JUNK_PATH, TYPO):
        key = name.split(" ")[0]
        untouched = (
            report.facts[f"{key}.store_reads"] == 0 and report.facts[f"{key}.argon2_runs"] == 0
        )
        report.bar(
            f"{name}: no store read, no argon2 run",
            f"{report.facts[f'{key}.store_reads']:g} reads, "
            f"{report.facts[f'{key}.argon2_runs']:g} runs",
            "0 and 0",
            untouched,
        )
        for way in ("authenticator", "asgi"):
            cheaper = result.ratio(f"{way}: {name}", f"{way}: {WARM}")
            report.facts[f"{key}.{way}_over_warm"] = cheaper
            report.bar(
                f"{name} ({way}): cheaper than a warm success",
                times(cheaper),
                "< 1.00x",
                cheaper < 1.0,
            )
    report.facts["wrong.authenticator_ns"] = sorted(wrong_direct)[1]
    report.notes.append(
        f"a wrong secret costs one store read and one SHA-256 per request: "
        f"{us(sorted(wrong_direct)[1], 1)} us through the Authenticator; no argon2, no thread"
    )
    return report
