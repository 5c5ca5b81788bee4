"""The console's pages, framework-free: a :class:`Visit` in, a :class:`Page` out. This decides.

Rules of this file:

1. The edges (:mod:`keyturn.console.asgi`, :mod:`keyturn.console.wsgi`,
   :mod:`keyturn.console.django`) turn their server's request into a :class:`Visit` and write
   the :class:`Page` back (both from :mod:`keyturn.console._visit`, so the ASGI and WSGI
   edges never import this file). They decide nothing about keys or pages -- only their
   server's plumbing: a mount point without its slash is redirected to it, a HEAD gets no
   body -- so all serve the same pages byte for byte (Django's says
   ``Referrer-Policy: same-origin``, which its CSRF check needs).
2. Every page carries :data:`HEADERS`: no caching, no inline script, no framing, no
   referrer. The two static files alone may be kept, revalidated on each use (``no-cache``).
3. A request carrying an API key is refused before anything else: a key can never create,
   list or revoke keys (spec section 1). Carrying means in any ``Authorization`` line, in any
   scheme (the gate's own reading, :func:`keyturn._core.decision.holds_key`), or having been
   authenticated by the API middleware, which strips the key before the console sees it.
4. Every POST passes two checks before it acts: it comes from this origin (``Origin``,
   ``Sec-Fetch-Site``) and it carries a form token issued to the same account; a host's own
   CSRF check (Django's) that refused it is heard too. The create form's token and the
   rotate form's work once, so a reload, a back-and-resubmit or a double click never makes
   a second key.
5. The secret of a new key appears in exactly one place: the body of the POST that created
   it (or rotated it). Never in a URL, a redirect, a cookie, a header or a log line.
6. The rules about names, lifetimes and dates are the library's (:mod:`keyturn._core.lifecycle`,
   :class:`~keyturn.Lifetime`): the page layer labels the lifetime choices and asks the
   library for a custom date's bounds and a choice's expiry (``_forms``), and this file
   turns its errors into messages. Neither sets a bound on a name, a lifetime or a date.
7. Creating and rotating mint a key that works for up to a year. When the host gives
   ``recently_authenticated``, their forms are shown, and their POSTs act, only on a visit
   whose sign-in the host calls recent (``Visit.recent_sign_in``); any other visit gets the
   host's ``reauthenticate_url`` with a ``next`` back to the same console page, a path on
   this origin (:func:`safe_next`). A refused POST creates nothing and says so. Revoking
   only takes power away: it needs no recent sign-in.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import shlex
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, timedelta
from functools import partial
from importlib import resources
from typing import Any, Final, Literal
from urllib.parse import urlencode

import anyio.from_thread
import attrs

from keyturn._core.decision import holds_key
from keyturn._core.lifecycle import validate_name
from keyturn._core.model import CreatedKey, KeyInfo, Organization, Principal, Scope, Status
from keyturn.activity import ActivityNotKept, By, KeyEvent
from keyturn.console._chart import CHART_DAYS, chart, window
from keyturn.console._forms import (
    FormTokens,
    expiry_choice,
    from_own_origin,
    preview,
    scope_choices,
    scope_label,
    scope_value,
    with_next,
    zone_named,
)
from keyturn.console._render import message, paired, render, time_left
from keyturn.console._visit import (
    HEADERS,
    ConsoleSetupError,
    Page,
    Visit,
    fields,
    needs_extra,
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
from keyturn.ratelimits import Rate, RateLimiter
from keyturn.usage import DailyUsage, KeyUsage, by_key

_log = logging.getLogger("keyturn.console")
StartOn = Literal["tenant", "organization"]
ACTIVITY_LIMIT: Final = 200  # events the Activity page shows at most
# A key that still works, older than this and not used for as long: "revoke it?"
UNUSED_FOR: Final = timedelta(days=30)


_STATIC: Final = {
    "/static/console.js": "text/javascript; charset=utf-8",
    "/static/console.css": "text/css; charset=utf-8",
    "/static/favicon.svg": "image/svg+xml",  # named by every page: no /favicon.ico lookup
}


class _Awaited:
    """An :class:`~keyturn.AsyncKeyManager` asked from the worker thread the ASGI edge runs
    a page in: each call runs on the event loop that owns the manager's pool."""

    def __init__(self, manager: AsyncKeyManager) -> None:
        self.manager = manager

    def _now(self) -> datetime:
        return self.manager._now()

    def list(self, account_id: str) -> list[KeyInfo]:
        return anyio.from_thread.run(self.manager.list, account_id)

    def create(self, account_id: str, **options: Any) -> CreatedKey:
        return anyio.from_thread.run(partial(self.manager.create, account_id, **options))

    def rotate(self, account_id: str, key_id: str, **options: Any) -> CreatedKey:
        return anyio.from_thread.run(partial(self.manager.rotate, account_id, key_id, **options))

    def revoke(self, account_id: str, key_id: str, **options: Any) -> KeyInfo:
        return anyio.from_thread.run(partial(self.manager.revoke, account_id, key_id, **options))

    def activity(self, account_id: str, **options: Any) -> Sequence[KeyEvent]:
        return anyio.from_thread.run(partial(self.manager.activity, account_id, **options))


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
        # The pages call the manager in a worker thread: an async one through the loop. The
        # questions that are no public operation go through its driver too (_ask): the
        # manager owns every question put to the store and the membership provider.
        self._keys: KeyManager | _Awaited
        self._ask: Callable[[Any], Any]
        if isinstance(manager, KeyManager):
            self._keys, self._ask = manager, manager._run
        else:
            self._keys = _Awaited(manager)
            self._ask = lambda flow: anyio.from_thread.run(manager._run, flow)
        # The usage charts, from a store that keeps counts (keyturn.protocols.UsageStore).
        self._usage_of: Callable[[str, date], Sequence[DailyUsage]] | None = None
        if manager.store_capabilities.has("usage_of"):
            self._usage_of = self._usage_rows
        self.signed_in = signed_in
        self.sign_in_url = sign_in_url
        self.start_on: StartOn = start_on
        self.current_organization = current_organization
        self.expiring_within = expiring_within
        self.recently_authenticated = recently_authenticated
        self.reauthenticate_url = reauthenticate_url
        self.api_url = api_url
        self.rate_limiter = rate_limiter
        self._tokens = FormTokens(secret or secrets.token_bytes(32))

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
        lines = (*visit.authorization, visit.headers.get("authorization", ""))
        if visit.by_key or holds_key(lines):
            return message(visit, 403, "API keys cannot manage keys", account=None)
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
            back = visit.base + visit.path[1:]
            if method != "GET":  # a form's page cannot be asked again: back to the list
                back = visit.base
            elif visit.query:
                back += "?" + urlencode(visit.query)
            return Page(303, (*HEADERS, ("Location", with_next(self.sign_in_url, back))), b"")
        handlers = routes[visit.path]
        if method not in handlers:
            allow = ("Allow", ", ".join(sorted({*handlers, "HEAD"})))
            return message(visit, 405, "Method not allowed", allow, account=None)
        if method == "POST":
            if not from_own_origin(visit.headers, visit.origin):
                return message(visit, 403, "Refused: another site sent this form")
            if visit.too_large:
                return message(visit, 413, "Form too large", account=None)
            content_type = visit.content_type.split(";")[0].strip().lower()
            if content_type != "application/x-www-form-urlencoded":
                return message(visit, 415, "Unsupported form", account=None)
            if visit.csrf_refused:
                return message(visit, 403, "This form has expired")
        try:
            return handlers[method](visit, visit.account_id)
        except Exception:
            # The store or the membership provider failed: say so, log it, never a bare 500.
            _log.exception("the key console could not answer %s %s", method, visit.path)
            return message(visit, 503, "Try again in a moment", ("Retry-After", "5"))

    def _now(self) -> datetime:
        return self._keys._now()

    def _keys_page(
        self,
        visit: Visit,
        account_id: str,
        form: Mapping[str, str] | None = None,
        errors: Mapping[str, str] | None = None,
    ) -> Page:
        """The list and the create form: fresh (*form* ``None``), or as sent with *errors*."""
        organizations = self._organizations_of(account_id)
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
        now = self._now()
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
        limits = self._limits(account_id, shown, organizations)
        context = {
            "values": values,
            "errors": defaultdict(str, errors or {}),
            "notice": notice,
            "scopes": [(value, label) for value, label, _ in choices],
            "preview": preview(values["lifetime"], values["date"], zone_name, now),
            "token": self._tokens.issue(account_id, "create"),
            "revoke_token": self._tokens.issue(account_id, "revoke"),
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
            "step_up": self._step_up(visit, visit.base),
        }
        return render(visit, "keys.html", 200 if form is None else 400, context)

    def _preview(self, visit: Visit, account_id: str) -> Page:
        lifetime, day, zone = (visit.query.get(f, "") for f in ("lifetime", "date", "tz"))
        shown = preview(lifetime, day, zone, self._now())
        body = json.dumps(shown.as_json()).encode()
        return Page(200, (*HEADERS, ("Content-Type", "application/json")), body)

    def _create(self, visit: Visit, account_id: str) -> Page:
        form = fields(visit.body)
        nonce = self._tokens.check(form.get("token", ""), account_id, "create")
        if nonce is None:
            return message(visit, 403, "This form has expired")
        step_up = self._step_up(visit, visit.base)
        if step_up is not None:
            return render(visit, "step_up.html", 403, {"step_up": step_up, "act": "create"})
        values = {f: form.get(f, "") for f in ("name", "lifetime", "date", "tz", "scope")}
        errors: dict[str, str] = {}
        try:
            name = validate_name(values["name"])
        except InvalidKeyName as exc:
            errors["name"] = _sentence(str(exc))
        now = self._now()
        zone = zone_named(values["tz"])
        problem = preview(values["lifetime"], values["date"], values["tz"], now).problem
        if problem is not None:
            custom_field = "date" if zone else "tz"
            errors[custom_field if values["lifetime"] == "custom" else "lifetime"] = problem
        choices = scope_choices(self._organizations_of(account_id))
        scope = {value: scope for value, _, scope in choices}.get(values["scope"])
        if scope is None:
            errors["scope"] = "Choose a scope: your tenant or one of your organizations."
        if errors:
            return self._keys_page(visit, account_id, values, errors)
        choice = expiry_choice(values["lifetime"], values["date"], zone)
        assert not isinstance(choice, str)
        assert scope is not None
        if not self._tokens.consume(nonce):
            return message(
                visit,
                409,
                "This form was already sent",
                text="The key it created is in your list; its secret is shown only once. "
                "If you lost it, revoke that key and create a new one.",
            )
        try:
            created = self._keys.create(
                account_id, name=name, scope=scope, expiry=choice, by=_by(visit, account_id)
            )
        except BaseException as exc:
            self._tokens.release(nonce)  # nothing was created: the same form may be sent again
            if not isinstance(exc, InvalidExpiry | ScopeNotReachable):
                raise
            errors["scope" if isinstance(exc, ScopeNotReachable) else "date"] = _sentence(str(exc))
            return self._keys_page(visit, account_id, values, errors)
        row = self._row(created.info, now, {})
        context = {"row": row, "zone": zone, **self._secret(visit, account_id, created)}
        return render(visit, "created.html", 201, context)

    def _secret(self, visit: Visit, account_id: str, created: CreatedKey) -> dict[str, str]:
        """What the page of a new key shows: its secret, and a ready ``curl`` line that calls
        the API with it; a tenant key's line names an organization (``default`` when the user
        reaches it, else one of the user's organizations in that tenant)."""
        headers = [f"Authorization: Bearer {created.secret}"]
        scope = created.info.scope
        if scope.organization_id is None:
            home = _works_in(scope, self._organizations_of(account_id))
            chosen = "default" if home is None or home.is_default else home.id
            headers.append(f"x-organization-id: {chosen}")
        url = self.api_url or visit.origin + "/managed-agents/v1/models"
        curl = shlex.join(["curl", *(arg for h in headers for arg in ("-H", h)), url])
        return {"secret": created.secret, "curl": curl}

    def _found(self, visit: Visit, account_id: str, *, form: str) -> Page:
        """The page of one of the account's keys (``?key=``) with a *form* token, or a 404."""
        keys = {info.key_id: info for info in self._keys.list(account_id)}
        info = keys.get(visit.query.get("key", ""))
        if info is None:
            return message(visit, 404, "No such key")
        context = {
            "row": self._row(info, self._now(), keys),
            "zone": zone_named(visit.query.get("tz", "")),
            "token": self._tokens.issue(account_id, form),
            "step_up": self._step_up(visit, _rotate_path(visit, info.key_id)),
        }
        return render(visit, f"{form}.html", 200, context)

    def _revoke(self, visit: Visit, account_id: str) -> Page:
        form = fields(visit.body)
        nonce = self._tokens.check(form.get("token", ""), account_id, "revoke")
        if nonce is None:
            return message(visit, 403, "This form has expired")
        key_id = form.get("key", "")
        try:
            self._keys.revoke(account_id, key_id, by=_by(visit, account_id))
        except KeyNotFound:
            return message(visit, 404, "No such key")
        except KeyNotRevocable as exc:
            return message(visit, 409, "Already final", text=_sentence(str(exc)))
        location = visit.base + "?" + urlencode({"revoked": key_id})
        return Page(303, (*HEADERS, ("Location", location)), b"")

    def _rotate(self, visit: Visit, account_id: str) -> Page:
        form = fields(visit.body)
        nonce = self._tokens.check(form.get("token", ""), account_id, "rotate")
        if nonce is None:
            return message(visit, 403, "This form has expired")
        step_up = self._step_up(visit, _rotate_path(visit, form.get("key", "")))
        if step_up is not None:
            return render(visit, "step_up.html", 403, {"step_up": step_up, "act": "rotate"})
        revoke_old = form.get("revoke_old", "")
        if revoke_old not in ("", "1"):
            return message(visit, 400, "Unsupported form", account=None)
        if not self._tokens.consume(nonce):
            return message(
                visit,
                409,
                "This form was already sent",
                text="The new key it created is in your list; its secret is shown only once. "
                "If you lost it, revoke that key and rotate again.",
            )
        try:
            created = self._keys.rotate(
                account_id,
                form.get("key", ""),
                revoke_old_on_first_use=revoke_old == "1",
                by=_by(visit, account_id),
            )
        except BaseException as exc:
            self._tokens.release(nonce)  # nothing was created: the same form may be sent again
            if isinstance(exc, KeyNotFound):
                return message(visit, 404, "No such key")
            if not isinstance(exc, KeyNotRotatable | ScopeNotReachable):
                raise
            text = _sentence(str(exc))
            return message(visit, 409, "This key cannot be rotated", text=text)
        keys = {info.key_id: info for info in self._keys.list(account_id)}
        context = {
            "row": self._row(created.info, self._now(), keys),
            "zone": zone_named(form.get("tz", "")),
            **self._secret(visit, account_id, created),
        }
        return render(visit, "created.html", 201, context)

    def _step_up(self, visit: Visit, back: str) -> str | None:
        """``None`` when the visit may mint a key (no step-up asked, or a recent sign-in),
        else the host's ``reauthenticate_url`` with ``next`` set to *back*, a page of this
        console: left out if the mount point makes it no local path (:func:`safe_next`)."""
        if self.reauthenticate_url is None or visit.recent_sign_in:
            return None
        return with_next(self.reauthenticate_url, back)

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

    def _organizations_of(self, account_id: str) -> Sequence[Organization]:
        found: Sequence[Organization] = self._ask(self.manager._organizations_of(account_id))
        return found

    def _role_of(self, account_id: str, organization_id: str) -> str | None:
        role: str | None = self._ask(self.manager._role_of(account_id, organization_id))
        return role

    def _usage_rows(self, account_id: str, since: date) -> Sequence[DailyUsage]:
        rows: Sequence[DailyUsage] = self._ask(self.manager._usage(account_id, since))
        return rows

    def _usage(
        self, account_id: str, now: datetime, key_ids: Sequence[str]
    ) -> dict[str, KeyUsage] | None:
        """The counts of the account's keys *key_ids* over the chart's days (zeros for an
        unused one); ``None`` when the store keeps none."""
        if self._usage_of is None:
            return None
        first, last = window(now.date())
        rows = self._usage_of(account_id, first)
        return by_key(rows, last_day=last, days=CHART_DAYS, key_ids=key_ids)

    def _limits(
        self, account_id: str, infos: Sequence[KeyInfo], organizations: Sequence[Organization]
    ) -> Limits:
        """The limits of the Active keys among *infos* and their use now, as the rows show
        them; nothing without a limiter. Each key is read as the principal of a request in
        the organization it works in by default (:func:`_works_in`)."""
        limiter = self.rate_limiter
        if limiter is None:
            return Limits()
        roles: dict[str, str | None] = {}
        principals: dict[str, Principal] = {}
        for info in infos:
            home = _works_in(info.scope, organizations)
            if info.status is not Status.ACTIVE or home is None:
                continue
            if home.id not in roles:
                roles[home.id] = self._role_of(account_id, home.id)
            role = roles[home.id]
            if role is not None:
                principals[info.key_id] = Principal(
                    account_id=account_id,
                    key_id=info.key_id,
                    key_name=info.name,
                    scope=info.scope,
                    organization_id=home.id,
                    tenant_id=home.tenant_id,
                    role=role,
                    expires_at=info.expires_at,
                )
        try:
            uses = limiter.uses_of(list(principals.values()))
        except Exception as exc:  # the engine is down or slow: the limits, without their use
            _log.warning(
                "the key console could not read rate limit use from %s (%s)",
                type(limiter.engine).__name__,
                type(exc).__name__,
            )
            rows = {
                key_id: [
                    _limit(name, rate, None, principal) for name, rate in _rates(limiter, principal)
                ]
                for key_id, principal in principals.items()
            }
            return Limits(rows=rows, unread=True, shared=limiter.engine.shared)
        rows = {
            key_id: [_limit(use.policy, use.rate, use.used, principal) for use in used]
            for (key_id, principal), used in zip(principals.items(), uses, strict=True)
        }
        return Limits(rows=rows, shared=limiter.engine.shared, slack=f"{limiter.slack:.0%}")

    def _row(
        self,
        info: KeyInfo,
        now: datetime,
        keys: Mapping[str, KeyInfo],
        usage: Mapping[str, KeyUsage] | None = None,
    ) -> dict[str, Any]:
        """One key as the templates show it: with its expiry warning, its usage chart (from
        *usage*, when given) and, from *keys* (the account's keys by id), the other key of
        its rotation."""
        new = keys.get(info.replaced_by or "")
        left = info.expires_at - now
        expiring = info.status in (Status.ACTIVE, Status.INACTIVE) and left <= self.expiring_within
        counts = None if usage is None else usage.get(info.key_id)
        if counts is not None and not counts.total_accepted + counts.total_refused:
            counts = None  # nothing to draw: "Last used" says enough
        return {
            "info": info,
            "old": keys.get(info.replaces or ""),
            "new": new,
            "expiring": f"expires in {time_left(left)}" if expiring else None,
            "chart": None if counts is None else chart(info.name, counts),
            # Still works, has existed long enough to have been used, and nobody used it.
            "unused": info.status.revocable
            and now - info.created_at >= UNUSED_FOR
            and (info.last_used_at is None or now - info.last_used_at >= UNUSED_FOR),
            # Only hides the Rotate button the library would refuse: an Active key whose
            # replacement, if any, no longer works.
            "rotatable": info.status is Status.ACTIVE and (new is None or not new.status.revocable),
        }


