"""``python -m keyturn.demo`` (``make demo``, ``keyturn demo``): the list-models API, live.

Seeds the embedded SQLite store with the tenant ``acme`` (organizations ``acme-main``, its
``default``, and ``acme-research``) and the user ``demo-user``, creates a fresh
tenant-scoped and organization-scoped key (revoking the ones an earlier run created), prints
them with a ready ``curl`` line per outcome, and serves a small Starlette app behind the
middleware under uvicorn on 127.0.0.1, with the key console at ``/console/`` behind a
sign-in page that is for the demo only (it trusts anyone). Each refusal is logged on the
console by the ``keyturn`` logger, with its precise reason.

Options: ``--store URL`` (else ``$KEYTURN_DEMO_STORE``, else
``sqlite:///keyturn-demo.sqlite3``) and ``--port N`` (else ``$KEYTURN_DEMO_PORT``, else
8000). The keys stay in the store after the demo stops; the demo prints the ``keyturn keys
list`` line that shows them.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from keyturn import (
    Authenticator,
    CreatedKey,
    KeyManager,
    KeyStore,
    Lifetime,
    Scope,
    Status,
    WritableMembership,
)
from keyturn.stores import open_database, redact_url

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["DemoKeys", "console_routes", "create_app", "instructions", "main", "seed"]

TENANT = "acme"
DEFAULT_ORGANIZATION = "acme-main"
OTHER_ORGANIZATION = "acme-research"
USER = "demo-user"
DEMO_STORE = "sqlite:///keyturn-demo.sqlite3"
DEMO_COOKIE = "keyturn_demo_account"
KEY_NAMES = ("demo: tenant", "demo: research")
# The demo writes each request's counts at once, so its console's chart is never behind; a
# service keeps the default (60 s), one write per key per minute.
USAGE_INTERVAL = 0.0
MODELS = ("agent-small", "agent-large")


@attrs.frozen(kw_only=True)
class DemoKeys:
    tenant: CreatedKey
    organization: CreatedKey


def seed(store: KeyStore, membership: WritableMembership) -> DemoKeys:
    """Create the demo tenant, organizations and user, and two fresh keys for that user.

    A secret cannot be shown twice, so a rerun replaces the demo's keys: the ones an earlier
    run created are revoked, and the user has two active demo keys, never more.
    """
    membership.add_organization(DEFAULT_ORGANIZATION, tenant_id=TENANT, default=True)
    membership.add_organization(OTHER_ORGANIZATION, tenant_id=TENANT)
    membership.add_member(USER, DEFAULT_ORGANIZATION, role="admin")
    membership.add_member(USER, OTHER_ORGANIZATION, role="member")
    manager = KeyManager(store, membership)
    for earlier in manager.list(USER, status=Status.ACTIVE):
        if earlier.name in KEY_NAMES:
            manager.revoke(USER, earlier.key_id)
    tenant_name, organization_name = KEY_NAMES
    day = Lifetime.DAYS_1
    return DemoKeys(
        tenant=manager.create(USER, name=tenant_name, scope=Scope.tenant(TENANT), expiry=day),
        organization=manager.create(
            USER, name=organization_name, organization=OTHER_ORGANIZATION, expiry=day
        ),
    )


# The names a browser on this machine uses for the demo (it listens on 127.0.0.1 only).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
_REFUSED_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Refused</title></head>
<body><p>Refused: another site sent this form.</p></body></html>
"""
_SIGN_IN_PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Demo sign-in (demo only)</title>
<link rel="stylesheet" href="/console/static/console.css"></head>
<body><header class="bar"><span>keyturn demo</span></header>
<main><section class="panel"><h1>Demo sign-in</h1>
<p class="warning"><strong>For this demo only.</strong> This page signs anyone in as a demo
user, with no password. A real service mounts the key console behind its own sign-in.</p>
<form method="post" class="actions">\
<button name="account" value="{USER}">Sign in as {USER}</button></form>
</section></main></body></html>
"""


def console_routes(
    store: KeyStore, membership: Any, *, hosts: Sequence[str] = LOOPBACK_HOSTS
) -> list[Any]:
    """The key console at ``/console/`` and its demo-only sign-in at ``/demo/sign-in``.

    Both answer only requests whose ``Host`` is one of *hosts* (a page of another site that
    rebinds its name to 127.0.0.1 sends its own name); the sign-in takes only a form sent by
    its own page, and no page can be framed.
    """
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, RedirectResponse, Response
    from starlette.routing import Mount, Route

    from keyturn.console import Console, safe_next
    from keyturn.console._forms import from_own_origin
    from keyturn.console._visit import HEADERS

    def signed_in(request: Request) -> str | None:
        account = request.cookies.get(DEMO_COOKIE)
        return account if account == USER else None

    async def sign_in(request: Request) -> Response:
        if request.method == "POST":
            own = f"{request.url.scheme}://{request.headers.get('host', '')}"
            if not from_own_origin(request.headers, own):
                return HTMLResponse(_REFUSED_PAGE, status_code=403, headers=dict(HEADERS))
            form = (await request.body()).decode(errors="replace")
            account = form.partition("account=")[2].partition("&")[0]
            if account == USER:
                back = safe_next(request.query_params.get("next"), "/console/")
                response = RedirectResponse(back, status_code=303, headers=dict(HEADERS))
                response.set_cookie(DEMO_COOKIE, account, httponly=True, samesite="strict")
                return response
        return HTMLResponse(_SIGN_IN_PAGE, headers=dict(HEADERS))

    manager = KeyManager(store, membership)
    console = Console(manager, signed_in=signed_in, sign_in_url="/demo/sign-in")
    allowed = list(hosts)
    return [
        Mount("/console", app=TrustedHostMiddleware(console.asgi(), allowed_hosts=allowed)),
        Route(
            "/demo/sign-in",
            TrustedHostMiddleware(_endpoint(sign_in), allowed_hosts=allowed),
            methods=["GET", "POST"],
        ),
    ]


def _endpoint(handler: Any) -> Any:
    """*handler* (a request in, a response out) as an ASGI app, to wrap in middleware."""
    from starlette.requests import Request

    async def app(scope: Any, receive: Any, send: Any) -> None:
        response = await handler(Request(scope, receive))
        await response(scope, receive, send)

    return app


def create_app(authenticator: Authenticator, *, routes: Sequence[Any] = ()) -> Starlette:
    """The demo's list-models API: Starlette behind the ASGI middleware (the demo extra)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from keyturn.asgi import ApiKeyMiddleware, principal

    async def list_models(request: Request) -> JSONResponse:
        caller = principal(request)
        items = [{"id": model, "organization_id": caller.organization_id} for model in MODELS]
        return JSONResponse({"items": items})

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[
            Route("/managed-agents/v1/models", list_models),
            Route("/healthz", healthz),
            *routes,
        ],
        middleware=[Middleware(ApiKeyMiddleware, authenticator=authenticator)],
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
            "# 404 not_found: an organization the key's user does not reach",
            _curl(models, tenant, "x-organization-id: acme-elsewhere"),
            "# 401 unauthorized: no key",
            _curl(models),
            "",
            "Each refusal is logged below by the 'keyturn' logger, with its precise reason.",
            "",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m keyturn.demo",
        description="Seed a demo tenant and user, print two fresh keys and curl lines, and "
        "serve the list-models API on 127.0.0.1 until Ctrl+C.",
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
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", args.port))
        except OSError:
            raise SystemExit(
                f"port {args.port} on 127.0.0.1 is in use: pass --port N or set KEYTURN_DEMO_PORT"
            ) from None
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
    log = logging.getLogger("keyturn")  # on the console: its INFO line on each refusal
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    with (
        open_database(args.store) as db,
        Authenticator(db.keys, db.membership, usage_interval=USAGE_INTERVAL) as authenticator,
    ):
        db.create_schema()
        keys = seed(db.keys, db.membership)
        app = create_app(authenticator, routes=console_routes(db.keys, db.membership))
        store, base_url = redact_url(args.store), f"http://127.0.0.1:{args.port}"
        listing = shlex.join([_command(), "keys", "list", "--as", USER, "--store", store])
        print(
            f"Store: {store}\n{instructions(keys, base_url)}\n"
            f"Key console: {base_url}/console/ -- its sign-in page is for this demo only: it "
            f"signs anyone in as {USER}, no password.\n"
            f"The keys stay in the store after the demo stops; list them with {listing}",
            flush=True,
        )
        uvicorn.run(app, host="127.0.0.1", port=args.port)


def _command() -> str:
    """How to call the ``keyturn`` command from here: the one installed beside this Python."""
    beside = Path(sys.executable).parent / "keyturn"
    if not beside.is_file():
        return "keyturn"
    try:
        return str(beside.relative_to(Path.cwd()))
    except ValueError:
        return str(beside)


if __name__ == "__main__":
    main()
