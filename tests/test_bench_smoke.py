"""Every benchmark section, run once with tiny counts, so that ``bench/`` cannot rot.

No timing is asserted (this machine's times mean nothing here); the *counted* facts are:
a junk or mistyped key touches neither the store nor argon2, a key's first request runs no
argon2 (one legacy argon2id key's runs it once, and concurrent first requests with it share
that run), every
same-work baseline really checks the organization, and callgrind counts more instructions
for a request through keyturn than for the bare app.

``valgrind`` and ``wrk`` are not on a fresh machine: without valgrind the instruction
count is skipped (the reason is shown), and without wrk the real-HTTP section uses its
Python load generator, which is tested on its own below.

The PostgreSQL parts read ``KEYTURN_TEST_POSTGRES_DSN``: unset, they skip with the reason
shown in the summary; with ``KEYTURN_REQUIRE_POSTGRES=1`` a missing or unreachable server
fails them instead (as in ``tests/stores/conftest.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest
from bench import DEFAULT, SECTIONS, breakdown, run_section, scale
from bench import __main__ as bench_main
from bench._apps import asgi_call, wsgi_call
from bench._core import SMOKE, Report
from bench._count import main as count_main
from bench._databases import postgres_unavailable
from bench._variants import LABELS, REFUSALS, base_of, build, world
from bench._world import OTHER_ORGANIZATION
from bench.instructions import valgrind_missing
from bench.real_http import Server, _python_load, cores


def smoke(name: str) -> Report:
    report = run_section(name, SMOKE)
    assert report.name == name
    assert report.tables, f"section {name} printed no table"
    assert all(table.rows for table in report.tables)
    assert report.render()
    return report


def test_sections_are_all_listed() -> None:
    """The default run is every section, in the documented order."""
    assert list(DEFAULT) == [
        "instructions",
        "asgi",
        "wsgi",
        "refusals",
        "cold",
        "http",
        "stores",
        "lag",
        "scale",
        "breakdown",
        "payload",
        "ratelimits",
    ]
    assert set(SECTIONS) == set(DEFAULT)


def test_asgi_warm_path_runs_no_argon2() -> None:
    """The timed ASGI variants run no argon2, and the section states its rows."""
    report = smoke("asgi")
    names = {target.name for target in report.targets}
    assert report.facts["warm.argon2_runs_while_timed"] == 0
    assert "ASGI warm overhead / floor, paired wall time (GC on), organization key" in names
    assert "ASGI / Starlette AuthenticationMiddleware same work, time, tenant key" in names
    assert len(report.tables) == 1


def test_wsgi_warm_path_runs_no_argon2() -> None:
    """The timed WSGI variants run no argon2."""
    report = smoke("wsgi")
    assert report.facts["warm.argon2_runs_while_timed"] == 0
    assert "flask.keyturn/flask.httpauth" in report.facts


SAME_WORK = [
    name
    for name in LABELS
    if name.split(".")[1].removesuffix("+tenant")
    in ("floor", "auth", "bearer", "httpauth", "keyturn")
]


def _reply(name: str, organization: str | None) -> tuple[int, str | None]:
    """Status and ``service-organization-id`` of one request to *name*, naming *organization*."""
    w = world()
    try:
        variant = build(name, w)
        if variant.kind == "asgi":
            scope = dict(variant.request)
            if organization is not None:
                scope["headers"] = [
                    *scope["headers"],
                    (b"x-organization-id", organization.encode()),
                ]
            reply = asyncio.run(asgi_call(variant.app, scope))
        else:
            environ = dict(variant.request)
            if organization is not None:
                environ["HTTP_X_ORGANIZATION_ID"] = organization
            reply = wsgi_call(variant.app, environ)
    finally:
        w.authenticator.close()
    return reply.status, reply.header("service-organization-id")


@pytest.mark.parametrize("name", SAME_WORK)
def test_same_work_baselines_check_the_organization(name: str) -> None:
    """Each same-work guard answers 200 with the service header, refuses another organization."""
    status, organization = _reply(name, None)
    assert status == 200
    assert organization is not None
    if not name.endswith("+tenant"):  # an organization key naming another organization
        assert _reply(name, OTHER_ORGANIZATION)[0] != 200


@pytest.mark.parametrize("name", list(LABELS))
def test_count_harness_runs_every_variant(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``bench._count`` builds, checks and runs every variant (here without valgrind)."""
    count_main([name, "3"])
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert said == {"variant": name, "n": 3, "status": 200}
    assert base_of(name) in LABELS


