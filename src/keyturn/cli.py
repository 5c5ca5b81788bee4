"""The ``keyturn`` command: keys, organizations and memberships in a store, from a shell.

::

    keyturn db init
    keyturn org add org_acme --tenant acme --default
    keyturn member add alice org_acme --role admin
    keyturn keys create --as alice --name "CI deploys" --tenant acme --lifetime 7d
    keyturn keys list --as alice --status active
    keyturn keys revoke --as alice 3fZk8QmPx2Lw
    keyturn scan .          # exit 1 if a key sits in a file

The store is ``--store URL``, else ``$KEYTURN_STORE_URL``, else
``sqlite:///keyturn.sqlite3`` (see :func:`keyturn.stores.open_database`). Every command but
``db init`` needs an initialized store.

``--as ACCOUNT`` names the signed-in account the console would act for: the command follows
the console's rules (a user lists and revokes only the keys they created), and is meant for
operators and local development -- whoever runs it can already write to the store.

Exit status: 0 done; 1 not found, not revocable, not reachable, conflicting, or the store
failed; 2 bad usage or an invalid value (name, expiry, time zone, store URL).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sqlite3
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any, Final, TextIO, TypeAlias
from urllib.parse import urlsplit, urlunsplit
from zoneinfo import ZoneInfo

from keyturn._decision import DEFAULT_ORGANIZATION, DEFAULT_ORGANIZATION_PATTERN
from keyturn._model import CustomDate, KeyInfo, Lifetime, Scope, ScopeKind, Status
from keyturn.errors import (
    InvalidExpiry,
    InvalidKeyName,
    KeyNotFound,
    KeyNotRevocable,
    ScopeNotReachable,
    StoreUnreachable,
)
from keyturn.manager import KeyManager
from keyturn.stores import open_database
from keyturn.stores.sqlite import SQLiteDatabase

if TYPE_CHECKING:
    from keyturn.protocols import Database

    Handler: TypeAlias = Callable[[Database, argparse.Namespace, TextIO], None]

__all__ = ["main"]

ENVIRONMENT_VARIABLE: Final = "KEYTURN_STORE_URL"
DEFAULT_STORE_URL: Final = "sqlite:///keyturn.sqlite3"

LIFETIMES: Final = {
    "3h": Lifetime.HOURS_3,
    "1d": Lifetime.DAYS_1,
    "7d": Lifetime.DAYS_7,
    "30d": Lifetime.DAYS_30,
    "90d": Lifetime.DAYS_90,
}
STATUSES: Final = {status.value.lower(): status for status in Status}

# Most specific first: InvalidKeyName is a ValueError, KeyNotFound a LookupError.
_EXIT_CODES: Final[Sequence[tuple[type[Exception], int]]] = (
    (InvalidKeyName, 2),
    (InvalidExpiry, 2),
    (KeyNotFound, 1),
    (KeyNotRevocable, 1),
    (ScopeNotReachable, 1),
    (LookupError, 1),  # an organization that does not exist
    (ValueError, 1),  # a conflicting organization
)


class CommandError(Exception):
    """A failure the command reports in one line, with its exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


# --- the commands ---------------------------------------------------------------------------


def _db_init(db: Database, args: argparse.Namespace, out: TextIO) -> None:
    version = db.create_schema()
    print(f"The store {_redact(args.store)} is ready (schema version {version}).", file=out)


def _org_add(db: Database, args: argparse.Namespace, out: TextIO) -> None:
    existing = db.membership.get_organization(args.organization)
    if existing is not None and (existing.tenant_id, existing.is_default) != (
        args.tenant,
        args.default,
    ):
        default = ", as its default organization" if existing.is_default else ""
        raise CommandError(
            f"organization {args.organization!r} already exists in tenant "
            f"{existing.tenant_id!r}{default}; 'org add' does not change an organization"
        )
    if args.organization == DEFAULT_ORGANIZATION:
        _warn("x-organization-id: default always names the tenant's default organization")
    elif not re.fullmatch(DEFAULT_ORGANIZATION_PATTERN, args.organization, re.ASCII):
        _warn(
            f"x-organization-id cannot name {args.organization!r}: an organization id is a "
            "letter or digit, then up to 127 letters, digits and _.:-"
        )
    db.membership.add_organization(args.organization, tenant_id=args.tenant, default=args.default)
    default = ", its default organization" if args.default else ""
    print(f"Organization {args.organization} is in tenant {args.tenant}{default}.", file=out)


