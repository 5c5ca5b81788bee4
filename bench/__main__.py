"""``python -m bench [--quick] [--only NAME ...] [--postgres-dsn URL]``: run, print tables."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from importlib.metadata import version

from bench import DEFAULT, SECTIONS, run_section, title
from bench._core import FULL, POSTGRES_ENV, QUICK, Bar, Target, machine, target_table
from bench._databases import postgres_unavailable


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="keyturn's benchmarks: ratios measured in one run, paired repetitions.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer repetitions and smaller loads (< 1 min)"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(SECTIONS),
        metavar="NAME",
        help=f"run only these sections: {', '.join(SECTIONS)} (default: all)",
    )
    parser.add_argument(
        "--postgres-dsn",
        default=os.environ.get(POSTGRES_ENV, ""),
        help=f"PostgreSQL URL for the store sections (default: ${POSTGRES_ENV}); "
        "the benchmarks work in a scratch schema they drop",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    settings = (QUICK if args.quick else FULL).with_postgres(args.postgres_dsn)
    names = args.only or list(DEFAULT)
    postgres = postgres_unavailable(settings.postgres_dsn)
    print(f"keyturn {version('keyturn')} benchmarks, {settings.label} settings")
    print(f"machine: {machine()}")
    print(f"PostgreSQL: {'used' if postgres is None else 'skipped: ' + postgres}")
    bars: list[Bar] = []
    targets: list[Target] = []
    failed: list[str] = []
    started = time.perf_counter()
    for name in names:
        heading = title(name)
        print(f"\n{'=' * len(heading)}\n{heading}\n{'=' * len(heading)}\n", flush=True)
        began = time.perf_counter()
        try:
            report = run_section(name, settings)
        except Exception:
            traceback.print_exc()
            failed.append(name)
            continue
        print(report.render())
        print(f"\n({name}: {time.perf_counter() - began:.1f} s)", flush=True)
        bars.extend(report.bars)
        targets.extend(report.targets)
    print(f"\n{'=' * 7}\nsummary ({time.perf_counter() - started:.0f} s)\n{'=' * 7}")
    if targets:
        print(target_table("the targets, measured in this run", targets).render())
        print()
    for bar in bars:
        print(bar.render())
    if failed:
        print(f"sections that failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
