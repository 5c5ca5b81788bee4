"""Section 1: the warm path through ASGI, in process, timed against the same-work baselines.

Each variant (``bench._variants``) is the same list-models endpoint called with a prepared
scope and a receive / send that do nothing, so what differs between variants is only what
sits in front of it. keyturn's key has been verified once before timing (its token is in
the cache), so this is the path every request but a key's first takes. The garbage
collector stays on. Section 0 counts the same variants in instructions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Final

from bench._apps import asgi_batch, asgi_call
from bench._core import Batch, Paired, Report, Settings, Table, Target, paired, times, us
from bench._variants import LABELS, Variant, base_of, build, world
from keyturn._core import hashing as _hashing

__all__ = ["check", "measure", "overhead_table", "run", "timed"]

NAME: Final = "asgi"
TITLE: Final = "1. ASGI in process: warm path, paired wall time (GC on)"
VARIANTS: Final = tuple(name for name in LABELS if name.startswith(("starlette.", "fastapi.")))
# What each guard's overhead is divided by in the last column.
VERSUS: Final = {
    name: "fastapi.bearer"
    if name.startswith("fastapi.")
    else ("starlette.floor+tenant" if name.endswith("+tenant") else "starlette.floor")
    for name in VARIANTS
}


def check(variant: Variant, status: int, organization: str | None) -> None:
    """Every variant answers 200, and those that promise them add the service headers."""
    if status != 200:
        raise RuntimeError(f"{variant.name} answered {status}")
    if variant.headers and organization is None:
        raise RuntimeError(f"{variant.name} did not set the service headers")


def overhead_table(title: str, result: Paired, versus: Mapping[str, str]) -> Table:
    """Absolute figures, overhead over the variant's bare app, and the ratio to another's."""
    table = Table(
        title,
        ["variant", "min us/req", "median us/req", "overhead us (median)", "overhead ratio"],
    )
    for name, other in versus.items():
        base = base_of(name)
        overhead = "-" if name == base else us(result.overhead(name, base))
        ratio = (
            f"{times(result.ratio(name, other, base))} of {other}"
            if name not in (base, other)
            else "-"
        )
        table.add(LABELS[name], us(result.min(name)), us(result.median(name)), overhead, ratio)
    return table


def measure(reps: int, batch: int) -> dict[str, Any]:
    """Every variant's paired samples, and the argon2 runs while timing (there must be none)."""
    w = world()
    variants = {name: build(name, w) for name in VARIANTS}
    loop = asyncio.new_event_loop()
    try:
        for variant in variants.values():  # for keyturn: the key's first, decided request
            reply = loop.run_until_complete(asgi_call(variant.app, variant.request))
            check(variant, reply.status, reply.header("service-organization-id"))
        runs = _hashing.legacy_verifications
        batches: dict[str, Batch] = {
            name: asgi_batch(loop.run_until_complete, variant.app, variant.request)
            for name, variant in variants.items()
        }
        result = paired(batches, reps=reps, n=batch)
    finally:
        loop.close()
        w.authenticator.close()
    return {"samples": result.samples, "argon2_runs": _hashing.legacy_verifications - runs}


def timed(
    report: Report,
    measure: Callable[[int, int], dict[str, Any]],
    settings: Settings,
    versus: Mapping[str, str],
) -> Paired:
    """The section's paired result; its table and argon2 count go in *report*."""
    said = measure(settings.reps, settings.batch)
    result = Paired(said["samples"])
    report.facts["warm.argon2_runs_while_timed"] = said["argon2_runs"]
    title = f"per request, {settings.reps} paired repetitions x {settings.batch} requests, GC on"
    report.tables.append(overhead_table(title, result, versus))
    return result


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    result = timed(report, measure, settings, VERSUS)
    for kind, tenant in (("organization key", ""), ("tenant key", "+tenant")):
        name, base = f"starlette.keyturn{tenant}", f"starlette.bare{tenant}"
        floor, auth = f"starlette.floor{tenant}", f"starlette.auth{tenant}"
        versus_floor = result.ratio(name, floor, base)
        versus_auth = result.ratio(name, auth, base)
        report.facts[f"{name}/{floor}"] = versus_floor
        report.facts[f"{name}/{auth}"] = versus_auth
        mine = us(result.overhead(name, base))
        report.targets.append(
            Target(
                f"ASGI warm overhead / floor, paired wall time (GC on), {kind}",
                versus_floor,
                "<=",
                detail=f"{mine} vs {us(result.overhead(floor, base))} us",
            )
        )
        report.targets.append(
            Target(
                f"ASGI / Starlette AuthenticationMiddleware same work, time, {kind}",
                versus_auth,
                "<",
                detail=f"{mine} vs {us(result.overhead(auth, base))} us",
            )
        )
    on_fastapi = result.ratio("fastapi.keyturn", "fastapi.bearer", "fastapi.bare")
    report.facts["fastapi.keyturn/fastapi.bearer"] = on_fastapi
    report.targets.append(
        Target(
            "FastAPI: keyturn / HTTPBearer dependency same work, time, org key",
            on_fastapi,
            "<=",
            detail=f"{us(result.overhead('fastapi.keyturn', 'fastapi.bare'))} vs "
            f"{us(result.overhead('fastapi.bearer', 'fastapi.bare'))} us",
        )
    )
    report.notes.append(
        "same work: the header scan, sha256 + dict lookup, the organization rule and the two "
        "service headers; trivial: the lookup only (the frameworks' trivial rows add no headers)"
    )
    return report
