"""The pieces the middlewares share (``_web``): one reading of an environ's headers, one
filter of the app's own lines of keyturn's names, one check of the options."""

from __future__ import annotations

from typing import Any

import pytest

from keyturn._core.decision import AuthRequest
from keyturn._web import check_options, environ_request, without_reserved


@pytest.mark.parametrize("strip", [True, False])
def test_an_environ_reads_as_the_decision_input(strip: bool) -> None:
    """Each header is one value or none; the method upper-cased; with *strip*, the key is
    taken out of the environ (WSGI's, and Django's ``request.META``)."""
    environ: dict[str, Any] = {
        "HTTP_AUTHORIZATION": "Bearer rma_x",
        "HTTP_X_ORGANIZATION_ID": "default",
    }

    request = environ_request(environ, "get", "/managed-agents/v1/models", strip)

    assert request == AuthRequest(
        ("Bearer rma_x",), ("default",), "GET", "/managed-agents/v1/models"
    )
    assert type(request) is AuthRequest
    assert ("HTTP_AUTHORIZATION" in environ) is not strip
    assert environ_request({}, "POST", "/p", strip) == AuthRequest((), (), "POST", "/p")


def test_the_apps_own_lines_of_our_names_are_dropped_as_text_and_bytes() -> None:
    """Any spelling of a reserved name goes; every other line stays, in its order."""
    text = [("Service-Tenant-Id", "t"), ("x-a", "1"), ("service-key-expires-at", "e")]
    raw = [(b"SERVICE-ORGANIZATION-ID", b"o"), (b"x-b", b"2")]

    assert without_reserved(text) == [("x-a", "1")]
    assert without_reserved(raw) == [(b"x-b", b"2")]


def test_options_are_checked_at_startup() -> None:
    """Anything but an Authenticator is refused before a request arrives."""
    with pytest.raises(TypeError, match=r"keyturn\.Authenticator"):
        check_options(object(), "/p/", (), "realm")  # type: ignore[arg-type]
