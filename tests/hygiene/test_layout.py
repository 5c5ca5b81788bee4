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


# The layers, lowest first: a module imports modules of lower layers and, inside its own
# folder, its neighbours; never a higher layer. docs/architecture.md draws the same list.
LAYERS = (
    ("errors",),
    ("_core",),  # the pure core
    ("usage",),  # the public model of usage counts
    ("protocols", "redaction", "client", "scan"),
    ("stores",),
    ("_run",),  # the runtime: capabilities, drivers, memo, usage recorder
    ("activity",),  # the record of key actions, public: its model, export, paging over a store
    ("ratelimits",),
    ("authenticator", "manager"),  # the owners of a decision and of the operations
    ("metrics", "notices", "keyturn"),  # the package's own __init__ exports the owners
    ("_web",),  # web plumbing shared by every edge
    ("payload", "leaks"),
    ("fastapi",),
    ("asgi", "wsgi", "django", "console"),  # the edges
    ("demo",),
    ("cli",),
    ("management", "__main__"),  # the Django command and ``python -m keyturn``: the CLI
)


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else parts[0]
    for index, names in enumerate(LAYERS):
        if top in names:
            return index
    raise AssertionError(f"{module} is in no layer: place it in LAYERS")


def _folder(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def test_every_import_points_down_the_layers() -> None:
    upward = sorted(
        f"{module} -> {imported}"
        for module, imports in graph().items()
        for imported in imports
        if _folder(module) != _folder(imported) and _layer(imported) >= _layer(module)
    )
    assert upward == []
