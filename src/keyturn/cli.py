"""The ``keyturn`` command: keys, organizations and memberships in a store, from a shell.

``keyturn --help`` shows examples (:func:`_examples`); ``docs/cli.md`` is the guide.

The store is ``--store URL``, else ``$KEYTURN_STORE_URL``, else
``sqlite:///keyturn.sqlite3`` (see :func:`keyturn.stores.open_database`). The store
commands (``db``, ``org``, ``member``, ``keys``) work on an initialized store, but
``db init``, which makes one; ``scan`` opens no store, and ``demo`` hands ``--store`` to
the demo. ``--as ACCOUNT`` names the account whose keys are listed or revoked.

The command creates and rotates no key: keys are created only in the console, by the
signed-in user (spec section 1), so no secret ever goes to whoever runs a command. An
operator's emergency ``keys revoke`` needs ``--reason``; who ran it and why is logged.

Rules of this file:

1. A store command is a function ``(db, args)`` that returns nothing, run on an open store
   by :func:`_in_store`, which returns its exit status. ``demo`` and ``scan`` open no store
   here (the demo opens its own, from ``--store``): each is a function ``(args)`` that
   returns the exit status itself. The parser (:func:`build_parser`) is the table of
   contents.
2. The library's own errors (:class:`~keyturn.errors.KeyturnError`) and the database
   drivers' are the operator's to fix: one line on stderr and an exit status (2 for an
   invalid value, else 1). Anything else is a bug, and its traceback shows.
3. No secret reaches stderr, and no store password is ever printed (:func:`redact_url`).
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote

from keyturn import _token
from keyturn._decision import DEFAULT_ORGANIZATION, DEFAULT_ORGANIZATION_PATTERN
from keyturn._model import (
    KeyInfo,
    Organization,
    ScopeKind,
    Status,
)
from keyturn.activity import By, Channel, each_event_since, json_line
from keyturn.errors import InvalidExpiry, InvalidKeyName, InvalidStoreURL, KeyNotFound, KeyturnError
from keyturn.manager import KeyManager
from keyturn.protocols import UsageStore
from keyturn.stores import open_database, redact_url
from keyturn.usage import BLOCKS, NONE, KeyUsage, by_key, sparkline

if TYPE_CHECKING:
    from keyturn.protocols import Database

__all__ = ["main"]

_log: Final = logging.getLogger("keyturn.cli")
ENVIRONMENT_VARIABLE: Final = "KEYTURN_STORE_URL"
DEFAULT_STORE_URL: Final = "sqlite:///keyturn.sqlite3"
STATUSES: Final = {status.value.lower(): status for status in Status}
WEEK: Final = 7  # days of requests `keys list` shows
# How the command is called: "keyturn", or "manage.py keyturn" in a Django project; every
# message that names a command names it so.
_PROG: ContextVar[str] = ContextVar("prog", default="keyturn")


class CommandError(Exception):
    """A failure the command reports in one line, with its exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


# --- store commands: (db, args), printing to standard output --------------------------------


def db_init(db: Database, args: argparse.Namespace) -> None:
    version = db.create_schema()
    print(f"The store {redact_url(args.url)} is ready (schema version {version}).")


def org_add(db: Database, args: argparse.Namespace) -> None:
    org, tenant = args.organization, args.tenant
    existing = db.membership.get_organization(org)
    if existing is not None and (existing.tenant_id, existing.is_default) != (tenant, args.default):
        default = ", as its default organization" if existing.is_default else ""
        raise CommandError(
            f"organization {org!r} already exists in tenant {existing.tenant_id!r}{default}; "
            "'org add' does not change an organization"
        )
    if org == DEFAULT_ORGANIZATION:
        _warn("x-organization-id: default always names the tenant's default organization")
    elif not re.fullmatch(DEFAULT_ORGANIZATION_PATTERN, org, re.ASCII):
        _warn(
            f"x-organization-id cannot name {org!r}: an organization id is a letter or digit, "
            "then up to 127 letters, digits and _.:-"
        )
    db.membership.add_organization(org, tenant_id=tenant, default=args.default)
    default = ", its default organization" if args.default else ""
    print(f"Organization {org} is in tenant {tenant}{default}.")


def org_list(db: Database, args: argparse.Namespace) -> None:
    found = [o for o in db.membership.organizations() if args.tenant in (None, o.tenant_id)]
    if args.json:
        _json([{"id": o.id, "tenant_id": o.tenant_id, "default": o.is_default} for o in found])
    elif not found:
        print("No organizations." if args.tenant is None else f"Tenant {args.tenant} has none.")
    else:
        rows = [(o.id, o.tenant_id, "yes" if o.is_default else "-") for o in found]
        _table(("ORG", "TENANT", "DEFAULT"), rows)


