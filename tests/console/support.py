"""The console tests' world: a seeded membership, a clock the test sets, both edges.

``make_world`` seeds tenant ``acme`` (``acme-main``, its default, and ``acme-research``)
and tenant ``globex`` (``globex-hq``); ``alice`` is in both acme organizations, ``bob`` only
in ``acme-main``. The signed-in account is read from the ``test_account`` cookie, the way a
host's own sign-in would read its session; on the Django edge it is Django's own
``request.user``, signed in through Django's sessions (``sign_in``).

``make_world(step_up=True)`` asks for a recent sign-in before a key is minted: the host
calls a sign-in recent for :data:`RECENT` after the time in the ``test_signed_in_at``
cookie (on the world's clock), and its re-sign-in page at :data:`REAUTHENTICATE` (on every
edge's host) sets that cookie and redirects to ``next`` through ``safe_next``.
"""

from __future__ import annotations

import re
import socket
import threading
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any
from urllib.parse import urlencode

import attrs
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse
from starlette.routing import Mount, Route
from werkzeug import Response as WerkzeugResponse
from werkzeug.exceptions import NotFound
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.serving import make_server
from werkzeug.wrappers import Request as WerkzeugRequest

from keyturn import Authenticator, KeyManager
from keyturn.console import Console, safe_next
from keyturn.console._page import StartOn
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from tests.world import Clock

ACCOUNT_COOKIE = "test_account"
SIGN_IN = "/sign-in"
EDGES = ("asgi", "wsgi")
BROWSER_EDGES = (*EDGES, "django")  # the browser suite also runs against the Django edge
NOW = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)  # where the console tests' clock starts
SIGNED_IN_AT_COOKIE = "test_signed_in_at"  # when the host last saw the password: a timestamp
REAUTHENTICATE = "/reauthenticate"  # the host's re-sign-in page
RECENT = timedelta(minutes=10)  # how recent a sign-in the host asks for before minting a key


@attrs.frozen
class World:
    store: MemoryKeyStore
    membership: MemoryMembership
    clock: Clock
    console: Console
    manager: KeyManager


def signed_in(request: Any) -> str | None:
    cookies = request.COOKIES if hasattr(request, "COOKIES") else request.cookies  # Django's
    account = cookies.get(ACCOUNT_COOKIE)
    return account if isinstance(account, str) else None


def recently_authenticated(clock: Clock, request: Any) -> bool:
    """The tests' host: whether the sign-in in *request*'s cookie is :data:`RECENT` enough."""
    cookies = request.COOKIES if hasattr(request, "COOKIES") else request.cookies  # Django's
    raw = cookies.get(SIGNED_IN_AT_COOKIE, "")
    if not raw.isdigit():
        return False
    return clock() - datetime.fromtimestamp(int(raw), UTC) < RECENT


def signed_in_at(at: datetime) -> str:
    """The value of the host's ``test_signed_in_at`` cookie for a sign-in at *at*."""
    return str(int(at.timestamp()))


def make_world(
    *, start_on: StartOn = "tenant", edge: str = "asgi", step_up: bool = False, **options: Any
) -> World:
    """The seeded world, its console reading the sign-in the way *edge*'s host would;
    *options* go to :class:`Console`. With *step_up*, minting a key needs a recent sign-in."""
    store, membership, clock = MemoryKeyStore(), MemoryMembership(), Clock(NOW)
    membership.add_organization("acme-main", tenant_id="acme", default=True)
    membership.add_organization("acme-research", tenant_id="acme")
    membership.add_organization("globex-hq", tenant_id="globex", default=True)
    membership.add_member("alice", "acme-main", role="admin")
    membership.add_member("alice", "acme-research", role="member")
    membership.add_member("bob", "acme-main", role="member")
    manager = KeyManager(store, membership, clock=clock)
    if edge == "django":
        from keyturn.console.django import username

        options.setdefault("signed_in", username)
    options.setdefault("signed_in", signed_in)
    if step_up:
        options.setdefault("recently_authenticated", partial(recently_authenticated, clock))
        options.setdefault("reauthenticate_url", REAUTHENTICATE)
    console = Console(manager, sign_in_url=SIGN_IN, start_on=start_on, **options)
    return World(store=store, membership=membership, clock=clock, console=console, manager=manager)