def _member_add(db: Database, args: argparse.Namespace, out: TextIO) -> None:
    db.membership.add_member(args.account, args.organization, role=args.role)
    print(f"{args.account} has the role {args.role} in {args.organization}.", file=out)


def _member_remove(db: Database, args: argparse.Namespace, out: TextIO) -> None:
    if db.membership.get_role(args.account, args.organization) is None:
        raise CommandError(f"{args.account} has no role in {args.organization}")
    db.membership.remove_member(args.account, args.organization)
    print(f"{args.account} no longer has a role in {args.organization}.", file=out)


def _warn(message: str) -> None:
    print(f"keyturn: warning: {message}", file=sys.stderr)


def _keys_create(db: Database, args: argparse.Namespace, out: TextIO) -> None:
    if args.organization is not None:
        organization = db.membership.get_organization(args.organization)
        if organization is None:
            raise CommandError(f"there is no organization {args.organization!r}")
        scope = Scope.organization(organization.id, tenant_id=organization.tenant_id)
    else:
        scope = Scope.tenant(args.tenant)
    expiry: Lifetime | CustomDate
    if args.expires_on is not None:
        expiry = CustomDate(args.expires_on, args.time_zone or _local_time_zone())
    elif args.time_zone is not None:
        raise CommandError("--time-zone goes with --expires-on", status=2)
    else:
        expiry = LIFETIMES[args.lifetime]
    created = KeyManager(db.keys, db.membership).create(
        args.account, name=args.name, scope=scope, expiry=expiry
    )
    info = created.info
    local = ""
    if isinstance(expiry, CustomDate):  # the zone is valid: create() checked it
        zone = str(expiry.time_zone)
        local = f" ({info.expires_at.astimezone(ZoneInfo(zone)):%Y-%m-%d %H:%M} in {zone})"
    print(f"Created key {info.key_id} for {args.account}.", file=out)
    print(f"  name     {info.name}", file=out)
    print(f"  scope    {info.scope}", file=out)
    print(f"  hint     {info.hint}", file=out)
    print(f"  expires  {_when(info.expires_at)}{local}", file=out)
    print("", file=out)
    print(
        "Secret -- shown once, it cannot be retrieved later; keep it in a secret store:", file=out
    )
    print(created.secret, file=out)


def _keys_list(db: Database, args: argparse.Namespace, out: TextIO) -> None:
    scope, organization_id = None, None
    if args.scope in ("tenant", "organization"):
        scope = ScopeKind(args.scope)
    elif args.scope is not None:
        scope, organization_id = ScopeKind.ORGANIZATION, args.scope
    status = None if args.status is None else STATUSES[args.status]
    infos = KeyManager(db.keys, db.membership).list(args.account, status=status, scope=scope)
    if organization_id is not None:
        infos = [info for info in infos if info.scope.organization_id == organization_id]
    if args.json:
        json.dump([_as_json(info) for info in infos], out, indent=2)
        print(file=out)
    elif not infos:
        print(f"No keys of {args.account} match.", file=out)
    else:
        _table(infos, out)


def _keys_revoke(db: Database, args: argparse.Namespace, out: TextIO) -> None:
    if args.key_id.startswith("rma_"):  # a key or a hint, not an id; never echo it
        raise CommandError(
            "KEY_ID is the key's id, the KEY ID column of 'keyturn keys list' "
            "(12 letters and digits), not the key or its hint",
            status=2,
        )
    info = KeyManager(db.keys, db.membership).revoke(args.account, args.key_id)
    print(
        f"Revoked key {info.key_id} ({info.hint}, {info.name!r}): "
        "refused from its next request on.",
        file=out,
    )


# --- output ---------------------------------------------------------------------------------


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _as_json(info: KeyInfo) -> dict[str, Any]:
    def instant(at: datetime | None) -> str | None:
        return None if at is None else at.astimezone(UTC).isoformat()

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
    }


