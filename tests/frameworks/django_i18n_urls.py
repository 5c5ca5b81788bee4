"""A URLconf with the API under ``i18n_patterns``: ``/fr/managed-agents/v1/whoami`` routes to
the same view as ``/managed-agents/v1/whoami`` (the default language needs no prefix).
"""

from __future__ import annotations

from django.conf.urls.i18n import i18n_patterns
from django.urls import path

from tests.frameworks.test_django import WHOAMI, whoami

urlpatterns = i18n_patterns(path(WHOAMI[1:], whoami), prefix_default_language=False)
