"""Metrics from audit events: real decisions, counted by OpenTelemetry's SDK in memory."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

from keyturn import ApiKey, AuditEvent, Authenticator, AuthRequest, KeyManager, Principal, Scope
from keyturn._core import hashing as _hashing
from keyturn._core import token as _token
from keyturn._core.model import utc_now
from keyturn.metrics import DURATION_BUCKETS, METHODS, MetricsAudit
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from tests.legacy import legacy_hash


class Meters:
    """An SDK meter provider read in memory: {instrument: {attributes: value}}."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])
        self.meter = self.provider.get_meter("keyturn")

    def points(self) -> dict[str, dict[frozenset[tuple[str, Any]], Any]]:
        data = self.reader.get_metrics_data()
        points: dict[str, dict[frozenset[tuple[str, Any]], Any]] = {}
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    points[metric.name] = {
                        frozenset(point.attributes.items()): point
                        for point in metric.data.data_points
                    }
        return points

    def read(self) -> dict[str, dict[frozenset[tuple[str, Any]], int]]:
        """The counters' values (histograms left out: see :meth:`durations`)."""
        return {
            name: {attributes: point.value for attributes, point in points.items()}
            for name, points in self.points().items()
            if name != "keyturn.decision.duration"
        }

    def durations(self) -> dict[frozenset[tuple[str, Any]], HistogramDataPoint]:
        return self.points().get("keyturn.decision.duration", {})


@pytest.fixture
def meters() -> Iterator[Meters]:
    meters = Meters()
    yield meters
    meters.provider.shutdown()


class World:
    def __init__(self) -> None:
        self.store = MemoryKeyStore()
        self.membership = MemoryMembership()
        self.membership.add_organization("org_acme", tenant_id="acme", default=True)
        self.membership.add_member("alice", "org_acme", role="admin")
        manager = KeyManager(self.store, self.membership)
        self.secret = manager.create(
            "alice", name="ci", scope=Scope.organization("org_acme", tenant_id="acme")
        ).secret


def request(secret: str | None, method: str = "GET", path: str = "/managed-agents/v1/x") -> Any:
    authorization = () if secret is None else (f"Bearer {secret}",)
    return AuthRequest(authorization=authorization, method=method, path=path)


def attrs_of(**values: Any) -> frozenset[tuple[str, Any]]:
    return frozenset(values.items())


def test_decisions_are_counted_by_outcome_and_precise_reason(meters: Meters) -> None:
    """Allowed, missing and wrong-secret decisions each land on their own attribute set."""
    world = World()
    audit = MetricsAudit(meters.meter)
    with Authenticator(world.store, world.membership, audit=audit) as auth:
        for _ in range(2):
            assert isinstance(auth.authenticate(request(world.secret)), Principal)
        auth.authenticate(request(None, method="BREW"))
        body = world.secret[:16] + "A" * 28
        auth.authenticate(request(body + _token._checksum(body)))  # the id, another secret
    counts = meters.read()
    assert counts["keyturn.decisions"] == {
        attrs_of(
            **{"http.request.method": "GET", "keyturn.outcome": "allowed", "keyturn.reason": "ok"}
        ): 2,
        attrs_of(
            **{
                "http.request.method": "_OTHER",
                "keyturn.outcome": "refused",
                "keyturn.reason": "missing",
                "http.response.status_code": 401,
            }
        ): 1,
        attrs_of(
            **{
                "http.request.method": "GET",
                "keyturn.outcome": "refused",
                "keyturn.reason": "wrong_secret",
                "http.response.status_code": 401,
            }
        ): 1,
    }
    # SHA-256 keys: the process-wide count of argon2 runs is observed, and none were added.
    assert counts["keyturn.legacy_hash.verifications"] == {
        frozenset(): _hashing.legacy_verifications
    }


def test_legacy_hash_verifications_are_observed(meters: Meters) -> None:
    """A key still holding an argon2id hash runs argon2 once, at its first use (then its
    hash is replaced): the observable counter moves by one for three requests."""
    world = World()
    key_id, secret = _token.split(world.secret)
    stored = world.store.get_key(key_id)
    assert stored is not None
    world.store.upgrade_hash(key_id, stored.secret_hash, legacy_hash(secret))
    before = _hashing.legacy_verifications
    with Authenticator(world.store, world.membership, audit=MetricsAudit(meters.meter)) as auth:
        for _ in range(3):
            assert isinstance(auth.authenticate(request(world.secret)), Principal)
    counts = meters.read()
    assert counts["keyturn.legacy_hash.verifications"] == {frozenset(): before + 1}


class SlowStore(MemoryKeyStore):
    """A store whose lookups wait until released: a backend that stopped answering."""

    nonblocking = False  # it blocks: the authenticator bounds its calls with the timeout

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def get_key(self, key_id: str) -> ApiKey | None:
        self.release.wait(10)
        return super().get_key(key_id)


