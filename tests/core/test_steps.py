"""The sans-IO core driven by hand: a request and the answers to its steps, in a table.

Each row sends :func:`~keyturn._core.decision.decide` the answers a store and provider would give,
with ``send()``, and checks which questions it asked, in order, and what it concluded. No
driver, no thread: the decision alone (a secret is checked in place, one SHA-256).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import attrs
import pytest

from keyturn import (
    ApiKey,
    AuthRequest,
    InvalidRequest,
    NotFound,
    Organization,
    Principal,
    Reason,
    Refusal,
    Scope,
    Unauthorized,
)
from keyturn._core import token as _token
from keyturn._core.decision import Rules, decide
from keyturn._core.hashing import hash_secret
from keyturn._core.steps import UpgradeHash
from tests.legacy import legacy_hash
from tests.world import START

TOKEN = _token.generate()
TENANT_KEY = ApiKey(
    key_id=TOKEN.key_id,
    secret_hash=hash_secret(TOKEN.secret),
    hint=TOKEN.hint,
    name="bot",
    account_id="alice",
    scope=Scope.tenant("acme"),
    created_at=START,
    expires_at=START + timedelta(days=30),
)
ORG_KEY = attrs.evolve(TENANT_KEY, scope=Scope.organization("org_a", tenant_id="acme"))
REVOKED_KEY = attrs.evolve(TENANT_KEY, revoked_at=START)
OTHER_SECRET_KEY = attrs.evolve(TENANT_KEY, secret_hash=hash_secret("x" * 28))
ORG_A = Organization(id="org_a", tenant_id="acme", is_default=True)
GLOBEX = Organization(id="org_g", tenant_id="globex")
BEARER = (f"Bearer {TOKEN.token}",)


def request(organization: tuple[str, ...] = (), authorization: tuple[str, ...] = BEARER) -> Any:
    return AuthRequest(authorization=authorization, organization=organization)


def verified(key: ApiKey, **more: Any) -> dict[str, Any]:
    """The answers of a key that exists (its secret matches, if its hash is TOKEN's), and
    *more*."""
    return {"get_key": key, **more}


# request, answers by method -> methods asked in order, outcome (refusal type and reason,
# or the principal's organization and role)
TABLE: list[tuple[str, AuthRequest, dict[str, Any], list[str], Any]] = [
    ("no header", request(authorization=()), {}, [], (Unauthorized, Reason.MISSING)),
    (
        "basic scheme",
        request(authorization=("Basic dXNlcg==",)),
        {},
        [],
        (Unauthorized, Reason.NOT_BEARER),
    ),
    (
        "two authorization headers",
        request(authorization=BEARER * 2),
        {},
        [],
        (Unauthorized, Reason.AUTHORIZATION_REPEATED),
    ),
    (
        "malformed",
        request(authorization=("Bearer rma_short",)),
        {},
        [],
        (Unauthorized, Reason.MALFORMED),
    ),
    ("unknown key", request(), {"get_key": None}, ["get_key"], (Unauthorized, Reason.UNKNOWN_KEY)),
    (
        "wrong secret",
        request(),
        {"get_key": OTHER_SECRET_KEY},
        ["get_key"],
        (Unauthorized, Reason.WRONG_SECRET),
    ),
    (
        "revoked",
        request(("org_a",)),
        verified(REVOKED_KEY),
        ["get_key"],
        (Unauthorized, Reason.REVOKED),
    ),
    (
        "tenant key, no header",
        request(),
        verified(TENANT_KEY, reaches_tenant=True),
        ["get_key", "reaches_tenant"],
        (InvalidRequest, Reason.ORG_HEADER_MISSING),
    ),
    (
        "tenant key, creator gone",
        request(("org_a",)),
        verified(TENANT_KEY, get_organization=ORG_A, get_role=None, reaches_tenant=False),
        ["get_key", "get_organization", "get_role", "reaches_tenant"],
        (Unauthorized, Reason.INACTIVE),
    ),
    (
        "tenant key, named organization",
        request(("org_a",)),
        verified(TENANT_KEY, get_organization=ORG_A, get_role="admin"),
        ["get_key", "get_organization", "get_role"],
        ("org_a", "admin"),
    ),
    (
        "tenant key, default",
        request(("default",)),
        verified(TENANT_KEY, get_default_organization=ORG_A, get_role="member"),
        ["get_key", "get_default_organization", "get_role"],
        ("org_a", "member"),
    ),
    (
        "tenant key, unknown organization",
        request(("org_x",)),
        verified(TENANT_KEY, get_organization=None, reaches_tenant=True),
        ["get_key", "get_organization", "reaches_tenant"],
        (NotFound, Reason.ORG_NOT_FOUND),
    ),
    (
        "tenant key, another tenant's organization",
        request(("org_g",)),
        verified(TENANT_KEY, get_organization=GLOBEX, reaches_tenant=True),
        ["get_key", "get_organization", "reaches_tenant"],
        (NotFound, Reason.ORG_NOT_FOUND),
    ),
    (
        "tenant key, organization without a role",
        request(("org_a",)),
        verified(TENANT_KEY, get_organization=ORG_A, get_role=None, reaches_tenant=True),
        ["get_key", "get_organization", "get_role", "reaches_tenant"],
        (NotFound, Reason.ORG_NOT_REACHABLE),
    ),
    (
        "tenant key, bad header",
        request(("a,b",)),
        verified(TENANT_KEY, reaches_tenant=True),
        ["get_key", "reaches_tenant"],
        (InvalidRequest, Reason.ORG_HEADER_INVALID),
    ),
    (
        "organization key",
        request(),
        verified(ORG_KEY, get_role="viewer"),
        ["get_key", "get_role"],
        ("org_a", "viewer"),
    ),
    (
        "organization key, creator gone",
        request(),
        verified(ORG_KEY, get_role=None),
        ["get_key", "get_role"],
        (Unauthorized, Reason.INACTIVE),
    ),
    (
        "organization key aimed elsewhere",
        request(("org_b",)),
        verified(ORG_KEY, get_role="viewer"),
        ["get_key", "get_role"],
        (NotFound, Reason.ORG_NOT_KEYS_OWN),
    ),
    (
        "organization key, default is its own",
        request(("default",)),
        verified(ORG_KEY, get_role="viewer", get_default_organization=ORG_A),
        ["get_key", "get_role", "get_default_organization"],
        ("org_a", "viewer"),
    ),
    (
        "organization key, two organization headers",
        request(("org_a", "org_a")),
        verified(ORG_KEY, get_role="viewer"),
        ["get_key", "get_role"],
        (InvalidRequest, Reason.ORG_HEADER_REPEATED),
    ),
]


def run(
    request: AuthRequest,
    answers: dict[str, Any],
    rules: Rules | None = None,
) -> tuple[list[str], Principal | Refusal]:
    """Drive the decision by hand: each step is answered from *answers* by its method."""
    flow = decide(request, START, Rules() if rules is None else rules)
    asked: list[str] = []
    answer: Any = None
    try:
        while True:
            step = flow.send(answer)
            asked.append(step.method)
            answer = answers[step.method]
    except StopIteration as done:
        return asked, done.value


@pytest.mark.parametrize(
    ("request_", "answers", "steps", "expected"),
    [row[1:] for row in TABLE],
    ids=[row[0] for row in TABLE],
)
def test_request_and_answers_give_steps_and_outcome(
    request_: AuthRequest, answers: dict[str, Any], steps: list[str], expected: Any
) -> None:
    """decide() asks exactly these questions, in this order, and reaches this outcome."""
    asked, outcome = run(request_, answers)
    assert asked == steps
    if isinstance(expected[0], type):
        assert isinstance(outcome, expected[0]), outcome
        assert outcome.reason is expected[1]
    else:
        assert isinstance(outcome, Principal), outcome
        assert (outcome.organization_id, outcome.role) == expected
        assert (outcome.key_id, outcome.account_id) == (TOKEN.key_id, "alice")


def test_decide_mutates_nothing_it_is_given() -> None:
    """The request and the rules are the same after a decision as before."""
    rules = Rules()
    req = request(("org_a",))
    before = (req, attrs.asdict(rules))
    answers = verified(TENANT_KEY, get_organization=ORG_A, get_role="admin")
    _, outcome = run(req, answers, rules)
    assert isinstance(outcome, Principal)
    assert (req, attrs.asdict(rules)) == before


def test_a_legacy_hash_is_replaced_by_a_conditional_write_after_the_status_checks() -> None:
    """A key holding an argon2id hash: once its secret and status pass, the decision asks
    the store to replace that hash (only while it is still there) by the secret's SHA-256;
    a revoked one, or a store that cannot, is asked nothing of the kind."""
    legacy = attrs.evolve(ORG_KEY, secret_hash=legacy_hash(TOKEN.secret))
    upgrading = Rules(upgrades=True)
    answers = verified(legacy, get_role="viewer", upgrade_hash=True)
    flow = decide(request(), START, upgrading)
    step = flow.send(None)
    assert step.method == "get_key"
    step = flow.send(legacy)
    assert isinstance(step, UpgradeHash)
    assert (step.key_id, step.old_hash, step.new_hash) == (
        TOKEN.key_id,
        legacy.secret_hash,
        hash_secret(TOKEN.secret),
    )
    assert TOKEN.secret not in repr(step) and legacy.secret_hash not in repr(step)
    asked, outcome = run(request(), answers, upgrading)
    assert asked == ["get_key", "upgrade_hash", "get_role"]
    assert isinstance(outcome, Principal)
    revoked = attrs.evolve(legacy, revoked_at=START)
    asked, outcome = run(request(), verified(revoked), upgrading)
    assert (asked, outcome.reason) == (["get_key"], Reason.REVOKED)  # type: ignore[union-attr]
    asked, outcome = run(request(), answers)
    assert asked == ["get_key", "get_role"]
    assert isinstance(outcome, Principal)