@attrs.frozen(kw_only=True)
class Limits:
    """What the key list shows of rate limits: per Active key id, its limits (an empty
    list: none applies; no entry: no limiter, or a key that makes no request), and
    whether their use could be read and whose requests it counts."""

    rows: Mapping[str, list[dict[str, Any]]] = attrs.field(factory=dict)
    unread: bool = False  # the engine did not answer: limits without their use
    shared: bool = False  # the counts are every instance's, not this process's
    slack: str = ""  # how far a shared count may run ahead of the requests served: "5%"


_POLICY_LABELS: Final = {"key": "Key", "account": "Account", "organization": "Organization"}


def _works_in(scope: Scope, organizations: Sequence[Organization]) -> Organization | None:
    """The organization the console takes a key of *scope* to be used in (its ``curl``
    line's, its limits'): an organization key's own; for a tenant key, whose requests name
    theirs, the tenant's default organization when the account reaches it, else the
    account's first one there. ``None``: the account reaches none of them."""
    reached = [o for o in organizations if o.tenant_id == scope.tenant_id]
    if scope.organization_id is not None:
        return next((o for o in reached if o.id == scope.organization_id), None)
    return next((o for o in reached if o.is_default), reached[0] if reached else None)


def _rates(limiter: RateLimiter, principal: Principal) -> list[tuple[str, Rate]]:
    limits = limiter.limits_of(principal)
    if limits is None:
        return []
    named = (
        ("key", limits.key),
        ("account", limits.account),
        ("organization", limits.organization),
    )
    return [(name, rate) for name, rate in named if rate is not None]


