"""The ``keyturn`` command's parser, as a table: each command, its help and its arguments.

:data:`COMMANDS` is the table of contents, in the order ``keyturn --help`` lists it: a
group (``keys``) by its help, followed by its commands (``keys list``). Each argument is
written in argparse's own words (:func:`arg`). :func:`build_parser` turns the table into
the parser; each command sets ``run(args) -> exit status``.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Final

import attrs

from keyturn.cli._commands import (
    SMTP_PASSWORD,
    STATUSES,
    WEBHOOK_SECRET,
    audit_export,
    db_init,
    demo,
    in_store,
    keys_expiring,
    keys_leaked,
    keys_list,
    keys_revoke,
    made_elsewhere,
    member_add,
    member_list,
    member_remove,
    notify,
    org_add,
    org_list,
    org_remove,
    scan,
)
from keyturn.cli._output import PROG
from keyturn.cli._store import DEFAULT_STORE_URL, ENVIRONMENT_VARIABLE

Argument = tuple[tuple[str, ...], dict[str, Any]]


def arg(*names: str, **options: Any) -> Argument:
    """One argument, as ``add_argument(*names, **options)`` takes it; ``{prog}`` in its help
    stands for the command's name."""
    return names, options


@attrs.frozen
class OneOf:
    """Arguments of which at most one is given; exactly one if *required*."""

    arguments: Sequence[Argument]
    required: bool = False


@attrs.frozen
class Command:
    """One command. *help* ``None``: left out of the list of commands."""

    run: Callable[..., Any]  # (db, args) on an open store, else (args) -> exit status
    help: str | None
    arguments: Sequence[Argument | OneOf] = ()
    description: str | None = attrs.field(default=None, kw_only=True)  # default: the help
    epilog: str | None = attrs.field(default=None, kw_only=True)
    store: bool = attrs.field(default=True, kw_only=True)  # --store; run on the open store
    raw: bool = attrs.field(default=False, kw_only=True)  # its words are its own: the demo's


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


STORE: Final = arg(
    "--store",
    metavar="URL",
    default=argparse.SUPPRESS,  # before or after the command; after wins
    help=f"the store (default: ${ENVIRONMENT_VARIABLE}, else {DEFAULT_STORE_URL})",
)
# The arguments, then the table of commands.
ACCOUNT: Final = arg(
    "--as",
    dest="account",
    metavar="ACCOUNT",
    required=True,
    type=_nonempty,
    help="the account whose keys these are",
)
JSON: Final = arg("--json", action="store_true", help="print JSON (UTF-8)")
ORG: Final = arg("organization", metavar="ORG", type=_nonempty)
MEMBER: Final = arg("account", metavar="ACCOUNT", type=_nonempty)
SPAN: Final = {"type": _within, "metavar": "SPAN"}
TENANT: Final = arg("--tenant", required=True, type=_nonempty, help="the tenant it belongs to")
TENANT_FILTER: Final = arg("--tenant", type=_nonempty, help="only this tenant's")
DEFAULT: Final = arg("--default", action="store_true", help="make it the tenant's 'default' one")
NAMED_ORG: Final = arg(
    "organization", metavar="ORG", type=_nonempty, help="as x-organization-id names it"
)
ROLE: Final = arg("--role", required=True, type=_nonempty, help="e.g. admin, member, viewer")
KEY_ID: Final = arg("key_id", metavar="KEY_ID", help="as shown by '{prog} keys list'")
REASON: Final = arg("--reason", required=True, help="why the key is revoked, for its creator")
STATUS: Final = arg("--status", choices=STATUSES, type=str.lower, help="any case")
SCOPE: Final = arg("--scope", help="tenant, organization, or one organization's id")
WITHIN: Final = arg(
    "--within",
    default=timedelta(days=14),
    help="days or hours ahead, like 14d or 12h (default: 14d)",
    **SPAN,
)
SINCE: Final = arg(
    "--since",
    type=_since,
    metavar="WHEN",
    help="only events at or after: a date, an ISO 8601 instant (UTC if no offset), or 7d",
)
OUTPUT: Final = arg(
    "--output", metavar="FILE", help="write to FILE (mode 600, replaced) instead of stdout"
)
NOTIFY: Final = (
    arg(
        "--console-url", required=True, metavar="URL", help="the key console every notice links to"
    ),
    OneOf(
        [
            arg("--smtp", metavar="HOST[:PORT]", help="send email through this server"),
            arg("--webhook", metavar="URL", help="POST each notice, signed, to URL"),
        ],
        required=True,
    ),
    arg("--from", dest="sender", metavar="ADDRESS", help="the email's sender"),
    arg("--starttls", action="store_true", help="upgrade SMTP with STARTTLS"),
    arg("--smtp-user", metavar="USER", help="log in to the SMTP server as USER"),
    arg(
        "--to",
        default="{account}",
        metavar="TEMPLATE",
        help="the creator's address, {account} standing for the account id "
        "(default: the account id itself), e.g. {account}@example.com",
    ),
    arg(
        "--window",
        default=timedelta(days=30),
        help="how far back to look for what happened (default: 30d)",
        **SPAN,
    ),
)
SCAN: Final = (
    arg("paths", nargs="*", metavar="PATH", help="default: ."),
    OneOf(
        [
            arg(
                "--staged",
                action="store_true",
                help="only the keys the next commit adds, read from the staged files "
                "(a pre-commit check)",
            ),
            arg(
                "--diff",
                metavar="FILE",
                help="only the added lines of a unified diff ('-': standard input)",
            ),
        ]
    ),
)

