"""``python -m keyturn.cli``: the ``keyturn`` command."""

import sys

from keyturn.cli import main

if __name__ == "__main__":
    sys.exit(main())
