"""
Django middleware
=================

Authenticates every request to the agents API inside a Django project, under Django's
WSGI handler, its ASGI handler and its test client alike. A request under the protected
prefix is either refused with the JSON error the spec prescribes -- no view runs -- or
reaches the view with ``request.principal`` set, and its response carries
``service-organization-id`` and ``service-tenant-id``.

Configure it in ``settings.py``::

    MIDDLEWARE = [
        "django.middleware.security.SecurityMiddleware",
        "keyturn.django.ApiKeyMiddleware",
        ...
    ]
    KEYTURN = {
        "STORE_URL": "sqlite:///keyturn.sqlite3",  # or "AUTHENTICATOR": "myproject.keys.auth"
        "PREFIX": "/managed-agents/v1/",  # the defaults of the other middlewares
        "PUBLIC_PATHS": ["/managed-agents/v1/health"],
        "REALM": "agents-api",
        "STRIP_AUTHORIZATION": True,
        "EXPIRY_HEADER": False,  # True: service-key-expires-at on accepted responses
        "PAYLOAD_GUARD": None,  # True, a dict of PayloadGuard options, or a PayloadGuard
    }

and read the caller in a view::

    from keyturn.django import principal

    def list_models(request):
        caller = principal(request)  # or request.principal
        return JsonResponse({"organization": caller.organization_id})

``AUTHENTICATOR`` is an :class:`~keyturn.Authenticator`, the dotted path of one, or of a
function that returns one: for a store, policy, audit hook, clock or timeout of your own.
``STORE_URL`` is the short way: an ``Authenticator`` over ``open_database(url)``, closed
at interpreter exit. Settings are read when Django builds its middleware chain, so a
mistake is an ``ImproperlyConfigured`` at startup, not a 500 later.

The middleware can run synchronously and asynchronously: under ``ASGIHandler`` with async
views it awaits ``Authenticator.authenticate_async``; under WSGI it calls ``authenticate``.
The decision is the same one the ASGI and WSGI middlewares make. Repeated header lines
reach Django joined by commas, so a doubled ``Authorization`` or ``x-organization-id`` is
refused, never guessed.
"""

from __future__ import annotations

import atexit
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any, Final

try:
    from asgiref.sync import iscoroutinefunction, markcoroutinefunction
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.http import HttpRequest, HttpResponse, HttpResponseBase
    from django.utils.module_loading import import_string
    from django.utils.translation import get_language_from_path
except ImportError as exc:
    raise ImportError("keyturn.django needs Django: pip install 'keyturn[django]'") from exc

from keyturn._core.model import Principal
from keyturn._core.target import Unreadable
from keyturn._web import (
    DEFAULT_PREFIX,
    DEFAULT_REALM,
    PRINCIPAL_KEY,
    RESERVED_HEADER_NAMES,
    check_options,
    environ_request,
    principal_in,
    rendered,
    response_headers,
    unreadable,
)
from keyturn.authenticator import Authenticator, LimitHeaders
from keyturn.errors import Refusal
from keyturn.payload import PayloadGuard

__all__ = ["ApiKeyMiddleware", "principal"]

GetResponse = Callable[[HttpRequest], HttpResponseBase | Awaitable[HttpResponseBase]]

_SETTINGS: Final = frozenset(
    {
        "AUTHENTICATOR",
        "STORE_URL",
        "PREFIX",
        "PUBLIC_PATHS",
        "REALM",
        "STRIP_AUTHORIZATION",
        "EXPIRY_HEADER",
        "PAYLOAD_GUARD",
    }
)
_built: dict[str, Authenticator] = {}  # STORE_URL -> its Authenticator, one per process


