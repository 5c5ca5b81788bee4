"""The one Django configuration of the test process, shared by every test that uses Django.

Django's settings can be configured once per process, so the middleware tests and the
console tests configure the same project here and choose their URLconf and middleware with
``override_settings``. Its database is a SQLite file in a temporary folder, holding Django's
users and sessions (``database()`` creates the tables, and the users ``alice`` and ``bob``).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import django
from django.conf import settings

urlpatterns: list[Any] = []  # the project's own URLconf: each test overrides it

_folder = Path(tempfile.mkdtemp(prefix="keyturn-django-"))
atexit.register(shutil.rmtree, _folder, ignore_errors=True)

if not settings.configured:
    settings.configure(
        ALLOWED_HOSTS=["testserver", "127.0.0.1", "localhost"],
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django.contrib.sessions",
            "keyturn",
        ],
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": _folder / "db.sqlite3"}
        },
        ROOT_URLCONF=__name__,
        MIDDLEWARE=[],
        SECRET_KEY="test-only-not-secret",
        USE_TZ=True,
        DEBUG=False,
    )
    django.setup()

CONSOLE_MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "keyturn.django.ApiKeyMiddleware",
]

_ready = False
T = TypeVar("T")


def _in_a_thread(work: Callable[[], T]) -> T:
    """*work*'s result, done in a thread of its own: Playwright's sync API keeps an event
    loop running in the test's thread, where Django refuses to touch its database."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(work).result()


def database() -> None:
    """Create Django's tables and the users ``alice`` and ``bob``, once per process."""
    global _ready
    if not _ready:
        _in_a_thread(_create)
        _ready = True


def _create() -> None:
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    for name in ("alice", "bob"):
        User.objects.get_or_create(username=name)
    connection.close()  # this thread ends here


def session_cookie(account: str) -> tuple[str, str]:
    """``(name, value)`` of a Django session cookie in which *account* is signed in."""
    database()
    return _in_a_thread(lambda: _session(account))


def _session(account: str) -> tuple[str, str]:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    client = Client()
    client.force_login(User.objects.get(username=account))
    connection.close()  # this thread ends here
    name = settings.SESSION_COOKIE_NAME
    return name, client.cookies[name].value
