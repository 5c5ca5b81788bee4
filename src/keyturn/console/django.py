"""The console's Django edge: an ``include()``-able URLconf over a
:class:`~keyturn.console.Console`. Decides nothing.

In a project's ``urls.py``::

    from django.urls import include, path

    from keyturn import KeyManager
    from keyturn.console import Console
    from keyturn.console.django import console_urls, username

    console = Console(
        KeyManager(db.keys, db.membership),
        signed_in=username,  # request.user, from Django's sessions
        sign_in_url="/accounts/login/",
    )
    urlpatterns = [..., path("console/", include(console_urls(console)))]

One view answers every page below the mount point. It reads the request (at most
:data:`~keyturn.console._visit.MAX_FORM_BYTES` of body), asks the host's ``signed_in`` (and
``current_organization``, and ``recently_authenticated`` of a signed-in user) with Django's
``HttpRequest``, and writes the page layer's answer
back as an ``HttpResponse``. Django's own CSRF check guards every POST, whatever
``MIDDLEWARE`` says: its token rides in every form the console renders, and a POST it
refuses gets the console's "This form has expired" page (403), not Django's. The console's
own ``Origin`` check and one-use form token run as well.

The pages say ``Referrer-Policy: same-origin`` here, not ``no-referrer``: under
``no-referrer`` a browser sends its own form's POST with ``Origin: null``, which Django's
CSRF check refuses. The console's address still never reaches another site.

With an :class:`~keyturn.AsyncKeyManager` the view is async: serve the project with Django's
ASGI handler, so the manager's pool lives on one event loop.
"""

from __future__ import annotations

try:
    import anyio.to_thread
    from asgiref.sync import sync_to_async
    from django.http import HttpRequest, HttpResponse
    from django.http.request import RawPostDataException
    from django.middleware.csrf import CsrfViewMiddleware, get_token
    from django.urls import URLPattern, re_path
except ImportError as exc:
    raise ImportError(
        "keyturn.console.django needs Django: pip install 'keyturn[console,django]'"
    ) from exc

from keyturn._web import PRINCIPAL_KEY, Body, read_django_body
from keyturn.console._page import Console
from keyturn.console._visit import (
    MAX_FORM_BYTES,
    ConsoleSetupError,
    Page,
    Visit,
    fields,
    plain_hooks,
    read,
    text,
)
from keyturn.manager import AsyncKeyManager

__all__ = ["console_urls", "username"]

APP_NAME = "keyturn_console"
REFERRER_POLICY = ("Referrer-Policy", "same-origin")


def _unreachable(request: HttpRequest) -> HttpResponse:
    raise AssertionError("the console asks Django's CSRF check, it never chains to it")


_CSRF = CsrfViewMiddleware(_unreachable)  # Django's check, run by hand on every request


def username(request: HttpRequest) -> str | None:
    """The signed-in Django user's username (its ``USERNAME_FIELD``), or ``None``.

    Keys belong to this account id: your membership provider must know users by it. If it
    knows them by primary key, pass ``signed_in=lambda r: str(r.user.pk) if
    r.user.is_authenticated else None`` instead.
    """
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    name = user.get_username()
    return name if isinstance(name, str) and name else None


def console_urls(console: Console) -> tuple[list[URLPattern], str]:
    """The console's URLconf, for ``path("console/", include(console_urls(console)))``.

    Its namespace is ``keyturn_console``: ``reverse("keyturn_console:page",
    kwargs={"rest": ""})`` is the key list.
    """
    if not isinstance(console, Console):
        raise ConsoleSetupError(f"console must be a keyturn Console, got {type(console).__name__}")
    plain_hooks(
        console,
        "the Django edge calls signed_in, current_organization and recently_authenticated "
        "as plain functions (Django's request.user is read in Django's own thread): pass "
        "plain functions",
    )

    if isinstance(console.manager, AsyncKeyManager):

        async def console_page(request: HttpRequest, rest: str) -> HttpResponse:
            # The host's sign-in may read Django's database: in Django's own thread.
            visit = await sync_to_async(_visit)(console, request, rest)
            # The page layer in a worker thread; the manager's calls come back to this loop.
            page = await anyio.to_thread.run_sync(console.handle, visit)
            return _response(request, page)

    else:

        def console_page(request: HttpRequest, rest: str) -> HttpResponse:  # type: ignore[misc]
            return _response(request, console.handle(_visit(console, request, rest)))

    # Exempt from CsrfViewMiddleware only because the view runs the same check itself
    # (_visit), to answer a refusal with the console's own page. The flag is what
    # csrf_exempt sets; set directly, an async view stays one for Django 4.2 too.
    console_page.csrf_exempt = True  # type: ignore[attr-defined]
    return [re_path(r"^(?P<rest>.*)\Z", console_page, name="page")], APP_NAME


def _visit(console: Console, request: HttpRequest, rest: str) -> Visit:
    if "CSRF_COOKIE" not in request.META:
        # CsrfViewMiddleware is not in MIDDLEWARE (it would have read the cookie): read it
        # here, or get_token() below makes a new secret on every page, and a form open in
        # another tab fails once any other page loads.
        _CSRF.process_request(request)
    csrf_refused = _CSRF.process_view(request, None, (), {}) is not None
    body = Body(b"")
    if request.method == "POST":
        try:
            body = read_django_body(request, MAX_FORM_BYTES)
        except RawPostDataException:  # Django streamed a multipart body: not a console form
            body = Body(b"")
    account = text(console.signed_in(request)) or None
    hook, recent = console.current_organization, console.recently_authenticated
    path = request.path
    meta = request.META
    return Visit(
        method=(request.method or "GET").upper(),
        path="/" + rest,
        base=path[: len(path) - len(rest)],
        origin=f"{request.scheme}://{request.get_host()}",
        query=fields(_raw(meta.get("QUERY_STRING", ""))),
        content_type=meta.get("CONTENT_TYPE", ""),
        account_id=account,
        organization=text(None if hook is None else hook(request)),
        form_fields={"csrfmiddlewaretoken": get_token(request)},
        csrf_refused=csrf_refused,
        authorization=(meta["HTTP_AUTHORIZATION"],) if "HTTP_AUTHORIZATION" in meta else (),
        by_key=PRINCIPAL_KEY in meta,
        recent_sign_in=account is not None and recent is not None and recent(request) is True,
        client_address=meta.get("REMOTE_ADDR") or None,
        **read(request.headers, body),
    )


def _raw(query: str) -> bytes:
    """The query string's bytes: a WSGI server hands them over as latin-1 text (PEP 3333),
    Django's ASGI handler as UTF-8 text."""
    try:
        return query.encode("latin-1")
    except UnicodeEncodeError:
        return query.encode("utf-8", "surrogateescape")


def _response(request: HttpRequest, page: Page) -> HttpResponse:
    response = HttpResponse(b"" if request.method == "HEAD" else page.body, status=page.status)
    for name, value in page.headers:
        response[name] = value
    response[REFERRER_POLICY[0]] = REFERRER_POLICY[1]
    return _CSRF.process_response(request, response)  # sets the CSRF cookie get_token asked for
