"""The fallback load generator: ``python -m bench._load PORT TOKEN CLIENTS REQUESTS SECONDS [CPU]``.

Used by the real-HTTP section when ``wrk`` is not installed, in a process of its own,
pinned to core *CPU* when given (another core than the server's). *CLIENTS* threads each keep one
connection to 127.0.0.1:*PORT* alive and send the same ``GET`` with the same
``Authorization`` header; the load stops after *REQUESTS* in total or *SECONDS*, whichever
comes first. It prints one JSON line: requests answered, failures, nanoseconds elapsed.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time

__all__ = ["load", "main"]

MODELS = "/managed-agents/v1/models"


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def load(port: int, token: str, clients: int, requests: int, seconds: float) -> dict[str, int]:
    """Send at most *requests* in total, for at most *seconds*, over *clients* connections."""
    request = (
        f"GET {MODELS} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\nAccept: */*\r\n\r\n"
    ).encode("ascii")
    per_client = max(1, requests // clients)
    tally: list[tuple[int, int]] = []
    ready = threading.Barrier(clients + 1)
    deadline = [0.0]  # set once every client is connected

    def client() -> None:
        done = failed = 0
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
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
    deadline[0] = time.perf_counter() + seconds
    with contextlib.suppress(threading.BrokenBarrierError):
        ready.wait(30)
    start = time.perf_counter_ns()
    for thread in threads:
        thread.join(seconds + 30)
    elapsed = time.perf_counter_ns() - start
    if any(thread.is_alive() for thread in threads):
        raise RuntimeError("a load client did not finish in time")
    return {
        "requests": sum(done for done, _ in tally),
        "failed": sum(failed for _, failed in tally),
        "elapsed_ns": elapsed,
    }


def main(argv: list[str]) -> None:
    if len(argv) not in (5, 6):
        raise SystemExit("usage: python -m bench._load PORT TOKEN CLIENTS REQUESTS SECONDS [CPU]")
    if len(argv) == 6:
        os.sched_setaffinity(0, {int(argv[5])})
    port, token, clients, requests, seconds = argv[:5]
    result = load(int(port), token, int(clients), int(requests), float(seconds))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
