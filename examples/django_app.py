"""The list-models API on Django, behind keyturn's Django middleware, in one file.

A Django project keeps these parts in ``settings.py``, ``urls.py`` and ``views.py``; here
they sit together. ``create_app(authenticator)`` configures Django with the middleware
and returns the WSGI application (``create_asgi_app`` the ASGI one). The authenticator is
yours to configure (store, membership, clock, policy, audit hook, timeout); in a project,
name it in settings instead: ``KEYTURN = {"AUTHENTICATOR": "myproject.keys.authenticator"}``
or ``KEYTURN = {"STORE_URL": "sqlite:///keyturn.sqlite3"}``. Every path under
``/managed-agents/v1/`` needs a key; ``/healthz`` does not.

Serve it as it is (``pip install 'keyturn[django]'``), on the standard library's server;
in production, give the application to gunicorn, waitress or an ASGI server::

    keyturn db init --store sqlite:///keyturn.sqlite3
    KEYTURN_STORE_URL=sqlite:///keyturn.sqlite3 PORT=8000 python examples/django_app.py
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any, ClassVar
from wsgiref.simple_server import make_server

import django
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest, JsonResponse
from django.urls import path

from keyturn import Authenticator
from keyturn.django import principal
from keyturn.stores import open_database

MODELS = ("agent-small", "agent-large")


def list_models(request: HttpRequest) -> JsonResponse:
    caller = principal(request)  # the key's user, in the organization the request runs in
    items = [{"id": model, "organization_id": caller.organization_id} for model in MODELS]
    return JsonResponse({"items": items})


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


class Urls:
    """The URLconf (a project's ``urls.py``)."""

    urlpatterns: ClassVar[list[Any]] = [
        path("managed-agents/v1/models", list_models),
        path("healthz", healthz),
    ]


def configure(authenticator: Authenticator) -> None:
    """The settings (a project's ``settings.py``): the middleware, given *authenticator*."""
    settings.configure(
        ROOT_URLCONF=Urls,
        MIDDLEWARE=["keyturn.django.ApiKeyMiddleware"],
        KEYTURN={"AUTHENTICATOR": authenticator},
        ALLOWED_HOSTS=["127.0.0.1", "localhost", "testserver"],
        SECRET_KEY=os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret"),
        DEBUG=False,
    )
    django.setup()


def create_app(authenticator: Authenticator) -> WSGIHandler:
    """The WSGI application; *authenticator* is one per process (it holds the caches)."""
    configure(authenticator)
    return WSGIHandler()


def create_asgi_app(authenticator: Authenticator) -> ASGIHandler:
    """The ASGI application, for uvicorn and other ASGI servers."""
    configure(authenticator)
    return ASGIHandler()


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
