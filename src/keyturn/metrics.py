"""
Decisions measured
==================

OpenTelemetry metrics from the authenticator's audit events. Install the ``otel`` extra
(``pip install 'keyturn[otel]'``: ``opentelemetry-api`` only) and configure a meter provider
and exporter in your application as OpenTelemetry's SDK documents; without one, every
instrument is a no-op. ::

    from keyturn import Authenticator
    from keyturn.metrics import MetricsAudit

    audit = MetricsAudit(then=my_audit_log)  # keeps your own hook
    auth = Authenticator(store, membership, audit=audit)

The instruments (meter ``keyturn``):

``keyturn.decisions`` (counter)
    One per decision, with ``keyturn.outcome`` (``allowed`` or ``refused``),
    ``keyturn.reason`` (the precise :class:`~keyturn.Reason` of a refusal, ``ok`` for an
    allowed request), ``http.response.status_code`` (a refusal's status) and
    ``http.request.method`` (the known methods; any other is ``_OTHER``).
``keyturn.backend.timeouts`` (counter)
    Requests refused with 503 because the key store or membership provider did not answer
    in time.
``keyturn.legacy_hash.verifications`` (observable counter)
    argon2 runs in this process for keys still holding an argon2id hash from before
    SHA-256 (D2): each such key runs one at its first use, then its hash is replaced. Zero
    once every key in use has been upgraded.
``keyturn.decision.duration`` (histogram, seconds)
    How long each decision took, from the driver's start to its outcome: store and
    membership waits included (:attr:`AuditEvent.elapsed <keyturn.AuditEvent.elapsed>`).
    Attributes: ``keyturn.outcome`` and ``keyturn.reason`` only.

Every attribute takes a handful of values: no key id, account id, organization, path or
anything of a secret is ever an attribute. To break the counts down by something of your
own that is bounded (a tenant, when you have a few), pass ``attributes=`` a function of the
event returning extra attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

try:
    from opentelemetry import metrics
    from opentelemetry.metrics import Meter, Observation
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "keyturn.metrics needs the OpenTelemetry API: pip install 'keyturn[otel]'"
    ) from exc

from keyturn._core import hashing as _hashing
from keyturn._run.capabilities import is_coroutine_function
from keyturn.authenticator import AuditEvent, AuditHook
from keyturn.errors import Reason

__all__ = ["DURATION_BUCKETS", "METHODS", "MetricsAudit"]

# Seconds: a warm decision takes microseconds, a cold one a store round trip (a key made
# before SHA-256: one argon2 run, milliseconds), a timed-out one the authenticator's
# timeout (5 s by default).
DURATION_BUCKETS: Final = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
# OpenTelemetry's HTTP conventions: known methods by name, every other one as "_OTHER".
METHODS: Final = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"}
)

Attributes = Mapping[str, str | int]

_ALLOWED: Final = {"keyturn.outcome": "allowed", "keyturn.reason": "ok"}


class MetricsAudit:
    """An audit hook that counts decisions on OpenTelemetry instruments.

    :param meter: where the instruments live; by default the global provider's ``keyturn``
        meter.
    :param then: another audit hook, called after the counting (an audit log, say), and
        called even when the counting raises (that error is then raised on).
    :param attributes: extra attributes per event, for a breakdown you know to be bounded.
    """

    def __init__(
        self,
        meter: Meter | None = None,
        *,
        then: AuditHook | None = None,
        attributes: Callable[[AuditEvent], Attributes] | None = None,
    ) -> None:
        if is_coroutine_function(then):
            raise TypeError("then must be a plain function: audit hooks are called synchronously")
        self.meter = meter if meter is not None else metrics.get_meter("keyturn")
        self.then = then
        self.attributes = attributes
        self.decisions = self.meter.create_counter(
            "keyturn.decisions", unit="{decision}", description="Authentication decisions."
        )
        self.timeouts = self.meter.create_counter(
            "keyturn.backend.timeouts",
            unit="{request}",
            description="Requests refused because the store or membership did not answer.",
        )
        self.duration = self.meter.create_histogram(
            "keyturn.decision.duration",
            unit="s",
            description="Time from a request's arrival at the authenticator to its outcome.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.meter.create_observable_counter(
            "keyturn.legacy_hash.verifications",
            callbacks=[lambda options: [Observation(_hashing.legacy_verifications)]],
            unit="{run}",
            description="argon2 runs for keys still holding a legacy argon2id hash.",
        )

    def __repr__(self) -> str:
        return f"MetricsAudit(meter={self.meter!r}, then={self.then!r})"

    def __call__(self, event: AuditEvent) -> None:
        try:
            self._count(event)
        finally:  # a counting failure (raised on, and logged) never costs the chained hook
            if self.then is not None:
                self.then(event)

    def _count(self, event: AuditEvent) -> None:
        method = event.method if event.method in METHODS else "_OTHER"
        attributes: dict[str, str | int] = {"http.request.method": method}
        if event.error is None:
            outcome = _ALLOWED
        else:
            reason = event.error.reason
            outcome = {"keyturn.outcome": "refused", "keyturn.reason": reason.value}
            attributes["http.response.status_code"] = event.error.status
            if reason is Reason.BACKEND_TIMEOUT:
                self.timeouts.add(1)
        attributes |= outcome
        if self.attributes is not None:
            attributes |= self.attributes(event)
        self.decisions.add(1, attributes)
        if event.elapsed is not None:
            self.duration.record(event.elapsed, outcome)
