"""Section 2: the warm path through WSGI, in process, on Flask, paired wall time (GC on).

Each variant (``bench._variants``) calls the app with a prepared environ and a
``start_response`` that does nothing, consumes the returned iterable and closes it, as a
WSGI server would. Section 0 counts the same variants in instructions.
"""

from __future__ import annotations

from typing import Final

from bench._apps import wsgi_batch, wsgi_call
from bench._core import Batch, Report, Settings, Target, paired, us
from bench._variants import LABELS, build, world
from bench.asgi_warm import check, overhead_table

__all__ = ["run"]

NAME: Final = "wsgi"
TITLE: Final = "2. WSGI in process: warm path on Flask, paired wall time (GC on)"
VARIANTS: Final = tuple(name for name in LABELS if name.startswith("flask."))
VERSUS: Final = {
    name: "flask.floor+tenant" if name.endswith("+tenant") else "flask.floor" for name in VARIANTS
}


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    w = world()
    variants = {name: build(name, w) for name in VARIANTS}
    try:
        for variant in variants.values():  # for keyturn: the key's one cold verification
            reply = wsgi_call(variant.app, variant.request)
            check(variant, reply.status, reply.header("service-organization-id"))
        runs = w.authenticator.verifier.runs
        batches: dict[str, Batch] = {
            name: wsgi_batch(variant.app, variant.request) for name, variant in variants.items()
        }
        result = paired(batches, reps=settings.reps, n=settings.batch)
    finally:
        w.authenticator.close()
    report.facts["warm.argon2_runs_while_timed"] = w.authenticator.verifier.runs - runs
    report.tables.append(
        overhead_table(
            f"per request, {settings.reps} paired repetitions x {settings.batch} requests, GC on",
            result,
            VERSUS,
        )
    )
    for kind, suffix in (("organization key", ""), ("tenant key", "+tenant")):
        name, base = f"flask.keyturn{suffix}", f"flask.bare{suffix}"
        floor, httpauth = f"flask.floor{suffix}", f"flask.httpauth{suffix}"
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
