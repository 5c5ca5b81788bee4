"""``python -m keyturn.demo`` (``make demo``, ``keyturn demo``): the list-models example, live.

Seeds the embedded SQLite store with the tenant ``acme`` (organizations ``acme-main``, its
``default``, and ``acme-research``) and the user ``demo-user``, creates a fresh
tenant-scoped and organization-scoped key, prints them with ready ``curl`` lines, and
serves ``examples/starlette_app.py`` under uvicorn on 127.0.0.1.

Options: ``--store URL`` (else ``$KEYTURN_DEMO_STORE``, else
``sqlite:///keyturn-demo.sqlite3``) and ``--port N`` (else ``$KEYTURN_DEMO_PORT``, else
8000). The keys stay in the store after the demo stops; look at them with
``keyturn keys list --as demo-user --store sqlite:///keyturn-demo.sqlite3``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import shlex
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from keyturn import CreatedKey, KeyManager, KeyStore, Lifetime, Scope, WritableMembership
from keyturn.stores import open_database

__all__ = ["DemoKeys", "instructions", "main", "seed"]

TENANT = "acme"
DEFAULT_ORGANIZATION = "acme-main"
OTHER_ORGANIZATION = "acme-research"
USER = "demo-user"
DEMO_STORE = "sqlite:///keyturn-demo.sqlite3"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "starlette_app.py"


@attrs.frozen(kw_only=True)
class DemoKeys:
    tenant: CreatedKey
    organization: CreatedKey


def seed(store: KeyStore, membership: WritableMembership) -> DemoKeys:
    """Create the demo tenant, organizations and user, and two fresh keys for that user."""
    membership.add_organization(DEFAULT_ORGANIZATION, tenant_id=TENANT, default=True)
    membership.add_organization(OTHER_ORGANIZATION, tenant_id=TENANT)
    membership.add_member(USER, DEFAULT_ORGANIZATION, role="admin")
    membership.add_member(USER, OTHER_ORGANIZATION, role="member")
    manager = KeyManager(store, membership)
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
            f"Fresh demo keys for {USER} (tenant {TENANT}), valid for one day:",
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
    # A source checkout serves examples/ as it stands; an installed wheel carries a copy.
    if not EXAMPLE.is_file():
        try:
            return importlib.import_module("keyturn._example_app")
        except ImportError:
            raise SystemExit(f"the demo serves {EXAMPLE}; run it from a source checkout") from None
    spec = importlib.util.spec_from_file_location("starlette_app", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m keyturn.demo",
        description="Seed a demo tenant and user, print two fresh keys and curl lines, and "
        "serve examples/starlette_app.py on 127.0.0.1 until Ctrl+C.",
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        default=os.environ.get("KEYTURN_DEMO_STORE", DEMO_STORE),
        help=f"the demo's store (default: $KEYTURN_DEMO_STORE, else {DEMO_STORE})",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("KEYTURN_DEMO_PORT", "8000")),
        help="default: $KEYTURN_DEMO_PORT, else 8000",
    )
    args = parser.parse_args(argv)
    try:
        import uvicorn  # the demo extra; the library itself does not need it
    except ImportError:
        raise SystemExit("the demo needs uvicorn: pip install 'keyturn[demo]'") from None
    if not _port_is_free(args.port):
        raise SystemExit(
            f"port {args.port} on 127.0.0.1 is in use: pass --port N or set KEYTURN_DEMO_PORT"
        )
    example = _load_example()
    with open_database(args.store) as db:
        db.create_schema()
        keys = seed(db.keys, db.membership)
        app = example.create_app(db.keys, db.membership)
        print(f"Store: {args.store}")
        print(instructions(keys, f"http://127.0.0.1:{args.port}"))
        print(
            "The keys stay in the store after the demo stops; list them with",
            shlex.join(["keyturn", "keys", "list", "--as", USER, "--store", args.store]),
            flush=True,
        )
        uvicorn.run(app, host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