def _table(infos: Sequence[KeyInfo], out: TextIO) -> None:
    header = ("KEY ID", "HINT", "STATUS", "SCOPE", "EXPIRES", "LAST USED", "NAME")
    rows = [
        (
            info.key_id,
            info.hint,
            info.status.value,
            info.scope.organization_id or f"tenant {info.scope.tenant_id}",
            _when(info.expires_at),
            _when(info.last_used_at),
            info.name,
        )
        for info in infos
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]), file=out)


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _local_time_zone() -> str:
    """The IANA name of this machine's zone: $TZ, else /etc/localtime's target, else UTC."""
    name = os.environ.get("TZ", "").removeprefix(":")
    if name:
        return name
    target = os.path.realpath("/etc/localtime")
    _, found, zone = target.partition("/zoneinfo/")
    return zone if found and zone else "UTC"


# --- the parser -----------------------------------------------------------------------------

_EXAMPLES: Final = """\
examples:
  keyturn db init
  keyturn org add org_acme --tenant acme --default
  keyturn member add alice org_acme --role admin
  keyturn keys create --as alice --name "CI deploys" --tenant acme --lifetime 7d
  keyturn keys create --as alice --name laptop --org org_acme \\
      --expires-on 2026-12-31 --time-zone Europe/Paris
  keyturn keys list --as alice --status active --json
  keyturn keys revoke --as alice 3fZk8QmPx2Lw
  keyturn scan .                      # exit 1 if a key sits in a file

store URLs:
  sqlite:///keyturn.sqlite3        a file, relative to the current directory
  sqlite:////var/lib/app/keys.db    an absolute path (four slashes)
  postgresql://app@127.0.0.1:5432/app

exit status: 0 done; 1 not found, not revocable, not reachable, conflicting, or the
store failed; 2 bad usage or an invalid value.
"""


_AS: Final = "the signed-in account the console would act for"


