"""Where the warm ASGI request goes, piece by piece, in instructions (``--only breakdown``).

The path: Starlette + keyturn, organization-scoped key (and the tenant key for the
organization header), warm. Each piece is isolated: called *N* times in a loop, minus an
empty call's loop. Under ``valgrind --tool=callgrind`` (one run, ``python -m
bench.breakdown N``) a marker call between pieces dumps the counts, so each piece's part
holds its loop alone; callgrind's own per-function view does not help here, since every
Python function runs inside the interpreter's one evaluation loop. Without valgrind, the
same pieces are timed in nanoseconds instead (noisy on a shared machine).

THIS is the one benchmark file that reaches into keyturn's internals (the header scan, the
path guard, the decision's helpers, the driver): when they move, update :func:`pieces`
here. A piece whose internal is gone is reported as missing, not as a failure.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from bench._apps import MODELS, asgi_batch
from bench._core import Report, Settings, Table, run_batch
from bench._variants import build, world
from bench._world import ACCOUNT, ORGANIZATION

__all__ = ["pieces", "run"]

NAME: Final = "breakdown"
TITLE: Final = "Breakdown: the warm ASGI request (organization key), piece by piece"
ROOT: Final = Path(__file__).resolve().parents[1]
EMPTY: Final = "(empty call)"
GUARD: Final = "path guard (Paths.read: root path joined, decoded, matched)"
ADAPTER: Final = "= adapter work after the decision (request - async driver - scan - guard)"
ASYNC_DRIVER: Final = "Authenticator.authenticate_async (async driver: the memo's answer)"
DRIVER: Final = "= async driver around the memo's answer (driver - recall - usage.seen)"
Loop = Callable[[int], object]  # runs a piece n times


def _internal(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


def _repeat(fn: Callable[[], object]) -> Loop:
    def loop(n: int) -> None:
        for _ in range(n):
            fn()

    return loop


def pieces() -> tuple[dict[str, Loop], list[str], Callable[[], None]]:
    """The pieces to measure, the ones whose internals are missing, and a closer."""
    from keyturn import AuthRequest, Principal
    from keyturn.asgi import ApiKeyMiddleware

    w = world()
    authenticator = w.authenticator
    keyturn = build("starlette.keyturn", w)
    bare = build("starlette.bare", w)
    floor = build("starlette.floor", w)
    tenant = build("starlette.keyturn+tenant", w)
    loop = asyncio.new_event_loop()
    scope = keyturn.request
    token = w.keys.organization
    found: dict[str, Loop] = {}
    missing: list[str] = []

    def add(name: str, make: Callable[[], Loop]) -> None:
        try:
            found[name] = make()
        except (AttributeError, ImportError, TypeError, ValueError) as exc:
            missing.append(f"{name}: {type(exc).__name__}: {exc}")

    request = AuthRequest(authorization=(f"Bearer {token}",), path=MODELS)
    tenant_request = AuthRequest(
        authorization=(f"Bearer {w.keys.tenant}",), organization=(ORGANIZATION,), path=MODELS
    )
    for req in (request, tenant_request):  # the keys' one cold verification, off the counts
        if not isinstance(authenticator.authenticate(req), Principal):
            raise RuntimeError("a benchmark key was refused")

    def whole(app: Any, request_scope: dict[str, Any]) -> Loop:
        return asgi_batch(loop.run_until_complete, app, request_scope)

    add(EMPTY, lambda: _repeat(lambda: None))
    add("request: bare Starlette", lambda: whole(bare.app, bare.request))
    add("request: floor, same work", lambda: whole(floor.app, floor.request))
    add("request: keyturn, organization key", lambda: whole(keyturn.app, keyturn.request))
    add("request: keyturn, tenant key", lambda: whole(tenant.app, tenant.request))

    def guard() -> Loop:
        paths = ApiKeyMiddleware(bare.app, authenticator=authenticator).paths
        root, path = scope.get("root_path", ""), scope["path"]
        return _repeat(lambda: paths.read(root, path))

    add(GUARD, guard)

    def read() -> Loop:
        scan = _internal("keyturn.asgi", "_read")
        # strip=False: the scope is reused, and the strip is the middleware's, not the scan's
        return _repeat(lambda: scan(scope, MODELS, False))

    add("header scan into AuthRequest (asgi._read)", read)
    add(
        "AuthRequest(...) alone",
        lambda: _repeat(lambda: AuthRequest((f"Bearer {token}",), (), "GET", MODELS)),
    )

    def async_driver() -> Loop:
        async def many(n: int) -> None:
            for _ in range(n):
                await authenticator.authenticate_async(request)

        return lambda n: loop.run_until_complete(many(n))

    add(ASYNC_DRIVER, async_driver)
    add(
        "Authenticator.authenticate (sync driver: the memo's answer)",
        lambda: _repeat(lambda: authenticator.authenticate(request)),
    )

    def decision() -> Loop:
        decide = _internal("keyturn._core.decision", "decide")
        store, membership = authenticator.store, authenticator.membership
        clock, rules = authenticator.clock, authenticator.rules
        targets = (membership, store)  # indexed by Step.via

        def drive() -> object:
            flow = decide(request, clock(), rules)
            answer: Any = None
            try:
                while True:
                    step = flow.send(answer)
                    answer = step.ask(targets[step.via])
            except StopIteration as done:
                return done.value

        return _repeat(drive)

    add("decide() driven inline (no driver, no _finish)", decision)

    def bearer() -> Loop:
        parse = _internal("keyturn._core.decision", "bearer_token")
        return _repeat(lambda: parse(request.authorization))

    add("bearer_token", bearer)
    add(
        "memo.recall (a remembered answer)",
        lambda: _repeat(lambda: authenticator.memo.recall(request)),
    )

    check_secret = _internal("keyturn._core.hashing", "check_secret")
    token_key_id, token_secret = _internal("keyturn._core.token", "split")(token)
    stored: Any = authenticator.store.get_key(token_key_id)  # the memory store: sync
    add(
        "check_secret (one SHA-256, constant-time comparison)",
        lambda: _repeat(lambda: check_secret(stored.secret_hash, token_secret)),
    )
    add("clock (datetime.now(UTC))", lambda: _repeat(authenticator.clock))
    prefix, id_length = (
        _internal("keyturn._core.token", "PREFIX"),
        _internal("keyturn._core.token", "ID_LENGTH"),
    )
    key_id = token[len(prefix) : len(prefix) + id_length]
    store: Any = authenticator.store  # the memory store and membership: sync
    membership: Any = authenticator.membership
    key = store.get_key(key_id)
    add("store.get_key (memory)", lambda: _repeat(lambda: store.get_key(key_id)))
    add(
        "membership.get_role (memory)",
        lambda: _repeat(lambda: membership.get_role(ACCOUNT, ORGANIZATION)),
    )

    def status() -> Loop:
        derive = _internal("keyturn._core.lifecycle", "derive_status")
        now = authenticator.clock()
        return _repeat(lambda: derive(key, now, reaches_scope=True))

    add("derive_status", status)

    def organization(values: tuple[str, ...]) -> Callable[[], Loop]:
        def make() -> Loop:
            header = _internal("keyturn._core.decision", "organization_header")
            pattern = authenticator.rules.organization_pattern
            return _repeat(lambda: header(values, pattern))

        return make

    add("organization_header (absent)", organization(()))
    add("organization_header (present: regex)", organization((ORGANIZATION,)))
    principal = authenticator.authenticate(request)

    def police() -> Loop:
        run = _internal("keyturn._core.decision", "police")
        rules = authenticator.rules
        return _repeat(lambda: run(principal, (), request.method, request.path, rules))

    add("police (no role policy)", police)

    def usage() -> Loop:
        recorder = authenticator.usage
        if recorder is None:
            raise ValueError("no usage recorder")
        return _repeat(lambda: recorder.seen(principal.key_id))  # type: ignore[union-attr]

    add("usage.seen (no write due)", usage)
    add(
        "_finish (usage, no audit hook)",
        lambda: _repeat(lambda: authenticator._finish(request.method, request.path, principal)),
    )

    def encode() -> Loop:
        names = _internal("keyturn._web", "service_headers")
        return _repeat(
            lambda: [
                (k.encode("latin-1"), v.encode("latin-1"))
                for k, v in names(principal.organization_id, principal.tenant_id)
            ]
        )

    add("service headers, encoded", encode)

    def wrapper() -> Loop:
        names = _internal("keyturn._web", "_RESERVED_EITHER")
        lengths = _internal("keyturn._web", "RESERVED_LENGTHS")
        start = {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", b"53"), (b"content-type", b"application/json")],
        }
        extra = [(b"service-organization-id", b"org_main"), (b"service-tenant-id", b"acme")]

        def filter_and_copy() -> object:
            headers = [
                line
                for line in start["headers"]
                if len(line[0]) not in lengths or line[0].lower() not in names
            ]
            return {**start, "headers": headers + extra}

        return _repeat(filter_and_copy)

    add("send wrapper: filter + copy the start message", wrapper)
    add(
        "strip Authorization: copy the header list, remove one line",
        lambda: _repeat(lambda: list(scope["headers"]).remove(scope["headers"][-1])),
    )
    who = w.table[hashlib.sha256(token.encode("ascii")).digest()]
    add(
        "floor: sha256 + dict lookup",
        lambda: _repeat(lambda: w.table.get(hashlib.sha256(token.encode("ascii")).digest())),
    )
    add("floor: the organization rule", lambda: _repeat(lambda: w.rule.organization(who, None)))

    def close() -> None:
        loop.close()
        authenticator.close()

    return found, missing, close


def _count_main(n: int) -> None:
    """Under callgrind: every piece n times, a marker call (``os.getppid``) after each."""
    found, missing, close = pieces()
    try:
        for piece in found.values():  # warm-up, then the counted loops
            piece(max(10, n // 10))
        os.getppid()  # part 1 (set-up, warm-up) ends
        for piece in found.values():
            piece(n)
            os.getppid()
    finally:
        close()
    print(json.dumps({"pieces": list(found), "missing": missing, "n": n}), flush=True)


def _instructions(n: int) -> tuple[dict[str, float], list[str]]:
    from bench.instructions import callgrind

    said, parts = callgrind("bench.breakdown", str(n))
    names: list[str] = said["pieces"]
    if sorted(parts) != list(range(1, len(names) + 3)):
        raise RuntimeError(f"expected {len(names) + 2} callgrind parts, got {sorted(parts)}")
    return {name: parts[index + 2] / n for index, name in enumerate(names)}, said["missing"]


def _nanoseconds(n: int) -> tuple[dict[str, float], list[str]]:
    found, missing, close = pieces()
    try:
        for piece in found.values():
            piece(max(10, n // 10))
        result = {}
        for name, piece in found.items():

            def batch(count: int, piece: Loop = piece) -> int:
                start = time.perf_counter_ns()
                piece(count)
                return time.perf_counter_ns() - start

            result[name] = min(run_batch(batch, n) for _ in range(3))
    finally:
        close()
    return result, missing


def _pieces(per_call: dict[str, float]) -> dict[str, float]:
    """Each piece net of the empty call's loop, whole requests over bare, and the three sums."""
    empty = per_call[EMPTY]
    net = {
        name: value - (0 if name.startswith("request:") else empty)
        for name, value in per_call.items()
        if name != EMPTY
    }
    bare = net.pop("request: bare Starlette")
    rows = {
        f"{name}, over bare Starlette": value - bare
        for name, value in net.items()
        if name.startswith("request:")
    }
    rows.update((name, value) for name, value in net.items() if not name.startswith("request:"))

    def get(name: str) -> float:
        return net.get(name, float("nan"))

    keyturn = net.get("request: keyturn, organization key", float("nan")) - bare
    rows[ADAPTER] = (
        keyturn - get(ASYNC_DRIVER) - get("header scan into AuthRequest (asgi._read)") - get(GUARD)
    )
    rows[DRIVER] = (
        get(ASYNC_DRIVER)
        - get("memo.recall (a remembered answer)")
        - get("usage.seen (no write due)")
    )
    rows["= decide()'s own bytecode, generator protocol and step objects (a memo miss)"] = get(
        "decide() driven inline (no driver, no _finish)"
    ) - sum(
        get(name)
        for name in (
            "bearer_token",
            "cache.digest (keyed BLAKE2b)",
            "cache.lookup",
            "clock (datetime.now(UTC))",
            "store.get_key (memory)",
            "membership.get_role (memory)",
            "derive_status",
            "organization_header (absent)",
        )
    )
    return rows


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    n = max(20, settings.count_requests)
    counted = shutil.which("valgrind") is not None
    found, missing = _instructions(n) if counted else _nanoseconds(settings.batch)
    unit = "instructions" if counted else "ns (valgrind not installed: timed instead)"
    rows = _pieces(found)
    table = Table(
        f"{unit} per call, {n} calls per piece, minus an empty call's loop ({found[EMPTY]:,.0f})",
        ["piece", unit.split()[0]],
    )
    for name, value in rows.items():
        table.add(name, f"{value:,.0f}")
    report.tables.append(table)
    report.facts.update(
        pieces=len(rows) - 3,
        missing=len(missing),
        counted=int(counted),
        keyturn_over_bare=rows.get(
            "request: keyturn, organization key, over bare Starlette", float("nan")
        ),
        adapter=rows[ADAPTER],
    )
    report.notes += [f"missing piece (internal moved): {text}" for text in sorted(set(missing))]
    return report


if __name__ == "__main__":
    _count_main(int(sys.argv[1]))
