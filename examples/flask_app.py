"""The list-models API on Flask, behind keyturn's WSGI middleware.

``create_app(authenticator)`` builds the app around an :class:`~keyturn.Authenticator` you
configure (store, membership, clock, policy, audit hook, timeout). WSGI has no shutdown
event: whoever creates the authenticator closes it when the server stops, as ``main()``
does. Every path under ``/managed-agents/v1/`` needs a key; ``/healthz`` does not.

Serve it as it is (``pip install 'keyturn[wsgi]' flask``), on the standard library's
server; in production, give ``create_app`` to waitress or gunicorn the same way::

    keyturn db init --store sqlite:///keyturn.sqlite3
    KEYTURN_STORE_URL=sqlite:///keyturn.sqlite3 PORT=8000 python examples/flask_app.py
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any
from wsgiref.simple_server import make_server

from flask import Blueprint, Flask, request

from keyturn import Authenticator
from keyturn.stores import open_database
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


def create_app(authenticator: Authenticator) -> Flask:
    """The app; *authenticator* is one per process (it holds the caches)."""
    app = Flask(__name__)
    app.register_blueprint(api)
    app.wsgi_app = ApiKeyMiddleware(app.wsgi_app, authenticator=authenticator)  # type: ignore[method-assign]
    return app


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
