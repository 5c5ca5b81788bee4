"""``python -m agentkey.demo``: the core on its own, no web server.

Creates a tenant with two organizations, a user, a tenant-scoped and an organization-scoped
key in the in-memory store, then authenticates a few requests and prints each decision.
"""

from __future__ import annotations

from agentkey import Authenticator, AuthError, AuthRequest, KeyManager, Lifetime, Scope
from agentkey.stores.memory import MemoryDirectory, MemoryKeyStore


def main() -> None:
    store, directory = MemoryKeyStore(), MemoryDirectory()
    directory.add_organization("org_default", tenant_id="acme", default=True)
    directory.add_organization("org_research", tenant_id="acme")
    directory.add_member("alice", "org_default", role="admin")
    directory.add_member("alice", "org_research", role="member")

    manager = KeyManager(store, directory)
    tenant_key = manager.create("alice", name="demo: tenant", scope=Scope.tenant("acme"))
    org_key = manager.create(
        "alice",
        name="demo: research",
        scope=Scope.organization("org_research", tenant_id="acme"),
        expiry=Lifetime.DAYS_7,
    )
    print(f"tenant-scoped key:       {tenant_key.secret}")
    print(f"organization-scoped key: {org_key.secret}\n")

    auth = Authenticator(store, directory)
    requests = {
        "tenant key, x-organization-id: default": AuthRequest(
            authorization=(f"Bearer {tenant_key.secret}",), organization=("default",)
        ),
        "tenant key, no x-organization-id": AuthRequest(
            authorization=(f"Bearer {tenant_key.secret}",)
        ),
        "organization key, no header": AuthRequest(authorization=(f"Bearer {org_key.secret}",)),
        "organization key, another organization": AuthRequest(
            authorization=(f"Bearer {org_key.secret}",), organization=("org_default",)
        ),
        "mistyped key": AuthRequest(authorization=(f"Bearer {org_key.secret[:-1]}x",)),
        "no key": AuthRequest(),
    }
    for label, request in requests.items():
        outcome = auth.authenticate(request)
        if isinstance(outcome, AuthError):
            print(f"{label:42} -> {outcome.status} {outcome.code} ({outcome.reason.value})")
        else:
            print(
                f"{label:42} -> 200 as {outcome.account_id} in {outcome.organization_id} "
                f"(tenant {outcome.tenant_id}, role {outcome.role})"
            )

    manager.revoke("alice", org_key.info.key_id)
    outcome = auth.authenticate(requests["organization key, no header"])
    assert isinstance(outcome, AuthError)
    print(f"{'organization key after revoke':42} -> {outcome.status} ({outcome.reason.value})")
    auth.close()


if __name__ == "__main__":
    main()
