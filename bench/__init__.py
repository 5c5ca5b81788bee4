"""keyturn's benchmarks: ``python -m bench [--quick] [--only NAME ...]`` (``make bench``).

Each section is a module with ``NAME``, ``TITLE`` and ``run(settings) -> Report``; they are
imported only when run, so ``python -m bench._server`` stays light. See
``docs/performance.md`` for what each measures and the figures of a full run.
"""

from __future__ import annotations

import importlib
from typing import Final

from bench._core import Report, Settings

__all__ = ["DEFAULT", "SECTIONS", "run_section"]

# name -> module, in the order of docs/performance.md
SECTIONS: Final = {
    "instructions": "bench.instructions",
    "asgi": "bench.asgi_warm",
    "wsgi": "bench.wsgi_warm",
    "refusals": "bench.refusals",
    "cold": "bench.cold",
    "http": "bench.real_http",
    "stores": "bench.stores",
    "lag": "bench.lag",
    "scale": "bench.scale",
    "breakdown": "bench.breakdown",
    "payload": "bench.payload",
    "ratelimits": "bench.ratelimits",
}
# What a run without --only runs: every section.
DEFAULT: Final = tuple(SECTIONS)


def title(name: str) -> str:
    title: str = importlib.import_module(SECTIONS[name]).TITLE
    return title


def run_section(name: str, settings: Settings) -> Report:
    """Run the section called *name* with *settings*."""
    report: Report = importlib.import_module(SECTIONS[name]).run(settings)
    return report
