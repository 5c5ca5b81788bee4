"""The web tests' two-adapter fixtures, for the security tests."""

from tests.web.conftest import client, serve, world

__all__ = ["client", "serve", "world"]
