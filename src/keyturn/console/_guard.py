"""Whether a console request may act; each check answers with its refusal's page.

A request carrying an API key is refused before anything else: a key can never create, list
or revoke keys (spec section 1). Carrying means in any ``Authorization`` line, in any scheme
(:func:`keyturn._core.decision.holds_key`), or having been authenticated by the API
middleware, which strips the key before the console sees it.

Every POST comes from this origin (``Origin``, ``Sec-Fetch-Site``), as a small form, with a
form token issued to the same account; a host's own CSRF check (Django's) that refused it is
heard too. The create and rotate forms' tokens work once, so a reload, a back-and-resubmit
or a double click never makes a second key; a form that created nothing may be sent again.

Creating and rotating mint a key that works for up to a year. When the host gives
``recently_authenticated``, their forms are shown, and their POSTs act, only on a visit whose
sign-in the host calls recent; any other visit gets the host's ``reauthenticate_url`` with a
``next`` back to the same console page (:func:`~keyturn.console.safe_next`). Revoking only
takes power away: it needs no recent sign-in.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from typing import Final, TypeVar
from urllib.parse import urlencode

from keyturn._core.decision import holds_key
from keyturn._core.fork import renew_in_child
from keyturn.console._forms import from_own_origin, with_next
from keyturn.console._render import message, render
from keyturn.console._visit import Page, Visit, fields, redirect

T = TypeVar("T")
FORM_TOKEN_TTL: Final = 12 * 3600  # seconds a form stays usable


def key_refusal(visit: Visit) -> Page | None:
    lines = (*visit.authorization, visit.headers.get("authorization", ""))
    if visit.by_key or holds_key(lines):
        return message(visit, 403, "API keys cannot manage keys", account=None)
    return None


def to_sign_in(visit: Visit, method: str, sign_in_url: str) -> Page:
    """Where a visitor who is not signed in goes, with ``next`` back to this page."""
    back = visit.base + visit.path[1:]
    if method != "GET":  # a form's page cannot be asked again: back to the list
        back = visit.base
    elif visit.query:
        back += "?" + urlencode(visit.query)
    return redirect(with_next(sign_in_url, back))


def post_refusal(visit: Visit) -> Page | None:
    if not from_own_origin(visit.headers, visit.origin):
        return message(visit, 403, "Refused: another site sent this form")
    if visit.too_large:
        return message(visit, 413, "Form too large", account=None)
    content_type = visit.content_type.split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        return message(visit, 415, "Unsupported form", account=None)
    if visit.csrf_refused:
        return message(visit, 403, "This form has expired")
    return None


def rotate_path(visit: Visit, key_id: str) -> str:
    return visit.base + "rotate?" + urlencode({"key": key_id})


class FormTokens:
    """Form tokens: HMAC-signed for one account and one form; a token used once
    (:meth:`consume`) is refused again."""

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


class Guard(FormTokens):
    """The form tokens, and the step-up a form that mints a key asks for."""

    def __init__(self, secret: bytes, reauthenticate_url: str | None) -> None:
        super().__init__(secret)
        self.reauthenticate_url = reauthenticate_url

    def step_up(self, visit: Visit, back: str) -> str | None:
        """``None`` when the visit may mint a key (no step-up asked, or a recent sign-in),
        else the host's ``reauthenticate_url`` with ``next`` set to *back*, a page of this
        console: left out if the mount point makes it no local path (:func:`safe_next`)."""
        if self.reauthenticate_url is None or visit.recent_sign_in:
            return None
        return with_next(self.reauthenticate_url, back)

    def form(self, visit: Visit, account_id: str, form: str) -> tuple[dict[str, str], str] | Page:
        """The POSTed *form*'s fields and its token's nonce, or the refusal: a token not
        issued to *account_id* for *form*, or one too old; for a form that mints a key
        (``create``, ``rotate``), a sign-in not recent enough."""
        sent = fields(visit.body)
        nonce = self.check(sent.get("token", ""), account_id, form)
        if nonce is None:
            return message(visit, 403, "This form has expired")
        if form in ("create", "rotate"):  # they mint a key
            back = visit.base if form == "create" else rotate_path(visit, sent.get("key", ""))
            step_up = self.step_up(visit, back)
            if step_up is not None:
                return render(visit, "step_up.html", 403, {"step_up": step_up, "act": form})
        return sent, nonce

    def once(self, visit: Visit, nonce: str, lost: str, mint: Callable[[], T]) -> T | Page:
        """*mint* called for the first use of *nonce*; a later use gets a 409 that says
        *lost*, what to do about a secret not kept."""
        if not self.consume(nonce):
            return message(visit, 409, "This form was already sent", text=lost)
        try:
            return mint()
        except BaseException:
            self.release(nonce)  # nothing was created: the same form may be sent again
            raise