def org_remove(db: Database, args: argparse.Namespace) -> None:
    members = [account for account, _ in _members(db, args.organization)]
    with _inactivated(db, members):
        db.membership.remove_organization(args.organization)
        print(f"Organization {args.organization} is removed, with {len(members)} member(s).")


def member_add(db: Database, args: argparse.Namespace) -> None:
    _organization(db, args.organization)
    db.membership.add_member(args.account, args.organization, role=args.role)
    print(f"{args.account} has the role {args.role} in {args.organization}.")


def member_list(db: Database, args: argparse.Namespace) -> None:
    members = _members(db, args.organization)
    if args.json:
        _json([{"account_id": account, "role": role} for account, role in members])
    elif not members:
        print(f"{args.organization} has no members.")
    else:
        _table(("ACCOUNT", "ROLE"), members)


def member_remove(db: Database, args: argparse.Namespace) -> None:
    account, org = args.account, args.organization
    if db.membership.get_role(account, org) is None:
        raise CommandError(f"{account} has no role in {org}")
    with _inactivated(db, [account]):
        db.membership.remove_member(account, org)
        print(f"{account} no longer has a role in {org}.")


def keys_list(db: Database, args: argparse.Namespace) -> None:
    kind = ScopeKind(args.scope) if args.scope in ("tenant", "organization") else None
    infos = _manager(db).list(args.account, status=STATUSES.get(args.status), scope=kind)
    if args.scope is not None and kind is None:  # one organization's id
        infos = [info for info in infos if info.scope.organization_id == args.scope]
    usage = _last_week(db, args.account, infos)
    if args.json:
        _json([_as_json(info, usage) for info in infos])
    elif not infos:
        print(f"{args.account} has no key that matches.")
    else:
        _key_table(infos, usage)


def _last_week(
    db: Database, account_id: str, infos: Sequence[KeyInfo]
) -> dict[str, KeyUsage] | None:
    """The keys' counts of the last seven UTC days, today included; ``None`` when the
    store keeps none."""
    if not isinstance(db.keys, UsageStore) or not infos:
        return None
    today = datetime.now(UTC).date()
    rows = db.keys.usage_of(account_id, today - timedelta(days=WEEK - 1))
    return by_key(rows, last_day=today, days=WEEK, key_ids=[info.key_id for info in infos])


def keys_revoke(db: Database, args: argparse.Namespace) -> None:
    # An operator's emergency revoke: the console is where the creator revokes. Who did it
    # and why is logged, so the creator can be told.
    _key_id_argument(args.key_id)
    reason = " ".join(args.reason.split())
    if not reason:
        raise CommandError("--reason must say why the key is revoked", status=2)
    if _token.PREFIX in reason.lower():  # never echoed: it may be the key itself
        raise CommandError("--reason must not hold a key; give its id as KEY_ID", status=2)
    operator = _operator()
    try:
        by = By.operator(operator, reason=reason)
        info = _manager(db).revoke(args.account, args.key_id, by=by)
    except KeyNotFound:
        raise _no_such_key(args.account, args.key_id) from None
    _log.warning(
        "operator %s revoked key %s of %s: %s",
        _shown(operator),
        info.key_id,
        _shown(args.account),
        _shown(reason),
    )
    print(
        f"Revoked key {info.key_id} ({info.hint}, {info.name!r}) of {_shown(args.account)}: "
        f"refused from its next request on.\nRevoked by {_shown(operator)}: {_shown(reason)}"
    )


