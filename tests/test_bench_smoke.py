"""Every benchmark section, run once with tiny counts, so that ``bench/`` cannot rot.

No timing is asserted (this machine's times mean nothing here); the *counted* facts are:
a junk or mistyped key touches neither the store nor argon2, a key's first request runs
argon2 exactly once, and concurrent first requests with one new key share that one run.

The PostgreSQL parts read ``KEYTURN_TEST_POSTGRES_DSN``: unset, they skip with the reason
shown in the summary; with ``KEYTURN_REQUIRE_POSTGRES=1`` a missing or unreachable server
fails them instead (as in ``tests/stores/conftest.py``).
"""

from __future__ import annotations

import os

import pytest
from bench import DEFAULT, SECTIONS, run_section
from bench import __main__ as bench_main
from bench._core import SMOKE, Report
from bench._databases import postgres_unavailable


def smoke(name: str) -> Report:
    report = run_section(name, SMOKE)
    assert report.name == name
    assert report.tables, f"section {name} printed no table"
    assert all(table.rows for table in report.tables)
    assert report.render()
    return report


def test_sections_are_all_listed() -> None:
    """The default run is every section but the profile, in the documented order."""
    assert list(DEFAULT) == ["asgi", "wsgi", "refusals", "cold", "http", "stores", "scale"]
    assert set(SECTIONS) == {*DEFAULT, "profile"}


def test_asgi_warm_path_runs_no_argon2() -> None:
    report = smoke("asgi")
    assert report.facts["warm.argon2_runs_while_timed"] == 0
    assert {bar.name for bar in report.bars} >= {
        "ASGI warm path, organization key: overhead vs floor's",
        "ASGI warm path, tenant key: overhead vs floor's",
    }


def test_wsgi_warm_path_runs_no_argon2() -> None:
    report = smoke("wsgi")
    assert report.facts["warm.argon2_runs_while_timed"] == 0


def test_refusals_touch_what_they_must_and_no_more() -> None:
    facts = smoke("refusals").facts
    for path in ("junk", "typo"):  # refused before any lookup
        assert facts[f"{path}.store_reads"] == 0
        assert facts[f"{path}.membership_calls"] == 0
        assert facts[f"{path}.argon2_runs"] == 0
    assert (facts["unknown.store_reads"], facts["unknown.argon2_runs"]) == (1, 0)
    assert (facts["wrong.store_reads"], facts["wrong.argon2_runs"]) == (1, 1)
    assert (facts["warm.store_reads"], facts["warm.argon2_runs"]) == (1, 0)


def test_cold_path_runs_argon2_once() -> None:
    facts = smoke("cold").facts
    assert facts["first.argon2_runs_min"] == facts["first.argon2_runs_max"] == 1
    assert facts["second.argon2_runs_max"] == 0
    assert facts["crowd.asgi_argon2_runs"] == 1
    assert facts["crowd.wsgi_argon2_runs"] == 1
    assert facts["crowd.asgi_ok"] == facts["crowd.wsgi_ok"] == facts["crowd.size"] > 1


def test_real_http_servers_start_answer_and_stop() -> None:
    facts = smoke("http").facts
    assert facts["requests"] > 0
    assert facts["failed"] == 0


def test_stores_without_postgres() -> None:
    report = run_section("stores", SMOKE.with_postgres(None))
    assert report.facts["postgres_skipped"] == 1
    assert any("PostgreSQL skipped" in note for note in report.notes)
    assert any(name.startswith("sqlite") for name in report.facts)


def test_scale_without_postgres() -> None:
    report = smoke("scale")
    assert "memory.largest_over_smallest" in report.facts
    assert "sqlite.largest_over_smallest" in report.facts
    assert report.facts["cache.traced_bytes_per_entry"] > 0


def test_profile() -> None:
    report = smoke("profile")
    assert report.facts["profiled_functions"] > 0


def _postgres_dsn() -> str:
    dsn = os.environ.get("KEYTURN_TEST_POSTGRES_DSN", "")
    reason = "KEYTURN_TEST_POSTGRES_DSN is not set" if not dsn else postgres_unavailable(dsn)
    if reason is not None:
        if os.environ.get("KEYTURN_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"KEYTURN_REQUIRE_POSTGRES=1 but {reason}", pytrace=False)
        pytest.skip(f"PostgreSQL benchmarks skipped: {reason}")
    return dsn


@pytest.mark.postgres
@pytest.mark.parametrize("name", ["stores", "scale"])
def test_postgres_parts(name: str) -> None:
    report = run_section(name, SMOKE.with_postgres(_postgres_dsn()))
    assert not any("PostgreSQL skipped" in note for note in report.notes)
    if name == "stores":
        assert report.facts["postgres_skipped"] == 0
    else:
        assert "postgres.largest_over_smallest" in report.facts


def test_command_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m bench --quick --only ...`` prints the tables and the bars' summary."""
    monkeypatch.setattr(bench_main, "QUICK", SMOKE)  # the smoke counts, through the real CLI
    assert bench_main.main(["--quick", "--only", "refusals", "--postgres-dsn", ""]) == 0
    out = capsys.readouterr().out
    assert "3. Refusal paths" in out
    assert "[PASS] junk token: no store read, no argon2 run" in out
    assert "PostgreSQL: skipped" in out
