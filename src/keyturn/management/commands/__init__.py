"""``manage.py keyturn``: the ``keyturn`` command over the project's store."""
