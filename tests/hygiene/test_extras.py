"""Each hygiene module and the client need only their own extra: no web framework comes with
them."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("module", "extra"),
    [
        ("keyturn.leaks", "cryptography"),
        ("keyturn.metrics", "opentelemetry"),
        ("keyturn.client", "httpx"),
    ],
)
def test_importing_pulls_in_no_framework(module: str, extra: str) -> None:
    """Importing the module loads its extra's library and no web framework or driver."""
    code = (
        f"import sys, {module}\n"
        "loaded = sorted({name.split('.')[0] for name in sys.modules})\n"
        "print(' '.join(loaded))\n"
    )
    done = subprocess.run(  # noqa: S603 -- our own interpreter and code
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(done.stdout.split())
    assert extra in loaded
    assert not loaded & {"starlette", "werkzeug", "fastapi", "flask", "psycopg", "jinja2"}
