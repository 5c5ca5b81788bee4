"""``python -m keyturn``: the ``keyturn`` command, where no script is on PATH."""

import sys

from keyturn.cli import main

if __name__ == "__main__":
    sys.exit(main())