def asgi_app(console: Console) -> Any:
    async def reauthenticate(request: Request) -> RedirectResponse:
        target = safe_next(request.query_params.get("next"), "/console/")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(SIGNED_IN_AT_COOKIE, signed_in_at(console.manager.clock()))
        return response

    routes = [Route(REAUTHENTICATE, reauthenticate), Mount("/console", app=console.asgi())]
    return Starlette(routes=routes)


def wsgi_app(console: Console) -> Any:
    @WerkzeugRequest.application
    def host(request: WerkzeugRequest) -> Any:
        if request.path != REAUTHENTICATE:
            return NotFound()
        target = safe_next(request.args.get("next"), "/console/")
        response = WerkzeugResponse(status=303, headers={"Location": target})
        response.set_cookie(SIGNED_IN_AT_COOKIE, signed_in_at(console.manager.clock()))
        return response

    return DispatcherMiddleware(host, {"/console": console.wsgi()})


def django_reauthenticate(console: Console) -> Any:
    """The Django host's re-sign-in view."""
    from django.http import HttpRequest, HttpResponseRedirect

    def reauthenticate(request: HttpRequest) -> HttpResponseRedirect:
        response = HttpResponseRedirect(safe_next(request.GET.get("next"), "/console/"))
        response.set_cookie(SIGNED_IN_AT_COOKIE, signed_in_at(console.manager.clock()))
        return response

    return reauthenticate


@contextmanager
def django_settings(console: Console) -> Iterator[None]:
    """The tests' Django project with *console* included at /console/, behind Django's
    sessions, authentication and CSRF middleware, and keyturn's for the API beside it."""
    from django.test import override_settings
    from django.urls import include, path

    from keyturn.console.django import console_urls
    from tests.django_project import CONSOLE_MIDDLEWARE, database

    database()
    urls = types.ModuleType("console_urls")  # a URLconf module of this console alone
    urls.urlpatterns = [  # type: ignore[attr-defined]
        path("console/", include(console_urls(console))),
        path(REAUTHENTICATE[1:], django_reauthenticate(console)),
    ]
    manager = console.manager
    with (
        Authenticator(manager.store, manager.membership) as gate,  # the API beside it
        override_settings(
            ROOT_URLCONF=urls, MIDDLEWARE=CONSOLE_MIDDLEWARE, KEYTURN={"AUTHENTICATOR": gate}
        ),
    ):
        yield


def sign_in(context: Any, edge: str, account: str, url: str) -> None:
    """Sign *account* in to the browser *context*: the test cookie, or a Django session."""
    if edge == "django":
        from tests.django_project import session_cookie

        name, value = session_cookie(account)
        context.add_cookies([{"name": name, "value": value, "url": url}])
    else:
        context.add_cookies([{"name": ACCOUNT_COOKIE, "value": account, "url": url}])


def hidden_fields(html: str, form_id: str = "create") -> dict[str, str]:
    """The hidden fields of a form of *html*: the form token, and Django's CSRF token."""
    form = html[html.index(f'<form id="{form_id}"') :]
    form = form[: form.index("</form>")]
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form))


def form_token(html: str) -> str:
    match = re.search(r'name="token" value="([^"]+)"', html)
    assert match is not None, "the page holds no form token"
    return match.group(1)


@attrs.frozen
class Reply:
    status: int
    headers: Mapping[str, str]  # lower-case names
    text: str


