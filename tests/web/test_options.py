"""The three middlewares share one set of options, documented once (``_web.OPTIONS``).

The ASGI and WSGI middlewares show each option's text in their own docstring, where
``help()``, editors and the docs site read it; Django's middleware takes the same options
as ``KEYTURN`` settings. These tests hold every copy to the one text.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from keyturn import asgi, django, wsgi
from keyturn._web import OPTIONS


def params(doc: str) -> dict[str, str]:
    """Each ``:param name: text`` of *doc*, its text on one line."""
    found = re.findall(r":param (\w+):(.*?)(?=:param |:raises |\n\s*\n|\Z)", doc, re.DOTALL)
    return {name: " ".join(text.split()) for name, text in found}


@pytest.mark.parametrize(
    "middleware", [asgi.ApiKeyMiddleware, wsgi.ApiKeyMiddleware], ids=["asgi", "wsgi"]
)
def test_each_option_reads_as_documented_once(middleware: type[Any]) -> None:
    """The class's ``:param`` line of every shared option is ``OPTIONS``'s text."""
    documented = params(middleware.__doc__ or "")

    assert list(documented) == ["app", *OPTIONS]
    for name, text in OPTIONS.items():
        assert documented[name] == " ".join(text.split()), name


def test_django_takes_each_option_as_a_setting() -> None:
    """Every shared option but the authenticator (``AUTHENTICATOR`` or ``STORE_URL``) is a
    ``KEYTURN`` setting of its name, upper-cased, shown in the module's example."""
    for name in OPTIONS.keys() - {"authenticator"}:
        assert name.upper() in django._SETTINGS, name
        assert f'"{name.upper()}":' in (django.__doc__ or ""), name
    assert {"AUTHENTICATOR", "STORE_URL"} <= django._SETTINGS
