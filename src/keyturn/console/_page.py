"""The console's pages, framework-free: :class:`Console` answers a :class:`Visit` with a
:class:`Page`. This decides which page answers which path and method, what each shows, and
what its form does to the account's keys, once the guard (``_guard``) lets a request by.

The secret of a new key appears in exactly one place: the body of the POST that created it
(or rotated it). Never in a URL, a redirect, a cookie, a header or a log line. The rules
about names, lifetimes and dates are the library's (:mod:`keyturn._core.lifecycle`): the
pages turn its errors into messages. The two static files alone may be kept by a browser,
revalidated on each use (``no-cache``).
"""

from __future__ import annotations

import json
import logging
import secrets
import shlex
from collections import defaultdict
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from functools import partial
from importlib import resources
from typing import Any, Final, Literal
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from keyturn._core.lifecycle import validate_name
from keyturn._core.model import CreatedKey, Status
from keyturn.activity import ActivityNotKept, By
from keyturn.console._chart import CHART_DAYS, window
from keyturn.console._forms import (
    expiry_choice,
    preview,
    scope_choices,
    scope_label,
    scope_value,
    zone_named,
)
from keyturn.console._guard import Guard, key_refusal, post_refusal, rotate_path, to_sign_in
from keyturn.console._keys import Keys
from keyturn.console._limits import limits_of, works_in
from keyturn.console._render import message, paired, render, row
from keyturn.console._visit import (
    HEADERS,
    ConsoleSetupError,
    Page,
    Visit,
    needs_extra,
    redirect,
)
from keyturn.errors import (
    InvalidExpiry,
    InvalidKeyName,
    KeyNotFound,
    KeyNotRevocable,
    KeyNotRotatable,
    ScopeNotReachable,
)
from keyturn.manager import AsyncKeyManager, KeyManager
from keyturn.protocols import ConsoleMembership
from keyturn.ratelimits import RateLimiter
from keyturn.usage import KeyUsage, by_key

_log = logging.getLogger("keyturn.console")
StartOn = Literal["tenant", "organization"]
ACTIVITY_LIMIT: Final = 200  # events the Activity page shows at most

_STATIC: Final = {
    "/static/console.js": "text/javascript; charset=utf-8",
    "/static/console.css": "text/css; charset=utf-8",
    "/static/favicon.svg": "image/svg+xml",  # named by every page: no /favicon.ico lookup
}


