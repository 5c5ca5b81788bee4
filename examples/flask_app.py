"""The list-models API on Flask, behind keyturn's WSGI middleware.

``create_app(store, membership)`` builds the app. Every path under ``/managed-agents/v1/``
needs a key; ``/healthz`` does not.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Flask, request

from keyturn import Authenticator, KeyStore, MembershipProvider
from keyturn.wsgi import ApiKeyMiddleware, principal

MODELS = ("agent-small", "agent-large")

api = Blueprint("api", __name__)


@api.get("/managed-agents/v1/models")
def list_models() -> dict[str, Any]:
    caller = principal(request)  # the key's user, in the organization the request runs in
    items = [{"id": model, "organization_id": caller.organization_id} for model in MODELS]
    return {"items": items}


@api.get("/healthz")
def healthz() -> dict[str, Any]:
    return {"status": "ok"}


def create_app(store: KeyStore, membership: MembershipProvider) -> Flask:
    app = Flask(__name__)
    app.register_blueprint(api)
    authenticator = Authenticator(store, membership)  # one per process: it holds the caches
    app.wsgi_app = ApiKeyMiddleware(app.wsgi_app, authenticator=authenticator)  # type: ignore[method-assign]
    return app
