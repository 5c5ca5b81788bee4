"""The run's closing lines group what was skipped by reason (``tests/skip_summary.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.RunResult:
    """A run of the module in *pytester* with the plugin loaded, as tests/conftest.py does."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the plugin lives in the tests package
    return pytester.runpytest_subprocess("-p", "tests.skip_summary", "-p", "no:cacheprovider")


def test_skips_are_counted_by_reason_at_the_end(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Skips from a test, a fixture and a mark are grouped, the commonest first, last."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.fixture
        def server():
            pytest.skip("KEYTURN_TEST_POSTGRES_DSN is not set")

        @pytest.mark.parametrize("n", range(3))
        def test_store(server, n):
            pass

        def test_pipe():
            pytest.skip("needs /dev/zero")

        @pytest.mark.skipif(True, reason="file modes are POSIX")
        def test_modes():
            pass

        def test_runs():
            pass
        """
    )

    result = _run(pytester, monkeypatch)

    result.assert_outcomes(passed=1, skipped=5)
    assert re.fullmatch(r"=+ 5 skipped, by reason =+", result.outlines[-5])
    assert result.outlines[-4:-1] == [
        "    3  KEYTURN_TEST_POSTGRES_DSN is not set",
        "    1  file modes are POSIX",
        "    1  needs /dev/zero",
    ]
    assert re.fullmatch(r"=+ 1 passed, 5 skipped in .* =+", result.outlines[-1])


def test_nothing_is_added_when_nothing_was_skipped(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run without skips ends as pytest ends it."""
    pytester.makepyfile("def test_runs():\n    pass\n")

    result = _run(pytester, monkeypatch)

    result.assert_outcomes(passed=1)
    assert not any("by reason" in line for line in result.outlines)
