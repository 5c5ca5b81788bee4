"""The SQL stores are plain methods: sync and async twins in step, nothing made at run time,
and a store call reaches the driver from the store's own frame."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

from keyturn.stores import _async, _sync
from keyturn.stores.sqlite import SQLiteDatabase

TWINS = [
    (_sync.SQLKeyStore, _async.AsyncSQLKeyStore),
    (_sync.SQLMembership, _async.AsyncSQLMembership),
]


def public_methods(cls: type) -> dict[str, object]:
    return {
        name: member
        for name, member in vars(cls).items()
        if callable(member) and not name.startswith("_")
    }


@pytest.mark.parametrize(("sync", "awaited"), TWINS)
def test_the_twins_have_the_same_methods_and_parameters(sync: type, awaited: type) -> None:
    """Every method of a sync store has an async twin with the same parameters, awaited
    (the replica's ``lookup_cached`` and ``changes`` never wait, in both)."""
    plain, twin = public_methods(sync), public_methods(awaited)
    assert plain.keys() == twin.keys()
    for name, method in plain.items():
        assert inspect.signature(method) == inspect.signature(twin[name]), name  # type: ignore[arg-type]
        waits = name not in ("lookup_cached", "changes")
        assert inspect.iscoroutinefunction(twin[name]) == waits, name


@pytest.mark.parametrize("cls", [cls for pair in TWINS for cls in pair])
def test_store_methods_are_written_in_their_module(cls: type) -> None:
    """No method is made at run time: each is defined in its class's own module, under
    its own name, and its source reads as the method it is."""
    module_file = sys.modules[cls.__module__].__file__
    for name, method in public_methods(cls).items():
        assert method.__qualname__ == f"{cls.__name__}.{name}"  # type: ignore[attr-defined]
        assert method.__code__.co_filename == module_file  # type: ignore[attr-defined]
        assert inspect.getsource(method).lstrip().startswith(("def ", "async def "))  # type: ignore[arg-type]


def test_a_store_call_reaches_sqlite_from_the_store_s_frame(tmp_path: Path) -> None:
    """While SQLite runs a store's statement, one keyturn frame is on the stack: the store
    method's own (the connection's lender is not: it has lent and returned)."""
    stacks: list[list[str]] = []

    def seen(statement: str) -> None:
        frames = inspect.stack()[1:]
        stacks.append([f.function for f in frames if "/keyturn/" in f.filename])

    with SQLiteDatabase(tmp_path / "k.sqlite3") as db:
        db.keys.get_key("warm-up")
        with db.connection() as connection:
            connection.set_trace_callback(seen)
        db.keys.get_key("NoSuchKey123")
        db.membership.get_role("alice", "org_default")
        db.keys.lookup("NoSuchKey123", None)
    assert stacks == [["get_key"], ["get_role"], ["lookup"]]
