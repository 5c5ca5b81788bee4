"""The console's ASGI edge: an ASGI app over :class:`~keyturn.console.Console`. Decides nothing.

It reads the request (at most :data:`~keyturn.console._visit.MAX_FORM_BYTES` of body), asks the
host's ``signed_in`` (and ``current_organization``, and ``recently_authenticated`` of a
signed-in visitor) with a Starlette
:class:`~starlette.requests.Request` (a coroutine function is awaited, a plain one runs in a
worker thread), and runs the page layer -- which calls the key store -- in a worker thread,
so a blocking store never stalls the event loop; an :class:`~keyturn.AsyncKeyManager`'s
calls go back to the event loop from there.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from keyturn._run.capabilities import is_coroutine_function
from keyturn._web import (
    PRINCIPAL_KEY,
    ASGIScope,
    Body,
    Receive,
    Send,
    asgi_path,
    lifespan,
    read_asgi_body,
)
from keyturn.console._visit import MAX_FORM_BYTES, Pages, Visit, fields, read, redirect, text

__all__ = ["ConsoleASGI"]


class ConsoleASGI:
    """``Mount("/console", app=console.asgi())`` in Starlette, ``app.mount(...)`` in FastAPI."""

    def __init__(self, console: Pages) -> None:
        self.console = console

    def __repr__(self) -> str:
        return f"ConsoleASGI({self.console!r})"

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # a WebSocket handshake gets no accept: the server closes it
        path = asgi_path(scope)
        if path == "":
            page = redirect(scope.get("root_path", "") + "/", 308)
        else:
            form = Body(b"")
            if scope["method"] == "POST":
                # The host's functions get a request that still answers the form read here.
                form, receive = await read_asgi_body(scope, receive, MAX_FORM_BYTES)
            visit = await _visit(self, Request(scope, receive), path, form)
            page = await run_in_threadpool(self.console.handle, visit)
        await send(
            {
                "type": "http.response.start",
                "status": page.status,
                "headers": [
                    (name.lower().encode("latin-1"), value.encode("latin-1"))
                    for name, value in (*page.headers, ("Content-Length", str(len(page.body))))
                ],
            }
        )
        body = b"" if scope["method"] == "HEAD" else page.body
        await send({"type": "http.response.body", "body": body})


async def _visit(edge: ConsoleASGI, request: Request, path: str, body: Body) -> Visit:
    console = edge.console
    account = text(await _ask(console.signed_in, request)) or None
    hook, recent = console.current_organization, console.recently_authenticated
    headers = request.headers
    return Visit(
        method=request.method,
        path=path,
        base=request.scope.get("root_path", "") + "/",
        origin=f"{request.url.scheme}://{headers.get('host', '')}",
        query=fields(request.scope.get("query_string", b"")),
        content_type=headers.get("content-type", ""),
        account_id=account,
        organization=text(None if hook is None else await _ask(hook, request)),
        authorization=tuple(headers.getlist("authorization")),
        by_key=PRINCIPAL_KEY in (request.scope.get("state") or {}),
        recent_sign_in=account is not None
        and recent is not None
        and await _ask(recent, request) is True,
        client_address=request.client.host if request.client else None,
        **read(headers, body),
    )


async def _ask(host: Callable[[Request], Any], request: Request) -> Any:
    """A host function's answer: a coroutine function awaited, a plain one (it may read a
    database) run off the event loop."""
    if is_coroutine_function(host):
        return await host(request)
    answer = await run_in_threadpool(host, request)
    return await answer if inspect.isawaitable(answer) else answer
