"""The list-models API on Starlette, behind keyturn's ASGI middleware.

``create_app(authenticator)`` builds the app around an :class:`~keyturn.Authenticator` you
configure (store, membership, clock, policy, audit hook, timeout); its lifespan closes it
at shutdown with ``aclose()``, so the last ``last_used_at`` writes land. Every path under
``/managed-agents/v1/`` needs a key; ``/healthz`` does not.

Serve it as it is (``pip install 'keyturn[asgi]' uvicorn``)::

    keyturn db init --store sqlite:///keyturn.sqlite3
    KEYTURN_STORE_URL=sqlite:///keyturn.sqlite3 PORT=8000 python examples/starlette_app.py
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from keyturn import Authenticator
from keyturn.asgi import ApiKeyMiddleware, principal
from keyturn.stores import open_database

MODELS = ("agent-small", "agent-large")


async def list_models(request: Request) -> JSONResponse:
    caller = principal(request)  # the key's user, in the organization the request runs in
    items = [{"id": model, "organization_id": caller.organization_id} for model in MODELS]
    return JSONResponse({"items": items})


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


def create_app(authenticator: Authenticator) -> Starlette:
    """The app; *authenticator* is one per process (it holds the caches) and closed at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await authenticator.aclose()

    return Starlette(
        routes=[Route("/managed-agents/v1/models", list_models), Route("/healthz", healthz)],
        middleware=[Middleware(ApiKeyMiddleware, authenticator=authenticator)],
        lifespan=lifespan,
    )


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
