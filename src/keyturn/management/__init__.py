"""Django management commands, when ``"keyturn"`` is in ``INSTALLED_APPS``."""
