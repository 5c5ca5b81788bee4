"""The apps of the server matrix, as real servers load them (``tests.servers.apps:<name>``):

- ``asgi``: the Starlette example; ``fastapi``: the FastAPI example; ``quart``: a Quart app;
  ``bare``: a framework-less ASGI app; each behind the ASGI middleware (the last two with a
  role policy: only admins reach ``/managed-agents/v1/admin``);
- ``wsgi``: the Flask example; ``werkzeug``: the plain Werkzeug example; ``django``:
  Django's WSGI handler behind the WSGI middleware;
- ``django_native`` / ``django_native_asgi``: Django with keyturn's own Django middleware,
  as a WSGI and as an ASGI application;
- ``postgres``: the Starlette example over the async PostgreSQL store.

Every app turns on the opt-in expiry header, and mounts the key console at ``/console/``
(the PostgreSQL app's console runs on the sync twin of its database); the Starlette and
FastAPI apps mount it under the API prefix too, behind the middleware.
The console's sign-in is a test fixture: the cookie ``matrix_account`` names the account.

The key database is the SQLite file named by ``KEYTURN_MATRIX_DB`` (the PostgreSQL URL in
``KEYTURN_MATRIX_POSTGRES`` for ``postgres``); the test seeded it. Every request that
reaches an API app behind the middleware appends one line to the file named by
``KEYTURN_MATRIX_REACHED``: that is how the matrix knows whether the app was reached, and
whether it could see the request's ``Authorization`` header.
Each app is built on first access, so a server process builds only the one it serves.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

from keyturn import Authenticator, AuthRequest, KeyManager, Principal
from keyturn import asgi as keyturn_asgi
from keyturn import wsgi as keyturn_wsgi
from keyturn.stores.sqlite import SQLiteDatabase
from tests.web.web_support import load_example

CONSOLE = "/console"
PREFIXED_CONSOLE = "/managed-agents/v1/console"  # behind the middleware, under its prefix
SIGNED_IN_COOKIE = "matrix_account"  # test fixture: whoever sends it is signed in as it says


def _database() -> SQLiteDatabase:
    return SQLiteDatabase(os.environ["KEYTURN_MATRIX_DB"])


def _authenticator(policy: Any = None) -> Authenticator:
    db = _database()
    return Authenticator(db.keys, db.membership, policy=policy)


ADMIN = "/managed-agents/v1/admin"


def _admins_only_on_admin(principal: Principal, request: AuthRequest) -> bool:
    """The role policy of the Quart and framework-less apps: only admins reach ``ADMIN``."""
    return request.path != ADMIN or principal.role == "admin"


def _reached(path: str, saw_key: bool) -> None:
    """One line per request the app sees: its path, and whether its Authorization was left."""
    with open(os.environ["KEYTURN_MATRIX_REACHED"], "a", encoding="utf-8") as log:
        log.write(f"{'key' if saw_key else '-'} {path!r}\n")


def _console(db: Any = None) -> Any:
    """The console over *db* (a sync database; by default the SQLite one)."""
    from keyturn.console import Console

    def signed_in(request: Any) -> str | None:  # a Starlette or a Werkzeug request
        account: str | None = request.cookies.get(SIGNED_IN_COOKIE)
        return account

    db = db or _database()
    return Console(KeyManager(db.keys, db.membership), signed_in=signed_in, sign_in_url="/")


# --- recording ------------------------------------------------------------------------------


class _AsgiRecorder:
    """Stands in for the Starlette router behind the middleware, noting every request."""

    def __init__(self, router: Any) -> None:
        self.router = router

    def __getattr__(self, name: str) -> Any:
        return getattr(self.router, name)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        _record_scope(scope)
        await self.router(scope, receive, send)


def _record_scope(scope: Any) -> None:
    if scope["type"] != "lifespan":
        names = {name.lower() for name, _ in scope.get("headers", ())}
        _reached(scope.get("path", ""), b"authorization" in names)


def _record_asgi(app: Any) -> Any:
    async def recording(scope: Any, receive: Any, send: Any) -> None:
        _record_scope(scope)
        await app(scope, receive, send)

    return recording


def _record_wsgi(app: Any) -> Any:
    def recording(environ: Any, start_response: Any) -> Any:
        _reached(environ.get("PATH_INFO", ""), "HTTP_AUTHORIZATION" in environ)
        return app(environ, start_response)

    return recording


class DjangoRecorder:
    """A Django middleware after keyturn's: notes every request that got past it."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        _reached(request.path_info, "HTTP_AUTHORIZATION" in request.META)
        return self.get_response(request)


