"""The layout shows the architecture: the pure core imports nothing but itself and errors.

``keyturn._core`` holds what is decided (the decision, the target reading, tokens, hashing,
the lifecycle rules, the body scanner, the steps it asks and the model they speak of). It
does no I/O and knows no store, framework or server: every edge of the import graph from
a module in it ends in it or in ``keyturn.errors``. So the runtime (``keyturn._run``) and
the edges (the middlewares, the console, the command line) import the core, never the
reverse.
"""

from __future__ import annotations

from tests.hygiene.test_imports import graph

CORE = "keyturn._core"
ALLOWED = {CORE, "keyturn.errors"}


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_core_imports_only_itself_and_errors() -> None:
    edges = graph()
    core = sorted(module for module in edges if _inside(module, CORE))
    assert len(core) >= 10  # the folder is there, with its modules
    outside = {
        f"{module} -> {imported}"
        for module in core
        for imported in edges[module]
        if not any(_inside(imported, allowed) for allowed in ALLOWED)
    }
    assert outside == set()


def test_errors_import_nothing_of_keyturn() -> None:
    assert graph()["keyturn.errors"] == set()
