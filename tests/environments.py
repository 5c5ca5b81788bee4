"""Clean environments for the tests that play a user: the built wheel, and only what a user
would install beside it.

The wheel is built once per test run, and each environment once per run, under
``build/test-envs/`` (replaced, never reused across runs, since the source changes).
An environment is a virtual environment without pip of its own, filled by the running
pip (``pip --python``) from the wheel and the named requirements: ``keyturn[asgi]`` means
the built wheel with that extra, anything else is a package from the index.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[1]
BUILD: Final = ROOT / "build" / "test-envs"
_KEYTURN: Final = re.compile(r"keyturn(\[[a-z0-9,_-]+\])?")


def _run(*argv: str | Path, timeout: float = 300) -> None:
    done = subprocess.run(  # noqa: S603 -- our own interpreter and arguments
        [str(arg) for arg in argv], capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed:\n{done.stdout}\n{done.stderr}")


class Environments:
    """The test run's wheel and its environments, each made on first use."""

    def __init__(self, build: Path = BUILD) -> None:
        self.build = build
        self._wheel: Path | None = None
        self._made: dict[tuple[str, ...], Path] = {}
        self._lock = threading.Lock()
        shutil.rmtree(build, ignore_errors=True)
        build.mkdir(parents=True)

    @property
    def wheel(self) -> Path:
        """The project's wheel, built from the working tree."""
        if self._wheel is None:
            out = self.build / "wheel"
            _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, ROOT)
            (self._wheel,) = out.glob("keyturn-*.whl")
        return self._wheel

    def python(self, requirements: Iterable[str]) -> Path:
        """The interpreter of an environment holding exactly *requirements* (and their deps)."""
        wanted = tuple(sorted(set(requirements) or {"keyturn"}))
        with self._lock:
            if wanted not in self._made:
                self._made[wanted] = self._make(wanted)
            return self._made[wanted]

    def _make(self, wanted: tuple[str, ...]) -> Path:
        name = hashlib.sha256(" ".join(wanted).encode()).hexdigest()[:12]
        home = self.build / f"env-{name}"
        _run(sys.executable, "-m", "venv", "--without-pip", home)
        python = home / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        specs = [
            f"{match[0]} @ {self.wheel.as_uri()}" if (match := _KEYTURN.fullmatch(spec)) else spec
            for spec in wanted
        ]
        _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", *specs)
        (home / "requirements.txt").write_text("\n".join(wanted) + "\n", encoding="utf-8")
        return python
