"""The ``keyturn`` command: keys, organizations and memberships in a store, from a shell.

``keyturn --help`` shows examples; ``docs/cli.md`` is the guide.

The store is ``--store URL``, else ``$KEYTURN_STORE_URL``, else
``sqlite:///keyturn.sqlite3`` (see :func:`keyturn.stores.open_database`). The store
commands (``db``, ``org``, ``member``, ``keys``, ``audit``, ``notify``) work on an
initialized store, but ``db init``, which makes one; ``scan`` opens no store, and ``demo``
hands ``--store`` to the demo. ``--as ACCOUNT`` names the account whose keys are listed or
revoked.

The command creates and rotates no key: keys are created only in the console, by the
signed-in user (spec section 1), so no secret ever goes to whoever runs a command. An
operator's emergency ``keys revoke`` needs ``--reason``; who ran it and why is logged.

Rules of this package:

1. The parser is a table (``_parser.COMMANDS``) beside the commands it runs
   (``_commands``); each command is a plain function, a store command one ``(db, args)``
   run on the store ``_store`` opens.
2. The library's own errors (:class:`~keyturn.errors.KeyturnError`) and the database
   drivers' are the operator's to fix: one line on stderr and an exit status (2 for an
   invalid value, else 1). Anything else is a bug, and its traceback shows.
3. No secret reaches stderr, and no store password is ever printed
   (:func:`~keyturn.stores.redact_url`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from keyturn.cli._output import PROG, CommandError
from keyturn.cli._parser import build_parser
from keyturn.errors import InvalidExpiry, InvalidKeyName, KeyturnError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None, *, prog: str = "keyturn") -> int:
    """Run the command in *argv* (default: ``sys.argv[1:]``); returns the exit status. Its
    usage and messages call the command *prog*."""
    token = PROG.set(prog)
    try:
        return _main(argv)
    finally:
        PROG.reset(token)


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
        status: int = args.run(args)
    except SystemExit as exit:  # --help, a usage error argparse printed, the demo's refusal
        if isinstance(exit.code, str):
            print(f"{PROG.get()}: error: {exit.code}", file=sys.stderr)
            return 1
        return exit.code or 0
    except (CommandError, KeyturnError) as error:
        print(f"{PROG.get()}: error: {error}", file=sys.stderr)
        if isinstance(error, CommandError):
            return error.status
        return 2 if isinstance(error, InvalidKeyName | InvalidExpiry) else 1
    except BrokenPipeError:  # `keyturn keys list | head`: the reader left, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status
