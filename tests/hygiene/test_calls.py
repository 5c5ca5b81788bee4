"""How a store or provider is called is read in one place, ``keyturn._calls``.

Whether an object is async (one of its methods is ``async def``), never blocks
(``nonblocking``) or bounds its own calls (``enforces_timeout``) is asked by
``_calls.caller_for`` alone; the authenticator, the usage recorder, the managers and the
leak responder take the caller it picks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import keyturn

SOURCE = Path(keyturn.__file__).parent
KIND_FLAGS = {"nonblocking", "enforces_timeout"}


def _reads_an_objects_kind(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    name = ast.unparse(node.func)
    if name == "getattr" and len(node.args) >= 2:
        attribute = node.args[1]
        return isinstance(attribute, ast.Constant) and attribute.value in KIND_FLAGS
    # iscoroutinefunction(obj.method) or (getattr(obj, ...)): a method, so an object's kind
    return (
        name.endswith("iscoroutinefunction")
        and bool(node.args)
        and isinstance(node.args[0], ast.Attribute | ast.Call)
    )


def test_one_place_asks_whether_a_store_is_async_or_blocks() -> None:
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        if path.name == "_calls.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if _reads_an_objects_kind(node):
                found.append(f"{path.relative_to(SOURCE)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []
    assert "def is_async(" in (SOURCE / "_calls.py").read_text()
