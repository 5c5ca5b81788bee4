"""Which build this suite runs against: pure Python, or the compiled hot path.

``make test`` runs the whole suite twice: against the pure-Python package (the reference)
and against the compiled build in ``.venv-compiled`` (``KEYTURN_TEST_COMPILED=1``), where
the warm path's modules must really be extension modules and the rest must stay the
interpreted reference.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import inspect
import os

import pytest

COMPILED_RUN = os.environ.get("KEYTURN_TEST_COMPILED", "") not in ("", "0")
# What hatch_build.py compiles under KEYTURN_COMPILE=1.
HOT_PATH = ("_token", "_target", "_decision", "authenticator", "asgi", "wsgi")
# Interpreted in both builds: tests and users subclass or patch _hashing's verifier, FastAPI
# reads the signature of what _dependency and fastapi define, Django's middleware extends
# _web's base class, and the rest is off the request path.
INTERPRETED = (
    "_hashing",
    "_web",
    "_dependency",
    "fastapi",
    "django",
    "manager",
    "errors",
    "_model",
)


def is_extension(module: str) -> bool:
    path = importlib.import_module(f"keyturn.{module}").__file__ or ""
    return path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


@pytest.mark.parametrize("module", HOT_PATH)
def test_the_hot_path_is_compiled_exactly_in_the_compiled_run(module: str) -> None:
    assert is_extension(module) is COMPILED_RUN


@pytest.mark.parametrize("module", INTERPRETED)
def test_the_rest_stays_interpreted(module: str) -> None:
    assert not is_extension(module)


def test_fastapi_can_read_the_dependency_signature() -> None:
    """current_principal is an interpreted function in both builds, with its annotations."""
    from starlette.requests import HTTPConnection

    from keyturn.asgi import current_principal

    parameters = inspect.signature(current_principal).parameters
    assert parameters["connection"].annotation is HTTPConnection
