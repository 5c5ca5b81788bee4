"""A PostgreSQL server of the benchmark's own, to restart under load; never a shared one.

``private_postgres()`` runs ``initdb`` and ``pg_ctl`` from the machine's PostgreSQL (as the
``postgres`` user when run as root) into a temporary folder, on a free loopback port, and
at the end stops the server by its PID (SIGQUIT: immediate shutdown) and removes the
folder. ``unavailable()`` says why it cannot, or ``None``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PrivateServer", "private_postgres", "unavailable"]


def _bin_dir() -> Path | None:
    binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return binaries[-1].parent if binaries else None


def _as_postgres() -> list[str] | None:
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser")
    return None if runuser is None else [runuser, "-u", "postgres", "--"]


def unavailable() -> str | None:
    """Why no private server can be started here, or ``None``."""
    if _bin_dir() is None:
        return "no PostgreSQL server binaries (initdb) under /usr/lib/postgresql"
    if _as_postgres() is None:
        return "running as root without runuser to become postgres"
    return None


@dataclass
class PrivateServer:
    data: Path
    port: int
    pg_ctl: str
    as_postgres: list[str]

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def ctl(self, *args: str) -> None:
        subprocess.run(  # noqa: S603 - the machine's own pg_ctl, fixed arguments
            [
                *self.as_postgres,
                self.pg_ctl,
                *("-D", str(self.data), "-w", "-l", str(self.log)),
                *args,
            ],
            check=True,
            timeout=120,
            # Not a pipe: the server it starts would hold it open, and this call wait on it.
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    @property
    def log(self) -> Path:
        return self.data.parent / "log"

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every session ends, the server is back when it returns."""
        self.ctl("-m", "fast", "restart")

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None


@contextmanager
def private_postgres() -> Iterator[PrivateServer]:
    bin_dir, as_postgres = _bin_dir(), _as_postgres()
    if bin_dir is None or as_postgres is None:
        raise RuntimeError(unavailable())
    top = Path(tempfile.mkdtemp(prefix="keyturn-bench-pg-"))
    if as_postgres:
        shutil.chown(top, user="postgres")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = PrivateServer(top / "data", port, str(bin_dir / "pg_ctl"), as_postgres)
    options = f"-p {port} -k {top} -c listen_addresses=127.0.0.1 -c fsync=off"
    try:
        subprocess.run(  # noqa: S603 - the machine's own initdb, fixed arguments
            [
                *as_postgres,
                str(bin_dir / "initdb"),
                "-D",
                str(server.data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
            check=True,
            timeout=120,
            capture_output=True,
        )
        server.ctl("-o", options, "start")
        yield server
    finally:
        pid = server.pid()
        if pid is not None:
            os.kill(pid, signal.SIGQUIT)  # immediate shutdown, by its PID
            deadline = time.monotonic() + 30
            while server.pid() is not None and time.monotonic() < deadline:
                time.sleep(0.05)
        shutil.rmtree(top, ignore_errors=True)
