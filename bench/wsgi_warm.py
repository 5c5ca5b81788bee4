"""Section 2: the warm path through WSGI, in process, on Flask.

Each variant calls the app with a prepared environ and a ``start_response`` that does
nothing, consumes the returned iterable and closes it, as a WSGI server would.
"""

from __future__ import annotations

from typing import Any, Final

from bench._apps import (
    FloorWSGI,
    Who,
    flask_app,
    flask_httpauth_app,
    sha256_keys,
    wsgi_batch,
    wsgi_call,
    wsgi_environ,
)
from bench._core import Batch, Report, Settings, Table, paired, times
from bench._world import ACCOUNT, ORGANIZATION, TENANT, memory_world
from bench.asgi_warm import overhead_table
from keyturn import Authenticator
from keyturn.wsgi import ApiKeyMiddleware

__all__ = ["run"]

NAME: Final = "wsgi"
TITLE: Final = "2. WSGI in process: warm path on a minimal Flask endpoint"

BARE: Final = "flask: bare"
FLOOR: Final = "flask: floor (minimal WSGI middleware)"
HTTPAUTH: Final = "flask: Flask-HTTPAuth HTTPTokenAuth"
KEYTURN_ORG: Final = "flask: keyturn, organization key"
KEYTURN_TENANT: Final = "flask: keyturn, tenant key + x-organization-id"
BASES: Final = dict.fromkeys((BARE, FLOOR, HTTPAUTH, KEYTURN_ORG, KEYTURN_TENANT), BARE)


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    store, membership, keys = memory_world()
    authenticator = Authenticator(store, membership)
    who = Who(ACCOUNT, ORGANIZATION, TENANT)
    table = sha256_keys({keys.organization: who, keys.tenant: who})
    organization = wsgi_environ({"Authorization": f"Bearer {keys.organization}"})
    tenant = wsgi_environ(
        {"Authorization": f"Bearer {keys.tenant}", "X-Organization-Id": ORGANIZATION}
    )
    bare = flask_app()
    guarded = flask_app()
    keyturn = ApiKeyMiddleware(guarded.wsgi_app, authenticator=authenticator)
    variants: dict[str, tuple[Any, dict[str, Any]]] = {
        BARE: (bare.wsgi_app, organization),
        FLOOR: (FloorWSGI(flask_app().wsgi_app, keys=table), organization),
        HTTPAUTH: (flask_httpauth_app(table).wsgi_app, organization),
        KEYTURN_ORG: (keyturn, organization),
        KEYTURN_TENANT: (keyturn, tenant),
    }
    try:
        for name, (app, environ) in variants.items():
            reply = wsgi_call(app, environ)  # keyturn: the key's one cold verification
            if reply.status != 200:
                raise RuntimeError(f"{name} answered {reply.status}: {reply.body!r}")
            if ("keyturn" in name or "floor" in name) and reply.header(
                "service-organization-id"
            ) != ORGANIZATION:
                raise RuntimeError(f"{name} did not set the service headers")
        runs = authenticator.verifier.runs
        batches: dict[str, Batch] = {
            name: wsgi_batch(app, environ) for name, (app, environ) in variants.items()
        }
        result = paired(batches, reps=settings.reps, n=settings.batch)
    finally:
        authenticator.close()
    report.facts["warm.argon2_runs_while_timed"] = authenticator.verifier.runs - runs

    report.tables.append(
        overhead_table(
            f"per request, {settings.reps} paired repetitions x {settings.batch} requests",
            result,
            BASES,
            FLOOR,
        )
    )
    ratios = Table(
        "ratios (median of per-repetition ratios of overheads)", ["comparison", "ratio", "bar"]
    )
    for key_kind, name in (("organization", KEYTURN_ORG), ("tenant", KEYTURN_TENANT)):
        versus_floor = result.ratio(name, FLOOR, BARE)
        versus_httpauth = result.ratio(name, HTTPAUTH, BARE)
        ratios.add(f"keyturn ({key_kind} key) / floor", times(versus_floor), "<= 1.50x")
        ratios.add(f"keyturn ({key_kind} key) / Flask-HTTPAuth", times(versus_httpauth), "< 1.00x")
        report.facts[f"{key_kind}.over_floor"] = versus_floor
        report.facts[f"{key_kind}.over_httpauth"] = versus_httpauth
        report.bar(
            f"WSGI warm path, {key_kind} key: overhead vs floor's",
            times(versus_floor),
            "<= 1.50x",
            versus_floor <= 1.5,
        )
        report.bar(
            f"WSGI warm path, {key_kind} key: overhead vs Flask-HTTPAuth's",
            times(versus_httpauth),
            "< 1.00x",
            versus_httpauth < 1.0,
        )
    report.tables.append(ratios)
    report.notes.append(
        "Flask-HTTPAuth runs inside the Flask view (after routing), the floor and keyturn in "
        "front of Flask; the floor and keyturn add the two service headers, Flask-HTTPAuth none"
    )
    return report
