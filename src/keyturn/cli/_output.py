"""What the ``keyturn`` command prints: tables, JSON, warnings, and the error it stops on.

Every cell of a table is shown escaped (:func:`shown`): an id or a name from the store
cannot send the operator's terminal control sequences.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from keyturn._core.model import KeyInfo
from keyturn.errors import CommandError as CommandError  # raised by the commands
from keyturn.usage import BLOCKS, NONE, KeyUsage, sparkline

# How the command is called: "keyturn", or "manage.py keyturn" in a Django project; every
# message that names a command names it so.
PROG: ContextVar[str] = ContextVar("prog", default="keyturn")


def warn(message: str) -> None:
    print(f"{PROG.get()}: warning: {message}", file=sys.stderr)


def print_json(value: object) -> None:
    if hasattr(sys.stdout, "reconfigure"):  # UTF-8 whatever the locale: names and hints as is
        sys.stdout.reconfigure(encoding="utf-8")
    print(json.dumps(value, indent=2, ensure_ascii=False))


def when(at: datetime | None) -> str:
    return "-" if at is None else at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def instant(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(UTC).isoformat()


def as_json(info: KeyInfo, usage: Mapping[str, KeyUsage] | None = None) -> dict[str, Any]:
    counts = None if usage is None else usage[info.key_id]
    return {
        "key_id": info.key_id,
        "hint": info.hint,
        "name": info.name,
        "status": info.status.value,
        "scope": {
            "kind": info.scope.kind.value,
            "tenant_id": info.scope.tenant_id,
            "organization_id": info.scope.organization_id,
        },
        "created_at": instant(info.created_at),
        "expires_at": instant(info.expires_at),
        "revoked_at": instant(info.revoked_at),
        "last_used_at": instant(info.last_used_at),
        "first_used_at": instant(info.first_used_at),
        "replaces": info.replaces,
        "revoke_old_on_first_use": info.revoke_old_on_first_use,
        "replaced_by": info.replaced_by,
        "replacement_first_used_at": instant(info.replacement_first_used_at),
        # Requests per UTC day, oldest first; absent when the store keeps no counts.
        **(
            {}
            if counts is None
            else {
                "last_7_days": [
                    {"day": day.isoformat(), "accepted": accepted, "refused": refused}
                    for day, accepted, refused in zip(
                        counts.days, counts.accepted, counts.refused, strict=True
                    )
                ]
            }
        ),
    }


def key_table(infos: Sequence[KeyInfo], usage: Mapping[str, KeyUsage] | None = None) -> None:
    # The blocks of a sparkline where the output can show them, else plain ASCII; an
    # output that cannot show the hint's ellipsis gets "..." and escapes.
    plain = not can_show(BLOCKS + NONE + "…")
    if plain and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    header = ("KEY ID", "HINT", "STATUS", "SCOPE", "EXPIRES", "LAST USED", "LAST 7 DAYS", "NAME")
    rows = [
        (
            info.key_id,
            info.hint.replace("…", "...") if plain else info.hint,
            info.status.value,
            info.scope.organization_id or f"tenant {info.scope.tenant_id}",
            when(info.expires_at),
            when(info.last_used_at),
            "-" if usage is None else week(usage[info.key_id], plain=plain),
            info.name,
        )
        for info in infos
    ]
    table(header, rows)
    rotations = [rotation(info, infos) for info in infos if info.replaced_by is not None]
    if any(rotations):
        print("\nRotations (old key -> its replacement):")
        for line in filter(None, rotations):
            print(f"  {line}")


def week(usage: KeyUsage, *, plain: bool) -> str:
    """A key's last seven days: a sparkline of its accepted requests, their total, and its
    refusals if any: ``▁▃█▅▂·· 1204 (3 refused)``."""
    text = f"{sparkline(usage.accepted, ascii=plain)} {usage.total_accepted}"
    return text + (f" ({usage.total_refused} refused)" if usage.total_refused else "")


def can_show(text: str) -> bool:
    """Whether standard output's encoding can write *text*."""
    try:
        text.encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def rotation(old: KeyInfo, infos: Sequence[KeyInfo]) -> str:
    """One line on an old key whose replacement is not final yet: first used, or not yet."""
    if not old.status.revocable:
        return ""  # the rotation is done: the old key no longer works
    new = next((info for info in infos if info.key_id == old.replaced_by), None)
    pair = f"{old.key_id} -> {old.replaced_by}"
    if old.replacement_first_used_at is not None:
        first = when(old.replacement_first_used_at)
        return f"{pair}  new key first used at {first}; revoke the old one"
    if new is not None and new.revoke_old_on_first_use:
        return f"{pair}  new key not used yet; {old.key_id} is revoked at its first use"
    return f"{pair}  new key not used yet: keep {old.key_id} until it is"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Aligned columns; the last one, free text, is not padded. Every cell is shown escaped:
    an id from the store cannot send the operator's terminal control sequences.
    """
    rows = [[shown(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]))


def shown(text: str) -> str:
    """*text* with every unprintable character (escapes, newlines, C1 controls) as ``\\x..``."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
        for c in text
    )
