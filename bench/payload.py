"""Section 10: the payload guard's cost per KiB of request body.

Three kinds of JSON body, each 1 KiB, 64 KiB and 1 MiB long: machine JSON with no escape at
all, chat text (a ``\\n`` every line, some ``\\"``), and text in another script sent with
``ensure_ascii`` (every character a ``\\u`` escape, the scanner's slowest input). For each:

- the scanner alone (``_payload.BodyScanner``), the body fed in 64 KiB chunks;
- a POST through the ASGI middleware with and without the guard, paired, the body in
  64 KiB messages as uvicorn hands them over, to an app that reads it; the guard's
  overhead is the difference;
- the same through the WSGI middleware (``wsgi.input`` a fresh ``BytesIO``).

Each figure is given per request and divided by the body's size in KiB; an empty body
(``{}``) shows what the guard costs a request by itself. The same variants are counted in
instructions by callgrind (64 KiB bodies, one valgrind run per body, ``python -m
bench.payload BODY N``): unlike times, counts do not move when the machine is busy.

Counted facts: the guard finds the one key put into each kind of body (plain, and
escaped), refuses it with 400, records it as leaked, and runs no argon2 (a key's secret is
checked with one SHA-256).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Final

from bench._apps import Message
from bench._core import Batch, Report, Settings, Table, paired, us
from bench._world import memory_world, new_key
from bench.instructions import callgrind, valgrind_missing
from keyturn import Authenticator
from keyturn._core import hashing as _hashing
from keyturn._core.scanner import BodyScanner
from keyturn.asgi import ApiKeyMiddleware as AsgiMiddleware
from keyturn.payload import PayloadGuard
from keyturn.wsgi import ApiKeyMiddleware as WsgiMiddleware

__all__ = ["main", "run"]

NAME: Final = "payload"
TITLE: Final = "10. Payload guard: cost per request and per KiB of request body"

SESSIONS: Final = "/managed-agents/v1/sessions"
CHUNK: Final = 64 * 1024
SIZES: Final = {"1 KiB": 1024, "64 KiB": 64 * 1024, "1 MiB": 1024 * 1024}
SMOKE_SIZES: Final = {"1 KiB": 1024, "64 KiB": 64 * 1024}


def _fill(unit: Callable[[int], Any], size: int) -> bytes:
    """A JSON list of *unit* items, padded with spaces to exactly *size* bytes."""
    count = size // (len(json.dumps(unit(0))) + 2)
    body = json.dumps([unit(i) for i in range(count)]).encode()
    for _ in range(count):  # bounded: one item fewer each time
        if len(body) <= size:
            break
        count -= 1
        body = json.dumps([unit(i) for i in range(count)]).encode()
    return body[:-1] + b" " * (size - len(body)) + b"]"


KINDS: Final[dict[str, Callable[[int], Any]]] = {
    "machine JSON, no escape": lambda i: {"id": i, "model": "agent-small", "tokens": [1, 2, 3]},
    'chat text, \\n and \\" escapes': lambda i: {
        "role": "user",
        "content": f'Line {i} of the "task":\nrun the tests, then report.\n',
    },
    "non-Latin text, every char \\u-escaped": lambda i: {
        "content": "\u043f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440 " * 4
    },
}


def _scan_batch(body: bytes) -> Batch:
    chunks = [body[at : at + CHUNK] for at in range(0, len(body), CHUNK)]

    def batch(n: int) -> int:
        start = time.perf_counter_ns()
        for _ in range(n):
            scanner = BodyScanner()
            for chunk in chunks:
                scanner.feed(chunk)
            scanner.end()
        return time.perf_counter_ns() - start

    return batch


async def _reading_app(scope: Any, receive: Any, send: Any) -> None:
    for _ in range(100_000):  # bounded: more messages than any body here has
        message = await receive()
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def _scope(token: str, size: int) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": SESSIONS,
        "raw_path": SESSIONS.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(size).encode()),
        ],
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
    }


async def _status(message: Message, into: list[int]) -> None:
    if message["type"] == "http.response.start":
        into.append(message["status"])


class _Body:
    """A request body handed over in the given chunks, as a server's ``receive``."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.pending = list(chunks)

    async def receive(self) -> Message:
        chunk = self.pending.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(self.pending)}


def _asgi_batch(loop: asyncio.AbstractEventLoop, app: Any, token: str, body: bytes) -> Batch:
    chunks = [body[at : at + CHUNK] for at in range(0, len(body), CHUNK)]
    statuses: list[int] = []

    async def send(message: Message) -> None:
        await _status(message, statuses)

    async def many(n: int) -> int:
        start = time.perf_counter_ns()
        for _ in range(n):
            await app(_scope(token, len(body)), _Body(chunks).receive, send)
        return time.perf_counter_ns() - start

    def batch(n: int) -> int:
        elapsed: int = loop.run_until_complete(many(n))
        if set(statuses) != {200}:
            raise RuntimeError(f"ASGI answered {sorted(set(statuses))}")
        statuses.clear()
        return elapsed

    return batch


