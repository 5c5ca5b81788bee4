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
   scheme (the gate's own reading, :func:`keyturn._decision.holds_key`), or having been
   authenticated by the API middleware, which strips the key before the console sees it.
4. Every POST passes two checks before it acts: it comes from this origin (``Origin``,
   ``Sec-Fetch-Site``) and it carries a form token issued to the same account; a host's own
   CSRF check (Django's) that refused it is heard too. The create form's token and the
   rotate form's work once, so a reload, a back-and-resubmit or a double click never makes
   a second key.
5. The secret of a new key appears in exactly one place: the body of the POST that created
   it (or rotated it). Never in a URL, a redirect, a cookie, a header or a log line.
6. The rules about names, lifetimes and dates are the library's (:mod:`keyturn._lifecycle`,
   :class:`~keyturn.Lifetime`): this file labels the lifetime choices
   (:data:`LIFETIME_CHOICES`), asks the library for a custom date's bounds and a choice's
   expiry, and turns its errors into messages. It sets no bound on a name, a lifetime or a
   date itself.
7. Creating and rotating mint a key that works for up to a year. When the host gives
   ``recently_authenticated``, their forms are shown, and their POSTs act, only on a visit
   whose sign-in the host calls recent (``Visit.recent_sign_in``); any other visit gets the
   host's ``reauthenticate_url`` with a ``next`` back to the same console page, a path on
   this origin (:func:`safe_next`). A refused POST creates nothing and says so. Revoking
   only takes power away: it needs no recent sign-in.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import re
import secrets
import shlex
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import urlencode, urlsplit, urlunsplit
from zoneinfo import TZPATH, ZoneInfo, available_timezones

import anyio.from_thread
import attrs
import jinja2
import markupsafe

from keyturn._decision import holds_key
from keyturn._fork import renew_in_child
from keyturn._lifecycle import MAX_NAME_LENGTH, custom_date_bounds, expiry_for, validate_name
from keyturn._model import CreatedKey, CustomDate, KeyInfo, Lifetime, Organization, Scope, Status
from keyturn.activity import Action, ActivityNotKept, By, Channel, KeyEvent
from keyturn.console._chart import CHART_DAYS, chart, window
from keyturn.console._visit import (
    HEADERS,
    MAX_FORM_BYTES,
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
from keyturn.usage import DailyUsage, KeyUsage, by_key

_log = logging.getLogger("keyturn.console")
StartOn = Literal["tenant", "organization"]
Header = tuple[str, str]

FORM_TOKEN_TTL: Final = 12 * 3600  # seconds a form stays usable
ACTIVITY_LIMIT: Final = 200  # events the Activity page shows at most
# A key that still works, older than this and not used for as long: "revoke it?"
UNUSED_FOR: Final = timedelta(days=30)


def _spoken(lifetime: Lifetime) -> str:
    """A lifetime's short form in words: ``3h`` is "3 hours", ``1d`` "1 day"."""
    amount, unit = int(lifetime.label[:-1]), {"h": "hour", "d": "day"}[lifetime.label[-1]]
    return f"{amount} {unit}" + ("" if amount == 1 else "s")


# The library's lifetimes, each under its short form and in words, then a custom date.
LIFETIME_CHOICES: Final[Sequence[tuple[str, str, Lifetime | None]]] = (
    *((lifetime.label, _spoken(lifetime), lifetime) for lifetime in Lifetime),
    ("custom", "Custom date", None),
)
_LIFETIMES: Final = {code: lifetime for code, _, lifetime in LIFETIME_CHOICES}


def _links() -> frozenset[str]:
    """The zone names that are aliases (``L`` lines of ``tzdata.zi``), from the system's time
    zone data or the ``tzdata`` package; none where neither has that file."""
    places: list[Any] = [Path(folder, "tzdata.zi") for folder in TZPATH]
    with contextlib.suppress(ModuleNotFoundError):
        places.append(resources.files("tzdata.zoneinfo").joinpath("tzdata.zi"))
    for index in places:
        if index.is_file():
            lines = index.read_text(encoding="utf-8").splitlines()
            return frozenset(line.split()[2] for line in lines if line.startswith("L "))
    return frozenset()


KNOWN_ZONES: Final = frozenset(z for z in available_timezones() if "/" in z or z == "UTC")
# The time zone list offers canonical zones only (no aliases such as Asia/Calcutta or
# US/Pacific, nor the sign-inverted Etc/GMT+5); a browser that names an alias still gets
# it, first in the list, and the server accepts every zone it knows.
ZONES: Final = tuple(
    sorted({"UTC", *(z for z in KNOWN_ZONES - _links() if not z.startswith("Etc/"))})
)
_STATUS_MARKS: Final = {
    Status.ACTIVE: "✓",
    Status.INACTIVE: "‖",
    Status.EXPIRED: "○",
    Status.REVOKED: "✕",
}
_STATIC: Final = {
    "/static/console.js": "text/javascript; charset=utf-8",
    "/static/console.css": "text/css; charset=utf-8",
    "/static/favicon.svg": "image/svg+xml",  # named by every page: no /favicon.ico lookup
}

_TEXTS: Final = {  # the message pages' texts, by title
    "API keys cannot manage keys": (
        "An API key can only call the agents API. Sign in to this console to create, list or "
        "revoke keys."
    ),
    "Not found": "There is no such console page.",
    "Method not allowed": "Use the console's forms.",
    "Refused: another site sent this form": (
        "The console only accepts forms sent from its own pages."
    ),
    "Form too large": "That form is too large.",
    "Unsupported form": "Send the console's form.",
    "This form has expired": "Nothing was changed. Go back to your keys and send the form again.",
    "No such key": "You have no key with that id.",
    "No activity is kept": "This service's key store keeps no record of key actions.",
    "Try again in a moment": (
        "Your keys cannot be reached right now. If you were creating a key, look for it in "
        "your list before creating it again."
    ),
}


def safe_next(target: object, default: str = "/") -> str:
    """*target* if it is a path on this site (``/console/rotate?key=...``), else *default*.

    For the ``next`` parameter a sign-in page redirects to: anything that could take a
    browser to another site gives *default* -- a scheme (``https:``, ``javascript:``), a
    network path (``//host``), a backslash (browsers read it as a slash), or a character
    that is not printable (browsers drop tabs and line breaks: a tab between two slashes is
    ``//host`` to them).
    """
    if (
        isinstance(target, str)
        and target.startswith("/")
        and not target.startswith("//")
        and "\\" not in target
        and target.isprintable()
    ):
        return target
    return default


def from_own_origin(headers: Mapping[str, str], origin: str) -> bool:
    """Whether a form POST says it comes from *origin* (``Origin``, ``Sec-Fetch-Site``;
    *headers* with lower-case names). A POST with neither header is refused: fail closed.
    """
    sent = headers.get("origin")
    site = headers.get("sec-fetch-site")
    if sent is None and site is None:
        return False
    # Under Referrer-Policy: no-referrer a browser sends "Origin: null" with its own forms,
    # so "null" is accepted only where Sec-Fetch-Site vouches for the origin.
    if sent is not None and sent not in (origin, "null"):
        return False
    if sent == "null" and site is None:
        return False
    return site is None or site in ("same-origin", "none")


@attrs.frozen(kw_only=True)
class Preview:
    """What the create form shows for a lifetime choice: date bounds, expiry, or a problem."""

    first_day: date | None  # the custom date bounds in the zone, when the zone is known
    last_day: date | None
    expires: str | None  # the resulting expiry, in the zone (else in UTC)
    problem: str | None

    def as_json(self) -> dict[str, str | None]:
        return {
            "min": self.first_day.isoformat() if self.first_day else None,
            "max": self.last_day.isoformat() if self.last_day else None,
            "expires": self.expires,
            "problem": self.problem,
        }


def _zone(name: str) -> ZoneInfo | None:
    return ZoneInfo(name) if name in KNOWN_ZONES else None


def local_time(at: datetime, zone: ZoneInfo | None) -> str:
    """*at* as the console shows it, in *zone* or else in UTC: ``2026-03-09 08:30 PDT``, and
    a midnight as the end of the day before, ``2027-01-15, end of day CET`` (a custom date
    expires at the end of the day the user picked, which is the next day's first instant)."""
    local = at.astimezone(zone or UTC)
    if (local.hour, local.minute, local.second, local.microsecond) == (0, 0, 0, 0):
        return f"{local.date() - timedelta(days=1)}, end of day {local.strftime('%Z')}"
    return local.strftime("%Y-%m-%d %H:%M %Z")


def _expiry_choice(lifetime: str, day: str, zone: ZoneInfo | None) -> Lifetime | CustomDate | str:
    """The expiry the create form's raw values choose, or what is missing from them."""
    if lifetime not in _LIFETIMES:
        return "Choose a lifetime."
    fixed = _LIFETIMES[lifetime]
    if fixed is not None:
        return fixed
    if zone is None:
        return "Choose your time zone: a custom date ends at midnight there."
    if not day:
        return "Choose the custom expiry date."
    try:
        return CustomDate(date.fromisoformat(day), zone)
    except ValueError:
        return "Enter the custom date as YYYY-MM-DD."


def preview(lifetime: str, day: str, time_zone: str, now: datetime) -> Preview:
    """The view data of the create form's lifetime part, from the form's raw values."""
    zone = _zone(time_zone)
    first, last = custom_date_bounds(now, zone) if zone else (None, None)
    choice = _expiry_choice(lifetime, day, zone)
    if isinstance(choice, str):
        return Preview(first_day=first, last_day=last, expires=None, problem=choice)
    try:
        expires = local_time(expiry_for(choice, now), zone)
    except InvalidExpiry:
        problem = f"Choose a date from {first} to {last}."
        return Preview(first_day=first, last_day=last, expires=None, problem=problem)
    return Preview(first_day=first, last_day=last, expires=expires, problem=None)


def _scope_value(scope: Scope) -> str:
    return f"{scope.kind.value}:{scope.organization_id or scope.tenant_id}"


def _scope_label(scope: Scope) -> str:
    return f"{scope.kind.value.title()} {scope.organization_id or scope.tenant_id}"


def _scope_choices(organizations: Sequence[Organization]) -> list[tuple[str, str, Scope]]:
    """Tenants first, each followed by its organizations: ``(value, label, scope)``."""
    choices: list[tuple[str, str, Scope]] = []
    for tenant in dict.fromkeys(org.tenant_id for org in organizations):
        scope = Scope.tenant(tenant)
        choices.append((_scope_value(scope), f"Tenant {tenant} (every organization)", scope))
        for org in organizations:
            if org.tenant_id == tenant:
                scope = Scope.organization(org.id, tenant_id=tenant)
                label = f"Organization {org.id}" + (" (default)" if org.is_default else "")
                choices.append((_scope_value(scope), label, scope))
    return choices


class _FormTokens:
    """Form tokens: HMAC-signed for one account and one form; create tokens work once."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._used: dict[str, float] = {}  # nonce -> when it may be forgotten
        self._lock = threading.Lock()
        renew_in_child(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork

    def _mac(self, account_id: str, form: str, body: str) -> str:
        message = f"{form}\0{account_id}\0{body}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def issue(self, account_id: str, form: str) -> str:
        body = f"{secrets.token_urlsafe(16)}.{int(time.time())}"
        return f"{body}.{self._mac(account_id, form, body)}"

    def check(self, token: str, account_id: str, form: str) -> str | None:
        """The token's nonce if it is genuine and fresh, else ``None``."""
        nonce, _, rest = token.partition(".")
        issued, _, mac = rest.partition(".")
        # compare_digest refuses non-ASCII text: such a token is forged, not a fault.
        if not (nonce and issued.isdigit() and mac and rest.isascii()):
            return None
        if not hmac.compare_digest(mac, self._mac(account_id, form, f"{nonce}.{issued}")):
            return None
        return nonce if 0 <= time.time() - int(issued) <= FORM_TOKEN_TTL else None

    def consume(self, nonce: str) -> bool:
        """Mark *nonce* used; ``False`` if it already was."""
        now = time.time()
        with self._lock:
            self._used = {n: until for n, until in self._used.items() if until >= now}
            if nonce in self._used:
                return False
            self._used[nonce] = now + FORM_TOKEN_TTL + 60
            return True

    def release(self, nonce: str) -> None:
        with self._lock:
            self._used.pop(nonce, None)


_AGENT_BROWSERS: Final = (
    ("Edg/", "Edge"),
    ("OPR/", "Opera"),
    ("Firefox/", "Firefox"),
    ("Chrome/", "Chrome"),
    ("Version/", "Safari"),
)
_AGENT_SYSTEMS: Final = (
    ("Android", "Android"),
    ("iPhone", "iOS"),
    ("iPad", "iPadOS"),
    ("Windows", "Windows"),
    ("Mac OS X", "macOS"),
    ("CrOS", "ChromeOS"),
    ("Linux", "Linux"),
)


def short_agent(agent: str) -> str:
    """A ``User-Agent`` as a person names it: ``Firefox 132 on Linux`` for a browser, the first
    product (``curl/8.5.0``) for anything else, at most 60 characters."""
    if agent.startswith("Mozilla/"):
        browser = next(
            ((name, marker) for marker, name in _AGENT_BROWSERS if marker in agent), None
        )
        system = next((name for marker, name in _AGENT_SYSTEMS if marker in agent), None)
        if browser is not None:
            name, marker = browser
            version = re.match(r"\d+", agent.split(marker, 1)[1])
            shown = f"{name} {version[0]}" if version else name
            return f"{shown} on {system}" if system else shown
    first = agent.split(" ", 1)[0]
    return first if len(first) <= 60 else first[:59] + "…"


@jinja2.pass_context
def _time(context: jinja2.runtime.Context, at: datetime) -> markupsafe.Markup:
    """*at* as a ``<time>`` element: the exact instant, shown in the page's ``zone``."""
    element = markupsafe.Markup('<time datetime="{}">{}</time>')
    return element.format(at.isoformat(), local_time(at, context["zone"]))


_TEMPLATES: Final = jinja2.Environment(
    loader=jinja2.PackageLoader("keyturn.console", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_TEMPLATES.globals.update(
    lifetimes=[(code, label) for code, label, _ in LIFETIME_CHOICES],
    zones=ZONES,
    max_name=MAX_NAME_LENGTH,
    statuses=[status.value for status in Status],
    marks=_STATUS_MARKS,
    time=_time,
    action_labels={
        Action.CREATED: "Created",
        Action.ROTATED: "Created by rotation",
        Action.REVOKED: "Revoked",
        Action.AUTO_REVOKED: "Revoked automatically",
        Action.LEAK_REPORTED: "Reported leaked",
        Action.NOTICE_SENT: "Notice sent",
    },
    channel_labels={
        Channel.CONSOLE: "console",
        Channel.CLI: "keyturn command",
        Channel.LEAK_ENDPOINT: "secret scanning",
        Channel.LIBRARY: "this service",
    },
)
_TEMPLATES.filters["scope_label"] = _scope_label
_TEMPLATES.filters["short_agent"] = short_agent


class _Awaited:
    """An :class:`~keyturn.AsyncKeyManager` asked from the worker thread the ASGI edge runs
    a page in: each call runs on the event loop that owns the manager's pool."""

    def __init__(self, manager: AsyncKeyManager) -> None:
        self.manager = manager

    def _now(self) -> datetime:
        return self.manager._now()

    def organizations_of(self, account_id: str) -> Sequence[Organization]:
        found: Sequence[Organization] = anyio.from_thread.run(
            self.manager.membership.organizations_of, account_id
        )
        return found

    def list(self, account_id: str) -> list[KeyInfo]:
        return anyio.from_thread.run(self.manager.list, account_id)

    def usage_of(self, account_id: str, since: date) -> Sequence[DailyUsage]:
        found: Sequence[DailyUsage] = anyio.from_thread.run(
            self.manager.store.usage_of, account_id, since
        )
        return found

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
        # The pages call the manager in a worker thread: an async one through the loop.
        self._keys: KeyManager | _Awaited
        self._organizations_of: Callable[[str], Sequence[Organization]]
        if isinstance(manager, KeyManager):
            self._keys, self._organizations_of = manager, self.membership.organizations_of
        else:
            self._keys = _Awaited(manager)
            self._organizations_of = self._keys.organizations_of
        # The usage charts, from a store that keeps counts (keyturn.protocols.UsageStore).
        self._usage_of: Callable[[str, date], Sequence[DailyUsage]] | None = None
        if callable(getattr(manager.store, "usage_of", None)):
            self._usage_of = (
                self._keys.usage_of if isinstance(self._keys, _Awaited) else manager.store.usage_of
            )
        self.signed_in = signed_in
        self.sign_in_url = sign_in_url
        self.start_on: StartOn = start_on
        self.current_organization = current_organization
        self.expiring_within = expiring_within
        self.recently_authenticated = recently_authenticated
        self.reauthenticate_url = reauthenticate_url
        self.api_url = api_url
        self._tokens = _FormTokens(secret or secrets.token_bytes(32))

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
            return self._message(visit, 403, "API keys cannot manage keys", account=None)
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
            return self._message(visit, 404, "Not found", account=None)
        if visit.account_id is None:
            back = visit.base + visit.path[1:]
            if method != "GET":  # a form's page cannot be asked again: back to the list
                back = visit.base
            elif visit.query:
                back += "?" + urlencode(visit.query)
            return Page(303, (*HEADERS, ("Location", _with_next(self.sign_in_url, back))), b"")
        handlers = routes[visit.path]
        if method not in handlers:
            allow = ("Allow", ", ".join(sorted({*handlers, "HEAD"})))
            return self._message(visit, 405, "Method not allowed", allow, account=None)
        if method == "POST":
            if not from_own_origin(visit.headers, visit.origin):
                return self._message(visit, 403, "Refused: another site sent this form")
            if len(visit.body) > MAX_FORM_BYTES:
                return self._message(visit, 413, "Form too large", account=None)
            content_type = visit.content_type.split(";")[0].strip().lower()
            if content_type != "application/x-www-form-urlencoded":
                return self._message(visit, 415, "Unsupported form", account=None)
            if visit.csrf_refused:
                return self._message(visit, 403, "This form has expired")
        try:
            return handlers[method](visit, visit.account_id)
        except Exception:
            # The store or the membership provider failed: say so, log it, never a bare 500.
            _log.exception("the key console could not answer %s %s", method, visit.path)
            return self._message(visit, 503, "Try again in a moment", ("Retry-After", "5"))

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
        choices = _scope_choices(self._organizations_of(account_id))
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
        zone = _zone(zone_name)
        now = self._now()
        every_key = self._keys.list(account_id)
        scopes = dict.fromkeys([*(s for _, _, s in choices), *(i.scope for i in every_key)])
        wanted_scope = next(
            (s for s in scopes if _scope_value(s) == visit.query.get("scope")), None
        )
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
        context = {
            "values": values,
            "errors": defaultdict(str, errors or {}),
            "notice": notice,
            "scopes": [(value, label) for value, label, _ in choices],
            "preview": preview(values["lifetime"], values["date"], zone_name, now),
            "token": self._tokens.issue(account_id, "create"),
            "revoke_token": self._tokens.issue(account_id, "revoke"),
            "rows": [self._row(info, now, by_id, usage) for info in _paired(shown)],
            "chart_days": CHART_DAYS,
            "zone": zone,
            "total": len(every_key),
            "filters": {
                "status": wanted_status.value if wanted_status else "",
                "scope": _scope_value(wanted_scope) if wanted_scope else "",
            },
            "filter_scopes": [(_scope_value(s), _scope_label(s)) for s in scopes],
            "tz_param": zone.key if zone and visit.query.get("tz") else "",
            "step_up": self._step_up(visit, visit.base),
        }
        return self._render(visit, "keys.html", 200 if form is None else 400, context)

    def _preview(self, visit: Visit, account_id: str) -> Page:
        lifetime, day, zone = (visit.query.get(f, "") for f in ("lifetime", "date", "tz"))
        shown = preview(lifetime, day, zone, self._now())
        body = json.dumps(shown.as_json()).encode()
        return Page(200, (*HEADERS, ("Content-Type", "application/json")), body)

    def _create(self, visit: Visit, account_id: str) -> Page:
        form = fields(visit.body)
        nonce = self._tokens.check(form.get("token", ""), account_id, "create")
        if nonce is None:
            return self._message(visit, 403, "This form has expired")
        step_up = self._step_up(visit, visit.base)
        if step_up is not None:
            return self._render(visit, "step_up.html", 403, {"step_up": step_up, "act": "create"})
        values = {f: form.get(f, "") for f in ("name", "lifetime", "date", "tz", "scope")}
        errors: dict[str, str] = {}
        try:
            name = validate_name(values["name"])
        except InvalidKeyName as exc:
            errors["name"] = _sentence(str(exc))
        now = self._now()
        zone = _zone(values["tz"])
        problem = preview(values["lifetime"], values["date"], values["tz"], now).problem
        if problem is not None:
            custom_field = "date" if zone else "tz"
            errors[custom_field if values["lifetime"] == "custom" else "lifetime"] = problem
        choices = _scope_choices(self._organizations_of(account_id))
        scope = {value: scope for value, _, scope in choices}.get(values["scope"])
        if scope is None:
            errors["scope"] = "Choose a scope: your tenant or one of your organizations."
        if errors:
            return self._keys_page(visit, account_id, values, errors)
        choice = _expiry_choice(values["lifetime"], values["date"], zone)
        assert not isinstance(choice, str)
        assert scope is not None
        if not self._tokens.consume(nonce):
            return self._message(
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
        return self._render(visit, "created.html", 201, context)

    def _secret(self, visit: Visit, account_id: str, created: CreatedKey) -> dict[str, str]:
        """What the page of a new key shows: its secret, and a ready ``curl`` line that calls
        the API with it; a tenant key's line names an organization (``default`` when the user
        reaches it, else one of the user's organizations in that tenant)."""
        headers = [f"Authorization: Bearer {created.secret}"]
        scope = created.info.scope
        if scope.organization_id is None:
            reached = [
                o for o in self._organizations_of(account_id) if o.tenant_id == scope.tenant_id
            ]
            chosen = (
                "default" if any(o.is_default for o in reached) or not reached else reached[0].id
            )
            headers.append(f"x-organization-id: {chosen}")
        url = self.api_url or visit.origin + "/managed-agents/v1/models"
        curl = shlex.join(["curl", *(arg for h in headers for arg in ("-H", h)), url])
        return {"secret": created.secret, "curl": curl}

    def _found(self, visit: Visit, account_id: str, *, form: str) -> Page:
        """The page of one of the account's keys (``?key=``) with a *form* token, or a 404."""
        keys = {info.key_id: info for info in self._keys.list(account_id)}
        info = keys.get(visit.query.get("key", ""))
        if info is None:
            return self._message(visit, 404, "No such key")
        context = {
            "row": self._row(info, self._now(), keys),
            "zone": _zone(visit.query.get("tz", "")),
            "token": self._tokens.issue(account_id, form),
            "step_up": self._step_up(visit, _rotate_path(visit, info.key_id)),
        }
        return self._render(visit, f"{form}.html", 200, context)

    def _revoke(self, visit: Visit, account_id: str) -> Page:
        form = fields(visit.body)
        nonce = self._tokens.check(form.get("token", ""), account_id, "revoke")
        if nonce is None:
            return self._message(visit, 403, "This form has expired")
        key_id = form.get("key", "")
        try:
            self._keys.revoke(account_id, key_id, by=_by(visit, account_id))
        except KeyNotFound:
            return self._message(visit, 404, "No such key")
        except KeyNotRevocable as exc:
            return self._message(visit, 409, "Already final", text=_sentence(str(exc)))
        location = visit.base + "?" + urlencode({"revoked": key_id})
        return Page(303, (*HEADERS, ("Location", location)), b"")

    def _rotate(self, visit: Visit, account_id: str) -> Page:
        form = fields(visit.body)
        nonce = self._tokens.check(form.get("token", ""), account_id, "rotate")
        if nonce is None:
            return self._message(visit, 403, "This form has expired")
        step_up = self._step_up(visit, _rotate_path(visit, form.get("key", "")))
        if step_up is not None:
            return self._render(visit, "step_up.html", 403, {"step_up": step_up, "act": "rotate"})
        revoke_old = form.get("revoke_old", "")
        if revoke_old not in ("", "1"):
            return self._message(visit, 400, "Unsupported form", account=None)
        if not self._tokens.consume(nonce):
            return self._message(
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
                return self._message(visit, 404, "No such key")
            if not isinstance(exc, KeyNotRotatable | ScopeNotReachable):
                raise
            text = _sentence(str(exc))
            return self._message(visit, 409, "This key cannot be rotated", text=text)
        keys = {info.key_id: info for info in self._keys.list(account_id)}
        context = {
            "row": self._row(created.info, self._now(), keys),
            "zone": _zone(form.get("tz", "")),
            **self._secret(visit, account_id, created),
        }
        return self._render(visit, "created.html", 201, context)

    def _step_up(self, visit: Visit, back: str) -> str | None:
        """``None`` when the visit may mint a key (no step-up asked, or a recent sign-in),
        else the host's ``reauthenticate_url`` with ``next`` set to *back*, a page of this
        console: left out if the mount point makes it no local path (:func:`safe_next`)."""
        if self.reauthenticate_url is None or visit.recent_sign_in:
            return None
        return _with_next(self.reauthenticate_url, back)

    def _activity(self, visit: Visit, account_id: str) -> Page:
        """The record of the account's own keys: what was done, by whom, from where."""
        try:
            events = self._keys.activity(account_id, limit=ACTIVITY_LIMIT)
        except ActivityNotKept:
            return self._message(visit, 501, "No activity is kept")
        context = {
            "events": events,
            "zone": _zone(visit.query.get("tz", "")),
            "limit": ACTIVITY_LIMIT,
        }
        return self._render(visit, "activity.html", 200, context)

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
            "expiring": f"expires in {_time_left(left)}" if expiring else None,
            "chart": None if counts is None else chart(info.name, counts),
            # Still works, has existed long enough to have been used, and nobody used it.
            "unused": info.status.revocable
            and now - info.created_at >= UNUSED_FOR
            and (info.last_used_at is None or now - info.last_used_at >= UNUSED_FOR),
            # Only hides the Rotate button the library would refuse: an Active key whose
            # replacement, if any, no longer works.
            "rotatable": info.status is Status.ACTIVE and (new is None or not new.status.revocable),
        }

    def _render(
        self, visit: Visit, template: str, status: int, context: dict[str, Any], *extra: Header
    ) -> Page:
        """*template* with *context*, and *extra* headers; the header bar names the signed-in
        account unless *context* sets ``account`` to ``None``."""
        html = _TEMPLATES.get_template(template).render(
            {
                "base": visit.base,
                "account": visit.account_id,
                "form_fields": visit.form_fields,
                **context,
            }
        )
        headers = (*HEADERS, ("Content-Type", "text/html; charset=utf-8"), *extra)
        return Page(status, headers, html.encode())

    def _message(
        self, visit: Visit, status: int, title: str, *extra: Header, **context: Any
    ) -> Page:
        """A message page: *title*, and its text from :data:`_TEXTS` unless *context* has one."""
        context = {"title": title, "text": _TEXTS.get(title), **context}
        return self._render(visit, "message.html", status, context, *extra)


def _with_next(url: str, back: str) -> str:
    """*url* with ``next`` set to *back*, a page of this console: left out if the mount point
    makes it no local path (:func:`safe_next`) or *url* names its own ``next``."""
    parts = urlsplit(url)
    if safe_next(back, "") != back or "next" in fields(parts.query.encode()):
        return url
    query = "&".join(filter(None, (parts.query, urlencode({"next": back}))))
    return urlunsplit(parts._replace(query=query))


def _rotate_path(visit: Visit, key_id: str) -> str:
    return visit.base + "rotate?" + urlencode({"key": key_id})


def _by(visit: Visit, account_id: str) -> By:
    """The signed-in user acting in the console, from the client the server saw."""
    return By.console(account_id, client_address=visit.client_address, user_agent=visit.user_agent)


def _sentence(message: str) -> str:
    return message[:1].upper() + message[1:] + ("" if message.endswith(".") else ".")


def _paired(infos: Sequence[KeyInfo]) -> list[KeyInfo]:
    """*infos* in their order, except that an old key follows its replacement: a rotation
    reads as one pair of rows."""
    shown = {info.key_id for info in infos}
    old_of = {info.replaced_by: info for info in infos if info.replaced_by in shown}
    moved = {old.key_id for old in old_of.values()}
    placed: list[KeyInfo] = []
    for info in infos:
        next_row: KeyInfo | None = None if info.key_id in moved else info
        while next_row is not None:
            placed.append(next_row)
            next_row = old_of.get(next_row.key_id)
    return placed


def _time_left(left: timedelta) -> str:
    """``3 days``, ``5 hours``, ``12 minutes``: the largest whole unit, rounded down."""
    seconds = max(int(left.total_seconds()), 0)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return "less than a minute"