class Console:
    """The key console for one service: mount :meth:`asgi` or :meth:`wsgi` behind sign-in.

    :param manager: the :class:`~keyturn.KeyManager` over your store and membership, or an
        :class:`~keyturn.AsyncKeyManager` for a console served only through the ASGI edge;
        its membership must also list an account's organizations
        (:class:`~keyturn.ConsoleMembership`), for the scope choice.
    :param signed_in: your sign-in, as a function of the framework's request (Starlette's,
        Werkzeug's or Django's) to the signed-in account id, or ``None``.
    :param sign_in_url: where to send a visitor who is not signed in.
    :param start_on: the scope the create form starts on: ``"tenant"``, or
        ``"organization"``: the one *current_organization* names, else the account's
        tenant's default organization if it is a member there, else its first.
    :param current_organization: with ``start_on="organization"``, which organization the
        user is in, as a function of the framework's request to an organization id or
        ``None`` (asked like *signed_in*, on each request).
    :param secret: signs the form tokens; give every process of one service the same
        secret (32 random bytes). By default a random one per process.
    :param expiring_within: the list marks Active and Inactive keys that expire this soon,
        with the time left (default 7 days; ``timedelta(0)`` marks none).
    :param recently_authenticated: your check that the user signed in recently enough to
        mint a key, as a function of the framework's request answering ``True`` (a
        coroutine function is awaited under ASGI; any answer but ``True`` is "not recent").
        With it, creating and rotating a key need a recent sign-in; revoking does not.
    :param reauthenticate_url: where a user whose sign-in is not recent confirms it, given
        with *recently_authenticated*. The console adds ``next``, the path of the console
        page to come back to; check it with :func:`safe_next` before you redirect to it.
    :param api_url: the API call the page of a new key shows as a ready ``curl`` line
        (default: this site's ``/managed-agents/v1/models``).
    :param rate_limiter: the :class:`~keyturn.ratelimits.RateLimiter` your API admits
        requests with: the list then shows each Active key's limits (key, account,
        organization) and their use now, read without taking anything. The very limiter
        object when the console runs in the API's process on the in-process engine (it
        counts only its own process); on Redis or PostgreSQL, any limiter on the same
        engine and limits. Without it, the list says nothing about limits.

    A visitor who is not signed in is sent to *sign_in_url* with ``next``, the path of the
    console page to come back to (the key list, after a form): check it with
    :func:`safe_next` before your sign-in redirects to it.
    """

    def __init__(
        self,
        manager: KeyManager | AsyncKeyManager,
        *,
        signed_in: Callable[[Any], Any],
        sign_in_url: str,
        start_on: StartOn = "tenant",
        current_organization: Callable[[Any], Any] | None = None,
        secret: bytes | None = None,
        expiring_within: timedelta = timedelta(days=7),
        recently_authenticated: Callable[[Any], Any] | None = None,
        reauthenticate_url: str | None = None,
        api_url: str | None = None,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        if not isinstance(manager, KeyManager | AsyncKeyManager):
            raise ConsoleSetupError(
                "manager must be a keyturn.KeyManager or keyturn.AsyncKeyManager, "
                f"got {type(manager).__name__}"
            )
        if not isinstance(manager.membership, ConsoleMembership):
            raise ConsoleSetupError(
                f"the console needs a membership provider with organizations_of(account_id) "
                f"(keyturn.ConsoleMembership) for its scope choice; "
                f"{type(manager.membership).__name__} has none"
            )
        if not callable(signed_in):
            raise ConsoleSetupError("signed_in must be a function of the request")
        if not isinstance(sign_in_url, str) or not sign_in_url:
            raise ConsoleSetupError("sign_in_url must be the URL of your sign-in page")
        if start_on not in ("tenant", "organization"):
            raise ConsoleSetupError(
                f"start_on must be 'tenant' or 'organization', got {start_on!r}"
            )
        if current_organization is not None and (
            start_on != "organization" or not callable(current_organization)
        ):
            raise ConsoleSetupError(
                "current_organization must be a function of the request, "
                "given with start_on='organization'"
            )
        if secret is not None and not isinstance(secret, bytes):
            raise ConsoleSetupError(
                f"secret must be bytes, not {type(secret).__name__}: make 32 random bytes once "
                "(python -c 'import secrets; print(secrets.token_hex(32))'), keep them in your "
                "secret store, and pass them as bytes, e.g. "
                "secret=bytes.fromhex(os.environ['CONSOLE_SECRET'])"
            )
        if secret is not None and len(secret) < 16:
            raise ConsoleSetupError(
                f"secret must be at least 16 random bytes, got {len(secret)}: "
                "secrets.token_bytes(32) makes 32"
            )
        if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
            raise ConsoleSetupError(
                "rate_limiter must be a keyturn.ratelimits.RateLimiter, "
                f"got {type(rate_limiter).__name__}"
            )
        if api_url is not None and (not isinstance(api_url, str) or not api_url):
            raise ConsoleSetupError("api_url must be the URL of a call to your API")
        if not isinstance(expiring_within, timedelta) or expiring_within < timedelta(0):
            raise ConsoleSetupError(
                f"expiring_within must be a timedelta of zero or more, got {expiring_within!r}"
            )
        if (recently_authenticated is None) != (reauthenticate_url is None):
            raise ConsoleSetupError(
                "recently_authenticated and reauthenticate_url go together: the console sends "
                "a user whose sign-in is not recent to reauthenticate_url"
            )
        if recently_authenticated is not None and not callable(recently_authenticated):
            raise ConsoleSetupError("recently_authenticated must be a function of the request")
        if reauthenticate_url is not None and (
            not isinstance(reauthenticate_url, str) or not reauthenticate_url
        ):
            raise ConsoleSetupError(
                "reauthenticate_url must be the URL of the page where a user signs in again"
            )
        self.manager = manager
        self.membership: ConsoleMembership = manager.membership
        self._keys = Keys(manager)
        self._row = partial(row, expiring_within=expiring_within)
        self.signed_in = signed_in
        self.sign_in_url = sign_in_url
        self.start_on: StartOn = start_on
        self.current_organization = current_organization
        self.expiring_within = expiring_within
        self.recently_authenticated = recently_authenticated
        self.reauthenticate_url = reauthenticate_url
        self.api_url = api_url
        self.rate_limiter = rate_limiter
        self._guard = Guard(secret or secrets.token_bytes(32), reauthenticate_url)

    def __repr__(self) -> str:
        return f"Console(manager={self.manager!r}, start_on={self.start_on!r})"

    def asgi(self) -> Any:
        """The console as an ASGI app: ``Mount("/console", app=console.asgi())``."""
        try:
            from keyturn.console.asgi import ConsoleASGI
        except ModuleNotFoundError as exc:
            raise needs_extra(exc) from exc

        return ConsoleASGI(self)

    def wsgi(self) -> Any:
        """The console as a WSGI app: mount it with Werkzeug's ``DispatcherMiddleware``."""
        try:
            from keyturn.console.wsgi import ConsoleWSGI
        except ModuleNotFoundError as exc:
            raise needs_extra(exc) from exc

        return ConsoleWSGI(self)

    def handle(self, visit: Visit) -> Page:
        """Answer one visit. Never raises for bad input: it answers with a page."""
        refused = key_refusal(visit)
        if refused is not None:
            return refused
        method = "GET" if visit.method == "HEAD" else visit.method
        if visit.path in _STATIC and method == "GET":
            body = resources.files("keyturn.console").joinpath(visit.path[1:]).read_bytes()
            cached = (
                *(h for h in HEADERS if h[0] != "Cache-Control"),
                ("Cache-Control", "no-cache"),
            )
            return Page(200, (*cached, ("Content-Type", _STATIC[visit.path])), body)
        routes: dict[str, dict[str, Callable[[Visit, str], Page]]] = {
            "/": {"GET": self._keys_page, "POST": self._create},
            "/preview": {"GET": self._preview},
            "/revoke": {"GET": partial(self._found, form="revoke"), "POST": self._revoke},
            "/rotate": {"GET": partial(self._found, form="rotate"), "POST": self._rotate},
            "/activity": {"GET": self._activity},
        }
        if visit.path not in routes:
            return message(visit, 404, "Not found", account=None)
        if visit.account_id is None:
            return to_sign_in(visit, method, self.sign_in_url)
        handlers = routes[visit.path]
        if method not in handlers:
            allow = ("Allow", ", ".join(sorted({*handlers, "HEAD"})))
            return message(visit, 405, "Method not allowed", allow, account=None)
        if method == "POST" and (refused := post_refusal(visit)) is not None:
            return refused
        try:
            return handlers[method](visit, visit.account_id)
        except Exception:
            # The store or the membership provider failed: say so, log it, never a bare 500.
            _log.exception("the key console could not answer %s %s", method, visit.path)
            return message(visit, 503, "Try again in a moment", ("Retry-After", "5"))

    def _keys_page(
        self,
        visit: Visit,
        account_id: str,
        form: Mapping[str, str] | None = None,
        errors: Mapping[str, str] | None = None,
    ) -> Page:
        """The list and the create form: fresh (*form* ``None``), or as sent with *errors*."""
        organizations = self._keys.organizations_of(account_id)
        choices = scope_choices(organizations)
        if form is None:
            starts = [v for v, _, s in choices if self.start_on == "tenant" or s.organization_id]
            # The organization the host says the user is in, when the user reaches it.
            if self.start_on == "organization" and visit.organization is not None:
                here = [v for v, _, s in choices if s.organization_id == visit.organization]
                starts = here + starts
            values = {"name": "", "lifetime": "30d", "date": "", "tz": visit.query.get("tz", "")}
            values["scope"] = starts[0] if starts else ""
        else:
            values = dict(form)
        zone_name = values["tz"] or visit.query.get("tz", "")
        zone = zone_named(zone_name)
        now = self._keys.now()
        every_key = self._keys.list(account_id)
        scopes = dict.fromkeys([*(s for _, _, s in choices), *(i.scope for i in every_key)])
        wanted_scope = next((s for s in scopes if scope_value(s) == visit.query.get("scope")), None)
        wanted_status = next((s for s in Status if s.value == visit.query.get("status")), None)
        by_id = {info.key_id: info for info in every_key}
        revoked = by_id.get(visit.query.get("revoked", "")) if form is None else None
        notice = None
        if revoked is not None and revoked.status is Status.REVOKED:
            notice = f"Key “{revoked.name}” ({revoked.hint}) is revoked: it no longer works."
        shown = [
            info
            for info in every_key
            if (wanted_status is None or info.status is wanted_status)
            and (wanted_scope is None or info.scope == wanted_scope)
        ]
        usage = self._usage(account_id, now, [info.key_id for info in shown]) if shown else None
        limits = limits_of(self.rate_limiter, account_id, shown, organizations, self._keys.role_of)
        context = {
            "values": values,
            "errors": defaultdict(str, errors or {}),
            "notice": notice,
            "scopes": [(value, label) for value, label, _ in choices],
            "preview": preview(values["lifetime"], values["date"], zone_name, now),
            "token": self._guard.issue(account_id, "create"),
            "revoke_token": self._guard.issue(account_id, "revoke"),
            "rows": [
                {**self._row(info, now, by_id, usage), "limits": limits.rows.get(info.key_id)}
                for info in paired(shown)
            ],
            "limits": limits,
            "chart_days": CHART_DAYS,
            "zone": zone,
            "total": len(every_key),
            "filters": {
                "status": wanted_status.value if wanted_status else "",
                "scope": scope_value(wanted_scope) if wanted_scope else "",
            },
            "filter_scopes": [(scope_value(s), scope_label(s)) for s in scopes],
            "tz_param": zone.key if zone and visit.query.get("tz") else "",
            "step_up": self._guard.step_up(visit, visit.base),
        }
        return render(visit, "keys.html", 200 if form is None else 400, context)

    def _preview(self, visit: Visit, account_id: str) -> Page:
        lifetime, day, zone = (visit.query.get(f, "") for f in ("lifetime", "date", "tz"))
        shown = preview(lifetime, day, zone, self._keys.now())
        body = json.dumps(shown.as_json()).encode()
        return Page(200, (*HEADERS, ("Content-Type", "application/json")), body)

    def _create(self, visit: Visit, account_id: str) -> Page:
        checked = self._guard.form(visit, account_id, "create")
        if isinstance(checked, Page):
            return checked
        form, nonce = checked
        values = {f: form.get(f, "") for f in ("name", "lifetime", "date", "tz", "scope")}
        errors: dict[str, str] = {}
        try:
            name = validate_name(values["name"])
        except InvalidKeyName as exc:
            errors["name"] = _sentence(str(exc))
        now = self._keys.now()
        zone = zone_named(values["tz"])
        problem = preview(values["lifetime"], values["date"], values["tz"], now).problem
        if problem is not None:
            custom_field = "date" if zone else "tz"
            errors[custom_field if values["lifetime"] == "custom" else "lifetime"] = problem
        choices = scope_choices(self._keys.organizations_of(account_id))
        scope = {value: scope for value, _, scope in choices}.get(values["scope"])
        if scope is None:
            errors["scope"] = "Choose a scope: your tenant or one of your organizations."
        if errors:
            return self._keys_page(visit, account_id, values, errors)
        choice = expiry_choice(values["lifetime"], values["date"], zone)
        assert not isinstance(choice, str)
        assert scope is not None
        by = _by(visit, account_id)
        create = partial(
            self._keys.create, account_id, name=name, scope=scope, expiry=choice, by=by
        )
        lost = (
            "The key it created is in your list; its secret is shown only once. "
            "If you lost it, revoke that key and create a new one."
        )
        try:
            created = self._guard.once(visit, nonce, lost, create)
        except (InvalidExpiry, ScopeNotReachable) as exc:
            errors["scope" if isinstance(exc, ScopeNotReachable) else "date"] = _sentence(str(exc))
            return self._keys_page(visit, account_id, values, errors)
        if isinstance(created, Page):
            return created
        return self._created(visit, account_id, created, self._row(created.info, now, {}), zone)

    def _created(
        self,
        visit: Visit,
        account_id: str,
        created: CreatedKey,
        shown: dict[str, Any],
        zone: ZoneInfo | None,
    ) -> Page:
        """The page of a new key: its row, its secret, and a ready ``curl`` line that calls
        the API with it; a tenant key's line names an organization (``default`` when the user
        reaches it, else one of the user's organizations in that tenant)."""
        headers = [f"Authorization: Bearer {created.secret}"]
        scope = created.info.scope
        if scope.organization_id is None:
            home = works_in(scope, self._keys.organizations_of(account_id))
            chosen = "default" if home is None or home.is_default else home.id
            headers.append(f"x-organization-id: {chosen}")
        url = self.api_url or visit.origin + "/managed-agents/v1/models"
        curl = shlex.join(["curl", *(arg for h in headers for arg in ("-H", h)), url])
        context = {"row": shown, "zone": zone, "secret": created.secret, "curl": curl}
        return render(visit, "created.html", 201, context)

    def _found(self, visit: Visit, account_id: str, *, form: str) -> Page:
        """The page of one of the account's keys (``?key=``) with a *form* token, or a 404."""
        keys = {info.key_id: info for info in self._keys.list(account_id)}
        info = keys.get(visit.query.get("key", ""))
        if info is None:
            return message(visit, 404, "No such key")
        context = {
            "row": self._row(info, self._keys.now(), keys),
            "zone": zone_named(visit.query.get("tz", "")),
            "token": self._guard.issue(account_id, form),
            "step_up": self._guard.step_up(visit, rotate_path(visit, info.key_id)),
        }
        return render(visit, f"{form}.html", 200, context)

    def _revoke(self, visit: Visit, account_id: str) -> Page:
        checked = self._guard.form(visit, account_id, "revoke")
        if isinstance(checked, Page):
            return checked
        key_id = checked[0].get("key", "")
        try:
            self._keys.revoke(account_id, key_id, by=_by(visit, account_id))
        except KeyNotFound:
            return message(visit, 404, "No such key")
        except KeyNotRevocable as exc:
            return message(visit, 409, "Already final", text=_sentence(str(exc)))
        return redirect(visit.base + "?" + urlencode({"revoked": key_id}))

    def _rotate(self, visit: Visit, account_id: str) -> Page:
        checked = self._guard.form(visit, account_id, "rotate")
        if isinstance(checked, Page):
            return checked
        form, nonce = checked
        revoke_old = form.get("revoke_old", "")
        if revoke_old not in ("", "1"):
            return message(visit, 400, "Unsupported form", account=None)
        rotate = partial(
            self._keys.rotate,
            account_id,
            form.get("key", ""),
            revoke_old_on_first_use=revoke_old == "1",
            by=_by(visit, account_id),
        )
        lost = (
            "The new key it created is in your list; its secret is shown only once. "
            "If you lost it, revoke that key and rotate again."
        )
        try:
            created = self._guard.once(visit, nonce, lost, rotate)
        except KeyNotFound:
            return message(visit, 404, "No such key")
        except (KeyNotRotatable, ScopeNotReachable) as exc:
            return message(visit, 409, "This key cannot be rotated", text=_sentence(str(exc)))
        if isinstance(created, Page):
            return created
        keys = {info.key_id: info for info in self._keys.list(account_id)}
        shown = self._row(created.info, self._keys.now(), keys)
        return self._created(visit, account_id, created, shown, zone_named(form.get("tz", "")))

    def _activity(self, visit: Visit, account_id: str) -> Page:
        """The record of the account's own keys: what was done, by whom, from where."""
        try:
            events = self._keys.activity(account_id, limit=ACTIVITY_LIMIT)
        except ActivityNotKept:
            return message(visit, 501, "No activity is kept")
        context = {
            "events": events,
            "zone": zone_named(visit.query.get("tz", "")),
            "limit": ACTIVITY_LIMIT,
        }
        return render(visit, "activity.html", 200, context)

    def _usage(
        self, account_id: str, now: datetime, key_ids: list[str]
    ) -> dict[str, KeyUsage] | None:
        """The counts of the account's keys *key_ids* over the chart's days (zeros for an
        unused one); ``None`` when the store keeps none."""
        first, last = window(now.date())
        rows = self._keys.usage_of(account_id, first)
        if rows is None:
            return None
        return by_key(rows, last_day=last, days=CHART_DAYS, key_ids=key_ids)


def _by(visit: Visit, account_id: str) -> By:
    """The signed-in user acting in the console, from the client the server saw."""
    return By.console(account_id, client_address=visit.client_address, user_agent=visit.user_agent)


def _sentence(message: str) -> str:
    return message[:1].upper() + message[1:] + ("" if message.endswith(".") else ".")