def _reading_wsgi(environ: Any, start_response: Any) -> list[bytes]:
    environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
    start_response("200 OK", [("content-type", "application/json")])
    return [b"{}"]


def _wsgi_batch(app: Any, token: str, body: bytes) -> Batch:
    base = {
        "REQUEST_METHOD": "POST",
        "SCRIPT_NAME": "",
        "PATH_INFO": SESSIONS,
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_AUTHORIZATION": f"Bearer {token}",
        "wsgi.url_scheme": "http",
    }
    statuses: list[str] = []

    def start_response(status: str, headers: Any, exc_info: Any = None) -> Any:
        statuses.append(status)
        return None

    def batch(n: int) -> int:
        start = time.perf_counter_ns()
        for _ in range(n):
            app({**base, "wsgi.input": io.BytesIO(body)}, start_response)
        elapsed = time.perf_counter_ns() - start
        if set(statuses) != {"200 OK"}:
            raise RuntimeError(f"WSGI answered {sorted(set(statuses))}")
        statuses.clear()
        return elapsed

    return batch


def _post(app: Any, token: str, body: bytes) -> str:
    """One POST of *body* through the WSGI *app*; its status line."""
    statuses: list[str] = []

    def start_response(status: str, headers: Any, exc_info: Any = None) -> None:
        statuses.append(status)

    app(
        {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": SESSIONS,
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)),
            "HTTP_AUTHORIZATION": f"Bearer {token}",
            "wsgi.input": io.BytesIO(body),
        },
        start_response,
    )
    return statuses[0]


def _facts(report: Report) -> None:
    """Counted: each kind of body with a key in it is refused and the key recorded; no
    argon2 runs (a key's secret is checked with one SHA-256)."""
    store, membership, keys = memory_world()
    quiet = logging.getLogger("keyturn")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # a WARNING per key recorded: expected here, not news
    with Authenticator(store, membership) as authenticator:
        guard = PayloadGuard()
        app = WsgiMiddleware(_reading_wsgi, authenticator=authenticator, payload_guard=guard)
        sender = keys.organization
        _post(app, sender, b"{}")  # the sending key's first request
        table = Table(
            "a key put into each kind of body (WSGI, counted)",
            ["body", "key written", "status", "recorded as leaked", "argon2 runs"],
        )
        for kind, unit in KINDS.items():
            for written in ("plainly", "escaped"):
                leaked = new_key(store, membership)
                text = leaked if written == "plainly" else leaked.replace("rma_", "\\u0072ma_")
                body = _fill(unit, 2048)[:-1] + f',"{text}"]'.encode()
                json.loads(body)  # still one JSON document
                runs = _hashing.legacy_verifications
                status = _post(app, sender, body)
                record = store.get_key(leaked[4:16])
                recorded = record is not None and record.leaked is not None
                ran = _hashing.legacy_verifications - runs
                table.add(kind, written, status.split()[0], "yes" if recorded else "no", ran)
                if status != "400 Bad Request" or not recorded:
                    raise RuntimeError(f"{kind}, {written}: {status}, recorded={recorded}")
        report.facts["refused_and_recorded"] = len(table.rows)
        # The sender's own key in its body: recorded too, no argon2 run.
        runs = _hashing.legacy_verifications
        status = _post(app, sender, json.dumps({"content": sender}).encode())
        ran = _hashing.legacy_verifications - runs
        report.facts["verified_key.argon2_runs"] = ran
        table.add("the sending key itself", "plainly", status.split()[0], "yes", ran)
        report.tables.append(table)
    quiet.setLevel(level)


# The variants one callgrind run counts, in order, each between two os.getppid() calls.
COUNTED: Final = ("scan", "asgi on", "asgi off", "wsgi on", "wsgi off")
COUNT_SIZE: Final = 64 * 1024


def _bodies(sizes: dict[str, int]) -> list[tuple[str, str, bytes]]:
    return [("empty JSON object", "2 B", b"{}")] + [
        (kind, label, _fill(unit, size))
        for kind, unit in KINDS.items()
        for label, size in sizes.items()
    ]


