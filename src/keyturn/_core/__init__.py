"""The pure core: what keyturn decides, with no I/O. Its modules import nothing outside this
folder but ``keyturn.errors`` (``tests/hygiene/test_layout.py`` holds it)."""
