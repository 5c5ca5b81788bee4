"""The sync SQL stores are generated from the async ones: the checked-in file is the
generator's output, so the twins cannot drift apart."""

from __future__ import annotations

import importlib.util
from pathlib import Path

GENERATOR = Path(__file__).resolve().parents[2] / "tools" / "async_to_sync.py"


def test_the_sync_stores_are_generated_from_the_async_ones() -> None:
    """``_sync.py`` is what ``tools/async_to_sync.py`` writes from ``_async.py`` today:
    after a change to ``_async.py``, run the script."""
    spec = importlib.util.spec_from_file_location("async_to_sync", GENERATOR)
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    checked_in = generator.TARGET.read_text(encoding="utf-8")
    assert checked_in == generator.generate(), "run: python tools/async_to_sync.py"