def test_store_timeouts_are_counted(meters: Meters) -> None:
    """A store that does not answer within the timeout is counted as a timeout, and a 503."""
    world = World()
    slow = SlowStore()
    for key in world.store.keys_of("alice"):
        slow.add_key(key)
    audit = MetricsAudit(meters.meter)
    with Authenticator(slow, world.membership, audit=audit, timeout=0.05) as auth:
        outcome = auth.authenticate(request(world.secret))
        slow.release.set()
    assert getattr(outcome, "status", None) == 503
    counts = meters.read()
    assert counts["keyturn.backend.timeouts"] == {frozenset(): 1}
    ((attributes, count),) = counts["keyturn.decisions"].items()
    assert dict(attributes)["keyturn.reason"] == "backend_timeout" and count == 1


def test_another_hook_still_runs_and_extra_attributes_are_opt_in(meters: Meters) -> None:
    """then= receives every event after counting; attributes= adds a bounded breakdown."""
    world = World()
    seen: list[AuditEvent] = []

    def by_tenant(event: AuditEvent) -> dict[str, str]:
        return {"tenant": event.principal.tenant_id if event.principal else "-"}

    audit = MetricsAudit(meters.meter, then=seen.append, attributes=by_tenant)
    with Authenticator(world.store, world.membership, audit=audit) as auth:
        auth.authenticate(request(world.secret))
        auth.authenticate(request(None))
    assert [event.allowed for event in seen] == [True, False]
    tenants = sorted(dict(a)["tenant"] for a in meters.read()["keyturn.decisions"])
    assert tenants == ["-", "acme"]


def test_an_async_hook_to_chain_is_refused_at_construction(meters: Meters) -> None:
    """An audit hook is called synchronously: a coroutine function would never run."""

    async def hook(event: AuditEvent) -> None: ...

    with pytest.raises(TypeError, match="plain function"):
        MetricsAudit(meters.meter, then=hook)


def test_without_a_configured_provider_nothing_fails() -> None:
    """With OpenTelemetry's default no-op provider, the hook counts nothing and raises nothing."""
    world = World()
    with Authenticator(world.store, world.membership, audit=MetricsAudit()) as auth:
        assert isinstance(auth.authenticate(request(world.secret)), Principal)


ALLOWED_KEYS = {
    "http.request.method",
    "keyturn.outcome",
    "keyturn.reason",
    "http.response.status_code",
}


@settings(max_examples=80, deadline=None)
@given(
    method=st.text(max_size=12),
    path=st.text(max_size=40),
    token=st.text(max_size=60) | st.none(),
)
def test_attributes_are_bounded_whatever_the_request(method: str, path: str, token: str) -> None:
    """No request text but a known method ever becomes an attribute value."""
    meters = Meters()
    world = World()
    audit = MetricsAudit(meters.meter)
    with Authenticator(world.store, world.membership, audit=audit) as auth:
        auth.authenticate(request(token, method=method, path=path))
        auth.authenticate(request(world.secret, method=method, path=path))
    for attributes in meters.durations():
        assert {name for name, _ in attributes} == {"keyturn.outcome", "keyturn.reason"}
    for attributes in meters.read()["keyturn.decisions"]:
        values = dict(attributes)
        assert set(values) <= ALLOWED_KEYS
        assert values["http.request.method"] in {
            *METHODS,
            "_OTHER",
        }
        assert values["keyturn.outcome"] in ("allowed", "refused")
        assert world.secret not in repr(values) and world.secret[4:16] not in repr(values)
    meters.provider.shutdown()


# --- decision latency -------------------------------------------------------------------------


def outcome_of(attributes: frozenset[tuple[str, Any]]) -> tuple[str, str]:
    values = dict(attributes)
    return values["keyturn.outcome"], values["keyturn.reason"]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_each_decision_is_one_duration_observation(meters: Meters, driver: str) -> None:
    """The histogram holds one non-negative observation per decision, keyed by outcome and
    reason only, with the advised buckets; the events carry the same durations.
    """
    world = World()
    seen: list[AuditEvent] = []
    audit = MetricsAudit(meters.meter, then=seen.append)
    basic = AuthRequest(authorization=("Basic YWxpY2U6cHc=",), method="BREW")
    requests = [request(world.secret)] * 3 + [request(None), basic]
    with Authenticator(world.store, world.membership, audit=audit) as auth:
        if driver == "sync":
            for each in requests:
                auth.authenticate(each)
        else:

            async def run() -> None:
                for each in requests:
                    await auth.authenticate_async(each)

            asyncio.run(run())
    durations = meters.durations()
    assert {outcome_of(a): point.count for a, point in durations.items()} == {
        ("allowed", "ok"): 3,
        ("refused", "missing"): 1,
        ("refused", "not_bearer"): 1,
    }
    for point in durations.values():
        assert point.min >= 0 and point.sum >= point.max >= point.min
        assert tuple(point.explicit_bounds) == DURATION_BUCKETS
        assert sum(point.bucket_counts) == point.count
    # Per attribute set, the histogram's sum is exactly the sum of the events' durations.
    elapsed = [event.elapsed for event in seen]
    assert all(isinstance(e, float) and e >= 0 for e in elapsed)
    allowed = [event.elapsed for event in seen if event.allowed]
    assert durations[attrs_of(**{"keyturn.outcome": "allowed", "keyturn.reason": "ok"})].sum == (
        pytest.approx(sum(e for e in allowed if e is not None))
    )


