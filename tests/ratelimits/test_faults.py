"""The engine down or slow: a Redis server of the test's own, killed, paused and restarted
under load; both fault policies.

The server is ``redis-server`` on a free loopback port, keeping nothing on disk; it is
stopped by its process id. Requests are counted, never timed: while the engine fails, fail
open lets every request through and counts it, fail closed answers each one
``service_unavailable`` with ``Retry-After``; after the restart, leases succeed again.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from keyturn.ratelimits import FaultPolicy, Outcome, Rate, RateLimiter, RateLimits
from tests.ratelimits.conftest import principal, redis_unavailable

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class OwnRedis:
    """A redis-server process of this test's own, on 127.0.0.1."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(  # noqa: S603 -- the machine's redis-server, our arguments
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        for _ in range(200):  # bounded: 10 s at most
            try:
                with redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1) as c:
                    c.ping()
                return
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    if not os.path.exists(REDIS_SERVER):
        redis_unavailable("redis-server is not installed (Debian: apt-get install redis-server)")
    server = OwnRedis()
    server.start()
    try:
        yield server
    finally:
        if server.process is not None and server.process.poll() is None:
            os.kill(server.process.pid, signal.SIGCONT)
        server.kill()


def limiter_on(server: OwnRedis, faults: FaultPolicy) -> RateLimiter:
    from keyturn.ratelimits.redis import RedisEngine

    # A slice of one: every request asks the engine, so a fault is met at once.
    return RateLimiter(
        RateLimits(key=Rate(1_000_000, 60)),
        engine=RedisEngine(server.url, deadline=0.2),
        faults=faults,
        instances=1_000_000,
        cooldown=0.05,
    )


class Load:
    """Four threads admitting requests until told to stop (bounded), outcomes counted."""

    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter
        self.outcomes: Counter[Outcome] = Counter()
        self.bad_unavailable = 0  # a 503 answer without Retry-After
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run) for _ in range(4)]

    def _run(self) -> None:
        for _ in range(200_000):  # bounded
            if self._stop.is_set():
                return
            admission = self.limiter.admit(principal())
            with self._lock:
                self.outcomes[admission.outcome] += 1
                if admission.outcome is Outcome.UNAVAILABLE and not (
                    admission.retry_after and dict(admission.headers).get("Retry-After")
                ):
                    self.bad_unavailable += 1
            time.sleep(0.0005)

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def wait_for(self, condition: object, rounds: int = 400) -> bool:
        for _ in range(rounds):  # bounded: 20 s at most
            if callable(condition) and condition():
                return True
            time.sleep(0.05)
        return False


@pytest.mark.parametrize("faults", [FaultPolicy.OPEN, FaultPolicy.CLOSED])
def test_redis_killed_and_restarted_under_load(
    own_redis: OwnRedis, faults: FaultPolicy, caplog: pytest.LogCaptureFixture
) -> None:
    """Killed: fail open lets requests through, fail closed answers 503 with Retry-After,
    each counted and logged; restarted: leases succeed again and nothing fails."""
    limiter = limiter_on(own_redis, faults)
    stats = limiter.stats
    with caplog.at_level(logging.WARNING, logger="keyturn.ratelimits"), Load(limiter) as load:
        assert load.wait_for(lambda: stats.leases >= 200)
        assert stats.faults == 0

        own_redis.kill()
        assert load.wait_for(
            lambda: stats.faults >= 3 and (stats.failed_open + stats.unavailable) >= 50
        )

        own_redis.start()
        leases = stats.leases
        faults_seen = stats.faults
        assert load.wait_for(lambda: stats.faults == faults_seen and stats.leases >= leases + 100)
        after = Counter(load.outcomes)
        assert load.wait_for(lambda: sum(load.outcomes.values()) >= sum(after.values()) + 100)
        recovered = load.outcomes - after

    assert recovered[Outcome.ALLOWED] == sum(recovered.values())  # all well again
    if faults is FaultPolicy.OPEN:
        assert stats.unavailable == 0
        assert stats.failed_open >= 50
        assert load.outcomes[Outcome.UNAVAILABLE] == 0
    else:
        assert stats.failed_open == 0
        assert load.outcomes[Outcome.UNAVAILABLE] == stats.unavailable >= 50
        assert load.bad_unavailable == 0
    assert load.outcomes[Outcome.REFUSED] == 0  # an outage is never a 429
    warnings = [r.getMessage() for r in caplog.records if r.name == "keyturn.ratelimits"]
    assert warnings
    assert all("RedisEngine failed" in w for w in warnings)


@pytest.mark.parametrize("faults", [FaultPolicy.OPEN, FaultPolicy.CLOSED])
def test_a_paused_redis_is_a_fault_within_the_deadline(
    own_redis: OwnRedis, faults: FaultPolicy
) -> None:
    """A server that accepts nothing (paused) fails the lease at the engine's deadline:
    every request gets an answer, and the policy's."""
    limiter = limiter_on(own_redis, faults)
    assert limiter.admit(principal()).allowed

    own_redis.pause()
    try:
        answers = [limiter.admit(principal()) for _ in range(5)]
    finally:
        own_redis.resume()

    expected = Outcome.ALLOWED if faults is FaultPolicy.OPEN else Outcome.UNAVAILABLE
    assert [a.outcome for a in answers] == [expected] * 5
    assert limiter.stats.faults >= 1
    assert load_after_resume(limiter)


def load_after_resume(limiter: RateLimiter) -> bool:
    """After the server resumes, a lease succeeds again (bounded tries)."""
    faults = limiter.stats.faults
    for _ in range(200):
        leases = limiter.stats.leases
        admission = limiter.admit(principal())
        if admission.allowed and limiter.stats.leases > leases and limiter.stats.faults == faults:
            return True
        time.sleep(0.05)
    return False