def _operator() -> str:
    """Who runs the command, as the operating system names them."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (a bare container)
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "an unknown user"


def keys_expiring(db: Database, args: argparse.Namespace) -> None:
    infos = _manager(db).expiring(args.account, within=args.within)
    if args.json:
        _json([_as_json(info) for info in infos])
    elif not infos:
        print(f"{args.account} has no key expiring within {_span(args.within)}.")
    else:
        print(f"Expiring within {_span(args.within)}, soonest first:")
        _key_table(infos)


def keys_leaked(db: Database, args: argparse.Namespace) -> None:
    # Every account's keys: reported by a code host's secret scanning (keyturn.leaks).
    leaks = [(key, key.leaked) for key in db.keys.leaked_keys() if key.leaked is not None]
    if args.json:
        fields = ("key_id", "hint", "name", "account_id")
        _json(
            [
                {
                    **{field: getattr(key, field) for field in fields},
                    "reported_at": _instant(leak.at),
                    "url": leak.url,
                    "revoked_at": _instant(key.revoked_at),
                }
                for key, leak in leaks
            ]
        )
    elif not leaks:
        print("No key has been reported leaked.")
    else:
        rows = [
            (key.key_id, key.hint, key.account_id, _when(leak.at), _when(key.revoked_at), leak.url)
            for key, leak in leaks
        ]
        _table(("KEY ID", "HINT", "ACCOUNT", "REPORTED", "REVOKED", "URL"), rows)


def audit_export(db: Database, args: argparse.Namespace) -> None:
    # Every account's events, oldest first, one JSON object a line: what a SIEM reads.
    if args.output is None:
        _export(db, args.since, sys.stdout)
        return
    # Personal data (client addresses): a new file, readable by its owner only (mkstemp
    # makes it so), moved over the name once whole. An existing file keeps neither its
    # mode nor its contents, and a symbolic link there is replaced, never written through.
    output = Path(args.output)
    try:
        descriptor, temporary = tempfile.mkstemp(
            prefix=f".{output.name}.", suffix=".tmp", dir=output.parent
        )
    except OSError as exc:
        raise CommandError(f"cannot write {args.output}: {exc.strerror}", 2) from None
    moved = False
    try:
        with open(descriptor, "w", encoding="utf-8") as file:
            count = _export(db, args.since, file)
        os.replace(temporary, output)
        moved = True
    except OSError as exc:
        raise CommandError(f"cannot write {args.output}: {exc.strerror}", 2) from None
    finally:
        if not moved:  # a failed export leaves no half-written file behind
            with suppress(OSError):
                os.unlink(temporary)
    print(f"Wrote {count} event(s) to {args.output}.", file=sys.stderr)


EXPORT_PAGE: Final = 1000


def _export(db: Database, since: datetime | None, out: Any) -> int:
    """Write the events from *since* on to *out*, one JSON line each; the number written."""
    if hasattr(out, "reconfigure"):
        out.reconfigure(encoding="utf-8")
    return each_event_since(
        db.keys, since, lambda event: out.write(json_line(event) + "\n"), EXPORT_PAGE
    )


SMTP_PASSWORD: Final = "KEYTURN_SMTP_PASSWORD"  # noqa: S105 - the variable's name
WEBHOOK_SECRET: Final = "KEYTURN_WEBHOOK_SECRET"  # noqa: S105 - the variable's name


def notify(db: Database, args: argparse.Namespace) -> None:
    # For cron or a systemd timer: send the lifecycle notices due now, once each.
    from keyturn.notices import Notifier, SMTPDelivery, WebhookDelivery

    deliver: Callable[..., object]
    if args.webhook is not None:
        secret = os.environ.get(WEBHOOK_SECRET, "")
        if len(secret.encode()) < 16:
            raise CommandError(f"--webhook needs ${WEBHOOK_SECRET}, at least 16 bytes", 2)
        deliver = WebhookDelivery(args.webhook, secret=secret.encode())
    else:
        host, _, port = args.smtp.rpartition(":") if ":" in args.smtp else (args.smtp, "", "25")
        if not port.isdigit() or args.sender is None:
            raise CommandError("--smtp takes HOST or HOST:PORT, with --from ADDRESS", 2)
        deliver = SMTPDelivery(
            host,
            int(port),
            sender=args.sender,
            starttls=args.starttls,
            username=args.smtp_user,
            password=os.environ.get(SMTP_PASSWORD),
        )
    notifier = Notifier(
        _manager(db),
        deliver=deliver,
        address_of=lambda account: args.to.replace("{account}", account),
        console_url=args.console_url,
        window=args.window,
        by=By(channel=Channel.CLI, actor=f"operator {_operator()}"),
    )
    report = notifier.run()
    print(
        f"Sent {report.sent} notice(s); {report.already_sent} already sent; "
        f"{report.failed} failed (sent again by the next run); "
        f"{report.no_address} without an address."
    )
    if report.failed:
        raise CommandError(f"{report.failed} notice(s) could not be delivered: see the log")


def _since(text: str) -> datetime:
    """``2026-11-01``, ``2026-11-01T08:00:00+00:00`` (UTC when no offset), or ``7d``/``12h`` ago."""
    if re.fullmatch(r"\s*\d{1,4}\s*[dhDH]\s*", text):
        return datetime.now(UTC) - _within(text)
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"give a date, an ISO 8601 instant or a span like 7d, not {text!r}"
        ) from None
    try:  # 0001-01-01T00:00:00+14:00 parses, yet lies before the first instant in UTC
        return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    except OverflowError:
        raise argparse.ArgumentTypeError(f"{text!r} lies outside the years 1 to 9999") from None


def _key_id_argument(key_id: str) -> str:
    if key_id.startswith(_token.PREFIX):  # a key or a hint, not an id; never echo it
        raise CommandError(
            f"KEY_ID is the key's id, the KEY ID column of '{_PROG.get()} keys list' "
            "(12 letters and digits), not the key or its hint",
            status=2,
        )
    return key_id


def _no_such_key(account: str, key_id: str) -> CommandError:
    return CommandError(f"{account} has no key with {_token.naming_id(key_id)}")


def _manager(db: Database) -> KeyManager:
    return KeyManager(db.keys, db.membership)


def _organization(db: Database, organization_id: str) -> Organization:
    organization = db.membership.get_organization(organization_id)
    if organization is None:
        raise CommandError(f"there is no organization {organization_id!r}")
    return organization


def _members(db: Database, organization_id: str) -> Sequence[tuple[str, str]]:
    return db.membership.members_of(_organization(db, organization_id).id)


@contextmanager
def _inactivated(db: Database, accounts: Sequence[str]) -> Iterator[None]:
    """Around a change of roles: print the keys of *accounts* it made Inactive."""
    manager = _manager(db)
    active = {info.key_id for a in accounts for info in manager.list(a, status=Status.ACTIVE)}
    yield
    lost = [
        info
        for account in accounts
        for info in manager.list(account, status=Status.INACTIVE)
        if info.key_id in active
    ]
    if lost:
        print("These keys are now Inactive (they work again if the role comes back):")
        _key_table(lost)


def _warn(message: str) -> None:
    print(f"{_PROG.get()}: warning: {message}", file=sys.stderr)


# --- output --------------------------------------------------------------------------------


def _json(value: object) -> None:
    if hasattr(sys.stdout, "reconfigure"):  # UTF-8 whatever the locale: names and hints as is
        sys.stdout.reconfigure(encoding="utf-8")
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _instant(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(UTC).isoformat()


def _as_json(info: KeyInfo, usage: Mapping[str, KeyUsage] | None = None) -> dict[str, Any]:
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
        "created_at": _instant(info.created_at),
        "expires_at": _instant(info.expires_at),
        "revoked_at": _instant(info.revoked_at),
        "last_used_at": _instant(info.last_used_at),
        "first_used_at": _instant(info.first_used_at),
        "replaces": info.replaces,
        "revoke_old_on_first_use": info.revoke_old_on_first_use,
        "replaced_by": info.replaced_by,
        "replacement_first_used_at": _instant(info.replacement_first_used_at),
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


def _key_table(infos: Sequence[KeyInfo], usage: Mapping[str, KeyUsage] | None = None) -> None:
    # The blocks of a sparkline where the output can show them, else plain ASCII; an
    # output that cannot show the hint's ellipsis gets "..." and escapes.
    plain = not _can_show(BLOCKS + NONE + "…")
    if plain and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    header = ("KEY ID", "HINT", "STATUS", "SCOPE", "EXPIRES", "LAST USED", "LAST 7 DAYS", "NAME")
    rows = [
        (
            info.key_id,
            info.hint.replace("…", "...") if plain else info.hint,
            info.status.value,
            info.scope.organization_id or f"tenant {info.scope.tenant_id}",
            _when(info.expires_at),
            _when(info.last_used_at),
            "-" if usage is None else _week(usage[info.key_id], plain=plain),
            info.name,
        )
        for info in infos
    ]
    _table(header, rows)
    rotations = [_rotation(info, infos) for info in infos if info.replaced_by is not None]
    if any(rotations):
        print("\nRotations (old key -> its replacement):")
        for line in filter(None, rotations):
            print(f"  {line}")


def _week(usage: KeyUsage, *, plain: bool) -> str:
    """A key's last seven days: a sparkline of its accepted requests, their total, and its
    refusals if any: ``▁▃█▅▂·· 1204 (3 refused)``."""
    text = f"{sparkline(usage.accepted, ascii=plain)} {usage.total_accepted}"
    return text + (f" ({usage.total_refused} refused)" if usage.total_refused else "")


def _can_show(text: str) -> bool:
    """Whether standard output's encoding can write *text*."""
    try:
        text.encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _rotation(old: KeyInfo, infos: Sequence[KeyInfo]) -> str:
    """One line on an old key whose replacement is not final yet: first used, or not yet."""
    if not old.status.revocable:
        return ""  # the rotation is done: the old key no longer works
    new = next((info for info in infos if info.key_id == old.replaced_by), None)
    pair = f"{old.key_id} -> {old.replaced_by}"
    if old.replacement_first_used_at is not None:
        first = _when(old.replacement_first_used_at)
        return f"{pair}  new key first used at {first}; revoke the old one"
    if new is not None and new.revoke_old_on_first_use:
        return f"{pair}  new key not used yet; {old.key_id} is revoked at its first use"
    return f"{pair}  new key not used yet: keep {old.key_id} until it is"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Aligned columns; the last one, free text, is not padded. Every cell is shown escaped:
    an id from the store cannot send the operator's terminal control sequences.
    """
    rows = [[_shown(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]))


def _shown(text: str) -> str:
    """*text* with every unprintable character (escapes, newlines, C1 controls) as ``\\x..``."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
        for c in text
    )


