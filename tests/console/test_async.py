"""The console over an AsyncKeyManager: an async host serves it with its one async pool.

The page layer runs in a worker thread, as always under ASGI; each call of the async manager
goes back to the event loop that owns the pool. Over an async face of the memory store in
Starlette's test client, over AsyncPostgresDatabase under uvicorn, and in a Django project
under Django's ASGI handler. A WSGI server, with no event loop, refuses it when built.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from keyturn import AsyncKeyManager
from keyturn.console import Console, ConsoleSetupError
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from tests.console.support import ACCOUNT_COOKIE, SIGN_IN, form_token, hidden_fields, signed_in
from tests.console.test_library import Awaited, postgres_url, seed  # noqa: F401

ORIGIN = "http://testserver"


def async_console(store: Any, membership: Any, **options: Any) -> Console:
    manager = AsyncKeyManager(store, membership)
    return Console(manager, signed_in=signed_in, sign_in_url=SIGN_IN, **options)


def walk(client: Any, origin: str) -> str:
    """Create a key, see it listed, revoke it: the secret the create page showed."""
    page = client.get("/console/")
    assert page.status_code == 200, page.text
    form = {
        "token": form_token(page.text),
        "name": "async host",
        "lifetime": "1d",
        "tz": "UTC",
        "scope": "tenant:acme",
    }
    created = client.post("/console/", data=form, headers={"Origin": origin})
    assert created.status_code == 201, created.text
    secret = created.text.split('id="secret" type="text" readonly value="')[1].split('"')[0]
    listed = client.get("/console/")
    assert "async host" in listed.text and secret not in listed.text
    key_id = listed.text.split('<tr data-key="')[1].split('"')[0]
    confirm = client.get(f"/console/revoke?key={key_id}")
    revoke = {"token": form_token(confirm.text), "key": key_id}
    revoked = client.post("/console/revoke", data=revoke, headers={"Origin": origin})
    assert revoked.status_code == 303
    activity = client.get("/console/activity")  # the record, read back through the loop
    assert activity.status_code == 200, activity.text
    assert activity.text.count('<tr data-event="') == 2 and "Revoked" in activity.text
    return secret


def test_asgi_edge_over_an_async_manager() -> None:
    """Create, list and revoke through the pages, every store call awaited on the loop."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    seed(membership)
    console = async_console(Awaited(store), Awaited(membership))
    app = Starlette(routes=[Mount("/console", app=console.asgi())])

    with TestClient(app, follow_redirects=False, cookies={ACCOUNT_COOKIE: "alice"}) as client:
        secret = walk(client, ORIGIN)

    [key] = store.keys_of("alice")
    assert secret.endswith(key.hint[-4:]) and key.revoked_at is not None


def test_a_wsgi_server_refuses_an_async_manager() -> None:
    """console.wsgi() over an AsyncKeyManager is refused when built, saying what to do."""
    membership = MemoryMembership()
    console = async_console(Awaited(MemoryKeyStore()), Awaited(membership))

    with pytest.raises(ConsoleSetupError, match=r"console\.asgi\(\)"):
        console.wsgi()


@contextmanager
def uvicorn_serving(app: Any) -> Iterator[str]:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(1000):  # bounded: about 10 s
        if server.started:
            break
        threading.Event().wait(0.01)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.mark.postgres
def test_uvicorn_serves_the_console_over_one_async_postgres_pool(postgres_url: str) -> None:  # noqa: F811
    """An async host's one AsyncPostgresDatabase serves the console under uvicorn; the key
    is really stored, and revoked."""
    from keyturn.stores.postgres import AsyncPostgresDatabase, PostgresDatabase

    with PostgresDatabase(postgres_url) as db:
        db.create_schema()
        seed(db.membership)
    adb = AsyncPostgresDatabase(postgres_url)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        await adb.open()  # on the server's loop, where every console call comes back
        try:
            yield
        finally:
            await adb.close()

    console = async_console(adb.keys, adb.membership)
    app = Starlette(routes=[Mount("/console", app=console.asgi())], lifespan=lifespan)
    with uvicorn_serving(app) as origin, httpx.Client(base_url=origin) as client:
        client.cookies.set(ACCOUNT_COOKIE, "alice")
        secret = walk(client, origin)

    with PostgresDatabase(postgres_url) as db:
        [key] = db.keys.keys_of("alice")
    assert secret.endswith(key.hint[-4:]) and key.revoked_at is not None


def test_django_asgi_serves_the_console_over_an_async_manager() -> None:
    """In a Django project under its ASGI handler the view is async: request.user is read in
    Django's thread, the manager awaited on the handler's loop."""
    from django.core.handlers.asgi import ASGIHandler

    from keyturn.console.django import username
    from tests.console.support import django_settings
    from tests.django_project import session_cookie

    store, membership = MemoryKeyStore(), MemoryMembership()
    seed(membership)
    manager = AsyncKeyManager(Awaited(store), Awaited(membership))  # type: ignore[arg-type]
    console = Console(manager, signed_in=username, sign_in_url=SIGN_IN)
    cookie = session_cookie("alice")

    async def run() -> None:
        transport = httpx.ASGITransport(app=ASGIHandler())
        async with httpx.AsyncClient(transport=transport, base_url=ORIGIN) as client:
            client.cookies.set(*cookie)
            page = await client.get("/console/")
            assert page.status_code == 200, page.text
            assert "Signed in as <strong>alice</strong>" in page.text
            form = {**hidden_fields(page.text), "name": "django async", "lifetime": "1d"}
            form["tz"] = "UTC"
            form["scope"] = "tenant:acme"
            created = await client.post("/console/", data=form, headers={"Origin": ORIGIN})
            assert created.status_code == 201, created.text

    with django_settings(console):
        asyncio.run(run())

    [key] = store.keys_of("alice")
    assert key.name == "django async"
