"""The list-models API on Starlette, behind keyturn's ASGI middleware.

``create_app(store, membership)`` builds the app; ``make demo`` serves it with demo keys
(and adds the key console through *routes*). Every path under ``/managed-agents/v1/``
needs a key; ``/healthz`` and anything in *routes* do not.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from keyturn import Authenticator, KeyStore, MembershipProvider
from keyturn.asgi import ApiKeyMiddleware, principal

MODELS = ("agent-small", "agent-large")


async def list_models(request: Request) -> JSONResponse:
    caller = principal(request)  # the key's user, in the organization the request runs in
    items = [{"id": model, "organization_id": caller.organization_id} for model in MODELS]
    return JSONResponse({"items": items})


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


def create_app(
    store: KeyStore, membership: MembershipProvider, *, routes: Sequence[BaseRoute] = ()
) -> Starlette:
    authenticator = Authenticator(store, membership)  # one per process: it holds the caches

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        authenticator.close()

    return Starlette(
        routes=[
            Route("/managed-agents/v1/models", list_models),
            Route("/healthz", healthz),
            *routes,
        ],
        middleware=[Middleware(ApiKeyMiddleware, authenticator=authenticator)],
        lifespan=lifespan,
    )
