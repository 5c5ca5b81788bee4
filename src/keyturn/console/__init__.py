"""
The key console
===============

The spec's web console -- create, list and revoke keys while signed in -- as part of the
library. Your service mounts it behind its own sign-in::

    from keyturn import KeyManager
    from keyturn.console import Console

    console = Console(
        KeyManager(db.keys, db.membership),
        signed_in=lambda request: request.session.get("account"),  # your sign-in
        sign_in_url="/login",
    )
    # Starlette
    routes = [..., Mount("/console", app=console.asgi())]
    # FastAPI
    app.mount("/console", console.asgi())
    # Flask (Werkzeug's DispatcherMiddleware)
    app.wsgi_app = DispatcherMiddleware(app.wsgi_app, {"/console": console.wsgi()})
    # Django (urls.py; signed_in=keyturn.console.django.username reads request.user)
    urlpatterns = [path("console/", include(keyturn.console.django.console_urls(console)))]

One framework-free page layer answers every request (``_page``, behind the checks of
``_guard``, asking its manager through ``_keys``, reading forms with ``_forms`` and drawing
pages with ``_render``); the ASGI, WSGI and Django edges only translate. Needs the
``console`` extra (Jinja2, Starlette, Werkzeug). See ``docs/console.md``.
"""

from keyturn.console._visit import ConsoleSetupError, Page, Visit, needs_extra

try:
    from keyturn.console._forms import LIFETIME_CHOICES, Preview, local_time, preview, safe_next
    from keyturn.console._page import Console
    from keyturn.console._render import short_agent
except ModuleNotFoundError as exc:
    raise needs_extra(exc) from exc

__all__ = [
    "LIFETIME_CHOICES",
    "Console",
    "ConsoleSetupError",
    "Page",
    "Preview",
    "Visit",
    "local_time",
    "preview",
    "safe_next",
    "short_agent",
]