@pytest.mark.parametrize("name", list(REFUSALS))
def test_count_harness_runs_every_refusal(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``bench._count`` runs every refused variant too: each answers 401, the app unreached."""
    count_main([name, "3"])
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert said == {"variant": name, "n": 3, "status": 401}
    assert base_of(name) in REFUSALS


@pytest.mark.skipif(valgrind_missing() is not None, reason=f"{valgrind_missing()}")
def test_instruction_counts_under_callgrind() -> None:
    """Callgrind counts a warm request through keyturn above the same bare app."""
    facts = smoke("instructions").facts
    assert facts["skipped"] == 0
    assert facts["starlette.keyturn.instructions"] > facts["starlette.bare.instructions"] > 0


def test_instructions_skip_without_valgrind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With no valgrind on the PATH the section is skipped and says why."""
    monkeypatch.setenv("PATH", str(tmp_path))
    report = run_section("instructions", SMOKE)
    assert report.facts["skipped"] == 1
    assert any("valgrind is not installed" in note for note in report.notes)


def test_breakdown_pieces_are_all_found(capsys: pytest.CaptureFixture[str]) -> None:
    """Every piece of the breakdown still finds the internal it measures."""
    breakdown._count_main(3)  # the loop valgrind runs, here without it
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert said["missing"] == []
    assert len(said["pieces"]) > 20


def test_refusals_touch_what_they_must_and_no_more() -> None:
    facts = smoke("refusals").facts
    for path in ("junk", "typo"):  # refused before any lookup
        assert facts[f"{path}.store_reads"] == 0
        assert facts[f"{path}.membership_calls"] == 0
        assert facts[f"{path}.argon2_runs"] == 0
    assert (facts["unknown.store_reads"], facts["unknown.argon2_runs"]) == (1, 0)
    assert (facts["wrong.store_reads"], facts["wrong.argon2_runs"]) == (1, 0)
    assert (facts["warm.store_reads"], facts["warm.argon2_runs"]) == (1, 0)


def test_cold_path_runs_no_argon2_and_a_legacy_key_runs_it_once() -> None:
    facts = smoke("cold").facts
    assert facts["fresh.first.argon2_runs_max"] == facts["fresh.second.argon2_runs_max"] == 0
    assert facts["legacy.first.argon2_runs_min"] == facts["legacy.first.argon2_runs_max"] == 1
    assert facts["legacy.second.argon2_runs_max"] == 0
    assert facts["crowd.asgi_argon2_runs"] == 1
    assert facts["crowd.wsgi_argon2_runs"] == 1
    assert facts["crowd.asgi_ok"] == facts["crowd.wsgi_ok"] == facts["crowd.size"] > 1


def test_real_http_servers_start_answer_and_stop() -> None:
    """Three pinned servers answer the load generator (wrk if installed) without a failure."""
    facts = smoke("http").facts
    assert facts["requests"] > 0
    assert facts["failed"] == 0


def test_python_load_generator() -> None:
    """The fallback load generator, in its own pinned process, gets only 200s from keyturn."""
    server_cpu, load_cpu = cores()
    server = Server("keyturn", server_cpu)
    try:
        requests, failed, _ = _python_load(server, 2, 40, 10.0, load_cpu)
    finally:
        server.stop()
    assert server.process.returncode is not None  # stopped by its PID
    assert (requests, failed) == (40, 0)


def test_stores_without_postgres() -> None:
    """SQLite's warm requests read no table with the replica, one statement without it."""
    report = run_section("stores", SMOKE.with_postgres(None))
    assert report.facts["postgres_skipped"] == 1
    assert any("PostgreSQL skipped" in note for note in report.notes)
    for driver in ("authenticate()", "authenticate_async()"):
        assert report.facts[f"sqlite, replica: {driver}.selects_per_request"] == 0
        assert report.facts[f"sqlite, replica=False: {driver}.statements_per_request"] == 1
    if "count.sqlite.instructions" in report.facts:  # valgrind and strace are there
        assert report.facts["count.sqlite.syscalls_per_request"] == 0
    assert report.facts["http.failed"] == 0


def test_lag_without_postgres() -> None:
    """Four SQLite instances refuse every revoked key, and none flips back; one instance
    never accepts a request begun after the commit."""
    report = run_section("lag", SMOKE.with_postgres(None))
    assert report.facts["postgres_skipped"] == 1
    for load in ("saturated", "paced", "writes"):
        assert report.facts[f"sqlite, {load}.revokes"] == SMOKE.revokes
        assert report.facts[f"sqlite, {load}.not_refused"] == 0
        assert report.facts[f"sqlite, {load}.flips"] == 0
    # With the WAL-index header, no request that began after a commit was let through.
    assert report.facts["sqlite, header mapped.accepted_after_commit"] == 0


def _scale_counted(facts: dict[str, float], kind: str) -> None:
    """Every request of the four instances counted once, every write made, in lockstep."""
    profile = scale.PROFILES["smoke"]
    for rate in profile.rates:
        name = f"{kind}.{profile.population}.{rate}"
        assert facts[f"{name}.requests"] == scale.INSTANCES * profile.requests
        assert facts[f"{name}.decided"] == sum(
            facts[f"{name}.{part}"] for part in ("first", "refused", "touched", "untouched")
        )
        assert facts[f"{name}.writes"] == (profile.requests // (scale.RPS // rate) if rate else 0)
    assert facts[f"big.{kind}.requests"] == profile.big_requests
    assert 0 <= facts[f"big.{kind}.read_through_rate"] <= 1
    assert 0 <= facts[f"big.{kind}.lru_miss_rate"] <= 1
    assert facts[f"rewarm.{kind}.done"] == facts[f"rewarm.{kind}.accepted"] > 0
    assert facts[f"rewarm.{kind}.read_throughs"] >= facts[f"rewarm.{kind}.done"]


def test_scale_without_postgres() -> None:
    """Four SQLite instances and a writer elsewhere, the 300k-keys study and the re-warming
    run and count; with no writes, every warm request is answered by the memo."""
    report = run_section("scale", SMOKE.with_postgres(None))
    facts = report.facts
    assert facts["postgres_skipped"] == 1
    _scale_counted(facts, "sqlite")
    assert facts[f"sqlite.{scale.PROFILES['smoke'].population}.0.hit_rate"] == 1.0


def test_scale_lru_and_zipf() -> None:
    """The LRU the replica is compared with, and the traffic's Zipf ranks."""
    assert scale.lru_misses([1, 2, 1, 3, 1, 2], size=2, measured_from=0) == 4
    assert scale.lru_misses([1, 2, 1, 3, 1, 2], size=2, measured_from=3) == 2
    trace = scale.zipf_trace(100, 5000, seed=1)
    assert trace == scale.zipf_trace(100, 5000, seed=1)
    assert trace.count(0) > trace.count(1) > trace.count(50)


@pytest.mark.skipif(shutil.which("valgrind") is not None, reason="the counted mode is above")
def test_breakdown_timed_without_valgrind() -> None:
    """Without valgrind the breakdown times its pieces instead."""
    facts = smoke("breakdown").facts
    assert facts["counted"] == 0
    assert facts["missing"] == 0


def test_payload_guard_costs_per_kib() -> None:
    """The payload section finds, refuses and records a key in each kind of body (plain and
    escaped), runs no argon2, and prints a cost per KiB."""
    report = smoke("payload")
    facts = report.facts
    assert facts["refused_and_recorded"] == 6
    assert facts["verified_key.argon2_runs"] == 0
    assert {name for name in facts if name.endswith(".scan_ns_per_kib")} == {
        f"{kind}.{size}.scan_ns_per_kib"
        for kind in ("machine", "chat", "non-Latin")
        for size in (1024, 65536)
    } | {"empty.2.scan_ns_per_kib"}
    if shutil.which("valgrind") is not None:  # the empty body, counted by callgrind
        assert facts["empty.asgi_instructions"] > 0


def _postgres_dsn() -> str:
    dsn = os.environ.get("KEYTURN_TEST_POSTGRES_DSN", "")
    reason = "KEYTURN_TEST_POSTGRES_DSN is not set" if not dsn else postgres_unavailable(dsn)
    if reason is not None:
        if os.environ.get("KEYTURN_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"KEYTURN_REQUIRE_POSTGRES=1 but {reason}", pytrace=False)
        pytest.skip(f"PostgreSQL benchmarks skipped: {reason}")
    return dsn


@pytest.mark.postgres
@pytest.mark.parametrize("name", ["stores", "lag", "scale"])
def test_postgres_parts(name: str) -> None:
    report = run_section(name, SMOKE.with_postgres(_postgres_dsn()))
    assert not any("PostgreSQL skipped" in note for note in report.notes)
    facts = report.facts
    if name == "stores":
        assert facts["postgres_skipped"] == 0
        for driver in ("authenticate()", "authenticate_async()"):
            assert facts[f"postgres, replica: {driver}.statements_per_request"] == 0
            assert facts[f"postgres, replica=False: {driver}.statements_per_request"] == 1
    elif name == "lag":
        assert facts["postgres_skipped"] == 0
        assert facts["postgres, saturated.not_refused"] == facts["postgres, paced.flips"] == 0
        if "faults.after.statements" in facts:  # a private server could be started
            assert facts["faults.revoked_accepted_late"] == 0
            # Once the feed is back the warm path reads nothing per request. A listener the
            # machine stalls past the settling wait makes a request read through (fail
            # closed), so a loaded machine may show one or two: never one per request.
            assert facts["faults.after.statements"] * 50 <= facts["faults.after.requests"]
            assert facts["faults.steady.other"] == facts["faults.restarted.other"] == 0
    else:
        assert facts["postgres_skipped"] == 0
        _scale_counted(facts, "postgres")


def test_command_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m bench --quick --only ...`` prints the tables and the bars' summary."""
    monkeypatch.setattr(bench_main, "QUICK", SMOKE)  # the smoke counts, through the real CLI
    assert bench_main.main(["--quick", "--only", "refusals", "--postgres-dsn", ""]) == 0
    out = capsys.readouterr().out
    assert "3. Refusal paths" in out
    assert "[PASS] junk token: no store read, no argon2 run" in out
    assert "PostgreSQL: skipped" in out


def test_rate_limit_section_counts_round_trips_and_replays_the_run() -> None:
    """The rate limit section: round trips counted per engine, the accuracy run on real
    servers replayed (no admission past 1.05 L, no false 429), wherever an engine runs."""
    report = smoke("ratelimits")
    for name, value in report.facts.items():
        if name.startswith("round_trips."):
            assert value <= 0.05, name
        if name.endswith((".over", ".false_429")):
            assert value == 0, name


def test_the_rate_limit_replay_counts_what_it_should() -> None:
    from bench.ratelimits import replay

    # q = 2 per 10 s: two admitted, one refused at the full count, one refused too early.
    decisions = [(100.0, 200), (101.0, 200), (102.0, 429), (103.0, 200), (110.5, 429)]
    counted = replay(decisions, quota=2, window=10, in_flight=0)
    assert counted["admitted"] == {10: 3}
    assert counted["over"] == 1  # the third admission passed 1.05 x 2
    assert counted["refused"] == 2
    assert counted["under"] == 0
    early = replay([(100.0, 429)], quota=2, window=10, in_flight=0)
    assert early["under"] == 1
