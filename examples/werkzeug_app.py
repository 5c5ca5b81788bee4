"""The list-models API on plain Werkzeug, behind keyturn's WSGI middleware.

``create_app(authenticator)`` builds the WSGI application around an
:class:`~keyturn.Authenticator` you configure (store, membership, clock, policy, audit hook,
timeout). WSGI has no shutdown event: whoever creates the authenticator closes it when the
server stops, as ``main()`` does. Every path under ``/managed-agents/v1/`` needs a key;
``/healthz`` does not.

Serve it as it is (``pip install 'keyturn[wsgi]' werkzeug``), on the standard library's server::

    keyturn db init --store sqlite:///keyturn.sqlite3
    KEYTURN_STORE_URL=sqlite:///keyturn.sqlite3 PORT=8000 python examples/werkzeug_app.py
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import make_server

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from keyturn import Authenticator
from keyturn.stores import open_database
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


def create_app(authenticator: Authenticator) -> WSGIApplication:
    """The app; *authenticator* is one per process (it holds the caches)."""
    return ApiKeyMiddleware(application, authenticator=authenticator)


def main() -> None:
    """Serve on 127.0.0.1:$PORT, keys from $KEYTURN_STORE_URL, until Ctrl+C or SIGTERM."""
    # Each refusal is an INFO line of the "keyturn" logger, with its reason and the key id.
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("keyturn").setLevel(logging.INFO)
    url = os.environ.get("KEYTURN_STORE_URL", "sqlite:///keyturn.sqlite3")
    with (
        open_database(url) as db,
        Authenticator(db.keys, db.membership) as authenticator,
        make_server(
            "127.0.0.1", int(os.environ.get("PORT", "8000")), create_app(authenticator)
        ) as server,
    ):
        # SIGTERM stops the loop from another thread (shutdown() waits for it), so the
        # with-block closes the authenticator and the database on the way out.
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
        print(f"Serving on http://127.0.0.1:{server.server_port}", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
