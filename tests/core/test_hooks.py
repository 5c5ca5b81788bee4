"""Hooks and providers that could silently pass: refused at startup, or failing closed."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from keyturn import Authenticator, AuthRequest, Principal, Reason, ServiceUnavailable
from tests.core.conftest import Decide
from tests.world import MAIN_SCOPE, RESEARCH_SCOPE, TENANT_SCOPE, World, bearer


async def async_policy(principal: Principal, request: AuthRequest) -> bool:
    return False


async def async_audit(event: Any) -> None:
    return None


class AsyncCallable:
    async def __call__(self, *args: Any) -> bool:
        return False


@pytest.mark.parametrize(
    ("name", "hook"),
    [("policy", async_policy), ("audit", async_audit), ("policy", AsyncCallable())],
    ids=["async policy", "async audit hook", "object with an async __call__"],
)
def test_an_async_hook_is_refused_at_construction(world: World, name: str, hook: Any) -> None:
    """An async policy would return a truthy coroutine (every request allowed); refused now."""
    with pytest.raises(TypeError, match=f"{name} must be a plain function"):
        Authenticator(world.store, world.membership, **{name: hook})


@pytest.mark.parametrize("answer", ["no", None, 0, 1], ids=repr)
def test_a_policy_answer_that_is_not_a_bool_fails_closed(
    world: World, make_decide: Callable[..., Decide], answer: object
) -> None:
    """A policy answering anything but True or False is a bug: an error, never a pass."""
    created = world.manager.create("alice", name="bot", scope=RESEARCH_SCOPE)
    decide = make_decide(world, policy=lambda principal, request: answer)
    with pytest.raises(TypeError, match="policy must return a bool"):
        decide(bearer(created.secret))


class Wrapped:
    """Answers *method* with a coroutine, as a sync tracing wrapper around an async one would."""

    nonblocking = True

    def __init__(self, inner: Any, method: str, answer: Any = None) -> None:
        self.inner, self.method, self.answer = inner, method, answer

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.inner, name)
        if name != self.method:
            return real

        async def later(*args: Any) -> Any:
            return real(*args)

        if self.answer is not None:
            return lambda *args: self.answer
        return lambda *args: later(*args)


# method -> (scope of the key, x-organization-id) that makes the decision ask it
ASKED_BY = {
    "get_key": (MAIN_SCOPE, None),
    "get_role": (MAIN_SCOPE, None),
    "get_organization": (TENANT_SCOPE, "org_research"),
    "get_default_organization": (TENANT_SCOPE, "default"),
    "reaches_tenant": (TENANT_SCOPE, None),
}


@pytest.mark.parametrize("wrong", [None, b"admin"], ids=["a coroutine", "bytes"])
@pytest.mark.parametrize("method", list(ASKED_BY))
def test_a_wrongly_typed_answer_is_503_naming_the_method(
    world: World,
    make_decide: Callable[..., Decide],
    caplog: pytest.LogCaptureFixture,
    method: str,
    wrong: Any,
) -> None:
    """Every answer is type-checked: a removed member's key cannot pass on a coroutine."""
    scope, organization = ASKED_BY[method]
    created = world.manager.create("alice", name="bot", scope=scope)
    if method == "get_key":
        decide = make_decide(world, store=Wrapped(world.store, method, wrong))
    else:
        decide = make_decide(world, membership=Wrapped(world.membership, method, wrong))
    with caplog.at_level(logging.ERROR, logger="keyturn"):
        outcome = decide(bearer(created.secret, organization))
    assert isinstance(outcome, ServiceUnavailable), outcome
    assert outcome.reason is Reason.BACKEND_ERROR
    assert f"{method}()" in caplog.text
    assert ("coroutine" if wrong is None else "bytes") in caplog.text