def main(argv: list[str]) -> None:
    """``python -m bench.payload BODY N``: for callgrind, the variants of :data:`COUNTED` on
    body number BODY (0: empty, then each kind at 64 KiB), N requests each, every variant
    between two ``os.getppid()`` calls (see ``bench._count``)."""
    index, n = int(argv[0]), int(argv[1])
    kind, _, body = _bodies({"64 KiB": COUNT_SIZE})[index]
    store, membership, keys = memory_world()
    loop = asyncio.new_event_loop()
    with Authenticator(store, membership) as authenticator:
        guard = PayloadGuard()
        variants = _variants(loop, authenticator, guard, keys.organization, body)
        for batch in variants.values():
            batch(max(2, n // 4))  # warm-up; the key's first, decided request falls here
        for batch in variants.values():
            os.getppid()  # the previous part ends
            batch(n)
        os.getppid()
    loop.close()
    print(json.dumps({"body": kind, "n": n}), flush=True)


def _variants(
    loop: asyncio.AbstractEventLoop,
    authenticator: Authenticator,
    guard: PayloadGuard,
    token: str,
    body: bytes,
) -> dict[str, Batch]:
    asgi_on = AsgiMiddleware(_reading_app, authenticator=authenticator, payload_guard=guard)
    asgi_off = AsgiMiddleware(_reading_app, authenticator=authenticator)
    wsgi_on = WsgiMiddleware(_reading_wsgi, authenticator=authenticator, payload_guard=guard)
    wsgi_off = WsgiMiddleware(_reading_wsgi, authenticator=authenticator)
    return {
        "scan": _scan_batch(body),
        "asgi on": _asgi_batch(loop, asgi_on, token, body),
        "asgi off": _asgi_batch(loop, asgi_off, token, body),
        "wsgi on": _wsgi_batch(wsgi_on, token, body),
        "wsgi off": _wsgi_batch(wsgi_off, token, body),
    }


def _instructions(report: Report, settings: Settings) -> None:
    """Instructions per request and per KiB, counted by callgrind: unlike time, the same on a
    busy machine."""
    missing = valgrind_missing()
    if missing is not None:
        report.notes.append(f"instruction counts skipped: {missing}")
        return
    table = Table(
        "the guard's cost in instructions (callgrind), 64 KiB bodies",
        ["body", "scanner instr/KiB", "ASGI guard instr/req", "instr/KiB", "WSGI instr/req",
         "instr/KiB"],
    )  # fmt: skip
    bodies = _bodies({"64 KiB": COUNT_SIZE})
    n = 2 if settings.label == "smoke" else 20
    for index, (kind, _, body) in enumerate(bodies[:1] if settings.label == "smoke" else bodies):
        said, parts = callgrind("bench.payload", str(index), str(n))
        if said != {"body": kind, "n": n} or sorted(parts) != list(range(1, len(COUNTED) + 3)):
            raise RuntimeError(f"callgrind run of {kind} said {said}, parts {sorted(parts)}")
        per = {name: parts[2 + at] / n for at, name in enumerate(COUNTED)}
        kib = len(body) / 1024
        asgi, wsgi = per["asgi on"] - per["asgi off"], per["wsgi on"] - per["wsgi off"]
        small = len(body) < 1024
        table.add(
            kind,
            "-" if small else f"{per['scan'] / kib:,.0f}",
            f"{asgi:,.0f}",
            "-" if small else f"{asgi / kib:,.0f}",
            f"{wsgi:,.0f}",
            "-" if small else f"{wsgi / kib:,.0f}",
        )
        slug = kind.split(",")[0].split(" ")[0]
        report.facts[f"{slug}.scan_instructions"] = per["scan"]
        report.facts[f"{slug}.asgi_instructions"] = asgi
        report.facts[f"{slug}.wsgi_instructions"] = wsgi
    report.tables.append(table)


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    _facts(report)
    _instructions(report, settings)
    sizes = SMOKE_SIZES if settings.label == "smoke" else SIZES
    store, membership, keys = memory_world()
    loop = asyncio.new_event_loop()
    timing = Table(
        f"the guard's cost, {settings.reps} paired repetitions, medians (scanner: min too)",
        [
            "body",
            "size",
            "scanner us/KiB (min)",
            "ASGI guard us/req",
            "us/KiB",
            "WSGI guard us/req",
            "us/KiB",
        ],
    )
    bodies = _bodies(sizes)
    with Authenticator(store, membership) as authenticator:
        guard = PayloadGuard(max_bytes=max(sizes.values()))
        token = keys.organization
        try:
            for kind, label, body in bodies:
                kib = len(body) / 1024
                # About 4 MiB of body per variant and repetition, at least 2 requests.
                n = max(2, min(settings.batch, (4 << 20) // len(body)))
                result = paired(
                    _variants(loop, authenticator, guard, token, body),
                    reps=settings.reps,
                    n=n,
                    warmup=1,
                )
                scan = result.median("scan") / kib
                asgi = result.overhead("asgi on", "asgi off")
                wsgi = result.overhead("wsgi on", "wsgi off")
                small = len(body) < 1024  # per KiB means nothing for a 2-byte body
                timing.add(
                    kind,
                    label,
                    "-" if small else f"{us(scan, 2)} ({us(result.min('scan') / kib, 2)})",
                    us(asgi, 1),
                    "-" if small else us(asgi / kib, 2),
                    us(wsgi, 1),
                    "-" if small else us(wsgi / kib, 2),
                )
                slug = f"{kind.split(',')[0].split(' ')[0]}.{len(body)}"
                report.facts[f"{slug}.scan_ns_per_kib"] = scan
                report.facts[f"{slug}.asgi_ns_per_request"] = asgi
                report.facts[f"{slug}.wsgi_ns_per_request"] = wsgi
        finally:
            loop.close()
    report.tables.append(timing)
    report.notes.append(
        "the guard's overhead is the paired difference of the same POST with and without it; "
        "a body with no escape costs a search for 'rma_', one with escapes a pass that reads them"
    )
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
