"""
FastAPI dependency
==================

The :class:`~keyturn.Principal` the ASGI middleware set, as a FastAPI dependency that also
tells OpenAPI how a request is authenticated: the bearer key and the ``x-organization-id``
header are declared as security schemes, so Swagger UI (``/docs``) has an **Authorize**
button that sends both. ::

    from keyturn.asgi import ApiKeyMiddleware
    from keyturn.fastapi import Caller

    app = FastAPI()
    app.add_middleware(ApiKeyMiddleware, authenticator=authenticator)

    @app.get("/managed-agents/v1/models")
    async def list_models(caller: Caller) -> dict[str, str]:
        return {"organization": caller.organization_id}

``Caller`` is ``Annotated[Principal, Depends(api_key)]``; use ``Depends(api_key)`` where
you need the dependency itself (``dependencies=[Depends(api_key)]`` on a router).
:func:`current_principal` (also ``keyturn.asgi.current_principal``) is the same answer
without the security schemes, for HTTP and WebSocket routes alike.

The middleware decides; this dependency only reads its answer. It does not read the
``Authorization`` header (the middleware removes it before the app), and a route that
uses it on a path the middleware does not guard fails with
:class:`~keyturn.MissingPrincipal`: a setup bug, surfaced as a 500, never an anonymous
request.
"""

from __future__ import annotations

from typing import Annotated, Final

try:
    from fastapi import Depends, Request, Security
    from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
    from starlette.requests import HTTPConnection
except ImportError as exc:
    raise ImportError("keyturn.fastapi needs FastAPI: pip install 'keyturn[fastapi]'") from exc

from keyturn._model import Principal
from keyturn._web import principal_in

__all__ = ["BEARER", "ORGANIZATION", "Caller", "api_key", "current_principal"]

BEARER: Final = HTTPBearer(
    scheme_name="apiKey",
    bearerFormat="rma_...",
    description="A personal API key, sent as `Authorization: Bearer rma_...`.",
    auto_error=False,  # the middleware has already refused a request without one
)
ORGANIZATION: Final = APIKeyHeader(
    name="x-organization-id",
    scheme_name="organization",
    description="The organization a tenant-scoped key acts in: its id, or `default`.",
    auto_error=False,  # an organization-scoped key needs none
)


async def api_key(
    request: Request,
    _bearer: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)],
    _organization: Annotated[str | None, Security(ORGANIZATION)],
) -> Principal:
    """The authenticated caller, as the middleware decided it.

    :raises MissingPrincipal: the middleware did not authenticate this request.
    """
    return principal_in(request.get("state"))


def current_principal(connection: HTTPConnection) -> Principal:
    """:func:`keyturn.asgi.principal` as a FastAPI dependency: ``Depends(current_principal)``.

    FastAPI passes the request (or the WebSocket) by this parameter's annotation.

    :raises MissingPrincipal: the middleware did not authenticate this request.
    """
    return principal_in(connection.get("state"))


Caller = Annotated[Principal, Depends(api_key)]