class Client:
    """One interface over Starlette's TestClient, Werkzeug's test Client and Django's (used
    inside ``django_settings(console)``)."""

    origin: str

    def __init__(self, edge: str, console: Console) -> None:
        self.edge = edge
        if edge == "asgi":
            from starlette.testclient import TestClient

            self._asgi = TestClient(asgi_app(console), follow_redirects=False)
            self.origin = "http://testserver"
        elif edge == "django":
            from django.test import Client as DjangoClient

            self._django = DjangoClient()
            self.origin = "http://testserver"
        else:
            from werkzeug.test import Client as WerkzeugClient

            self._wsgi = WerkzeugClient(wsgi_app(console))
            self.origin = "http://localhost"
        self.account: str | None = None
        self.cookies: dict[str, str] = {}  # the host's other cookies, sent on every request

    def request(
        self,
        method: str,
        path: str,
        *,
        data: Mapping[str, str] | bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        headers = dict(headers or {})
        if self.edge == "django":
            return self._django_request(method, path, data, headers)
        cookies = dict(self.cookies)
        if self.account is not None:
            cookies[ACCOUNT_COOKIE] = self.account
        if cookies and self.edge == "asgi":
            headers["Cookie"] = "; ".join(f"{name}={value}" for name, value in cookies.items())
        elif self.edge == "wsgi":
            for name, value in cookies.items():
                self._wsgi.set_cookie(name, value)
        if isinstance(data, bytes):
            headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
        if self.edge == "asgi":
            if isinstance(data, bytes):
                response = self._asgi.request(method, path, content=data, headers=headers)
            else:
                response = self._asgi.request(method, path, data=data, headers=headers)
            return Reply(
                response.status_code,
                {k.lower(): v for k, v in response.headers.items()},
                response.text,
            )
        reply = self._wsgi.open(path, method=method, data=data, headers=headers)
        return Reply(
            reply.status_code,
            {k.lower(): v for k, v in reply.headers.items()},
            reply.get_data(as_text=True),
        )

    def _django_request(
        self,
        method: str,
        path: str,
        data: Mapping[str, str] | bytes | None,
        headers: dict[str, str],
    ) -> Reply:
        cookies = self._django.cookies
        if self.account is not None:
            cookies[ACCOUNT_COOKIE] = self.account
        elif ACCOUNT_COOKIE in cookies:
            del cookies[ACCOUNT_COOKIE]
        for name, value in self.cookies.items():
            cookies[name] = value
        content_type = headers.pop("Content-Type", "application/x-www-form-urlencoded")
        body = urlencode(data) if isinstance(data, Mapping) else (data or b"")
        reply = self._django.generic(method, path, body, content_type=content_type, headers=headers)
        return Reply(
            reply.status_code,
            {k.lower(): v for k, v in reply.items()},
            reply.content.decode(),
        )

    def get(self, path: str, **kwargs: Any) -> Reply:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, data: Mapping[str, str] | bytes, **kwargs: Any) -> Reply:
        headers = {"Origin": self.origin, **kwargs.pop("headers", {})}
        return self.request("POST", path, data=data, headers=headers, **kwargs)


@contextmanager
def serving(edge: str, console: Console) -> Iterator[str]:
    """Serve the console on a free 127.0.0.1 port in this process; yield its base URL."""
    if edge == "asgi":
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(asgi_app(console), log_level="warning", lifespan="off")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        for _ in range(500):  # bounded: about 5 s
            if server.started:
                break
            threading.Event().wait(0.01)
        assert server.started, "uvicorn did not start"
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            thread.join(10)
            sock.close()
    elif edge == "django":
        from django.core.handlers.wsgi import WSGIHandler

        with django_settings(console), _werkzeug_serving(WSGIHandler()) as origin:
            yield origin
    else:
        with _werkzeug_serving(wsgi_app(console)) as origin:
            yield origin


@contextmanager
def _werkzeug_serving(app: Any) -> Iterator[str]:
    wsgi = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=wsgi.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{wsgi.server_port}"
    finally:
        wsgi.shutdown()
        thread.join(10)
        wsgi.server_close()


def expect() -> Any:
    """Playwright's auto-waiting assertions (imported late: Playwright may be missing)."""
    from playwright.sync_api import expect

    return expect
