"""``python manage.py keyturn ...``: the ``keyturn`` command on the project's own store.

With ``"keyturn"`` in ``INSTALLED_APPS``, every ``keyturn`` command runs through
``manage.py``, on the store that ``settings.KEYTURN["STORE_URL"]`` names (a ``--store`` given
on the line wins); the schema step of a deployment is::

    python manage.py keyturn db init

Everything after ``keyturn`` is the command's own (``manage.py keyturn --help`` is its
help). Its exit status is the command's. See ``docs/django.md`` and ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from keyturn import cli


def arguments(given: Sequence[str]) -> list[str]:
    """The ``keyturn`` command line: ``--store`` from the settings first, so a given one wins."""
    url = dict(getattr(settings, "KEYTURN", {})).get("STORE_URL")
    return (["--store", url] if isinstance(url, str) else []) + list(given)


class Command(BaseCommand):  # type: ignore[misc]  # Django ships no types
    help = (
        "Run the keyturn command (organizations, members, keys, db init) on the store of "
        "settings.KEYTURN['STORE_URL']. 'manage.py keyturn --help' lists its commands."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the keyturn command")

    def run_from_argv(self, argv: list[str]) -> None:
        # Every word after "keyturn" is the keyturn command's, --help and --version too; its
        # usage and messages name it as it was called: "manage.py keyturn".
        prog = f"{os.path.basename(argv[0])} {argv[1]}"
        sys.exit(cli.main(arguments(argv[2:]), prog=prog))

    def handle(self, *args: Any, **options: Any) -> None:  # call_command("keyturn", ...)
        status = cli.main(arguments([*args, *options["arguments"]]), prog="manage.py keyturn")
        if status:
            raise CommandError(f"keyturn exited with status {status}", returncode=status)
