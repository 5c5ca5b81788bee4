"""Every exception class keyturn defines is in ``keyturn.errors``, but for the few below.

A module that raises one imports it from there (and re-exports it where it was public). The
exceptions to the rule are private signals: raised and caught inside one module, they never
reach a caller, so they are not errors keyturn raises.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import operator

import pytest

from tests.hygiene.test_imports import modules

ELSEWHERE = {
    "keyturn.leaks._report._Refusal": "carries the leak endpoint's own response, built in "
    "keyturn.leaks, from the check that refuses a report to the flow that answers it",
    "keyturn.stores.postgres._Elsewhere": "the listener's reason to reconnect: its "
    "connection reached another database than the pool's",
    "keyturn.stores.postgres._Outdated": "the listener's reason to stop feeding the "
    "replica: the schema is older than the feed it needs",
}


def exception_classes() -> dict[str, list[str]]:
    """Module -> the exception classes its source defines, at any depth."""
    found: dict[str, list[str]] = {}
    for name, path in modules().items():
        if name.endswith("__main__"):  # runs when imported
            continue
        namespace = {**vars(builtins), **vars(importlib.import_module(name))}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                _is_exception(base, namespace) for base in node.bases
            ):
                found.setdefault(name, []).append(node.name)
    return found


def _is_exception(base: ast.expr, namespace: dict[str, object]) -> bool:
    """Whether the base class *base* names an exception class in *namespace*."""
    dotted = ast.unparse(base)
    head, _, rest = dotted.partition(".")
    value = namespace.get(head)
    if rest and value is not None:
        value = operator.attrgetter(rest)(value)
    return isinstance(value, type) and issubclass(value, BaseException)


def test_every_exception_class_is_defined_in_errors() -> None:
    """An exception class defined elsewhere is either moved to ``keyturn.errors`` (and
    imported back), or listed in :data:`ELSEWHERE` with the reason it stays."""
    defined = exception_classes()
    outside = {
        f"{module}.{name}"
        for module, names in defined.items()
        if module != "keyturn.errors"
        for name in names
    }
    assert outside == set(ELSEWHERE)
    assert len(defined["keyturn.errors"]) > 20


@pytest.mark.parametrize("where", sorted(ELSEWHERE))
def test_what_stays_elsewhere_is_private(where: str) -> None:
    """Only a module's private signal may stay: no public name, no caller catches it."""
    assert where.rpartition(".")[2].startswith("_")