# --- mounting the console -------------------------------------------------------------------


def _beside_wsgi(app: Any) -> Any:
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    return DispatcherMiddleware(app, {CONSOLE: _console().wsgi()})


def _beside_asgi(app: Any) -> Any:
    """The console at ``/console`` in front of an ASGI app, for apps with no mount of their own."""
    console = _console().asgi()

    async def dispatch(scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == CONSOLE or path.startswith(CONSOLE + "/")):
            root = scope.get("root_path", "") + CONSOLE
            inner = {**scope, "root_path": root, "path": root + path[len(CONSOLE) :]}
            await console(inner, receive, send)
        else:
            await app(scope, receive, send)

    return dispatch


# --- the apps -------------------------------------------------------------------------------


def _starlette(authenticator: Authenticator, console: Any) -> Any:
    from starlette.routing import Mount

    app = load_example("starlette_app").create_app(authenticator)
    (middleware,) = app.user_middleware
    middleware.kwargs["expiry_header"] = True
    app.router.routes.append(Mount(CONSOLE, app=console.asgi()))
    app.router.routes.append(Mount(PREFIXED_CONSOLE, app=console.asgi()))
    return app


def _asgi() -> Any:
    app = _starlette(_authenticator(), _console())
    app.router = _AsgiRecorder(app.router)  # the middleware stack is built on first call
    return app


def _fastapi() -> Any:
    app = load_example("fastapi_app").create_app(_authenticator())
    (middleware,) = app.user_middleware
    middleware.kwargs["expiry_header"] = True
    console = _console().asgi()
    app.mount(CONSOLE, console)
    app.mount(PREFIXED_CONSOLE, console)
    app.router = _AsgiRecorder(app.router)
    return app


def _postgres() -> Any:
    from keyturn.stores.postgres import AsyncPostgresDatabase, PostgresDatabase

    url = os.environ["KEYTURN_MATRIX_POSTGRES"]
    adb = AsyncPostgresDatabase(url)
    # The console's manager is synchronous: it gets the sync twin of the same database.
    app = _starlette(Authenticator(adb.keys, adb.membership), _console(PostgresDatabase(url)))
    closing = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with adb, closing(app):  # the pool opens inside the server's event loop
            yield

    app.router.lifespan_context = lifespan
    app.router = _AsgiRecorder(app.router)
    return app


def _quart() -> Any:
    from quart import Quart

    app = Quart(__name__)

    @app.get("/managed-agents/v1/models")
    async def models() -> Any:
        from quart import request

        caller = keyturn_asgi.principal(request.scope)
        return {"items": [{"id": "agent-small", "organization_id": caller.organization_id}]}

    @app.get(ADMIN)
    async def admin() -> Any:
        return {"admin": True}

    @app.get("/healthz")
    async def healthz() -> Any:
        return {"status": "ok"}

    app.asgi_app = keyturn_asgi.ApiKeyMiddleware(  # type: ignore[method-assign, assignment]
        _record_asgi(app.asgi_app),
        authenticator=_authenticator(_admins_only_on_admin),
        expiry_header=True,
    )
    return _beside_asgi(app)