# --- opening the store -----------------------------------------------------------------------

_SQLITE: Final = "sqlite:///"


def _open(url: str, *, init: bool) -> Database:
    """The store at *url*; unless *init*, one that ``db init`` prepared (none is created)."""
    if "://" not in url and not url.startswith("sqlite:"):
        if "=" in url:  # a libpq key=value string: never echoed, it may hold a password
            raise CommandError(
                "the store is a URL, not a key=value connection string: write it as "
                "postgresql://USER@HOST:PORT/DBNAME (the password in $PGPASSWORD or ~/.pgpass)",
                2,
            )
        raise CommandError(
            f"the store is a URL, not a file name: for a SQLite file, sqlite:///{url}", 2
        )
    if url.startswith(_SQLITE):  # SQLite creates a missing file: a typo must not
        path = os.path.abspath(url.removeprefix(_SQLITE))
        folder = os.path.dirname(path)
        if init and not os.path.isdir(folder):
            raise CommandError(f"cannot create {path}: there is no directory {folder}", 2)
        if not init and not os.path.exists(path):
            raise CommandError(
                f"there is no store at {path} (from {url}): check --store or "
                f"${ENVIRONMENT_VARIABLE}, or create it with '{_PROG.get()} db init'"
            )
    elif url.startswith(("postgresql://", "postgres://")):
        _reach_postgres(url)
    try:
        db = open_database(url)
    except (InvalidStoreURL, ImportError) as exc:  # no such store, or its extra is missing
        raise CommandError(str(exc), 2) from None
    try:  # SchemaTooNew goes to main() like any KeyturnError
        if not init and db.schema_version() <= 0:
            raise CommandError(
                f"the store {redact_url(url)} has no keyturn tables in the first schema of "
                f"its search_path: run '{_PROG.get()} db init'"
            )
    except BaseException:
        db.close()
        raise
    return db


