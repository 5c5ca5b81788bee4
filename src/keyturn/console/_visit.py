"""What a console edge and the page layer exchange: a :class:`Visit` in, a :class:`Page` out;
and what every edge reads alike from its server's request (:func:`read`, :func:`text`).

The edges (:mod:`keyturn.console.asgi`, :mod:`keyturn.console.wsgi`) import this module and
not the page layer, which imports them when asked for an app (``Console.asgi()``): so the
layers import one way only. An edge knows the console only as :class:`Pages`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol
from urllib.parse import parse_qsl

import attrs

from keyturn._run.capabilities import is_coroutine_function
from keyturn._web import Body
from keyturn.errors import ConsoleSetupError

__all__ = [
    "CSP",
    "HEADERS",
    "MAX_FORM_BYTES",
    "ConsoleSetupError",
    "Page",
    "Pages",
    "Visit",
    "fields",
    "needs_extra",
    "plain_hooks",
    "read",
    "redirect",
    "text",
]

MAX_FORM_BYTES: Final = 16 * 1024
# Every page's headers, the edges' own redirects' too: no caching, no inline script, no
# framing, no referrer.
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
HEADERS: Final = (
    ("Cache-Control", "no-store"),
    ("Content-Security-Policy", CSP),
    ("Referrer-Policy", "no-referrer"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
)


@attrs.frozen(kw_only=True)
class Visit:
    """One request, as an edge hands it over."""

    method: str  # upper case; HEAD is answered as GET, the edge drops the body
    path: str  # below the mount point: "/" is the key list
    base: str  # the mount point with a trailing slash, e.g. "/console/"
    origin: str  # this server as the browser names it: "http://127.0.0.1:8000"
    query: Mapping[str, str] = attrs.field(factory=dict)  # fields(raw query string)
    body: bytes = b""  # at most MAX_FORM_BYTES bytes of a POST's form
    too_large: bool = False  # the form was longer than MAX_FORM_BYTES: refused with 413
    content_type: str = ""
    headers: Mapping[str, str] = attrs.field(factory=dict)  # lower-case names
    account_id: str | None = None
    organization: str | None = None  # where the host says the user is (current_organization)
    form_fields: Mapping[str, str] = attrs.field(factory=dict)  # the host's, in every POST form
    csrf_refused: bool = False  # the host's own CSRF check (Django's) refused this POST
    authorization: tuple[str, ...] = ()  # every Authorization line, as sent
    by_key: bool = False  # the API middleware authenticated this request with a key
    # The host's recently_authenticated answered True (asked only of a signed-in visitor of
    # a console that has the hook; any other answer is False).
    recent_sign_in: bool = False
    client_address: str | None = None  # as the server saw it: for the record of key actions
    user_agent: str | None = None


@attrs.frozen
class Page:
    """A response: status, headers, body."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def redirect(location: str, status: int = 303) -> Page:
    return Page(status, (*HEADERS, ("Location", location)), b"")


class Pages(Protocol):
    """What an edge needs of the console: the host's hooks, its manager, and the pages."""

    signed_in: Callable[[Any], Any]
    current_organization: Callable[[Any], Any] | None
    recently_authenticated: Callable[[Any], Any] | None
    manager: Any

    def handle(self, visit: Visit) -> Page: ...


def plain_hooks(console: Pages, refusal: str) -> None:
    """Raise *refusal* if a host hook is a coroutine function: for an edge with no event
    loop to await it."""
    hooks = (console.signed_in, console.current_organization, console.recently_authenticated)
    if any(is_coroutine_function(hook) for hook in hooks):
        raise ConsoleSetupError(refusal)


def text(answer: object) -> str | None:
    """A host hook's answer as a :class:`Visit` holds it: a string, else ``None``."""
    return answer if isinstance(answer, str) else None


_HEARD: Final = ("authorization", "origin", "sec-fetch-site")  # the headers a page reads


def read(headers: Any, body: Body) -> dict[str, Any]:
    """What every edge reads alike from a request's (case-insensitive) *headers* and its form
    *body*, as :class:`Visit` fields."""
    return {
        "body": body.data,
        "too_large": body.over,
        "headers": {name: headers[name] for name in _HEARD if name in headers},
        "user_agent": headers.get("user-agent"),
    }


# The console extra's libraries (Starlette brings anyio).
_EXTRA: Final = frozenset({"jinja2", "markupsafe", "anyio", "starlette", "werkzeug"})


def needs_extra(missing: ModuleNotFoundError) -> ImportError:
    """What to raise when importing the console failed on *missing*: a library of the
    console extra is named with the line that installs it; anything else as it was."""
    library = (missing.name or "").partition(".")[0]
    if library not in _EXTRA:
        return missing
    return ImportError(
        f"the key console needs the console extra ({library} is not installed): "
        "pip install 'keyturn[console]'"
    )


def fields(body: bytes) -> dict[str, str]:
    """The fields of a form body or a query string; the first of a repeated name wins."""
    try:
        pairs = parse_qsl(body.decode(), keep_blank_values=True, max_num_fields=20)
    except ValueError:  # not UTF-8, or too many fields: no token either, so it is refused
        return {}
    return dict(reversed(pairs))
