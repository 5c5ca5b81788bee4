"""Section 5: real HTTP on 127.0.0.1, uvicorn serving the Starlette app bare and behind keyturn.

Each variant runs in a server process of its own (``bench._server``), started here on a
free port and stopped here by its PID. A bounded load -- a fixed number of requests per
connection or a fixed number of seconds, whichever ends first -- comes from a few threads,
each with one keep-alive connection sending the same prepared ``GET`` with the same
``Authorization`` header to either server. Variants alternate in paired rounds. The
server's CPU time (all its threads) is read from ``/proc/<pid>/task/*/schedstat``
(nanoseconds), or ``/proc/<pid>/stat`` (user + system, in clock ticks) without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

from bench._apps import MODELS
from bench._core import Report, Settings, Table, times
from bench._server import HTTP, LOOP, VARIANTS

__all__ = ["Load", "Server", "run"]

NAME: Final = "http"
TITLE: Final = "5. Real HTTP: uvicorn on 127.0.0.1, bare vs behind keyturn"
ROOT: Final = Path(__file__).resolve().parents[1]
STARTUP_SECONDS: Final = 30.0
WARMUP_REQUESTS: Final = 300


class Server:
    """One ``python -m bench._server <variant>`` process."""

    def __init__(self, variant: str) -> None:
        self.variant = variant
        self._log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop()
        self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "bench._server", variant],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
        )
        try:
            self.port, self.token = self._handshake()
        except BaseException:
            self.stop()
            raise

    def _handshake(self) -> tuple[int, str]:
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(timeout=STARTUP_SECONDS):
                raise RuntimeError(f"{self.variant} server: no port after {STARTUP_SECONDS} s")
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.variant} server exited: {self.log()}")
        hello = json.loads(line)
        port, token = int(hello["port"]), str(hello["token"])
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:  # the socket is bound at once; uvicorn listens a moment later
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return port, token
            except OSError as exc:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    message = f"{self.variant} server did not listen: {self.log()}"
                    raise RuntimeError(message) from exc
                time.sleep(0.02)

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-2000:]

    def cpu_ns(self) -> int:
        """CPU time of the server process so far, all its threads, in nanoseconds.

        ``/proc/<pid>/task/*/schedstat`` counts in nanoseconds; ``/proc/<pid>/stat`` (user +
        system, in clock ticks of 10 ms) is the fallback where the former is missing.
        """
        pid = self.process.pid
        try:
            total = 0
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as stat:
                    total += int(stat.read().split()[0])
            return total
        except (OSError, ValueError, IndexError):
            pass
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rpartition(")")[2].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        """Stop the process by its PID: SIGTERM, then SIGKILL if it lingers."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()


@dataclass(frozen=True)
class Load:
    """One bounded load run against one server."""

    requests: int
    failed: int  # answers other than 200, and connections that broke
    elapsed_ns: int
    cpu_ns: int

    @property
    def throughput(self) -> float:
        return self.requests / (self.elapsed_ns / 1e9) if self.elapsed_ns else 0.0

    @property
    def cpu_per_request_ns(self) -> float:
        return self.cpu_ns / self.requests if self.requests else float("inf")


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def load(server: Server, *, clients: int, requests: int, seconds: float) -> Load:
    """Send at most *requests* in total, for at most *seconds*, over *clients* connections."""
    request = (
        f"GET {MODELS} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Bearer {server.token}\r\nAccept: */*\r\n\r\n"
    ).encode("ascii")
    per_client = max(1, requests // clients)
    tally: list[tuple[int, int]] = []
    ready = threading.Barrier(clients + 1)
    deadline = [0.0]  # set once every client is connected

    def client() -> None:
        done = failed = 0
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                ready.wait(30)
                buffer = b""
                while done < per_client and time.perf_counter() < deadline[0]:
                    sock.sendall(request)
                    while b"\r\n\r\n" not in buffer:
                        chunk = sock.recv(65536)
                        if not chunk:
                            raise ConnectionError("the server closed the connection")
                        buffer += chunk
                    head, _, buffer = buffer.partition(b"\r\n\r\n")
                    length = _content_length(head)
                    while len(buffer) < length:
                        chunk = sock.recv(65536)
                        if not chunk:
                            raise ConnectionError("the server closed the connection")
                        buffer += chunk
                    buffer = buffer[length:]
                    done += 1
                    if head[9:12] != b"200":
                        failed += 1
        except (OSError, threading.BrokenBarrierError):
            failed += 1
            ready.abort()  # never leave the others (or the starter) waiting
        tally.append((done, failed))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    cpu_before = server.cpu_ns()
    deadline[0] = time.perf_counter() + seconds
    # Every client is connected: go. If one could not connect, the barrier is broken, the
    # others stop at once, and its failure is counted.
    with contextlib.suppress(threading.BrokenBarrierError):
        ready.wait(30)
    start = time.perf_counter_ns()
    for thread in threads:
        thread.join(seconds + 30)
    elapsed = time.perf_counter_ns() - start
    cpu = server.cpu_ns() - cpu_before
    if any(thread.is_alive() for thread in threads):
        raise RuntimeError("a load client did not finish in time")
    return Load(
        requests=sum(done for done, _ in tally),
        failed=sum(failed for _, failed in tally),
        elapsed_ns=elapsed,
        cpu_ns=cpu,
    )


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    servers: dict[str, Server] = {}
    samples: dict[str, list[Load]] = {variant: [] for variant in VARIANTS}
    try:
        for variant in VARIANTS:
            servers[variant] = Server(variant)
        for server in servers.values():  # keyturn's one cold verification, and warm caches
            warm = load(server, clients=1, requests=WARMUP_REQUESTS, seconds=10)
            if warm.failed:
                raise RuntimeError(f"{server.variant} server failed {warm.failed} warm-up requests")
        for round_ in range(settings.http_rounds):
            turn = round_ % len(VARIANTS)
            order = VARIANTS[turn:] + VARIANTS[:turn]
            for variant in order:
                samples[variant].append(
                    load(
                        servers[variant],
                        clients=settings.http_clients,
                        requests=settings.http_requests,
                        seconds=settings.http_seconds,
                    )
                )
    finally:
        for server in servers.values():
            server.stop()

    table = Table(
        f"{settings.http_rounds} paired rounds; each: at most {settings.http_requests} requests "
        f"or {settings.http_seconds:g} s over {settings.http_clients} keep-alive connections",
        [
            "variant",
            "requests",
            "failed",
            "req/s (median)",
            "req/s (max)",
            "server CPU us/req (median)",
            "server CPU busy",
        ],
    )
    for variant, loads in samples.items():
        busy = statistics.median(load.cpu_ns / load.elapsed_ns for load in loads)
        table.add(
            f"uvicorn + starlette: {variant}",
            sum(load.requests for load in loads),
            sum(load.failed for load in loads),
            f"{statistics.median(load.throughput for load in loads):.0f}",
            f"{max(load.throughput for load in loads):.0f}",
            f"{statistics.median(load.cpu_per_request_ns for load in loads) / 1000:.1f}",
            f"{busy:.0%}",
        )
    report.tables.append(table)
    bare, keyturn = samples["bare"], samples["keyturn"]
    throughput = statistics.median(
        a.throughput / b.throughput if b.throughput else 0.0
        for a, b in zip(keyturn, bare, strict=True)
    )
    cpu_ratio = statistics.median(
        a.cpu_per_request_ns / b.cpu_per_request_ns if b.cpu_per_request_ns else float("inf")
        for a, b in zip(keyturn, bare, strict=True)
    )
    cpu_overhead = statistics.median(
        a.cpu_per_request_ns - b.cpu_per_request_ns for a, b in zip(keyturn, bare, strict=True)
    )
    floor = samples["floor"]
    floor_throughput = statistics.median(
        a.throughput / b.throughput if b.throughput else 0.0
        for a, b in zip(floor, bare, strict=True)
    )
    floor_overhead = statistics.median(
        a.cpu_per_request_ns - b.cpu_per_request_ns for a, b in zip(floor, bare, strict=True)
    )
    ratios = Table("ratios (median of per-round ratios)", ["comparison", "value", "bar"])
    ratios.add("throughput: keyturn / bare", times(throughput), ">= 0.85x")
    ratios.add("throughput: floor / bare", times(floor_throughput), "(info)")
    ratios.add("server CPU per request: keyturn / bare", times(cpu_ratio), "(info)")
    ratios.add("server CPU per request: keyturn - bare", f"{cpu_overhead / 1000:.1f} us", "(info)")
    ratios.add("server CPU per request: floor - bare", f"{floor_overhead / 1000:.1f} us", "(info)")
    report.tables.append(ratios)
    failed = sum(load.failed for loads in samples.values() for load in loads)
    report.facts["throughput_ratio"] = throughput
    report.facts["cpu_ratio"] = cpu_ratio
    report.facts["failed"] = failed
    report.facts["requests"] = sum(load.requests for loads in samples.values() for load in loads)
    report.bar(
        "real HTTP throughput behind keyturn",
        f"{times(throughput)} of bare",
        ">= 0.85x",
        throughput >= 0.85 and failed == 0,
    )
    report.notes.append(
        f"uvicorn {_uvicorn_version()} with http={HTTP}, loop={LOOP} (pure Python; with "
        "httptools/uvloop the server's own cost per request drops, so the same overhead in "
        "us weighs more); client and server share this machine's cores"
    )
    return report


def _uvicorn_version() -> str:
    from importlib.metadata import version

    return version("uvicorn")