def _reach_postgres(url: str) -> None:
    """Connect once, so that a server that refuses or is down is reported at once, with
    libpq's reason (the store's pool would retry in the background until its timeout)."""
    try:
        import psycopg
    except ImportError:
        return  # open_database() says which extra to install
    timeout = {} if "connect_timeout" in url else {"connect_timeout": 5}
    try:
        psycopg.connect(url, **timeout).close()  # type: ignore[arg-type]
    except psycopg.Error as exc:
        reason = _without_secrets(" ".join(str(exc).split()), url)
        if isinstance(exc, psycopg.ProgrammingError):
            # libpq could not parse the URL, and quotes the part it stopped at, which may be
            # the password: only the kind of error is said.
            reason = reason.partition(":")[0] + " (check the URL's %-escapes and quoting)"
        raise CommandError(f"cannot connect to the store {redact_url(url)}: {reason}") from None


def _without_secrets(text: str, url: str) -> str:
    """*text* with every password of *url* (as written and percent-decoded) replaced."""
    userinfo = url.partition("://")[2].rpartition("@")[0]
    secrets = [userinfo.partition(":")[2]] if ":" in userinfo else []
    secrets += re.findall(r"(?:^|[?&])(?:ssl)?password=([^&]*)", url.partition("?")[2])
    for secret in sorted({*secrets, *map(unquote, secrets)}, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    return text


def _driver_errors() -> tuple[type[Exception], ...]:
    """The database drivers' errors: the store failed (disk, lock, permissions, server)."""
    psycopg = sys.modules.get("psycopg")  # imported only if a PostgreSQL store was opened
    return (sqlite3.Error,) if psycopg is None else (sqlite3.Error, psycopg.Error)


def _in_store(
    command: Callable[[Database, argparse.Namespace], None], args: argparse.Namespace
) -> int:
    """Run a store command on the store the options and environment name."""
    args.url = getattr(args, "store", None) or os.environ.get(ENVIRONMENT_VARIABLE)
    args.url = args.url or DEFAULT_STORE_URL
    db = _open(args.url, init=command is db_init)
    try:
        command(db, args)
    except _driver_errors() as exc:
        first_line = (str(exc).splitlines() or [""])[0]  # not the SQL excerpt that follows
        raise CommandError(f"the store failed: {type(exc).__name__}: {first_line}") from None
    finally:
        db.close()
    return 0


# --- commands without a store ------------------------------------------------------------------


def demo(args: argparse.Namespace) -> int:
    from keyturn import demo  # the demo extra (uvicorn) only when asked for

    store = ["--store", args.store] if getattr(args, "store", None) else []
    demo.main([*store, *args.options])
    return 0


def scan(args: argparse.Namespace) -> int:
    from keyturn import scan

    if args.paths and (args.staged or args.diff):
        raise CommandError("--staged and --diff take no PATH", 2)
    if args.staged:
        try:
            findings = list(scan.find_staged_keys())
        except (OSError, subprocess.CalledProcessError) as exc:
            reason = (getattr(exc, "stderr", b"") or b"").decode(errors="replace").strip()
            raise CommandError(f"git diff --cached failed: {reason or exc}", 2) from None
    elif args.diff:
        findings = list(scan.find_added_keys(_read(args.diff)))
    else:
        paths = args.paths or ["."]
        for path in paths:
            if path != "-" and not os.path.lexists(path):
                raise CommandError(f"no such file or directory: {path}", 2)
        findings = list(scan.scan_paths(path for path in paths if path != "-"))
        if "-" in paths:
            findings += scan.find_keys(sys.stdin.read(), "<stdin>")
    for finding in findings:
        print(finding)
    if findings:
        print(
            f"{_PROG.get()}: {len(findings)} API key(s) found: revoke them in the console "
            "and remove them from these files",
            file=sys.stderr,
        )
    return 1 if findings else 0


def _read(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        with open(name, encoding="utf-8", errors="surrogateescape") as file:
            return file.read()
    except OSError as exc:
        raise CommandError(f"cannot read {name}: {exc.strerror}", 2) from None


# --- the parser: the table of contents ------------------------------------------------------


_EXAMPLES: Final = """\
examples:
  keyturn db init
  keyturn org add org_acme --tenant acme --default
  keyturn member add alice org_acme --role admin
  keyturn keys list --as alice --status active --json
  keyturn keys revoke --as alice 3fZk8QmPx2Lw --reason "leaked in a build log"
  keyturn audit export --since 7d --output events.jsonl
  keyturn notify --console-url https://app.example/keys --smtp mail.example:25 \\
      --from keys@app.example --to "{account}@example.com"
  keyturn scan --staged               # exit 1 if the next commit adds a key

Keys are created and rotated in the key console only, by the signed-in user.

store URLs:
  sqlite:///keyturn.sqlite3        a file, relative to the current directory
  sqlite:////var/lib/app/keys.db    an absolute path (four slashes)
  postgresql://app@127.0.0.1:5432/app

exit status: 0 done; 1 not found, not revocable, not reachable, conflicting, or the
store failed; 2 bad usage or an invalid value.
"""


def _examples(prog: str) -> str:
    return _EXAMPLES.replace("\n  keyturn ", f"\n  {prog} ")


def _made_elsewhere(args: argparse.Namespace) -> int:
    """``keys create`` and ``keys rotate``: where keys are made instead (spec section 1)."""
    verb, call = {
        "create": ("created", "KeyManager.create(account_id, name=..., scope=...)"),
        "rotate": ("rotated", "KeyManager.rotate(account_id, key_id)"),
    }[args.verb]
    raise CommandError(
        f"this command makes no keys: keys are {verb} by the signed-in user in the key "
        f"console (keyturn.console), or by your service's code for its signed-in user with "
        f"{call}; in development, see 'A first key in development' in the quickstart",
        2,
    )


def _nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _within(text: str) -> timedelta:
    """``14d`` or ``12h``: how far ahead ``keys expiring`` looks."""
    match = re.fullmatch(r"(\d{1,4})([dh])", text.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"give days or hours, like 14d or 12h, not {text!r}")
    count = int(match[1])
    return timedelta(days=count) if match[2] == "d" else timedelta(hours=count)


def _span(within: timedelta) -> str:
    days, seconds = within.days, within.seconds
    return f"{days}d" if not seconds else f"{days * 24 + seconds // 3600}h"


def _version() -> str:
    try:
        return f"keyturn {version('keyturn')}"
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "keyturn (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The ``keyturn`` argument parser; each command sets ``run(args) -> exit status``."""
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument(
        "--store",
        metavar="URL",
        default=argparse.SUPPRESS,  # before or after the command; after wins
        help=f"the store (default: ${ENVIRONMENT_VARIABLE}, else {DEFAULT_STORE_URL})",
    )
    parser = argparse.ArgumentParser(
        prog=_PROG.get(),
        description="Manage personal API keys, organizations and memberships in a store.",
        epilog=_examples(_PROG.get()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[store],
    )
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    def group(name: str, text: str) -> Callable[..., argparse.ArgumentParser]:
        sub = commands.add_parser(name, help=text, description=text)
        leaves = sub.add_subparsers(title="commands", metavar="COMMAND", required=True)

        def leaf(
            name: str, run: Callable[..., Any], text: str, *, listed: bool = True, **extra: Any
        ) -> Any:
            if not listed:  # no help: argparse leaves it out of the list of commands
                return leaves.add_parser(name, add_help=False, prefix_chars="\0")
            command = leaves.add_parser(name, help=text, description=text, parents=[store], **extra)
            command.set_defaults(run=partial(_in_store, run))
            return command

        return leaf

    def account(command: argparse.ArgumentParser) -> None:
        command.add_argument(
            "--as",
            dest="account",
            metavar="ACCOUNT",
            required=True,
            type=_nonempty,
            help="the account whose keys these are",
        )

    def as_json(command: argparse.ArgumentParser) -> None:
        command.add_argument("--json", action="store_true", help="print JSON (UTF-8)")

    db = group("db", "the store itself")
    db("init", db_init, "create or upgrade keyturn's tables (idempotent)")

    org = group("org", "organizations")
    sub = org("add", org_add, "add an organization to a tenant")
    sub.add_argument(
        "organization", metavar="ORG", type=_nonempty, help="as x-organization-id names it"
    )
    sub.add_argument("--tenant", required=True, type=_nonempty, help="the tenant it belongs to")
    sub.add_argument("--default", action="store_true", help="make it the tenant's 'default' one")
    sub = org("list", org_list, "list the organizations, by tenant")
    sub.add_argument("--tenant", type=_nonempty, help="only this tenant's")
    as_json(sub)
    sub = org("remove", org_remove, "remove an organization and its memberships")
    sub.add_argument("organization", metavar="ORG", type=_nonempty)

    member = group("member", "who holds which role in which organization")
    sub = member("add", member_add, "give an account a role in an organization")
    sub.add_argument("account", metavar="ACCOUNT", type=_nonempty)
    sub.add_argument("organization", metavar="ORG", type=_nonempty)
    sub.add_argument("--role", required=True, type=_nonempty, help="e.g. admin, member, viewer")
    sub = member("list", member_list, "list the accounts of an organization and their roles")
    sub.add_argument("organization", metavar="ORG", type=_nonempty)
    as_json(sub)
    sub = member("remove", member_remove, "take an account's role in an organization away")
    sub.add_argument("account", metavar="ACCOUNT", type=_nonempty)
    sub.add_argument("organization", metavar="ORG", type=_nonempty)

    keys = group(
        "keys",
        "list personal API keys, and revoke one in an emergency (keys are created and "
        "rotated in the console)",
    )
    sub = keys("list", keys_list, "list the account's own keys, newest first (no secrets)")
    account(sub)
    sub.add_argument("--status", choices=STATUSES, type=str.lower, help="any case")
    sub.add_argument("--scope", help="tenant, organization, or one organization's id")
    as_json(sub)
    sub = keys(
        "revoke",
        keys_revoke,
        "an operator's emergency revoke of one of the account's keys: immediate, final",
        epilog="Who ran the command and --reason are logged (logger keyturn.cli) and printed, "
        "so the key's creator can be told. The creator revokes their own keys in the console.",
    )
    account(sub)
    sub.add_argument("key_id", metavar="KEY_ID", help=f"as shown by '{_PROG.get()} keys list'")
    sub.add_argument("--reason", required=True, help="why the key is revoked, for its creator")
    sub = keys("expiring", keys_expiring, "list the account's keys that expire soon, soonest first")
    account(sub)
    sub.add_argument(
        "--within",
        type=_within,
        default=timedelta(days=14),
        metavar="SPAN",
        help="days or hours ahead, like 14d or 12h (default: 14d)",
    )
    as_json(sub)
    sub = keys("leaked", keys_leaked, "list every account's keys reported leaked, latest first")
    as_json(sub)
    for verb in ("create", "rotate"):  # not listed: they answer where keys are made
        sub = keys(verb, _made_elsewhere, "", listed=False)
        sub.add_argument("options", nargs=argparse.REMAINDER)
        sub.set_defaults(run=_made_elsewhere, verb=verb)

    audit = group("audit", "the record of every key action")
    sub = audit(
        "export",
        audit_export,
        "write every account's key events as JSON lines, oldest first (for a SIEM)",
    )
    sub.add_argument(
        "--since",
        type=_since,
        metavar="WHEN",
        help="only events at or after: a date, an ISO 8601 instant (UTC if no offset), or 7d",
    )
    sub.add_argument(
        "--output", metavar="FILE", help="write to FILE (mode 600, replaced) instead of stdout"
    )

    sub = commands.add_parser(
        "notify",
        parents=[store],
        help="tell keys' creators what is due: expiring, expired, Inactive, leaked, revoked",
        description="Send the lifecycle notices due now, each once per key whatever runs at "
        "once (for cron or a systemd timer), by email or a signed webhook. The SMTP password "
        f"is read from ${SMTP_PASSWORD}, the webhook's secret from ${WEBHOOK_SECRET}. Exit "
        "status 1 if a notice could not be delivered (the next run sends it).",
    )
    sub.set_defaults(run=partial(_in_store, notify))
    sub.add_argument(
        "--console-url", required=True, metavar="URL", help="the key console every notice links to"
    )
    channel = sub.add_mutually_exclusive_group(required=True)
    channel.add_argument("--smtp", metavar="HOST[:PORT]", help="send email through this server")
    channel.add_argument("--webhook", metavar="URL", help="POST each notice, signed, to URL")
    sub.add_argument("--from", dest="sender", metavar="ADDRESS", help="the email's sender")
    sub.add_argument("--starttls", action="store_true", help="upgrade SMTP with STARTTLS")
    sub.add_argument("--smtp-user", metavar="USER", help="log in to the SMTP server as USER")
    sub.add_argument(
        "--to",
        default="{account}",
        metavar="TEMPLATE",
        help="the creator's address, {account} standing for the account id "
        "(default: the account id itself), e.g. {account}@example.com",
    )
    sub.add_argument(
        "--window",
        type=_within,
        default=timedelta(days=30),
        metavar="SPAN",
        help="how far back to look for what happened (default: 30d)",
    )

    sub = commands.add_parser(
        "demo",
        help=f"serve the list-models example with fresh demo keys ('{_PROG.get()} demo --help')",
        add_help=False,  # the demo's own options and --help: keyturn.demo parses them
        prefix_chars="\0",
    )
    sub.add_argument("options", nargs=argparse.REMAINDER)
    sub.set_defaults(run=demo)

    sub = commands.add_parser(
        "scan",
        help="find API keys in files before they are committed (exit 1 if any)",
        description="Report every keyturn API key (checked by its checksum, so look-alikes "
        "are ignored) in files and folders, by place, key id and hint: never the secret. "
        "Folders are walked, skipping .git, virtual environments and caches; only regular "
        "text files are read (UTF-8 or UTF-16). '-' reads standard input. Exit status: 0 "
        "no key found, 1 keys found (revoke them), 2 bad usage.",
    )
    sub.add_argument("paths", nargs="*", metavar="PATH", help="default: .")
    source = sub.add_mutually_exclusive_group()
    source.add_argument(
        "--staged",
        action="store_true",
        help="only the keys the next commit adds, read from the staged files (a pre-commit check)",
    )
    source.add_argument(
        "--diff",
        metavar="FILE",
        help="only the added lines of a unified diff ('-': standard input)",
    )
    sub.set_defaults(run=scan)
    return parser


# --- running a command -----------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, *, prog: str = "keyturn") -> int:
    """Run the command in *argv* (default: ``sys.argv[1:]``); returns the exit status. Its
    usage and messages call the command *prog*."""
    token = _PROG.set(prog)
    try:
        return _main(argv)
    finally:
        _PROG.reset(token)


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
        status: int = args.run(args)
    except SystemExit as exit:  # --help, a usage error argparse printed, the demo's refusal
        if isinstance(exit.code, str):
            print(f"{_PROG.get()}: error: {exit.code}", file=sys.stderr)
            return 1
        return exit.code or 0
    except (CommandError, KeyturnError) as error:
        print(f"{_PROG.get()}: error: {error}", file=sys.stderr)
        if isinstance(error, CommandError):
            return error.status
        return 2 if isinstance(error, InvalidKeyName | InvalidExpiry) else 1
    except BrokenPipeError:  # `keyturn keys list | head`: the reader left, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
