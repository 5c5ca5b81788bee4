"""The list-models API on FastAPI, behind keyturn's ASGI middleware.

``create_app(authenticator)`` builds the app around an :class:`~keyturn.Authenticator` you
configure (store, membership, clock, policy, audit hook, timeout); its lifespan closes it
at shutdown with ``aclose()``. Every path under ``/managed-agents/v1/`` needs a key;
``/healthz`` does not. ``keyturn.fastapi.Caller`` hands the route its caller, and
``document(app)`` declares the key with ``x-organization-id`` and the refusals in OpenAPI,
so ``/docs`` has an Authorize button and lists the 400, 401, 403, 404 and 503 answers.

Serve it as it is (``pip install 'keyturn[fastapi]' uvicorn``)::

    keyturn db init --store sqlite:///keyturn.sqlite3
    KEYTURN_STORE_URL=sqlite:///keyturn.sqlite3 PORT=8000 python examples/fastapi_app.py
"""

import contextlib
import logging
import os
from collections.abc import AsyncIterator

from fastapi import APIRouter, FastAPI

from keyturn import Authenticator
from keyturn.asgi import ApiKeyMiddleware
from keyturn.fastapi import Caller, document
from keyturn.stores import open_database

MODELS = ("agent-small", "agent-large")

router = APIRouter()


@router.get("/managed-agents/v1/models")
async def list_models(caller: Caller) -> dict[str, list[dict[str, str]]]:
    items = [{"id": model, "organization_id": caller.organization_id} for model in MODELS]
    return {"items": items}


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


def create_app(authenticator: Authenticator) -> FastAPI:
    """The app; *authenticator* is one per process (it holds the caches) and closed at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await authenticator.aclose()

    app = FastAPI(title="Agents API", lifespan=lifespan)
    app.include_router(router)
    app.add_middleware(ApiKeyMiddleware, authenticator=authenticator)
    document(app)
    return app


def main() -> None:
    """Serve the app with uvicorn on 127.0.0.1:$PORT, keys from $KEYTURN_STORE_URL."""
    # Each refusal is an INFO line of the "keyturn" logger, with its reason and the key id.
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("keyturn").setLevel(logging.INFO)
    import uvicorn

    with open_database(os.environ.get("KEYTURN_STORE_URL", "sqlite:///keyturn.sqlite3")) as db:
        app = create_app(Authenticator(db.keys, db.membership))
        uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))


if __name__ == "__main__":
    main()
