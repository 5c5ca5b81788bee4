"""The list-models API on plain Werkzeug, behind keyturn's WSGI middleware.

``create_app(store, membership)`` builds the WSGI application. Every path under
``/managed-agents/v1/`` needs a key; ``/healthz`` does not.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from keyturn import Authenticator, KeyStore, MembershipProvider
from keyturn.wsgi import ApiKeyMiddleware, principal

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

MODELS = ("agent-small", "agent-large")


def json_response(data: Any) -> Response:
    return Response(json.dumps(data), mimetype="application/json")


def list_models(request: Request) -> Response:
    caller = principal(request)  # the key's user, in the organization the request runs in
    items = [{"id": model, "organization_id": caller.organization_id} for model in MODELS]
    return json_response({"items": items})


def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


urls = Map(
    [
        Rule("/managed-agents/v1/models", endpoint=list_models, methods=["GET"]),
        Rule("/healthz", endpoint=healthz, methods=["GET"]),
    ]
)


@Request.application
def application(request: Request) -> Response | HTTPException:
    try:
        view, _ = urls.bind_to_environ(request.environ).match()
    except HTTPException as error:  # 404, 405: rendered by Werkzeug
        return error
    endpoint: Callable[[Request], Response] = view
    return endpoint(request)


def create_app(store: KeyStore, membership: MembershipProvider) -> WSGIApplication:
    authenticator = Authenticator(store, membership)  # one per process: it holds the caches
    return ApiKeyMiddleware(application, authenticator=authenticator)
