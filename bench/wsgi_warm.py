"""Section 2: the warm path through WSGI, in process, on Flask, paired wall time (GC on).

Each variant (``bench._variants``) calls the app with a prepared environ and a
``start_response`` that does nothing, consumes the returned iterable and closes it, as a
WSGI server would. Section 0 counts the same variants in instructions.
"""

from __future__ import annotations

from typing import Any, Final

from bench._apps import wsgi_batch, wsgi_call
from bench._core import Batch, Report, Settings, Target, paired, us
from bench._variants import LABELS, build, world
from bench.asgi_warm import check, timed
from keyturn._core import hashing as _hashing

__all__ = ["measure", "run"]

NAME: Final = "wsgi"
TITLE: Final = "2. WSGI in process: warm path on Flask, paired wall time (GC on)"
VARIANTS: Final = tuple(name for name in LABELS if name.startswith("flask."))
VERSUS: Final = {
    name: "flask.floor+tenant" if name.endswith("+tenant") else "flask.floor" for name in VARIANTS
}


def measure(reps: int, batch: int) -> dict[str, Any]:
    """Every variant's paired samples, and the argon2 runs while timing (there must be none)."""
    w = world()
    variants = {name: build(name, w) for name in VARIANTS}
    try:
        for variant in variants.values():  # for keyturn: the key's first, decided request
            reply = wsgi_call(variant.app, variant.request)
            check(variant, reply.status, reply.header("service-organization-id"))
        runs = _hashing.legacy_verifications
        batches: dict[str, Batch] = {
            name: wsgi_batch(variant.app, variant.request) for name, variant in variants.items()
        }
        result = paired(batches, reps=reps, n=batch)
    finally:
        w.authenticator.close()
    return {"samples": result.samples, "argon2_runs": _hashing.legacy_verifications - runs}


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    result = timed(report, measure, settings, VERSUS)
    for kind, tenant in (("organization key", ""), ("tenant key", "+tenant")):
        name, base = f"flask.keyturn{tenant}", f"flask.bare{tenant}"
        floor, httpauth = f"flask.floor{tenant}", f"flask.httpauth{tenant}"
        versus_floor = result.ratio(name, floor, base)
        versus_httpauth = result.ratio(name, httpauth, base)
        report.facts[f"{name}/{floor}"] = versus_floor
        report.facts[f"{name}/{httpauth}"] = versus_httpauth
        mine = us(result.overhead(name, base))
        report.targets.append(
            Target(
                f"WSGI warm overhead / floor, paired wall time (GC on), {kind}",
                versus_floor,
                "<=",
                detail=f"{mine} vs {us(result.overhead(floor, base))} us",
            )
        )
        report.targets.append(
            Target(
                f"WSGI / Flask-HTTPAuth same work, time, {kind}",
                versus_httpauth,
                "<=",
                detail=f"{mine} vs {us(result.overhead(httpauth, base))} us",
            )
        )
    report.notes.append(
        "Flask-HTTPAuth runs inside the Flask view (after routing) and adds the headers in an "
        "after_request hook; the floor and keyturn run in front of Flask"
    )
    return report
