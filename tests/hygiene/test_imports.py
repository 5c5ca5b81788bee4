"""No import circles in ``src/keyturn``: every import counts, wherever it is written.

The walk reads each module's source, not what Python happened to import: an import inside
a function (run on first use) and one under ``if TYPE_CHECKING:`` (read by mypy only) are
edges as much as a top-level one, since each says that one module needs another. A
submodule's implicit import of its own package is not an edge; an explicit one is.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import keyturn

SOURCE = Path(keyturn.__file__).parent
PACKAGE = "keyturn"


def modules(root: Path = SOURCE, package: str = PACKAGE) -> dict[str, Path]:
    """Every module under *root*, by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(module: str, path: Path, known: Mapping[str, Path]) -> Iterator[str]:
    """The known modules *module*'s source imports, at any depth of its syntax tree."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level - 1 more
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            # `from package import submodule` imports the submodule; a name, the module.
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in known:  # `import a.b.c` needs a.b.c, or what holds it
                name = name.rpartition(".")[0]
            if name and name != module:
                yield name
                if isinstance(node, ast.ImportFrom):
                    break  # the first known of submodule-or-module is what is imported


def graph(root: Path = SOURCE, package: str = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules it imports."""
    known = modules(root, package)
    return {module: set(_imported(module, path, known)) for module, path in known.items()}


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first walk closes, each as a closed path, none within another."""
    found: list[list[str]] = []
    done: set[str] = set()
    for start in sorted(edges):
        if start in done:
            continue
        # Depth-first from *start*, following edges in sorted order: a path back to a
        # module on the current path is a cycle.
        path: list[str] = [start]
        on_path = {start}
        stack = [iter(sorted(edges[start]))]
        while stack:
            following = next(stack[-1], None)
            if following is None:
                stack.pop()
                left = path.pop()
                on_path.discard(left)
                done.add(left)
                continue
            if following in on_path:
                cycle = [*path[path.index(following) :], following]
                if not any(set(cycle) <= set(other) for other in found):
                    found.append(cycle)
            elif following not in done:
                path.append(following)
                on_path.add(following)
                stack.append(iter(sorted(edges.get(following, ()))))
    return found


def test_the_walk_sees_every_kind_of_import(tmp_path: Path) -> None:
    """Top-level, relative, function-level and TYPE_CHECKING imports are all edges."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg.a import A\n")
    (package / "a.py").write_text("from .b import B\nA = 1\n")
    (package / "b.py").write_text("def f():\n    from pkg import c\nB = 2\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.sub.d\n"
    )
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "d.py").write_text("from .. import a\n")
    edges = graph(package, "pkg")
    assert edges == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.c"},
        "pkg.c": {"pkg.sub.d"},
        "pkg.sub": set(),
        "pkg.sub.d": {"pkg.a"},
    }
    assert cycles(edges) == [["pkg.a", "pkg.b", "pkg.c", "pkg.sub.d", "pkg.a"]]


def test_no_import_circles() -> None:
    """No module of keyturn reaches itself through its imports, lazy ones included."""
    edges = graph()
    assert "keyturn.asgi" in edges
    assert "keyturn.console._page" in edges
    found = [" -> ".join(cycle) for cycle in cycles(edges)]
    assert not found, "import circles:\n" + "\n".join(found)
