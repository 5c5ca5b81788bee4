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
        ("keyturn.ratelimits.redis", "redis"),
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


@pytest.mark.parametrize("module", ["keyturn.asgi", "keyturn.wsgi"])
def test_the_middlewares_import_no_framework(module: str) -> None:
    """The pure ASGI and WSGI middlewares load no framework; ``current_principal`` loads
    FastAPI when first asked for, and is then the dependency ``keyturn.fastapi`` defines.
    """
    code = (
        f"import sys, {module}\n"
        "before = sorted({name.split('.')[0] for name in sys.modules})\n"
        "import keyturn.asgi, keyturn.fastapi\n"
        "same = keyturn.asgi.current_principal is keyturn.fastapi.current_principal\n"
        "print(' '.join(before), same)\n"
    )
    done = subprocess.run(  # noqa: S603 -- our own interpreter and code
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    *loaded, same = done.stdout.split()
    assert not set(loaded) & {"starlette", "werkzeug", "fastapi", "flask", "django", "jinja2"}
    assert same == "True"
