"""The console's WSGI edge: a WSGI app over :class:`~keyturn.console.Console`. Decides nothing.

It reads the request (at most :data:`~keyturn.console._visit.MAX_FORM_BYTES` of body), asks the
host's ``signed_in`` (and ``current_organization``, and ``recently_authenticated`` of a
signed-in visitor) with a Werkzeug :class:`~werkzeug.wrappers.Request`, and writes the page
layer's answer back. It serves a :class:`~keyturn.KeyManager` and plain host functions
only: a WSGI server has no event loop for an async one.
"""

from __future__ import annotations

from collections.abc import Iterable
from http import HTTPStatus
from typing import TYPE_CHECKING

from werkzeug.wrappers import Request

from keyturn._web import PRINCIPAL_KEY, Body, read_wsgi_body
from keyturn.console._visit import (
    MAX_FORM_BYTES,
    ConsoleSetupError,
    Pages,
    Visit,
    fields,
    plain_hooks,
    read,
    redirect,
    text,
)
from keyturn.manager import AsyncKeyManager

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIEnvironment

__all__ = ["ConsoleWSGI"]


class ConsoleWSGI:
    """``DispatcherMiddleware(app.wsgi_app, {"/console": console.wsgi()})`` in Flask."""

    def __init__(self, console: Pages) -> None:
        if isinstance(console.manager, AsyncKeyManager):
            raise ConsoleSetupError(
                "a WSGI server has no event loop for an AsyncKeyManager: serve this console "
                "with console.asgi(), or give it a KeyManager"
            )
        plain_hooks(
            console,
            "a WSGI server has no event loop to await signed_in, current_organization or "
            "recently_authenticated: pass plain functions, or serve this console with "
            "console.asgi()",
        )
        self.console = console

    def __repr__(self) -> str:
        return f"ConsoleWSGI({self.console!r})"

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        root = request.script_root
        if request.path == "/" and not environ.get("PATH_INFO"):
            page = redirect(root + "/", 308)
        else:
            page = self.console.handle(_visit(self, request))
        headers = [*page.headers, ("Content-Length", str(len(page.body)))]
        start_response(f"{page.status} {HTTPStatus(page.status).phrase}", headers)
        return [b"" if request.method == "HEAD" else page.body]


def _visit(edge: ConsoleWSGI, request: Request) -> Visit:
    body = Body(b"")
    if request.method == "POST":
        # None: a CONTENT_LENGTH that is not digits, read as no body (as Werkzeug reads it)
        body = read_wsgi_body(request.environ, MAX_FORM_BYTES) or body
    console = edge.console
    account = text(console.signed_in(request)) or None
    hook, recent = console.current_organization, console.recently_authenticated
    return Visit(
        method=request.method,
        path=request.path,
        base=request.script_root + "/",
        origin=f"{request.scheme}://{request.host}",
        query=fields(request.query_string),
        content_type=request.content_type or "",
        account_id=account,
        organization=text(None if hook is None else hook(request)),
        authorization=tuple(request.headers.getlist("authorization")),
        by_key=PRINCIPAL_KEY in request.environ,
        recent_sign_in=account is not None and recent is not None and recent(request) is True,
        client_address=request.remote_addr,
        **read(request.headers, body),
    )
