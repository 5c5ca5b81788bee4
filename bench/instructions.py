"""Section 0: instructions per warm request, counted by callgrind, one variant per run.

Each variant of ``bench._variants`` runs in a process of its own under
``valgrind --tool=callgrind`` (``bench._count``): start-up, imports and warm-up first, then
*N* warm requests between two marker calls at which callgrind dumps its counts, so the
middle part holds those requests and nothing else. Instruction counts do not depend on
what else the machine is doing; on a shared machine they are the figures to trust, and
wall times (sections 1 and 2) are their noisy cross-check. The garbage collector stays on,
and ``PYTHONHASHSEED`` is fixed so that two runs execute the same instructions.

Without ``valgrind`` on the ``PATH`` the section is skipped, and says so.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from bench._core import Report, Settings, Table, Target, run_module, times
from bench._variants import LABELS, REFUSALS, base_of

__all__ = ["callgrind", "count", "run", "valgrind_missing"]

NAME: Final = "instructions"
TITLE: Final = "0. Instructions per warm request (callgrind), one variant per valgrind run"
ROOT: Final = Path(__file__).resolve().parents[1]
TIMEOUT: Final = 900.0  # seconds for one valgrind run, at most
_TOTALS: Final = re.compile(rb"^totals:\s+(\d+)", re.MULTILINE)
_PART: Final = re.compile(rb"^part:\s+(\d+)", re.MULTILINE)


def valgrind_missing() -> str | None:
    """Why callgrind cannot run here, or ``None`` when it can."""
    if shutil.which("valgrind") is None:
        return "valgrind is not installed (Debian: apt-get install valgrind)"
    return None


def _parts(directory: Path) -> dict[int, int]:
    """Part number -> instructions, from the dumps callgrind wrote into *directory*."""
    parts: dict[int, int] = {}
    for dump in directory.iterdir():
        text = dump.read_bytes()
        part, totals = _PART.search(text), _TOTALS.search(text)
        if part is None or totals is None:
            raise RuntimeError(f"no part/totals line in callgrind's {dump.name}")
        parts[int(part.group(1))] = int(totals.group(1))
    return parts


def callgrind(module: str, *args: str) -> tuple[dict[str, Any], dict[int, int]]:
    """Run ``python -m module args`` under callgrind, cutting parts at each ``os.getppid()``.

    Returns what the module printed last (one JSON line) and its parts' instruction counts.
    """
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as scratch:
        out = Path(scratch)
        valgrind = [
            "valgrind",
            "--tool=callgrind",
            "--dump-before=getppid",
            f"--callgrind-out-file={out / 'callgrind.out'}",
        ]
        said = run_module(sys.executable, module, *args, before=valgrind, timeout=TIMEOUT)
        return said, _parts(out)


def count(variant: str, n: int) -> float:
    """Instructions per warm request of *variant*, from one valgrind run of *n* requests."""
    said, parts = callgrind("bench._count", variant, str(n))
    status = 401 if variant in REFUSALS else 200
    if said != {"variant": variant, "n": n, "status": status}:
        raise RuntimeError(f"callgrind run of {variant} said {said}")
    if sorted(parts) != [1, 2, 3]:
        raise RuntimeError(f"{variant}: expected 3 callgrind parts, got {sorted(parts)}")
    return parts[2] / n


def _over(counts: dict[str, float], name: str) -> float:
    """*name*'s instructions over its bare app's."""
    return counts[name] - counts[base_of(name)]


def _ratio(counts: dict[str, float], name: str, other: str) -> float:
    """(name - its bare) / (other - its bare), in instructions."""
    mine = _over(counts, name)
    theirs = _over(counts, other)
    return mine / theirs if theirs > 0 else float("inf")


def run(settings: Settings) -> Report:
    report = Report(NAME, TITLE)
    missing = valgrind_missing()
    if missing is not None:
        report.notes.append(f"skipped: {missing}")
        report.facts["skipped"] = 1
        report.tables.append(Table("instructions per request", ["variant"], [["(skipped)"]]))
        return report
    report.facts["skipped"] = 0
    names = list(settings.count_variants or [*LABELS, *REFUSALS])
    for name in list(names):  # every variant needs its bare app
        if base_of(name) not in names:
            names.append(base_of(name))
    n = settings.count_requests

    def one(name: str) -> float:
        return count(name, n)

    jobs = max(1, min(2, os.cpu_count() or 1))  # counts do not depend on sharing the cores
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        counts = dict(zip(names, pool.map(one, names), strict=True))

    table = Table(
        f"instructions per warm request, {n} requests per variant, one valgrind run each",
        ["variant", "instructions/req", "over bare", "overhead / same-work floor's"],
    )
    for name in (name for name in LABELS if name in counts):
        base = base_of(name)
        floor = name.split(".")[0] + (".floor+tenant" if name.endswith("+tenant") else ".floor")
        over = "-" if name == base else f"{_over(counts, name):,.0f}"
        versus = (
            times(_ratio(counts, name, floor))
            if name != base and floor in counts and name != floor
            else "-"
        )
        table.add(LABELS[name], f"{counts[name]:,.0f}", over, versus)
        report.facts[f"{name}.instructions"] = counts[name]
    report.tables.append(table)
    refused = Table(
        f"instructions per refused request, {n} requests per variant, one valgrind run each",
        ["variant", "instructions/req", "/ floor's refusal", "over a fixed 401 / floor's"],
    )
    for name in (name for name in REFUSALS if name in counts):
        base, floor = base_of(name), name.split(".")[0] + ".floor-refusal"
        mine = name not in (base, floor) and floor in counts
        whole = times(counts[name] / counts[floor]) if mine else "-"
        over = times(_ratio(counts, name, floor)) if mine else "-"
        refused.add(REFUSALS[name], f"{counts[name]:,.0f}", whole, over)
        report.facts[f"{name}.instructions"] = counts[name]
    if refused.rows:
        report.tables.append(refused)

    def target(label: str, name: str, other: str, goal: float | None) -> None:
        if name in counts and other in counts:
            over, theirs = _over(counts, name), _over(counts, other)
            value = _ratio(counts, name, other)
            report.facts[f"{name}/{other}"] = value
            report.targets.append(
                Target(label, value, "<=", goal, f"{over:,.0f} vs {theirs:,.0f} instr")
            )

    target(
        "ASGI warm overhead / floor, instructions, organization key",
        "starlette.keyturn",
        "starlette.floor",
        1.8,
    )
    target(
        "ASGI warm overhead / floor, instructions, tenant key",
        "starlette.keyturn+tenant",
        "starlette.floor+tenant",
        1.8,
    )
    target(
        "ASGI / Starlette AuthenticationMiddleware same work, instructions, org key",
        "starlette.keyturn",
        "starlette.auth",
        None,
    )
    target(
        "ASGI / Starlette AuthenticationMiddleware same work, instructions, tenant key",
        "starlette.keyturn+tenant",
        "starlette.auth+tenant",
        None,
    )
    target(
        "WSGI warm overhead / floor, instructions, organization key",
        "flask.keyturn",
        "flask.floor",
        2.0,
    )
    target(
        "WSGI warm overhead / floor, instructions, tenant key",
        "flask.keyturn+tenant",
        "flask.floor+tenant",
        2.0,
    )
    target(
        "FastAPI: middleware + Caller / HTTPBearer dependency same work, instructions",
        "fastapi.keyturn-caller",
        "fastapi.bearer",
        0.5,
    )
    target(
        "FastAPI: middleware + Depends(current_principal) / HTTPBearer same work, instructions",
        "fastapi.keyturn-depends",
        "fastapi.bearer",
        None,
    )
    for label, name in (
        ("ASGI refusal of a typo (bad checksum)", "starlette.keyturn-typo"),
        ("ASGI refusal of an unknown key", "starlette.keyturn-unknown"),
        ("WSGI refusal of a typo (bad checksum)", "flask.keyturn-typo"),
        ("WSGI refusal of an unknown key", "flask.keyturn-unknown"),
    ):
        floor = name.split(".")[0] + ".floor-refusal"
        if name in counts and floor in counts:
            value = counts[name] / counts[floor]
            report.facts[f"{name}/{floor}"] = value
            report.targets.append(
                Target(
                    f"{label} / the floor's refusal, instructions, whole request",
                    value,
                    "<=",
                    2.5,
                    f"{counts[name]:,.0f} vs {counts[floor]:,.0f} instr",
                )
            )
    report.notes.append(
        "a refused request never reaches the app: its ratio is of whole requests, and of the "
        "work over a guard that answers a fixed 401 without reading anything; the floor's "
        "refusal is one header scan, one sha256, a dict miss and that fixed 401"
    )
    report.notes.append(
        "instructions counted by valgrind --tool=callgrind: every user-space instruction of "
        "the process (the kernel's work is not counted); overhead = variant - its bare app"
    )
    return report
