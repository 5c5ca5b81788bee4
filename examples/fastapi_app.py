"""The list-models API on FastAPI, behind keyturn's ASGI middleware.

``create_app(store, membership)`` builds the app. Every path under ``/managed-agents/v1/``
needs a key; ``/healthz`` does not.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI

from keyturn import Authenticator, KeyStore, MembershipProvider, Principal
from keyturn.asgi import ApiKeyMiddleware, current_principal

MODELS = ("agent-small", "agent-large")

router = APIRouter()


@router.get("/managed-agents/v1/models")
async def list_models(
    caller: Annotated[Principal, Depends(current_principal)],
) -> dict[str, list[dict[str, str]]]:
    items = [{"id": model, "organization_id": caller.organization_id} for model in MODELS]
    return {"items": items}


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


def create_app(store: KeyStore, membership: MembershipProvider) -> FastAPI:
    authenticator = Authenticator(store, membership)  # one per process: it holds the caches

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        authenticator.close()

    app = FastAPI(lifespan=lifespan)
    app.include_router(router)
    app.add_middleware(ApiKeyMiddleware, authenticator=authenticator)
    return app
