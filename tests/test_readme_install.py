"""The README's install lines, run as written in a copy of the clone: in place, and as a
built wheel installed with ``--find-links dist``. Each works with ``[asgi]`` in a fresh
virtual environment with pip, as a newcomer's would be."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a clone holds that an install reads (pyproject.toml names the readme).
CLONE = ["pyproject.toml", "README.md", "LICENSE", "src"]


def install_lines() -> list[str]:
    """The ``pip`` lines of the README's Install section, comments dropped."""
    text = ROOT.joinpath("README.md").read_text(encoding="utf-8")
    install = text.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", install, re.DOTALL)
    assert block is not None, "the Install section has no sh block"
    commands = (line.partition("#")[0].strip() for line in block[1].splitlines())
    return [command for command in commands if command]


def test_the_install_section_has_both_ways() -> None:
    """In place, then a wheel built and installed from dist/."""
    assert install_lines() == [
        "pip install -e '.[asgi]'",
        "pip wheel --no-deps -w dist .",
        "pip install --find-links dist 'keyturn[asgi]'",
    ]


def _run(argv: list[str | Path], cwd: Path) -> None:
    done = subprocess.run(  # noqa: S603 -- the README's own commands, our interpreter
        [str(arg) for arg in argv], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-4000:])


@pytest.mark.parametrize(("way", "lines"), [("in place", slice(0, 1)), ("wheel", slice(1, 3))])
def test_readme_install_lines_work(way: str, lines: slice, tmp_path: Path) -> None:
    """The lines install keyturn with Starlette, in a fresh environment, from the clone."""
    clone = tmp_path / "clone"
    for name in CLONE:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, clone / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            clone.mkdir(exist_ok=True)
            shutil.copy2(source, clone / name)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], tmp_path)
    pip = venv / "bin" / "pip"

    for line in install_lines()[lines]:
        command, *arguments = shlex.split(line)
        assert command == "pip"
        _run([pip, *arguments], clone)

    python = venv / "bin" / "python"
    code = "import keyturn, keyturn.asgi, starlette; print(keyturn.__file__)"
    done = subprocess.run(  # noqa: S603 -- the environment's interpreter
        [python, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    where = Path(done.stdout.strip())
    assert where.is_relative_to(clone / "src") == (way == "in place")