COMMANDS: Final[Mapping[str, str | Command]] = {  # a group's help, then its commands
    "db": "the store itself",
    "db init": Command(db_init, "create or upgrade keyturn's tables (idempotent)"),
    "org": "organizations",
    "org add": Command(org_add, "add an organization to a tenant", [NAMED_ORG, TENANT, DEFAULT]),
    "org list": Command(org_list, "list the organizations, by tenant", [TENANT_FILTER, JSON]),
    "org remove": Command(org_remove, "remove an organization and its memberships", [ORG]),
    "member": "who holds which role in which organization",
    "member add": Command(
        member_add, "give an account a role in an organization", [MEMBER, ORG, ROLE]
    ),
    "member list": Command(
        member_list, "list the accounts of an organization and their roles", [ORG, JSON]
    ),
    "member remove": Command(
        member_remove, "take an account's role in an organization away", [MEMBER, ORG]
    ),
    "keys": "list personal API keys, and revoke one in an emergency (keys are created and "
    "rotated in the console)",
    "keys list": Command(
        keys_list,
        "list the account's own keys, newest first (no secrets)",
        [ACCOUNT, STATUS, SCOPE, JSON],
    ),
    "keys revoke": Command(
        keys_revoke,
        "an operator's emergency revoke of one of the account's keys: immediate, final",
        [ACCOUNT, KEY_ID, REASON],
        epilog="Who ran the command and --reason are logged (logger keyturn.cli) and "
        "printed, so the key's creator can be told. The creator revokes their own keys "
        "in the console.",
    ),
    "keys expiring": Command(
        keys_expiring,
        "list the account's keys that expire soon, soonest first",
        [ACCOUNT, WITHIN, JSON],
    ),
    "keys leaked": Command(
        keys_leaked, "list every account's keys reported leaked, latest first", [JSON]
    ),
    # Not listed: they answer where keys are made.
    "keys create": Command(partial(made_elsewhere, verb="create"), None, store=False, raw=True),
    "keys rotate": Command(partial(made_elsewhere, verb="rotate"), None, store=False, raw=True),
    "audit": "the record of every key action",
    "audit export": Command(
        audit_export,
        "write every account's key events as JSON lines, oldest first (for a SIEM)",
        [SINCE, OUTPUT],
    ),
    "notify": Command(
        notify,
        "tell keys' creators what is due: expiring, expired, Inactive, leaked, revoked",
        NOTIFY,
        description="Send the lifecycle notices due now, each once per key whatever runs at "
        "once (for cron or a systemd timer), by email or a signed webhook. The SMTP password "
        f"is read from ${SMTP_PASSWORD}, the webhook's secret from ${WEBHOOK_SECRET}. Exit "
        "status 1 if a notice could not be delivered (the next run sends it).",
    ),
    # The demo's own options and --help: keyturn.demo parses them.
    "demo": Command(
        demo,
        "serve the list-models example with fresh demo keys ('{prog} demo --help')",
        store=False,
        raw=True,
    ),
    "scan": Command(
        scan,
        "find API keys in files before they are committed (exit 1 if any)",
        SCAN,
        description="Report every keyturn API key (checked by its checksum, so look-alikes "
        "are ignored) in files and folders, by place, key id and hint: never the secret. "
        "Folders are walked, skipping .git, virtual environments and caches; only regular "
        "text files are read (UTF-8 or UTF-16). '-' reads standard input. Exit status: 0 "
        "no key found, 1 keys found (revoke them), 2 bad usage.",
        store=False,
    ),
}

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


def build_parser() -> argparse.ArgumentParser:
    """The ``keyturn`` argument parser, from :data:`COMMANDS`."""
    prog = PROG.get()
    store = argparse.ArgumentParser(add_help=False)
    _add(store, STORE, prog)
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Manage personal API keys, organizations and memberships in a store.",
        epilog=_EXAMPLES.replace("\n  keyturn ", f"\n  {prog} "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[store],
    )
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    groups: dict[str, Any] = {"": commands}
    for name, entry in COMMANDS.items():
        group, _, leaf = name.rpartition(" ")
        if isinstance(entry, Command):
            _add_command(groups[group], leaf, entry, store, prog)
        else:  # a group, whose commands follow
            sub = commands.add_parser(name, help=entry, description=entry)
            groups[name] = sub.add_subparsers(title="commands", metavar="COMMAND", required=True)
    return parser


def _add_command(
    commands: Any, name: str, command: Command, store: argparse.ArgumentParser, prog: str
) -> None:
    listed = {} if command.help is None else {"help": command.help.replace("{prog}", prog)}
    if command.raw:  # every word after its name is its own, --help too
        sub = commands.add_parser(name, add_help=False, prefix_chars="\0", **listed)
        sub.add_argument("options", nargs=argparse.REMAINDER)
    else:
        sub = commands.add_parser(
            name,
            description=command.description or listed["help"],
            epilog=command.epilog,
            parents=[store] if command.store else [],
            **listed,
        )
    for argument in command.arguments:
        if isinstance(argument, OneOf):
            one_of = sub.add_mutually_exclusive_group(required=argument.required)
            for each in argument.arguments:
                _add(one_of, each, prog)
        else:
            _add(sub, argument, prog)
    sub.set_defaults(run=partial(in_store, command.run) if command.store else command.run)


def _add(parser: Any, argument: Argument, prog: str) -> None:
    names, options = argument
    if "help" in options:
        options = {**options, "help": options["help"].replace("{prog}", prog)}
    parser.add_argument(*names, **options)


def _version() -> str:
    try:
        return f"keyturn {version('keyturn')}"
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "keyturn (not installed)"
