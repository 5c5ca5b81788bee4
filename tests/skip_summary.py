"""A pytest plugin: the run's last lines say what was skipped and why, one line a reason.

``-ra`` lists each skip by location, scattered among failures; a reader who ran
``make test`` wants to know whether anything was left out, and what to set to run it (most
often ``KEYTURN_TEST_POSTGRES_DSN``). ``tests/conftest.py`` loads it; it prints nothing when
nothing was skipped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator

import pytest

__all__ = ["pytest_terminal_summary", "skip_reasons"]


def skip_reasons(reports: list[pytest.TestReport]) -> Counter[str]:
    """How many tests each reason skipped, from the terminal reporter's skipped reports."""
    reasons: Counter[str] = Counter()
    for report in reports:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    return reasons


# The outermost wrapper: pytest's own summary (and coverage's report) come first.
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> Generator[None]:
    """After everything else pytest prints, the skipped tests grouped by reason."""
    yield
    reasons = skip_reasons(terminalreporter.stats.get("skipped", []))
    if not reasons:
        return
    total = sum(reasons.values())
    terminalreporter.write_sep("=", f"{total} skipped, by reason", yellow=True)
    for reason, count in sorted(reasons.items(), key=lambda item: (-item[1], item[0])):
        terminalreporter.write_line(f"{count:5d}  {reason}")