class HeldStore(MemoryKeyStore):
    """A store that answers once the test releases it, and measures how long it was held."""

    nonblocking = False

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.held = 0.0

    def get_key(self, key_id: str) -> ApiKey | None:
        start = time.monotonic()
        self.entered.set()
        self.release.wait(10)
        self.held = time.monotonic() - start
        return super().get_key(key_id)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_the_duration_includes_the_store_wait(meters: Meters, driver: str) -> None:
    """The store's wait lies inside the measured decision: its duration is at least as long
    as the store itself measured (one monotonic span nested in the other, not a speed).
    """
    world = World()
    held = HeldStore()
    for key in world.store.keys_of("alice"):
        held.add_key(key)
    seen: list[AuditEvent] = []
    audit = MetricsAudit(meters.meter, then=seen.append)
    with Authenticator(held, world.membership, audit=audit, timeout=None) as auth:
        decide = (
            (lambda: auth.authenticate(request(world.secret)))
            if driver == "sync"
            else (lambda: asyncio.run(auth.authenticate_async(request(world.secret))))
        )
        caller = threading.Thread(target=decide)
        caller.start()
        assert held.entered.wait(10)
        deadline = time.monotonic() + 0.02  # a bounded, deliberate hold
        while time.monotonic() < deadline:
            time.sleep(0.005)
        held.release.set()
        caller.join(10)
    ((event,),) = [seen]
    assert event.allowed and event.elapsed is not None
    assert event.elapsed >= held.held > 0
    ((point,),) = [list(meters.durations().values())]
    assert point.count == 1 and point.sum == pytest.approx(event.elapsed)


def test_an_event_without_a_duration_is_counted_but_not_timed(meters: Meters) -> None:
    """A hand-built event (no elapsed) still counts as a decision; it adds no observation."""
    world = World()
    with Authenticator(world.store, world.membership) as auth:
        principal = auth.authenticate(request(world.secret))
    assert isinstance(principal, Principal)
    audit = MetricsAudit(meters.meter)
    audit(AuditEvent(at=utc_now(), method="GET", path="/", principal=principal, error=None))
    assert sum(meters.read()["keyturn.decisions"].values()) == 1
    assert meters.durations() == {}


class HungAsyncStore:
    """An async store that never answers in time: the async driver's timeout cuts it."""

    def __init__(self, inner: MemoryKeyStore) -> None:
        self.inner = inner

    async def get_key(self, key_id: str) -> ApiKey | None:
        await asyncio.sleep(10)
        return self.inner.get_key(key_id)


def test_async_store_timeouts_are_counted_and_timed(meters: Meters) -> None:
    """Through authenticate_async, a hung store is a 503 counted as a timeout and timed."""
    world = World()
    audit = MetricsAudit(meters.meter)
    auth = Authenticator(HungAsyncStore(world.store), world.membership, audit=audit, timeout=0.05)
    with auth:
        outcome = asyncio.run(auth.authenticate_async(request(world.secret)))
    assert getattr(outcome, "status", None) == 503
    assert meters.read()["keyturn.backend.timeouts"] == {frozenset(): 1}
    durations = meters.durations()
    assert [outcome_of(a) for a in durations] == [("refused", "backend_timeout")]


def test_the_chained_hook_gets_every_event_when_counting_raises(
    meters: Meters, caplog: pytest.LogCaptureFixture
) -> None:
    """An attributes callback that raises on refusals loses no event of the chained hook;
    the counting error is logged by the authenticator, and the decisions stand.
    """
    world = World()
    chained: list[AuditEvent] = []

    def attributes(event: AuditEvent) -> dict[str, str]:
        if event.error is not None:
            raise RuntimeError("a broken attributes callback")
        return {}

    audit = MetricsAudit(meters.meter, attributes=attributes, then=chained.append)
    with Authenticator(world.store, world.membership, audit=audit) as auth:
        assert isinstance(auth.authenticate(request(world.secret)), Principal)
        assert auth.authenticate(request(None)).status == 401  # type: ignore[union-attr]
        assert auth.authenticate(request("rma_junk")).status == 401  # type: ignore[union-attr]

    assert [event.allowed for event in chained] == [True, False, False]
    assert [r.getMessage() for r in caplog.records].count(
        "the audit hook failed; the decision stands"
    ) == 2