def _limit(name: str, rate: Rate, used: int | None, principal: Principal) -> dict[str, Any]:
    """One policy as a row shows it: "Key: 37 of 100 a minute"."""
    label = _POLICY_LABELS[name]
    if name == "organization":
        label += f" {principal.organization_id}"
    return {
        "label": label,
        "quota": rate.quota,
        "per": per_window(rate.window),
        "used": used,
        "high": math.ceil(rate.quota * 0.8),  # the meter turns from "fine" to "nearly spent"
    }


def per_window(seconds: int) -> str:
    """A window in words: ``a minute``, ``per 5 minutes``, ``per 90 seconds``."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds % size == 0:
            count = seconds // size
            if count == 1:
                return ("an " if unit == "hour" else "a ") + unit
            return f"per {count:,} {unit}s"
    raise AssertionError("every whole number of seconds is whole seconds")


def _rotate_path(visit: Visit, key_id: str) -> str:
    return visit.base + "rotate?" + urlencode({"key": key_id})


def _by(visit: Visit, account_id: str) -> By:
    """The signed-in user acting in the console, from the client the server saw."""
    return By.console(account_id, client_address=visit.client_address, user_agent=visit.user_agent)


def _sentence(message: str) -> str:
    return message[:1].upper() + message[1:] + ("" if message.endswith(".") else ".")
