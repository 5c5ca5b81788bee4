"""Lifecycle notices: tell a key's creator before it breaks, and when something happens to it.

Every key expires within a year, so every integration breaks unless someone is told. A
:class:`Notifier` run (``keyturn notify`` from cron or a systemd timer, or
:meth:`Notifier.run` from your code) tells each key's creator, once per key and notice:

- the key expires within 14 days, 7 days, 1 day (only the nearest of these is sent: a run
  that first sees a key 5 days before its expiry sends the 7-day notice, not the 14-day);
- it expired; it became Inactive (the creator no longer reaches its scope);
- it was reported leaked (:mod:`keyturn.leaks`);
- it was revoked by an operator (``keyturn keys revoke``) or automatically, at its
  replacement's first use or on a leak report.

Notices concern what happened within *window* (30 days) before the run, so a first run on
an old store does not mail about last year. Who the creator is to mail is your knowledge:
*address_of* maps an account id to an address (or ``None``: no notice, tried again next
run). *deliver* sends one :class:`Notice` and raises if it could not; two are ready:
:class:`SMTPDelivery` (email) and :class:`WebhookDelivery` (a signed POST, checked by the
receiver with :func:`verify_webhook`). A notice names the key by name and hint, never the
secret, and links to your console.

Once, even with several instances: before delivering, the run claims the notice in the
store (``claim_notice``: an insert that only one of any number of concurrent runs wins,
by the table's primary key). A delivery that fails gives the claim back
(``release_notice``), so the next run sends it; a process killed between the claim and
the delivery loses that one notice (at most once, never twice). Each notice sent is
recorded as a ``notice_sent`` event (:mod:`keyturn.activity`).

The store must keep the record (keyturn's own do); a host store without it gets
:class:`~keyturn.activity.ActivityNotKept` when a notifier is built. Which notices are
due is decided by :func:`due`, with no I/O; the run around it (this module) and the
deliveries are plain calls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import attrs

from keyturn._core.events import LIBRARY, Action, By, KeyEvent, new_event
from keyturn.errors import DeliveryFailed, WebhookRejected
from keyturn.manager import KeyManager
from keyturn.notices._compose import Due, Notice, NoticeKind, due
from keyturn.notices._deliver import (
    REPLAY_WINDOW,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SMTPDelivery,
    WebhookDelivery,
    verify_webhook,
)
from keyturn.notices._deliver import sign as sign  # what verify_webhook checks

__all__ = [
    "REPLAY_WINDOW",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "DeliveryFailed",
    "Due",
    "Notice",
    "NoticeKind",
    "Notifier",
    "RunReport",
    "SMTPDelivery",
    "WebhookDelivery",
    "WebhookRejected",
    "due",
    "verify_webhook",
]

log: Final = logging.getLogger("keyturn.notices")


@attrs.frozen(kw_only=True)
class RunReport:
    """What one run did: notices sent, already sent (by this run's peers too), failed
    (given back, to be sent by a later run), and left for want of an address."""

    sent: int = 0
    already_sent: int = 0
    failed: int = 0
    no_address: int = 0


class Notifier:
    """Sends the lifecycle notices due now, once each (see the module's documentation).

    :param manager: the :class:`~keyturn.KeyManager` over your store (which must keep the
        record, as keyturn's stores do) and membership: it derives each key's status.
    :param deliver: sends one :class:`Notice`, raising if it could not
        (:class:`SMTPDelivery`, :class:`WebhookDelivery`, or your own).
    :param address_of: the creator's address for an account id, or ``None``.
    :param console_url: where the creator manages keys; every notice links to it.
    :param window: how far back the run looks for what happened (default 30 days).
    :param by: who sends, for the record (the library by default; ``keyturn notify`` says
        the CLI).
    :raises ActivityNotKept: the store keeps no record of key actions and notices.
    """

    def __init__(
        self,
        manager: KeyManager,
        *,
        deliver: Callable[[Notice], object],
        address_of: Callable[[str], str | None],
        console_url: str,
        window: timedelta = timedelta(days=30),
        by: By = LIBRARY,
    ) -> None:
        if not isinstance(manager, KeyManager):
            raise TypeError(
                f"manager must be a keyturn.KeyManager (a sync one), got {type(manager).__name__}"
            )
        manager.store_capabilities.require_record(
            "a Notifier", also=("unrevoked_keys", "claim_notice", "release_notice", "leaked_keys")
        )
        if not callable(deliver) or not callable(address_of):
            raise TypeError("deliver and address_of must be functions")
        if not isinstance(console_url, str) or not console_url.startswith(("https://", "http://")):
            raise ValueError(f"console_url must be the console's http(s) URL, got {console_url!r}")
        self.manager = manager
        self.store: Any = manager.store
        self.deliver = deliver
        self.address_of = address_of
        self.console_url = console_url
        self.window = window
        self.by = by

    def __repr__(self) -> str:
        return f"Notifier(store={self.store!r}, console_url={self.console_url!r})"

    def run(self) -> RunReport:
        """Send every notice due now that no run sent before; what was done."""
        manager = self.manager
        ask = manager._run  # the store is asked through the manager, which owns its questions
        now = manager.clock().astimezone(UTC)
        since = now - self.window
        accounts = sorted({key.account_id for key in ask(manager._unrevoked(since))})
        infos = {account: manager.list(account) for account in accounts}
        events: list[KeyEvent] = []
        ask(manager._events_since(since, events.append))
        counts = {"sent": 0, "already_sent": 0, "failed": 0, "no_address": 0}
        for notice in due(infos, ask(manager._leaked()), events, now, self.window):
            counts[self._send(notice, now)] += 1
        return RunReport(**counts)

    def _send(self, due_notice: Due, now: datetime) -> str:
        """Claim, deliver and record one notice; which count it adds to."""
        kind, key_id = due_notice.kind, due_notice.key_id
        address = self.address_of(due_notice.account_id)
        if not address:
            return "no_address"
        manager = self.manager
        ask = manager._run
        stored = ask(manager._get(key_id))
        if stored is None:  # gone from the host's store: nothing to name
            return "no_address"
        if not ask(manager._claim_notice(key_id, kind.value, now)):
            return "already_sent"
        notice = Notice(
            kind=kind,
            account_id=due_notice.account_id,
            address=address,
            key_id=key_id,
            name=due_notice.name,
            hint=due_notice.hint,
            expires_at=stored.expires_at,
            console_url=self.console_url,
            detail=due_notice.detail,
        )
        try:
            self.deliver(notice)
        except Exception as exc:
            ask(manager._release_notice(key_id, kind.value))  # the next run tries again
            log.warning("could not deliver the %s notice of key %s: %s", kind.value, key_id, exc)
            return "failed"
        try:
            event = new_event(stored, Action.NOTICE_SENT, now, self.by, detail=kind.value)
            ask(manager._record_event(event))
        except Exception:
            log.exception("could not record the %s notice of key %s", kind.value, key_id)
        return "sent"
