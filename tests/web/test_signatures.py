"""The middlewares show their own parameters: ``help()`` and ``inspect`` need no private class."""

from __future__ import annotations

import inspect
import pydoc
import re
from typing import Any

import pytest

from keyturn import asgi, django, wsgi
from keyturn._web import DEFAULT_PREFIX, DEFAULT_REALM

OPTIONS = {
    "authenticator": inspect.Parameter.empty,
    "prefix": DEFAULT_PREFIX,
    "public_paths": (),
    "realm": DEFAULT_REALM,
    "strip_authorization": True,
    "expiry_header": False,
    "payload_guard": None,
}
MIDDLEWARES = pytest.mark.parametrize(
    "middleware", [asgi.ApiKeyMiddleware, wsgi.ApiKeyMiddleware], ids=["asgi", "wsgi"]
)


@MIDDLEWARES
def test_signature_lists_every_option(middleware: type[Any]) -> None:
    """``inspect.signature`` shows the app, then each option by keyword, with its default."""
    parameters = inspect.signature(middleware).parameters

    assert list(parameters) == ["app", *OPTIONS]
    assert parameters["app"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    for name, default in OPTIONS.items():
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert parameters[name].default == default


@MIDDLEWARES
def test_docstring_explains_every_parameter(middleware: type[Any]) -> None:
    """The class's own docstring has a ``:param:`` line for each parameter, and no other."""
    documented = re.findall(r":param (\w+):", middleware.__doc__ or "")

    assert documented == ["app", *OPTIONS]


@pytest.mark.parametrize(
    "middleware",
    [asgi.ApiKeyMiddleware, wsgi.ApiKeyMiddleware, django.ApiKeyMiddleware],
    ids=["asgi", "wsgi", "django"],
)
def test_help_points_at_no_private_module(middleware: type[Any]) -> None:
    """``help()`` shows the middleware on its own: no private base class, no ``_web``."""
    text = pydoc.render_doc(middleware, renderer=pydoc.plaintext)

    assert "ApiKeyMiddleware" in text
    assert "MiddlewareConfig" not in text
    assert "_web" not in text
    assert [cls.__name__ for cls in middleware.__mro__] == ["ApiKeyMiddleware", "object"]


def test_django_middleware_takes_what_django_passes() -> None:
    """Django builds it with the next handler; its options come from the KEYTURN setting."""
    assert list(inspect.signature(django.ApiKeyMiddleware).parameters) == ["get_response"]
    assert "KEYTURN" in (django.ApiKeyMiddleware.__doc__ or "")