def _nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date in YYYY-MM-DD form: {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """The ``keyturn`` argument parser (each leaf command sets ``handler``)."""
    formatter = argparse.RawDescriptionHelpFormatter
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument(
        "--store",
        metavar="URL",
        default=argparse.SUPPRESS,  # given after the command, it overrides the one before
        help=f"the store (default: ${ENVIRONMENT_VARIABLE}, else {DEFAULT_STORE_URL})",
    )
    parser = argparse.ArgumentParser(
        prog="keyturn",
        description="Manage personal API keys, organizations and memberships in a store.",
        epilog=_EXAMPLES,
        formatter_class=formatter,
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        default=None,
        help=f"the store (default: ${ENVIRONMENT_VARIABLE}, else {DEFAULT_STORE_URL})",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    def group(name: str, text: str) -> argparse._SubParsersAction[argparse.ArgumentParser]:
        sub = commands.add_parser(name, help=text, description=text)
        return sub.add_subparsers(title="commands", metavar="COMMAND", required=True)

    def leaf(
        parent: argparse._SubParsersAction[argparse.ArgumentParser],
        name: str,
        handler: Handler,
        text: str,
        epilog: str | None = None,
    ) -> argparse.ArgumentParser:
        sub = parent.add_parser(
            name,
            help=text,
            description=text,
            epilog=epilog,
            parents=[store],
            formatter_class=formatter,
        )
        sub.set_defaults(handler=handler)
        return sub

    db = group("db", "the store itself")
    leaf(db, "init", _db_init, "create or upgrade keyturn's tables (idempotent)")

    org = group("org", "organizations")
    sub = leaf(org, "add", _org_add, "add an organization to a tenant")
    sub.add_argument(
        "organization",
        metavar="ORG",
        type=_nonempty,
        help="the organization id, as x-organization-id will name it",
    )
    sub.add_argument("--tenant", required=True, type=_nonempty, help="the tenant it belongs to")
    sub.add_argument(
        "--default", action="store_true", help="make it the tenant's 'default' organization"
    )

    member = group("member", "who holds which role in which organization")
    sub = leaf(member, "add", _member_add, "give an account a role in an organization")
    sub.add_argument("account", metavar="ACCOUNT", type=_nonempty)
    sub.add_argument("organization", metavar="ORG", type=_nonempty)
    sub.add_argument("--role", required=True, type=_nonempty, help="e.g. admin, member, viewer")
    sub = leaf(member, "remove", _member_remove, "take an account's role in an organization away")
    sub.add_argument("account", metavar="ACCOUNT", type=_nonempty)
    sub.add_argument("organization", metavar="ORG", type=_nonempty)

    keys = group("keys", "create, list and revoke personal API keys")
    sub = leaf(
        keys,
        "create",
        _keys_create,
        "create a key; its secret is printed once and cannot be retrieved later",
        epilog=(
            "The key expires after --lifetime (default 30d), or at the end of the day given\n"
            "by --expires-on in --time-zone (between tomorrow and one year from today)."
        ),
    )
    sub.add_argument(
        "--as", dest="account", metavar="ACCOUNT", required=True, type=_nonempty, help=_AS
    )
    sub.add_argument("--name", required=True, help="where the key is used (1-100 characters)")
    scope = sub.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "--tenant", type=_nonempty, help="a tenant-scoped key: works in every organization"
    )
    scope.add_argument(
        "--org",
        dest="organization",
        metavar="ORG",
        type=_nonempty,
        help="an organization-scoped key",
    )
    expiry = sub.add_mutually_exclusive_group()
    expiry.add_argument("--lifetime", choices=LIFETIMES, default="30d", help="default: 30d")
    expiry.add_argument("--expires-on", type=_date, metavar="YYYY-MM-DD", help="a custom date")
    sub.add_argument(
        "--time-zone",
        metavar="ZONE",
        help="IANA zone of --expires-on, e.g. Europe/Paris (default: this machine's zone)",
    )

    sub = leaf(keys, "list", _keys_list, "list the account's own keys, newest first (no secrets)")
    sub.add_argument(
        "--as", dest="account", metavar="ACCOUNT", required=True, type=_nonempty, help=_AS
    )
    sub.add_argument("--status", choices=STATUSES, type=str.lower, help="any case")
    sub.add_argument(
        "--scope", metavar="SCOPE", help="tenant, organization, or one organization's id"
    )
    sub.add_argument("--json", action="store_true", help="print JSON instead of a table")

    sub = leaf(keys, "revoke", _keys_revoke, "revoke one of the account's keys: immediate, final")
    sub.add_argument(
        "--as", dest="account", metavar="ACCOUNT", required=True, type=_nonempty, help=_AS
    )
    sub.add_argument("key_id", metavar="KEY_ID", help="as shown by 'keyturn keys list'")

    sub = commands.add_parser(
        "demo",
        help="serve the list-models example with fresh demo keys",
        description="Seed a demo tenant and user, print two fresh keys and curl lines, and "
        "serve the list-models example on 127.0.0.1 until Ctrl+C. Its store is not your "
        "own: it defaults to sqlite:///keyturn-demo.sqlite3 in the current directory.",
    )
    sub.add_argument(
        "--store",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="the demo's store (default: $KEYTURN_DEMO_STORE, else sqlite:///keyturn-demo.sqlite3)",
    )
    sub.add_argument(
        "--port", type=int, default=None, help="default: $KEYTURN_DEMO_PORT, else 8000"
    )
    sub.set_defaults(standalone=_demo)

    sub = commands.add_parser(
        "scan",
        help="find API keys in files before they are committed (exit 1 if any)",
        description="Report every keyturn API key (checked by its checksum, so look-alikes "
        "are ignored) in the given files and folders, by place, key id and hint: never the "
        "secret. Folders are walked, skipping .git, virtual environments and caches; binary "
        "files are skipped. '-' reads standard input, e.g. 'git diff --cached | keyturn "
        "scan -'. Exit status: 0 no key found, 1 keys found (revoke them), 2 bad usage.",
    )
    sub.add_argument("paths", nargs="*", default=["."], metavar="PATH", help="default: .")
    sub.set_defaults(standalone=_scan)
    return parser


def _demo(args: argparse.Namespace) -> int:
    from keyturn import demo  # the demo extra (uvicorn) only when asked for

    demo.main(
        [
            *(["--store", args.store] if getattr(args, "store", None) else []),
            *(["--port", str(args.port)] if args.port is not None else []),
        ]
    )
    return 0


def _scan(args: argparse.Namespace) -> int:
    from keyturn.scan import find_keys, scan_paths

    files = [path for path in args.paths if path != "-"]
    findings = list(scan_paths(files))
    if "-" in args.paths:
        findings += find_keys(sys.stdin.read(), "<stdin>")
    for finding in findings:
        print(finding)
    if findings:
        print(
            f"keyturn: {len(findings)} API key(s) found: revoke them in the console "
            "(keyturn keys revoke) and remove them from these files",
            file=sys.stderr,
        )
        return 1
    return 0


# --- running a command --------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in *argv* (default: ``sys.argv[1:]``); returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit:  # --help, or a usage error already printed by argparse
        return exit.code if isinstance(exit.code, int) else 2
    standalone = getattr(args, "standalone", None)
    if standalone is not None:  # demo and scan: no store of the user's to open
        code: int = standalone(args)
        return code
    args.store = args.store or os.environ.get(ENVIRONMENT_VARIABLE) or DEFAULT_STORE_URL
    try:
        return _run(args, sys.stdout)
    except CommandError as error:
        print(f"keyturn: error: {error}", file=sys.stderr)
        return error.status
    except BrokenPipeError:  # `keyturn keys list | head`: the reader left, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


class _ConnectionErrors(logging.Handler):
    """Keeps the pool's last "error connecting" line, instead of letting it print."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.last = " ".join(record.getMessage().split())


def _run(args: argparse.Namespace, out: TextIO) -> int:
    # A PostgreSQL pool connects in the background and logs each failed attempt; the
    # command reports the last one, once, in its own error line.
    pool_log = logging.getLogger("psycopg.pool")
    errors, propagate = _ConnectionErrors(), pool_log.propagate
    pool_log.addHandler(errors)
    pool_log.propagate = False
    try:
        try:
            db = open_database(args.store)
        except ValueError as exc:
            raise CommandError(str(exc), status=2) from None
        try:
            if args.handler is _db_init:
                _require_membership(db)
            else:
                _require_schema(db, args.store)
            args.handler(db, args, out)
        except CommandError:
            raise
        except Exception as exc:
            error = _command_error(exc, args.store, errors.last)
            if error is None:
                raise  # a bug: let the traceback show
            raise error from None
        finally:
            db.close()
    finally:
        pool_log.removeHandler(errors)
        pool_log.propagate = propagate
    return 0


def _require_membership(db: Database) -> None:
    if isinstance(db, SQLiteDatabase):
        folder = os.path.dirname(os.path.abspath(db.path))
        if not os.path.isdir(folder):
            raise CommandError(
                f"cannot create {os.path.abspath(db.path)}: there is no directory {folder}",
                status=2,
            )


def _require_schema(db: Database, url: str) -> None:
    # The library creates a SQLite file on first use; the command does not, so that a typo
    # in a path is an error rather than a new empty store.
    if isinstance(db, SQLiteDatabase):
        if not os.path.exists(db.path):
            raise CommandError(
                f"there is no store at {os.path.abspath(db.path)} (from {url}): check --store "
                f"or ${ENVIRONMENT_VARIABLE}, or create it with 'keyturn db init'"
            )
    elif db.schema_version() == 0:
        raise CommandError(
            f"the store {_redact(url)} has no keyturn tables in the first schema of its "
            "search_path: run 'keyturn db init'"
        )


def _command_error(exc: Exception, url: str, connecting: str | None) -> CommandError | None:
    if isinstance(exc, StoreUnreachable):
        return CommandError(f"cannot connect to the store {_redact(url)}: {exc.reason}")
    for kind, status in _EXIT_CODES:
        if isinstance(exc, kind):
            return CommandError(str(exc), status)
    if type(exc).__name__ == "PoolTimeout" and connecting is not None:
        reason = connecting.partition(": ")[2] or connecting
        return CommandError(f"cannot connect to the store {_redact(url)}: {reason}")
    psycopg = sys.modules.get("psycopg")  # imported only if a PostgreSQL store was opened
    driver_errors = (sqlite3.Error,) if psycopg is None else (sqlite3.Error, psycopg.Error)
    if isinstance(exc, driver_errors):
        message = (str(exc).splitlines() or [""])[0]  # not the SQL excerpt that follows
        if type(exc).__name__ == "InvalidSchemaName":
            message += ": create the schema that the URL's search_path names first"
        return CommandError(f"the store failed: {type(exc).__name__}: {message}")
    return None


if __name__ == "__main__":
    sys.exit(main())
