"""``python -m agentkey.demo`` (``make demo``): the list-models example, live, with demo keys.

Seeds a key store with the tenant ``acme`` (organizations ``acme-main``, its ``default``,
and ``acme-research``) and the user ``demo-user``, creates a tenant-scoped and an
organization-scoped key, prints them with ready ``curl`` lines, and serves
``examples/starlette_app.py`` under uvicorn on 127.0.0.1, port 8000 or
``$AGENTKEY_DEMO_PORT``. Stop it with Ctrl-C; the keys die with the process.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
from pathlib import Path
from typing import Any, Protocol

import attrs

from agentkey import CreatedKey, KeyManager, KeyStore, Lifetime, MembershipProvider, Scope
from agentkey.stores.memory import MemoryDirectory, MemoryKeyStore

__all__ = ["DemoKeys", "instructions", "main", "seed"]

TENANT = "acme"
DEFAULT_ORGANIZATION = "acme-main"
OTHER_ORGANIZATION = "acme-research"
USER = "demo-user"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "starlette_app.py"


class Directory(MembershipProvider, Protocol):
    """A membership provider that can also be filled in, as the library's own are."""

    def add_organization(self, organization_id: str, *, tenant_id: str, default: bool = ...) -> Any:
        """Add an organization; ``default=True`` makes it the tenant's ``default``."""

    def add_member(self, account_id: str, organization_id: str, *, role: str) -> None:
        """Give the account a role in the organization."""


@attrs.frozen(kw_only=True)
class DemoKeys:
    tenant: CreatedKey
    organization: CreatedKey


def seed(store: KeyStore, directory: Directory) -> DemoKeys:
    """Create the demo tenant, organizations and user, and two fresh keys for that user."""
    directory.add_organization(DEFAULT_ORGANIZATION, tenant_id=TENANT, default=True)
    directory.add_organization(OTHER_ORGANIZATION, tenant_id=TENANT)
    directory.add_member(USER, DEFAULT_ORGANIZATION, role="admin")
    directory.add_member(USER, OTHER_ORGANIZATION, role="member")
    manager = KeyManager(store, directory)
    return DemoKeys(
        tenant=manager.create(
            USER, name="demo: tenant", scope=Scope.tenant(TENANT), expiry=Lifetime.DAYS_1
        ),
        organization=manager.create(
            USER,
            name="demo: research",
            scope=Scope.organization(OTHER_ORGANIZATION, tenant_id=TENANT),
            expiry=Lifetime.DAYS_1,
        ),
    )


def _curl(url: str, *headers: str) -> str:
    return shlex.join(["curl", "-i", *(arg for h in headers for arg in ("-H", h)), url])


def instructions(keys: DemoKeys, base_url: str) -> str:
    """What to try: the keys and one curl line per outcome."""
    models = f"{base_url}/managed-agents/v1/models"
    tenant = f"Authorization: Bearer {keys.tenant.secret}"
    organization = f"Authorization: Bearer {keys.organization.secret}"
    return "\n".join(
        [
            f"Demo keys for {USER} (tenant {TENANT}); they vanish when the demo stops.",
            f"  tenant-scoped:       {keys.tenant.secret}",
            f"  organization-scoped: {keys.organization.secret}  ({OTHER_ORGANIZATION})",
            "",
            "# 200, service-organization-id: acme-research, service-tenant-id: acme",
            _curl(models, organization),
            "# 200 in the default organization (acme-main)",
            _curl(models, tenant, "x-organization-id: default"),
            "# 400 invalid_request: a tenant-scoped key needs x-organization-id",
            _curl(models, tenant),
            "# 401 unauthorized: no key",
            _curl(models),
            "",
        ]
    )


def _load_example() -> Any:
    if not EXAMPLE.is_file():
        raise SystemExit(f"the demo serves {EXAMPLE}; run it from a source checkout")
    spec = importlib.util.spec_from_file_location("starlette_app", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    import uvicorn  # the demo extra; the library itself does not need it

    port = int(os.environ.get("AGENTKEY_DEMO_PORT", "8000"))
    store, directory = MemoryKeyStore(), MemoryDirectory()
    keys = seed(store, directory)
    app = _load_example().create_app(store, directory)
    print(instructions(keys, f"http://127.0.0.1:{port}"), flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port)


if __name__ == "__main__":
    main()
