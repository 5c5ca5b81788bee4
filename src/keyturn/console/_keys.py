"""How the pages call their manager: a :class:`~keyturn.KeyManager` in place, an
:class:`~keyturn.AsyncKeyManager` on the event loop that owns its pool (the ASGI edge runs
the pages in a worker thread). The questions that are no public operation go through the
manager's own driver too: it owns every question put to the store and the membership.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import date, datetime
from functools import partial
from typing import Any, cast

import anyio.from_thread

from keyturn._core.model import CreatedKey, KeyInfo, Organization
from keyturn.activity import KeyEvent
from keyturn.manager import AsyncKeyManager, KeyManager
from keyturn.usage import DailyUsage


def _in_place(method: Callable[..., Any], *args: Any, **options: Any) -> Any:
    return method(*args, **options)


def _on_the_loop(method: Callable[..., Any], *args: Any, **options: Any) -> Any:
    return anyio.from_thread.run(partial(method, *args, **options))


class Keys:
    """A manager as the pages ask it, whichever kind it is."""

    def __init__(self, manager: KeyManager | AsyncKeyManager) -> None:
        self.manager = manager
        self._call = _in_place if isinstance(manager, KeyManager) else _on_the_loop

    def now(self) -> datetime:
        return self.manager._now()

    def list(self, account_id: str) -> list[KeyInfo]:
        return cast("list[KeyInfo]", self._call(self.manager.list, account_id))

    def create(self, account_id: str, **options: Any) -> CreatedKey:
        return cast(CreatedKey, self._call(self.manager.create, account_id, **options))

    def rotate(self, account_id: str, key_id: str, **options: Any) -> CreatedKey:
        return cast(CreatedKey, self._call(self.manager.rotate, account_id, key_id, **options))

    def revoke(self, account_id: str, key_id: str, **options: Any) -> KeyInfo:
        return cast(KeyInfo, self._call(self.manager.revoke, account_id, key_id, **options))

    def activity(self, account_id: str, **options: Any) -> Sequence[KeyEvent]:
        return cast("Sequence[KeyEvent]", self._call(self.manager.activity, account_id, **options))

    def organizations_of(self, account_id: str) -> Sequence[Organization]:
        flow = self.manager._organizations_of(account_id)
        return cast("Sequence[Organization]", self._call(self.manager._run, flow))

    def role_of(self, account_id: str, organization_id: str) -> str | None:
        flow = self.manager._role_of(account_id, organization_id)
        return cast("str | None", self._call(self.manager._run, flow))

    def usage_of(self, account_id: str, since: date) -> Sequence[DailyUsage] | None:
        """The account's daily counts since *since*; ``None`` when the store keeps none
        (:class:`keyturn.protocols.UsageStore`)."""
        if not self.manager.store_capabilities.has("usage_of"):
            return None
        flow = self.manager._usage(account_id, since)
        return cast("Sequence[DailyUsage]", self._call(self.manager._run, flow))
