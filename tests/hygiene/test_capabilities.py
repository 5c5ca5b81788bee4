"""What a store, a provider or a hook can do is asked in one place, ``_run/capabilities.py``;
flows of steps are run by one driver pair, ``_run/drive.py``.

Whether an object is async, never blocks or bounds its own calls, which optional methods
it has, and whether keyturn may take a shortcut past asking it: every such probe
(``hasattr``, ``getattr`` of a named attribute, ``iscoroutinefunction``, ``is_async``, a
``__module__`` read) outside that module is one of the few below, each about something
other than a store, a provider or a hook. And the loops that send a flow its answers
(``.send(`` on a generator in a ``while`` loop that catches ``StopIteration``) are the two
drivers, beside ``client.py``'s two, which run httpx's auth flow, not store steps.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import keyturn

SOURCE = Path(keyturn.__file__).parent
CAPABILITIES = Path("_run/capabilities.py")

# (file, the probe as ast.unparse writes it) -> why it is not about a store, provider or hook.
ALLOWED = {
    ("_web.py", "getattr(error, 'retry_after', None)"): "a refusal's own field",
    ("_web.py", "getattr(error, 'limit_headers', None)"): "a refusal's own field",
    ("_core/fork.py", "hasattr(os, 'register_at_fork')"): "the platform",
    ("scan.py", "getattr(os, 'O_NONBLOCK', 0)"): "the platform",
    ("stores/sqlite.py", "getattr(os, 'O_CLOEXEC', 0)"): "the platform",
    ("stores/sqlite.py", "getattr(exc, 'sqlite_errorname', '')"): "an exception's field",
    ("stores/memory.py", "getattr(self._keys.get(key_id), 'account_id', None)"): "a stored key",
    ("client.py", "getattr(self, 'hint', None)"): "the client's own state",
    ("client.py", "getattr(self, 'organization', None)"): "the client's own state",
    ("cli/_output.py", "hasattr(sys.stdout, 'reconfigure')"): "the terminal",
    ("cli/_commands.py", "hasattr(os, 'getuid')"): "the platform",
    ("cli/_commands.py", "hasattr(sink, 'reconfigure')"): "the output stream",
    ("cli/_commands.py", "getattr(args, 'store', None)"): "the command line",
    ("cli/_commands.py", "getattr(exc, 'stderr', b'')"): "an exception's field",
    ("django.py", "getattr(settings, 'KEYTURN', {})"): "Django's settings",
    ("management/commands/keyturn.py", "getattr(settings, 'KEYTURN', {})"): "Django's settings",
    ("console/django.py", "getattr(request, 'user', None)"): "Django's request",
    ("notices/_deliver.py", "getattr(exc, 'reason', None)"): "an exception's field",
    # Django's own marker of an async view (asgiref's check, not inspect's): its handler.
    ("django.py", "iscoroutinefunction(get_response)"): "Django's handler",
}


def _probe(node: ast.expr) -> bool:
    """Whether *node* asks an object what it is or has."""
    if isinstance(node, ast.Attribute):
        return node.attr == "__module__" and isinstance(node.ctx, ast.Load)
    if not isinstance(node, ast.Call):
        return False
    name = ast.unparse(node.func)
    if name == "hasattr":
        return True
    if name == "getattr":  # a named attribute (callable(getattr(...)) is found through it)
        return len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
    return name.endswith(("iscoroutinefunction", "is_async"))


def probes() -> Iterator[tuple[str, str, int]]:
    for path in sorted(SOURCE.rglob("*.py")):
        relative = path.relative_to(SOURCE)
        if relative == CAPABILITIES:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.expr) and _probe(node):
                yield relative.as_posix(), ast.unparse(node), node.lineno


def test_only_capabilities_asks_what_a_store_provider_or_hook_can_do() -> None:
    found = [
        f"{file}:{line}: {probe}" for file, probe, line in probes() if (file, probe) not in ALLOWED
    ]
    assert found == []


def test_every_allowed_probe_is_still_there() -> None:
    """An allowance whose probe is gone goes too, so the list stays short and true."""
    assert set(ALLOWED) <= {(file, probe) for file, probe, _ in probes()}


def _drives(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether *function* sends a generator its answers in a loop, to its StopIteration."""
    sends = any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "send"
        for loop in ast.walk(function)
        if isinstance(loop, ast.While)
        for node in ast.walk(loop)
    )
    stops = any(
        isinstance(node, ast.ExceptHandler)
        and node.type is not None
        and "StopIteration" in ast.unparse(node.type)
        for node in ast.walk(function)
    )
    return sends and stops


def drivers() -> list[str]:
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _drives(node):
                found.append(f"{path.relative_to(SOURCE).as_posix()}:{node.name}")
    return sorted(found)


def test_one_driver_pair_runs_every_flow_of_steps() -> None:
    assert drivers() == [
        "_run/drive.py:drive",
        "_run/drive.py:drive_async",
        # httpx's auth flow: requests and responses, not store steps.
        "client.py:async_auth_flow",
        "client.py:sync_auth_flow",
    ]
