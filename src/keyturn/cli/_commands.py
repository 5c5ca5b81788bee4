"""The ``keyturn`` command's commands, each a plain function.

A store command is a function ``(db, args)`` that returns nothing, run on an open store by
:func:`in_store`, which returns its exit status. ``demo`` and ``scan`` open no store here
(the demo opens its own, from ``--store``): each is a function ``(args)`` that returns the
exit status itself. Their arguments are in the parser's table (``_parser``).

No command creates or rotates a key (:func:`made_elsewhere`). An operator's emergency
``keys revoke`` needs ``--reason``; who ran it and why is logged and printed.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from keyturn._core import token as _token
from keyturn._core.decision import DEFAULT_ORGANIZATION, DEFAULT_ORGANIZATION_PATTERN
from keyturn._core.model import KeyInfo, Organization, ScopeKind, Status
from keyturn.activity import By, Channel, KeyEvent, json_line
from keyturn.cli import _output as out
from keyturn.cli._output import PROG, CommandError
from keyturn.cli._store import driver_errors, open_store, store_url
from keyturn.errors import KeyNotFound
from keyturn.manager import KeyManager
from keyturn.protocols import UsageStore
from keyturn.stores import redact_url
from keyturn.usage import KeyUsage, by_key

if TYPE_CHECKING:
    from keyturn.protocols import Database

_log: Final = logging.getLogger("keyturn.cli")
STATUSES: Final = {status.value.lower(): status for status in Status}
WEEK: Final = 7  # days of requests `keys list` shows


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
        out.warn("x-organization-id: default always names the tenant's default organization")
    elif not re.fullmatch(DEFAULT_ORGANIZATION_PATTERN, org, re.ASCII):
        out.warn(
            f"x-organization-id cannot name {org!r}: an organization id is a letter or digit, "
            "then up to 127 letters, digits and _.:-"
        )
    db.membership.add_organization(org, tenant_id=tenant, default=args.default)
    default = ", its default organization" if args.default else ""
    print(f"Organization {org} is in tenant {tenant}{default}.")


def org_list(db: Database, args: argparse.Namespace) -> None:
    found = [o for o in db.membership.organizations() if args.tenant in (None, o.tenant_id)]
    if args.json:
        out.print_json(
            [{"id": o.id, "tenant_id": o.tenant_id, "default": o.is_default} for o in found]
        )
    elif not found:
        print("No organizations." if args.tenant is None else f"Tenant {args.tenant} has none.")
    else:
        rows = [(o.id, o.tenant_id, "yes" if o.is_default else "-") for o in found]
        out.table(("ORG", "TENANT", "DEFAULT"), rows)


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
        out.print_json([{"account_id": account, "role": role} for account, role in members])
    elif not members:
        print(f"{args.organization} has no members.")
    else:
        out.table(("ACCOUNT", "ROLE"), members)


def member_remove(db: Database, args: argparse.Namespace) -> None:
    account, org = args.account, args.organization
    if db.membership.get_role(account, org) is None:
        raise CommandError(f"{account} has no role in {org}")
    with _inactivated(db, [account]):
        db.membership.remove_member(account, org)
        print(f"{account} no longer has a role in {org}.")


def keys_list(db: Database, args: argparse.Namespace) -> None:
    kind = ScopeKind(args.scope) if args.scope in ("tenant", "organization") else None
    manager = _manager(db)
    infos = manager.list(args.account, status=STATUSES.get(args.status), scope=kind)
    if args.scope is not None and kind is None:  # one organization's id
        infos = [info for info in infos if info.scope.organization_id == args.scope]
    usage = _last_week(manager, args.account, infos)
    if args.json:
        out.print_json([out.as_json(info, usage) for info in infos])
    elif not infos:
        print(f"{args.account} has no key that matches.")
    else:
        out.key_table(infos, usage)


def _last_week(
    manager: KeyManager, account_id: str, infos: Sequence[KeyInfo]
) -> dict[str, KeyUsage] | None:
    """The keys' counts of the last seven UTC days, today included; ``None`` when the
    store keeps none."""
    if not isinstance(manager.store, UsageStore) or not infos:
        return None
    today = datetime.now(UTC).date()
    rows = manager._run(manager._usage(account_id, today - timedelta(days=WEEK - 1)))
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
        out.shown(operator),
        info.key_id,
        out.shown(args.account),
        out.shown(reason),
    )
    print(
        f"Revoked key {info.key_id} ({info.hint}, {info.name!r}) of {out.shown(args.account)}: "
        f"refused from its next request on.\nRevoked by {out.shown(operator)}: {out.shown(reason)}"
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
        out.print_json([out.as_json(info) for info in infos])
    elif not infos:
        print(f"{args.account} has no key expiring within {_span(args.within)}.")
    else:
        print(f"Expiring within {_span(args.within)}, soonest first:")
        out.key_table(infos)


def keys_leaked(db: Database, args: argparse.Namespace) -> None:
    # Every account's keys: reported by a code host's secret scanning (keyturn.leaks).
    manager = _manager(db)
    leaked = manager._run(manager._leaked())
    leaks = [(key, key.leaked) for key in leaked if key.leaked is not None]
    if args.json:
        fields = ("key_id", "hint", "name", "account_id")
        out.print_json(
            [
                {
                    **{field: getattr(key, field) for field in fields},
                    "reported_at": out.instant(leak.at),
                    "url": leak.url,
                    "revoked_at": out.instant(key.revoked_at),
                }
                for key, leak in leaks
            ]
        )
    elif not leaks:
        print("No key has been reported leaked.")
    else:
        rows = [
            (
                key.key_id,
                key.hint,
                key.account_id,
                out.when(leak.at),
                out.when(key.revoked_at),
                leak.url,
            )
            for key, leak in leaks
        ]
        out.table(("KEY ID", "HINT", "ACCOUNT", "REPORTED", "REVOKED", "URL"), rows)


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


def _export(db: Database, since: datetime | None, sink: Any) -> int:
    """Write the events from *since* on to *sink*, one JSON line each; the number written."""
    if hasattr(sink, "reconfigure"):
        sink.reconfigure(encoding="utf-8")

    def write(event: KeyEvent) -> None:
        sink.write(json_line(event) + "\n")

    manager = _manager(db)
    return manager._run(manager._events_since(since, write, EXPORT_PAGE))


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


def _key_id_argument(key_id: str) -> str:
    if key_id.startswith(_token.PREFIX):  # a key or a hint, not an id; never echo it
        raise CommandError(
            f"KEY_ID is the key's id, the KEY ID column of '{PROG.get()} keys list' "
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
        out.key_table(lost)


def in_store(
    command: Callable[[Database, argparse.Namespace], None], args: argparse.Namespace
) -> int:
    """Run a store command on the store the options and environment name."""
    args.url = store_url(getattr(args, "store", None))
    db = open_store(args.url, init=command is db_init)
    try:
        command(db, args)
    except driver_errors() as exc:
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
            f"{PROG.get()}: {len(findings)} API key(s) found: revoke them in the console "
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


def made_elsewhere(args: argparse.Namespace, *, verb: str) -> int:
    """``keys create`` and ``keys rotate``: where keys are made instead (spec section 1)."""
    done, call = {
        "create": ("created", "KeyManager.create(account_id, name=..., scope=...)"),
        "rotate": ("rotated", "KeyManager.rotate(account_id, key_id)"),
    }[verb]
    raise CommandError(
        f"this command makes no keys: keys are {done} by the signed-in user in the key "
        f"console (keyturn.console), or by your service's code for its signed-in user with "
        f"{call}; in development, see 'A first key in development' in the quickstart",
        2,
    )


def _span(within: timedelta) -> str:
    days, seconds = within.days, within.seconds
    return f"{days}d" if not seconds else f"{days * 24 + seconds // 3600}h"