class ApiKeyMiddleware:
    """Authenticate requests under ``settings.KEYTURN["PREFIX"]`` with personal API keys.

    Django builds it with the next handler, *get_response*; its options are the
    ``KEYTURN`` setting's (this module's docstring lists them), checked here, when Django
    builds its middleware chain: a mistake is an ``ImproperlyConfigured`` at startup.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: GetResponse) -> None:
        config: dict[str, Any] = dict(getattr(settings, "KEYTURN", {}))
        unknown = set(config) - _SETTINGS
        if unknown:
            raise ImproperlyConfigured(
                f"unknown KEYTURN settings {sorted(unknown)}; known: {sorted(_SETTINGS)}"
            )
        try:
            authenticator = _authenticator(config)
            realm = config.get("REALM", DEFAULT_REALM)
            prefix = config.get("PREFIX", DEFAULT_PREFIX)
            paths = check_options(authenticator, prefix, config.get("PUBLIC_PATHS", ()), realm)
            guard = _payload_guard(config.get("PAYLOAD_GUARD"), authenticator, paths.prefix)
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"KEYTURN: {exc}") from exc
        self.app = get_response
        self.authenticator = authenticator
        self.paths = paths
        self.realm: str = realm
        self.strip_authorization = bool(config.get("STRIP_AUTHORIZATION", True))
        self.expiry_header = bool(config.get("EXPIRY_HEADER", False))
        self.payload_guard = guard
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        path = self._path(request)
        if path is None:
            return self.app(request)
        if isinstance(path, Refusal):
            return self._refuse(path, request)
        guard = self.payload_guard
        began = None if guard is None else time.monotonic()  # for the audit event
        # With the guard, an acceptance is counted once the body is read (final=False). The
        # key leaves request.META once the request is admitted (_admit), not before.
        outcome, limits = self.authenticator.check(
            environ_request(request.META, request.method or "GET", path, strip=False),
            final=guard is None,
        )
        if isinstance(outcome, Refusal):
            return self._refuse(outcome, request)
        if guard is not None:  # the body, read before the view
            screened = guard.screen_django(request, path, outcome, self.authenticator, began)
            if screened is not None:
                return self._refuse(screened, request)
        self._admit(request, outcome)
        response = self.app(request)
        assert isinstance(response, HttpResponseBase)  # a sync chain answers synchronously
        return self._with_service_headers(response, outcome, limits)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        path = self._path(request)
        if path is None:
            return await self._next(request)
        if isinstance(path, Refusal):
            return self._refuse(path, request)
        guard = self.payload_guard
        began = None if guard is None else time.monotonic()  # for the audit event
        outcome, limits = await self.authenticator.check_async(
            environ_request(request.META, request.method or "GET", path, strip=False),
            final=guard is None,
        )
        if isinstance(outcome, Refusal):
            return self._refuse(outcome, request)
        if guard is not None:  # the body, read before the view
            screened = await guard.screen_django_async(
                request, path, outcome, self.authenticator, began
            )
            if screened is not None:
                return self._refuse(screened, request)
        self._admit(request, outcome)
        return self._with_service_headers(await self._next(request), outcome, limits)

    async def _next(self, request: HttpRequest) -> HttpResponseBase:
        response = self.app(request)
        assert not isinstance(response, HttpResponseBase)  # an async chain answers awaitably
        return await response

    def _admit(self, request: HttpRequest, outcome: Principal) -> None:
        request.META[PRINCIPAL_KEY] = outcome
        request.principal = outcome
        if self.strip_authorization and request.META.pop("HTTP_AUTHORIZATION", None) is not None:
            request.__dict__.pop("headers", None)  # request.headers is cached: read it anew

    def _path(self, request: HttpRequest) -> str | Refusal | None:
        """The canonical path to guard the request under (see ``_target``), or ``None``."""
        root = request.META.get("SCRIPT_NAME", "")
        path = self.paths.read(root, request.path_info)
        if path is None and (language := _language_prefix(request.path_info)):
            # i18n_patterns routes "/fr/managed-agents/v1/models" as the path below its
            # language prefix: to the router, that prefix is a mount prefix.
            path = self.paths.read(root + language, request.path_info[len(language) :])
        if isinstance(path, Unreadable):
            method = request.method or "GET"
            return unreadable(self.authenticator, path, method, root, request.path_info)
        return path

    def _with_service_headers(
        self, response: HttpResponseBase, caller: Principal, limits: LimitHeaders
    ) -> HttpResponseBase:
        """Every response to an admitted request names where it ran: ours replace the view's;
        a limited principal's also carries its rate limit's fields."""
        for name in RESERVED_HEADER_NAMES:
            if name in response:
                del response[name]
        expires_at = caller.expires_at if self.expiry_header else None
        for name, value in response_headers(caller.organization_id, caller.tenant_id, expires_at):
            response[name] = value
        for name, value in limits:
            response[name] = value
        return response

    def _refuse(self, error: Refusal, request: HttpRequest) -> HttpResponse:
        form = rendered(error, self.realm, request.method or "GET")
        response = HttpResponse(
            form.body, status=form.status, reason=HTTPStatus(form.status).phrase
        )
        for name, value in form.headers:
            response[name] = value
        return response


def _language_prefix(path: str) -> str:
    """The language prefix ``i18n_patterns`` may route *path* below (``"/fr"``), or ``""``:
    the first segment, when Django reads a language of ``LANGUAGES`` in it (any variant or
    case, so the guard reads at least what the router does).
    """
    language = get_language_from_path(path)
    if language is None or not path.startswith("/"):
        return ""
    return "/" + path.split("/", 2)[1]


def _payload_guard(
    setting: object, authenticator: Authenticator, prefix: str
) -> PayloadGuard | None:
    """``KEYTURN["PAYLOAD_GUARD"]``: ``None``/``False`` (off), ``True``, a dict of
    :class:`~keyturn.payload.PayloadGuard` options, or a guard."""
    if setting is None or setting is False:
        return None
    if setting is True:
        guard = PayloadGuard()
    elif isinstance(setting, dict):
        guard = PayloadGuard(**setting)
    elif isinstance(setting, PayloadGuard):
        guard = setting
    else:
        raise TypeError(
            "KEYTURN['PAYLOAD_GUARD'] must be True, a dict of PayloadGuard options or a "
            f"PayloadGuard, got {type(setting).__name__}"
        )
    return guard.check(authenticator, prefix)


def _authenticator(config: dict[str, Any]) -> Authenticator:
    path, url = config.get("AUTHENTICATOR"), config.get("STORE_URL")
    if (path is None) == (url is None):
        raise ImproperlyConfigured(
            "set exactly one of KEYTURN['AUTHENTICATOR'] (the dotted path of an "
            "Authenticator) and KEYTURN['STORE_URL'] (e.g. 'sqlite:///keyturn.sqlite3')"
        )
    if url is not None:
        if url not in _built:
            from keyturn.stores import open_database

            db = open_database(url)
            _built[url] = Authenticator(db.keys, db.membership)
            atexit.register(db.close)
            atexit.register(_built[url].close)  # runs first: last_used_at, then the database
        return _built[url]
    found = path
    if isinstance(path, str):
        try:
            found = import_string(path)
        except ImportError as exc:
            raise ImproperlyConfigured(f"KEYTURN['AUTHENTICATOR']: {exc}") from exc
    if not isinstance(found, Authenticator) and callable(found):
        found = found()
    if not isinstance(found, Authenticator):
        raise ImproperlyConfigured(
            f"KEYTURN['AUTHENTICATOR'] is a {type(found).__name__}, "
            "not an Authenticator or a function returning one"
        )
    return found


def principal(request: HttpRequest) -> Principal:
    """The :class:`~keyturn.Principal` of an authenticated request (also ``request.principal``).

    :raises MissingPrincipal: the middleware did not authenticate this request.
    """
    return principal_in(request.META)
