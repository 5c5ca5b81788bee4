"""Security logic written once: a key's secret is checked, and a leak recorded, in one place.

The decision, the leak responder and the payload guard all check a key as
:func:`keyturn._core.decision.credential` does, and the responder and the guard record a leak as
:func:`keyturn._core.leak.record_leak` does: a second copy of either would drift. The walk reads
the source of every module of ``src/keyturn``, and names each call or ``yield`` by the
innermost function it is written in.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import keyturn

SOURCE = Path(keyturn.__file__).parent

Function = ast.FunctionDef | ast.AsyncFunctionDef


def _called(node: ast.AST) -> str | None:
    """The name a call calls (``f(...)`` or ``module.f(...)``), if it is a call."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _within(node: ast.AST, where: str) -> Iterator[tuple[str, ast.AST]]:
    """Every node under *node*, with the qualified name of the innermost function it is in."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, Function | ast.ClassDef):
            inner = f"{where}.{child.name}" if where else child.name
            yield from _within(child, inner)
        else:
            yield where, child
            yield from _within(child, where)


def nodes() -> Iterator[tuple[str, ast.AST]]:
    """Every node of every module, with ``module:function`` naming where it is written."""
    for path in sorted(SOURCE.rglob("*.py")):
        module = ".".join(path.relative_to(SOURCE).with_suffix("").parts)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for where, node in _within(tree, ""):
            yield f"{module}:{where}", node


def callers(name: str) -> set[str]:
    """The functions that call *name*."""
    return {where for where, node in nodes() if _called(node) == name}


def yielders(step: str) -> set[str]:
    """The functions that yield a *step* they build (``yield Step(...)``)."""
    return {
        where
        for where, node in nodes()
        if isinstance(node, ast.Yield) and node.value is not None and _called(node.value) == step
    }


def test_the_walk_names_the_innermost_function() -> None:
    tree = ast.parse(
        "def outer():\n    check(1)\n    def inner():\n        yield Step(2)\n"
        "class C:\n    def method(self):\n        yield from other()\n"
    )
    found = {(where, _called(node)) for where, node in _within(tree, "") if _called(node)}
    assert found == {("outer", "check"), ("outer.inner", "Step"), ("C.method", "other")}


def test_a_secret_is_compared_in_one_function() -> None:
    """``check_secret`` (the constant-time comparison, and the legacy argon2id path) is
    called from the credential check alone."""
    assert callers("check_secret") == {"_core.decision:credential"}


def test_a_legacy_hash_is_upgraded_in_one_function() -> None:
    assert yielders("UpgradeHash") == {"_core.decision:credential"}


def test_a_leak_is_recorded_in_one_function() -> None:
    """``ReportLeak`` is yielded by the leak record alone: the leak responder and the payload
    guard both ``yield from`` it."""
    assert yielders("ReportLeak") == {"_core.leak:record_leak"}