def _bare() -> Any:
    """A framework-less ASGI app: two routes, matched on the path as the server gives it."""

    async def respond(send: Any, status: int, data: Any) -> None:
        body = json.dumps(data).encode()
        start = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": start})
        await send({"type": "http.response.body", "body": body})

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return  # no WebSocket route: the server closes the handshake
        if scope["path"] == "/managed-agents/v1/models" and scope["method"] in ("GET", "HEAD"):
            caller = keyturn_asgi.principal(scope)
            items = [{"id": "agent-small", "organization_id": caller.organization_id}]
            await respond(send, 200, {"items": items})
        elif scope["path"] == ADMIN:
            await respond(send, 200, {"admin": True})
        elif scope["path"] == "/healthz":
            await respond(send, 200, {"status": "ok"})
        else:
            await respond(send, 404, {"detail": "Not Found"})

    middleware = keyturn_asgi.ApiKeyMiddleware(
        _record_asgi(app),
        authenticator=_authenticator(_admins_only_on_admin),
        expiry_header=True,
    )
    return _beside_asgi(middleware)


def _wsgi() -> Any:
    app = load_example("flask_app").create_app(_authenticator())
    middleware = app.wsgi_app
    middleware.app = _record_wsgi(middleware.app)
    middleware.expiry_header = True
    app.wsgi_app = _beside_wsgi(middleware)
    return app


def _werkzeug() -> Any:
    middleware = load_example("werkzeug_app").create_app(_authenticator())
    middleware.app = _record_wsgi(middleware.app)
    middleware.expiry_header = True
    return _beside_wsgi(middleware)


def _django() -> Any:
    import django
    from django.conf import settings
    from django.core.wsgi import get_wsgi_application
    from django.http import JsonResponse
    from django.urls import path

    def models(request: Any) -> Any:
        caller = keyturn_wsgi.principal(request.META)
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
    middleware = keyturn_wsgi.ApiKeyMiddleware(
        _record_wsgi(get_wsgi_application()),
        authenticator=_authenticator(),
        expiry_header=True,
    )
    return _beside_wsgi(middleware)


def _configure_django_native() -> None:
    """The Django example's URLconf, with keyturn's Django middleware and the recorder."""
    import django
    from django.conf import settings

    settings.configure(
        ROOT_URLCONF=load_example("django_app").Urls,
        MIDDLEWARE=["keyturn.django.ApiKeyMiddleware", "tests.servers.apps.DjangoRecorder"],
        KEYTURN={"AUTHENTICATOR": _authenticator(), "EXPIRY_HEADER": True},
        ALLOWED_HOSTS=["*"],
        SECRET_KEY="server-matrix-test-only",
        DEBUG=False,
    )
    django.setup()


def _django_native() -> Any:
    from django.core.handlers.wsgi import WSGIHandler

    _configure_django_native()
    return _beside_wsgi(WSGIHandler())


def _django_native_asgi() -> Any:
    from django.core.handlers.asgi import ASGIHandler

    _configure_django_native()
    return _beside_asgi(ASGIHandler())


urlpatterns: list[Any] = []
_BUILDERS = {
    "asgi": _asgi,
    "bare": _bare,
    "django": _django,
    "django_native": _django_native,
    "django_native_asgi": _django_native_asgi,
    "fastapi": _fastapi,
    "postgres": _postgres,
    "quart": _quart,
    "werkzeug": _werkzeug,
    "wsgi": _wsgi,
}
_BUILT: dict[str, Any] = {}


def make_asgi() -> Any:
    """The Starlette app, for servers that call a factory (hypercorn: ``make_asgi()``)."""
    return __getattr__("asgi")


def make_quart() -> Any:
    """The Quart app, for hypercorn's factory call."""
    return __getattr__("quart")


def __getattr__(name: str) -> Any:
    if name not in _BUILDERS:
        raise AttributeError(name)
    if name not in _BUILT:
        _BUILT[name] = _BUILDERS[name]()
    return _BUILT[name]
