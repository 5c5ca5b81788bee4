"""Section 5: real HTTP on 127.0.0.1: uvicorn (httptools, uvloop) bare, floor, keyturn.

Each variant runs in a server process of its own (``bench._server``), started here on a
free port, pinned to one core, and stopped here by its PID. The load comes from another
process pinned to another core: ``wrk`` when it is installed (``apt-get install wrk``),
otherwise ``bench._load``, a bounded Python load generator; both keep a few connections
alive and send the same ``GET`` with the same ``Authorization`` header, for a bounded
number of seconds. Variants alternate in paired rounds. The server's CPU time (all its
threads) is read from ``/proc/<pid>/task/*/schedstat`` (nanoseconds) before and after
each load, or ``/proc/<pid>/stat`` (user + system, in clock ticks) without it.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

from bench._apps import MODELS
from bench._core import Report, Settings, Table, Target
from bench._server import HTTP, LOOP, VARIANTS

__all__ = ["Load", "Server", "run"]

NAME: Final = "http"
TITLE: Final = "5. Real HTTP: uvicorn (httptools, uvloop) on 127.0.0.1, bare vs floor vs keyturn"
ROOT: Final = Path(__file__).resolve().parents[1]
STARTUP_SECONDS: Final = 30.0
WARMUP_SECONDS: Final = 1.0


def cores() -> tuple[int | None, int | None]:
    """The core for the server and the one for the load, or ``None`` where there is one core."""
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        return None, None
    return usable[0], usable[1]


def _taskset(cpu: int | None) -> list[str]:
    """The prefix that pins a command to *cpu* (``taskset``), or none where it cannot."""
    if cpu is None or shutil.which("taskset") is None:
        return []
    return ["taskset", "--cpu-list", str(cpu)]


class Server:
    """One ``python -m bench._server <variant>`` process."""

    def __init__(self, variant: str, cpu: int | None, env: Mapping[str, str] | None = None) -> None:
        self.variant = variant
        self._log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop()
        pin = [] if cpu is None else [str(cpu)]
        self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "bench._server", variant, *pin],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=None if env is None else {**os.environ, **env},
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


_WRK_REQUESTS: Final = re.compile(r"(\d+) requests in ")
_WRK_RATE: Final = re.compile(r"Requests/sec:\s+([\d.]+)")
_WRK_NON_2XX: Final = re.compile(r"Non-2xx or 3xx responses: (\d+)")
_WRK_ERRORS: Final = re.compile(
    r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)"
)


def generator() -> str:
    """The load generator this run uses: ``wrk`` when installed, else ``bench._load``."""
    return "wrk" if shutil.which("wrk") else "bench._load"


def _wrk(server: Server, clients: int, seconds: float, cpu: int | None) -> tuple[int, int, int]:
    command = [
        *_taskset(cpu),
        "wrk",
        "--threads=1",
        f"--connections={clients}",
        f"--duration={max(1, round(seconds))}s",
        "--timeout=10s",
        f"--header=Authorization: Bearer {server.token}",
        f"http://127.0.0.1:{server.port}{MODELS}",
    ]
    done = subprocess.run(  # noqa: S603 - wrk, on loopback, bounded by --duration
        command,
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=False,
    )
    out = done.stdout
    found, rate = _WRK_REQUESTS.search(out), _WRK_RATE.search(out)
    if done.returncode != 0 or found is None or rate is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {out[-800:]} {done.stderr[-800:]}")
    requests = int(found.group(1))
    errors, non_2xx = _WRK_ERRORS.search(out), _WRK_NON_2XX.search(out)
    failed = sum(int(n) for n in errors.groups()) if errors else 0
    failed += int(non_2xx.group(1)) if non_2xx else 0
    elapsed = int(requests / float(rate.group(1)) * 1e9) if float(rate.group(1)) else 0
    return requests, failed, elapsed


def _python_load(
    server: Server, clients: int, requests: int, seconds: float, cpu: int | None
) -> tuple[int, int, int]:
    command = [
        sys.executable,
        "-m",
        "bench._load",
        str(server.port),
        server.token,
        str(clients),
        str(requests),
        str(seconds),
        *([] if cpu is None else [str(cpu)]),
    ]
    done = subprocess.run(  # noqa: S603 - our own interpreter and module, bounded
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=seconds + 90,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench._load failed ({done.returncode}): {done.stderr[-800:]}")
    said = json.loads(done.stdout.strip().splitlines()[-1])
    return int(said["requests"]), int(said["failed"]), int(said["elapsed_ns"])


def load(server: Server, *, clients: int, requests: int, seconds: float, cpu: int | None) -> Load:
    """One bounded load against *server* from another process; its CPU time read around it."""
    cpu_before = server.cpu_ns()
    if generator() == "wrk":
        done, failed, elapsed = _wrk(server, clients, seconds, cpu)
    else:
        done, failed, elapsed = _python_load(server, clients, requests, seconds, cpu)
    cpu_used = server.cpu_ns() - cpu_before
    return Load(requests=done, failed=failed, elapsed_ns=elapsed, cpu_ns=cpu_used)


def measure(
    runs: Mapping[str, tuple[str, Mapping[str, str] | None]],
    settings: Settings,
    server_cpu: int | None,
    load_cpu: int | None,
) -> dict[str, list[Load]]:
    """One server per label (its variant and environment), warmed up, then loaded in
    rounds, each round starting with another label; every server stopped at the end."""
    labels = list(runs)
    servers: dict[str, Server] = {}
    samples: dict[str, list[Load]] = {label: [] for label in labels}
    try:
        for label, (variant, env) in runs.items():
            servers[label] = Server(variant, server_cpu, env=env)
        for label, server in servers.items():  # the one cold verification, caches filled
            warm = load(server, clients=1, requests=300, seconds=WARMUP_SECONDS, cpu=load_cpu)
            if warm.failed or not warm.requests:
                raise RuntimeError(f"{label} server failed {warm.failed} warm-up requests")
        for round_ in range(settings.http_rounds):
            turn = round_ % len(labels)
            for label in labels[turn:] + labels[:turn]:
                samples[label].append(
                    load(
                        servers[label],
                        clients=settings.http_clients,
                        requests=settings.http_requests,
                        seconds=settings.http_seconds,
                        cpu=load_cpu,
                    )
                )
    finally:
        for server in servers.values():
            server.stop()
    return samples


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    server_cpu, load_cpu = cores()
    labels = list(VARIANTS)
    samples = measure({label: (label, None) for label in labels}, settings, server_cpu, load_cpu)

    table = Table(
        f"{settings.http_rounds} paired rounds of {settings.http_seconds:g} s per variant, "
        f"{settings.http_clients} keep-alive connections, load from {generator()}",
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
        busy = _median([load.cpu_ns / load.elapsed_ns for load in loads if load.elapsed_ns])
        table.add(
            f"uvicorn + starlette: {variant}",
            sum(load.requests for load in loads),
            sum(load.failed for load in loads),
            f"{_median([load.throughput for load in loads]):.0f}",
            f"{max(load.throughput for load in loads):.0f}",
            f"{_median([load.cpu_per_request_ns for load in loads]) / 1000:.1f}",
            f"{busy:.0%}",
        )
    report.tables.append(table)

    def paired_median(name: str, value: Callable[[Load, Load], float]) -> float:
        return _median([value(a, b) for a, b in zip(samples[name], samples["bare"], strict=True)])

    def throughput(a: Load, b: Load) -> float:
        return a.throughput / b.throughput if b.throughput else 0.0

    def extra_cpu(a: Load, b: Load) -> float:
        return a.cpu_per_request_ns - b.cpu_per_request_ns

    keyturn_throughput = paired_median("keyturn", throughput)
    floor_throughput = paired_median("floor", throughput)
    keyturn_cpu = paired_median("keyturn", extra_cpu)
    floor_cpu = paired_median("floor", extra_cpu)
    cpu_ratio = keyturn_cpu / floor_cpu if floor_cpu > 0 else float("inf")
    failed = sum(load.failed for loads in samples.values() for load in loads)
    report.facts.update(
        throughput_ratio=keyturn_throughput,
        floor_throughput_ratio=floor_throughput,
        extra_cpu_ns=keyturn_cpu,
        floor_extra_cpu_ns=floor_cpu,
        failed=failed,
        requests=sum(load.requests for loads in samples.values() for load in loads),
        pinned=int(server_cpu is not None),
    )
    report.targets += [
        Target("Real HTTP throughput / bare, keyturn", keyturn_throughput, ">=", 0.82),
        Target("Real HTTP throughput / bare, same-work floor", floor_throughput, ">="),
        Target(
            "Extra server CPU per request, keyturn / floor's",
            cpu_ratio,
            "<=",
            1.5,
            f"+{keyturn_cpu / 1000:.1f} us vs floor +{floor_cpu / 1000:.1f} us",
        ),
    ]
    pinning = (
        f"server pinned to core {server_cpu}, load to core {load_cpu}"
        if server_cpu is not None
        else "one core only: server and load not pinned"
    )
    report.notes.append(
        f"uvicorn {_uvicorn_version()} with http={HTTP}, loop={LOOP}; {pinning}; "
        "the floor does the same work as keyturn (organization rule, two headers)"
    )
    return report


def _uvicorn_version() -> str:
    from importlib.metadata import version

    return version("uvicorn")
