"""Real servers in this process on 127.0.0.1, each on a free port the system picks: a test
iterates ``serve_uvicorn(app)`` or ``serve_waitress(app)`` for the port, and the server stops
when the iteration ends."""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
import waitress  # type: ignore[import-untyped]


def serve_uvicorn(app: Any) -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
        thread.start()
        try:
            for _ in range(500):  # bounded: 5 seconds at most
                if server.started or not thread.is_alive():
                    break
                time.sleep(0.01)
            assert server.started, "uvicorn did not start"
            yield sock.getsockname()[1]
        finally:
            server.should_exit = True
            thread.join(10)
            assert not thread.is_alive()


def serve_waitress(app: Any) -> Iterator[int]:
    server = waitress.create_server(
        app, host="127.0.0.1", port=0, threads=2, asyncore_loop_timeout=0.05
    )

    def run() -> None:
        # waitress 3.0.2's loop dies when select() meets a socket that a worker thread has
        # just closed (EBADF, Pylons/waitress#468; fixed upstream, not yet released): go
        # round again, as the fix does. Bounded: waitress takes a socket out of its map
        # before closing it, so the next round's select() no longer sees it.
        for _ in range(100):
            try:
                server.run()
                return
            except OSError as exc:
                if exc.errno != errno.EBADF:
                    raise

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield server.effective_port
    finally:
        server.trigger.pull_trigger(server.close)  # closed by the loop's own thread: no race
        thread.join(10)
        server.task_dispatcher.shutdown()
        assert not thread.is_alive()
