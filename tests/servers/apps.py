"""The example apps as real servers load them: ``tests.servers.apps:asgi`` (Starlette),
``:wsgi`` (Flask) and ``:django`` (Django's WSGI handler behind the WSGI middleware).

The key database is the SQLite file named by ``KEYTURN_MATRIX_DB`` (the test seeded it).
Every request that reaches an app behind the middleware appends one line to the file named
by ``KEYTURN_MATRIX_REACHED``: that is how the matrix knows whether the app was reached, and
whether it could see the request's ``Authorization`` header.
Each app is built on first access, so a server process builds only the one it serves.
"""

from __future__ import annotations

import os
from typing import Any

from keyturn import Authenticator
from keyturn.stores.sqlite import SQLiteDatabase
from keyturn.wsgi import ApiKeyMiddleware, principal
from tests.web.web_support import load_example


def _database() -> SQLiteDatabase:
    return SQLiteDatabase(os.environ["KEYTURN_MATRIX_DB"])


def _reached(path: str, saw_key: bool) -> None:
    """One line per request the app sees: its path, and whether its Authorization was left."""
    with open(os.environ["KEYTURN_MATRIX_REACHED"], "a", encoding="utf-8") as log:
        log.write(f"{'key' if saw_key else '-'} {path!r}\n")


class _AsgiRecorder:
    """Stands in for the Starlette router behind the middleware, noting every request."""

    def __init__(self, router: Any) -> None:
        self.router = router

    def __getattr__(self, name: str) -> Any:
        return getattr(self.router, name)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            names = {name.lower() for name, _ in scope.get("headers", ())}
            _reached(scope.get("path", ""), b"authorization" in names)
        await self.router(scope, receive, send)


def _asgi() -> Any:
    db = _database()
    app = load_example("starlette_app").create_app(Authenticator(db.keys, db.membership))
    app.router = _AsgiRecorder(app.router)  # the middleware stack is built on first call
    return app


def _record_wsgi(app: Any) -> Any:
    def recording(environ: Any, start_response: Any) -> Any:
        _reached(environ.get("PATH_INFO", ""), "HTTP_AUTHORIZATION" in environ)
        return app(environ, start_response)

    return recording


def _wsgi() -> Any:
    db = _database()
    app = load_example("flask_app").create_app(Authenticator(db.keys, db.membership))
    middleware = app.wsgi_app
    middleware.app = _record_wsgi(middleware.app)
    return app


def _django() -> Any:
    import django
    from django.conf import settings
    from django.core.wsgi import get_wsgi_application
    from django.http import JsonResponse
    from django.urls import path

    def models(request: Any) -> Any:
        caller = principal(request.META)
        return JsonResponse({"items": [{"id": "agent-small", "org": caller.organization_id}]})

    def healthz(request: Any) -> Any:
        return JsonResponse({"status": "ok"})

    global urlpatterns
    urlpatterns = [path("managed-agents/v1/models", models), path("healthz", healthz)]
    settings.configure(
        ROOT_URLCONF=__name__,
        ALLOWED_HOSTS=["*"],
        SECRET_KEY="server-matrix-test-only",
        MIDDLEWARE=[],
        INSTALLED_APPS=[],
    )
    django.setup()
    db = _database()
    authenticator = Authenticator(db.keys, db.membership)
    return ApiKeyMiddleware(_record_wsgi(get_wsgi_application()), authenticator=authenticator)


urlpatterns: list[Any] = []
_BUILDERS = {"asgi": _asgi, "wsgi": _wsgi, "django": _django}
_BUILT: dict[str, Any] = {}


def make_asgi() -> Any:
    """The Starlette app, for servers that call a factory (hypercorn: ``make_asgi()``)."""
    return __getattr__("asgi")


def __getattr__(name: str) -> Any:
    if name not in _BUILDERS:
        raise AttributeError(name)
    if name not in _BUILT:
        _BUILT[name] = _BUILDERS[name]()
    return _BUILT[name]
