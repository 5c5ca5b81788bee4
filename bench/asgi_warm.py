"""Section 1: the warm path through ASGI, in process, against the floor and the frameworks.

Each variant is the same list-models endpoint called with a prepared scope and a receive /
send that do nothing, so what differs between variants is only what sits in front of it.
keyturn's key has been verified once before timing (its token is in the cache), so this
is the path every request but a key's first takes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

from starlette.middleware import Middleware

from bench._apps import (
    FloorASGI,
    Who,
    asgi_batch,
    asgi_call,
    fastapi_app,
    fastapi_bearer_app,
    http_scope,
    sha256_keys,
    starlette_app,
    starlette_auth_backend,
)
from bench._core import Batch, Paired, Report, Settings, Table, paired, times, us
from bench._world import ACCOUNT, ORGANIZATION, TENANT, memory_world
from keyturn import Authenticator
from keyturn.asgi import ApiKeyMiddleware

__all__ = ["overhead_table", "run"]

NAME: Final = "asgi"
TITLE: Final = "1. ASGI in process: warm path on a minimal Starlette endpoint"

BARE: Final = "starlette: bare"
FLOOR: Final = "starlette: floor (minimal ASGI middleware)"
STARLETTE_AUTH: Final = "starlette: AuthenticationMiddleware"
KEYTURN_ORG: Final = "starlette: keyturn, organization key"
KEYTURN_TENANT: Final = "starlette: keyturn, tenant key + x-organization-id"
FASTAPI_BARE: Final = "fastapi: bare"
FASTAPI_BEARER: Final = "fastapi: HTTPBearer dependency"
FASTAPI_KEYTURN: Final = "fastapi: keyturn, organization key"

# Which bare app each variant's overhead is measured over.
BASES: Final = {
    BARE: BARE,
    FLOOR: BARE,
    STARLETTE_AUTH: BARE,
    KEYTURN_ORG: BARE,
    KEYTURN_TENANT: BARE,
    FASTAPI_BARE: FASTAPI_BARE,
    FASTAPI_BEARER: FASTAPI_BARE,
    FASTAPI_KEYTURN: FASTAPI_BARE,
}


def overhead_table(
    title: str, result: Paired, bases: Mapping[str, str], floor: str | None
) -> Table:
    """Absolute figures, overhead over the variant's bare app, and the ratio to the floor's."""
    table = Table(
        title,
        [
            "variant",
            "min us/req",
            "median us/req",
            "overhead us (median)",
            "overhead / floor's",
        ],
    )
    for name, base in bases.items():
        overhead = "-" if name == base else us(result.overhead(name, base))
        versus = (
            times(result.ratio(name, floor, base))
            if floor is not None and name != base and bases[floor] == base
            else "-"
        )
        table.add(name, us(result.min(name)), us(result.median(name)), overhead, versus)
    return table


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    store, membership, keys = memory_world()
    authenticator = Authenticator(store, membership)
    who = Who(ACCOUNT, ORGANIZATION, TENANT)
    table = sha256_keys({keys.organization: who, keys.tenant: who})
    organization_scope = http_scope([("authorization", f"Bearer {keys.organization}")])
    tenant_scope = http_scope(
        [("authorization", f"Bearer {keys.tenant}"), ("x-organization-id", ORGANIZATION)]
    )
    keyturn = Middleware(ApiKeyMiddleware, authenticator=authenticator)
    starlette_keyturn = starlette_app(keyturn)
    variants: dict[str, tuple[Any, dict[str, Any]]] = {
        BARE: (starlette_app(), organization_scope),
        FLOOR: (starlette_app(Middleware(FloorASGI, keys=table)), organization_scope),
        STARLETTE_AUTH: (starlette_app(starlette_auth_backend(table)), organization_scope),
        KEYTURN_ORG: (starlette_keyturn, organization_scope),
        KEYTURN_TENANT: (starlette_keyturn, tenant_scope),
        FASTAPI_BARE: (fastapi_app(), organization_scope),
        FASTAPI_BEARER: (fastapi_bearer_app(table), organization_scope),
        FASTAPI_KEYTURN: (fastapi_app(keyturn), organization_scope),
    }
    loop = asyncio.new_event_loop()
    try:
        # Every variant answers 200, and the ones that promise them add the service headers.
        # For keyturn this first call is the key's cold verification.
        for name, (app, scope) in variants.items():
            reply = loop.run_until_complete(asgi_call(app, scope))
            if reply.status != 200:
                raise RuntimeError(f"{name} answered {reply.status}: {reply.body!r}")
            promised = "keyturn" in name or "floor" in name
            if promised and reply.header("service-organization-id") != ORGANIZATION:
                raise RuntimeError(f"{name} did not set the service headers")
        runs = authenticator.verifier.runs
        batches: dict[str, Batch] = {
            name: asgi_batch(loop.run_until_complete, app, scope)
            for name, (app, scope) in variants.items()
        }
        result = paired(batches, reps=settings.reps, n=settings.batch)
    finally:
        loop.close()
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
        "ratios (median of per-repetition ratios of overheads)",
        ["comparison", "ratio", "bar"],
    )
    for key_kind, name in (("organization", KEYTURN_ORG), ("tenant", KEYTURN_TENANT)):
        versus_floor = result.ratio(name, FLOOR, BARE)
        versus_starlette = result.ratio(name, STARLETTE_AUTH, BARE)
        ratios.add(f"keyturn ({key_kind} key) / floor", times(versus_floor), "<= 1.50x")
        ratios.add(
            f"keyturn ({key_kind} key) / Starlette AuthenticationMiddleware",
            times(versus_starlette),
            "< 1.00x",
        )
        report.facts[f"{key_kind}.over_floor"] = versus_floor
        report.facts[f"{key_kind}.over_starlette_auth"] = versus_starlette
        report.bar(
            f"ASGI warm path, {key_kind} key: overhead vs floor's",
            times(versus_floor),
            "<= 1.50x",
            versus_floor <= 1.5,
        )
        report.bar(
            f"ASGI warm path, {key_kind} key: overhead vs Starlette AuthenticationMiddleware's",
            times(versus_starlette),
            "< 1.00x",
            versus_starlette < 1.0,
        )
    on_fastapi = result.ratio(FASTAPI_KEYTURN, FASTAPI_BEARER, FASTAPI_BARE)
    ratios.add("fastapi: keyturn / HTTPBearer dependency", times(on_fastapi), "(info)")
    report.facts["fastapi.over_httpbearer"] = on_fastapi
    report.tables.append(ratios)
    report.notes.append(
        "the floor and keyturn add the two service headers; Starlette's "
        "AuthenticationMiddleware and FastAPI's HTTPBearer add none (that is how they work)"
    )
    return report
