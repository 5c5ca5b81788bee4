"""The web plumbing lives in one module: ``keyturn._web`` alone reads request bodies.

Every edge (the middlewares, the payload guard, the leak endpoints, the console) reads a
body, answers a lifespan scope and declares the ASGI types through ``_web``; a second
reader would be a second place to get a limit, ``more_body`` or a disconnect wrong. The
walk reads each module's source, so a new reader anywhere in ``src/keyturn`` fails here.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import keyturn

SOURCE = Path(keyturn.__file__).parent


def _functions(tree: ast.AST) -> dict[ast.AST, str]:
    """Each node of *tree* mapped to the name of the innermost function that holds it."""
    owner: dict[ast.AST, str] = {}

    def walk(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = (
                child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else name
            )
            owner[child] = inner
            walk(child, inner)

    walk(tree, "<module>")
    return owner


def _found() -> dict[str, Counter[str]]:
    """Where each piece of plumbing is written: ``module:function`` and how often."""
    found: dict[str, Counter[str]] = {
        "await receive()": Counter(),
        "wsgi.input read": Counter(),
        "wsgi.input replaced": Counter(),
        "request.body": Counter(),
        "lifespan.startup.complete": Counter(),
    }
    for path in sorted(SOURCE.rglob("*.py")):
        module = ".".join(path.relative_to(SOURCE.parent).with_suffix("").parts)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        owner = _functions(tree)
        called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
        stored = {
            id(node.slice)
            for node in ast.walk(tree)
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store)
        }
        for node in ast.walk(tree):
            where = f"{module}:{owner.get(node, '<module>')}"
            if (
                isinstance(node, ast.Await)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "receive"
            ):
                found["await receive()"][where] += 1
            elif isinstance(node, ast.Constant) and node.value == "wsgi.input":
                kind = "replaced" if id(node) in stored else "read"
                found[f"wsgi.input {kind}"][where] += 1
            elif (
                isinstance(node, ast.Attribute)
                and node.attr == "body"
                and isinstance(node.value, ast.Name)
                and node.value.id == "request"
                and id(node) not in called  # Starlette's request.body() is another thing
            ):
                found["request.body"][where] += 1
            elif isinstance(node, ast.Constant) and node.value == "lifespan.startup.complete":
                found["lifespan.startup.complete"][where] += 1
    return found


def test_only_web_reads_bodies_and_answers_lifespan() -> None:
    """One ASGI reader (with the ``receive`` that replays its body) and one lifespan loop
    await ``receive()``; one WSGI reader reads ``wsgi.input``; one Django reader reads
    ``request.body``. The payload guard hands its app the body it read as a fresh
    ``wsgi.input``: that is a replacement, not a read.
    """
    found = _found()

    assert found["await receive()"] == Counter(
        {
            "keyturn._web:read_asgi_body": 1,
            "keyturn._web:replayed": 1,  # replay(): the body read, then the server's messages
            "keyturn._web:lifespan": 1,
        }
    )
    assert found["wsgi.input read"] == Counter({"keyturn._web:read_wsgi_body": 1})
    assert found["wsgi.input replaced"] == Counter({"keyturn.payload.__init__:_read_wsgi": 1})
    assert found["request.body"] == Counter({"keyturn._web:read_django_body": 1})
    assert found["lifespan.startup.complete"] == Counter({"keyturn._web:lifespan": 1})


def test_the_asgi_types_are_declared_once() -> None:
    """``Receive``, ``Send``, ``Message``, ``ASGIScope`` and ``ASGIApp`` are assigned in
    ``_web`` only; every other module imports them (none borrows Starlette's)."""
    names = {"ASGIScope", "Message", "Receive", "Send", "ASGIApp", "Scope"}
    declared: Counter[str] = Counter()
    borrowed: list[str] = []
    for path in sorted(SOURCE.rglob("*.py")):
        module = ".".join(path.relative_to(SOURCE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id in names:
                        declared[f"{module}:{target.id}"] += 1
            elif isinstance(node, ast.ImportFrom) and node.module == "starlette.types":
                borrowed.append(module)

    assert declared == Counter(
        f"keyturn._web:{name}" for name in ("ASGIScope", "Message", "Receive", "Send", "ASGIApp")
    )
    assert borrowed == []
