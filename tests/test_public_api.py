"""The public helpers a user meets from outside: secrets, lifetimes, organization-only scopes."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import keyturn
from keyturn import (
    AsyncKeyManager,
    InvalidExpiry,
    KeyManager,
    KeyturnError,
    Lifetime,
    NotAKey,
    Scope,
    ScopeNotReachable,
    describe_secret,
    errors,
)
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership


@pytest.fixture
def manager() -> KeyManager:
    membership = MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_organization("org_research", tenant_id="acme")
    membership.add_organization("org_other", tenant_id="globex", default=True)
    membership.add_member("alice", "org_main", role="admin")
    membership.add_member("alice", "org_research", role="member")
    return KeyManager(MemoryKeyStore(), membership)


def test_describe_secret_names_id_and_hint(manager: KeyManager) -> None:
    """A created key's secret describes to the id and hint the console shows."""
    created = manager.create("alice", name="CI", scope=Scope.tenant("acme"))

    described = describe_secret(created.secret)

    assert (described.key_id, described.hint) == (created.info.key_id, created.info.hint)
    assert created.secret not in repr(described)


def test_describe_secret_refuses_a_typo_without_echoing_it(manager: KeyManager) -> None:
    """A key with one character changed fails its checksum; the message does not repeat it."""
    secret = manager.create("alice", name="CI", scope=Scope.tenant("acme")).secret
    typo = secret[:-1] + ("A" if secret[-1] != "A" else "B")

    with pytest.raises(NotAKey, match="checksum") as raised:
        describe_secret(typo)

    assert typo not in str(raised.value)
    assert isinstance(raised.value, KeyturnError)
    assert isinstance(raised.value, ValueError)


MESSAGES = {
    "not a keyturn key: one is 'rma_' and 46 letters and digits",
    "not a keyturn key: its checksum does not match (a typo?)",
}


@given(st.one_of(st.text(max_size=60), st.from_regex(r"rma_[A-Za-z0-9]{46}", fullmatch=True)))
def test_describe_secret_never_echoes_its_input(text: str) -> None:
    """Text that is not a key gets one of two fixed messages: nothing of the input in them."""
    message = None
    try:
        described = describe_secret(text)
    except NotAKey as error:
        message = str(error)
    if message is None:
        assert text.startswith("rma_" + described.key_id)
    else:
        assert message in MESSAGES


def test_lifetime_parse_round_trips() -> None:
    """Every lifetime parses from its label; anything else is refused with the choices."""
    assert {lifetime.label: Lifetime.parse(lifetime.label) for lifetime in Lifetime} == {
        "3h": Lifetime.HOURS_3,
        "1d": Lifetime.DAYS_1,
        "7d": Lifetime.DAYS_7,
        "30d": Lifetime.DAYS_30,
        "90d": Lifetime.DAYS_90,
    }
    with pytest.raises(InvalidExpiry, match="3h, 1d, 7d, 30d, 90d") as raised:
        Lifetime.parse("2d")
    assert isinstance(raised.value, KeyturnError)
    assert isinstance(raised.value, ValueError)


def test_create_with_organization_alone(manager: KeyManager) -> None:
    """An organization id alone is enough: the tenant comes from the membership provider."""
    created = manager.create("alice", name="research", organization="org_research")

    assert created.info.scope == Scope.organization("org_research", tenant_id="acme")


def test_create_with_unknown_or_foreign_organization(manager: KeyManager) -> None:
    """An unknown organization, or one alice has no role in, is not reachable."""
    with pytest.raises(ScopeNotReachable, match="no organization 'org_nope'"):
        manager.create("alice", name="x", organization="org_nope")
    with pytest.raises(ScopeNotReachable, match="no role"):
        manager.create("alice", name="x", organization="org_other")


def test_create_refuses_scope_and_organization(manager: KeyManager) -> None:
    """Both a scope and an organization is ambiguous: a TypeError says to pick one."""
    with pytest.raises(TypeError, match="not both"):
        manager.create("alice", name="x", scope=Scope.tenant("acme"), organization="org_main")


def public_classes() -> list[type]:
    """Every class a public module of keyturn names in its ``__all__``."""
    found: dict[str, type] = {}
    for module in pkgutil.walk_packages(keyturn.__path__, "keyturn."):
        if any(part.startswith("_") for part in module.name.split(".")):
            continue
        for name in getattr(importlib.import_module(module.name), "__all__", ()):
            value = getattr(sys.modules[module.name], name)
            if isinstance(value, type) and value.__module__.startswith("keyturn"):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return list(found.values())


def test_public_methods_are_written_where_they_are_named() -> None:
    """No method is made at run time: every public method of a public class is a function
    of the class that defines it, under its own name, and its source reads as that method
    (help(), inspect, tracebacks and a wrong argument's TypeError name it)."""
    classes = public_classes()
    assert KeyManager in classes
    checked = 0
    for cls in classes:
        for owner in cls.__mro__:
            if not owner.__module__.startswith("keyturn"):
                continue
            for name, member in vars(owner).items():
                function = getattr(member, "__func__", member)  # classmethod, staticmethod
                if name.startswith("_") or not inspect.isfunction(function):
                    continue
                if isinstance(member, staticmethod) and "." not in function.__qualname__:
                    continue  # a module's function used as a method: written out there
                assert function.__qualname__ == f"{owner.__qualname__}.{name}", function
                source = inspect.getsource(function)  # decorators first, then the def
                assert re.match(rf"(\s*@.*\n)*\s*(async )?def {name}\b", source), function
                checked += 1
    assert checked > 50


def test_a_wrong_argument_names_the_method() -> None:
    """A misspelled argument's TypeError names the public method, as the user wrote it."""
    manager = KeyManager(MemoryKeyStore(), MemoryMembership())
    with pytest.raises(TypeError, match=r"^KeyManager\.create\(\) got an unexpected keyword"):
        manager.create("alice", nme="CI")  # type: ignore[call-arg]
    assert KeyManager.create.__qualname__ == "KeyManager.create"
    assert list(inspect.signature(AsyncKeyManager.revoke).parameters) == [
        "self",
        "account_id",
        "key_id",
        "by",
    ]


def test_errors_lists_every_error_it_defines() -> None:
    """``keyturn.errors.__all__`` names every class the module defines, and nothing else."""
    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and value.__module__ == errors.__name__
    }

    assert set(errors.__all__) == defined
    assert errors.__all__ == sorted(errors.__all__)
