"""The console's Activity page and what the console records, through every edge."""

from __future__ import annotations

from keyturn import KeyManager, Scope
from keyturn.activity import Action, Channel
from keyturn.console import Console
from keyturn.console._visit import CSP
from tests.console.support import Client, World, form_token
from tests.console.test_pages import create_form
from tests.stores.test_activity import HostStore

# What each test client hands over as the client's address (Werkzeug's sets no REMOTE_ADDR).
CLIENT_ADDRESS = {"asgi": "testclient", "wsgi": None, "django": "127.0.0.1"}


def test_what_the_console_does_is_recorded_with_the_client(client: Client, world: World) -> None:
    """A create and a revoke in the console record alice, the console, the client's address
    and user agent."""
    agent = {"User-Agent": "Mozilla/5.0 (keyturn test) <b>&"}
    assert client.post("/console/", create_form(client), headers=agent).status == 201
    (info,) = world.manager.list("alice")
    token = form_token(client.get(f"/console/revoke?key={info.key_id}").text)
    form = {"token": token, "key": info.key_id}
    assert client.post("/console/revoke", form, headers=agent).status == 303
    revoked, created = world.manager.activity("alice")
    assert (created.action, revoked.action) == (Action.CREATED, Action.REVOKED)
    for event in (created, revoked):
        assert (event.actor, event.channel) == ("alice", Channel.CONSOLE)
        assert event.user_agent == "Mozilla/5.0 (keyturn test) <b>&"
        assert event.client_address == CLIENT_ADDRESS[client.edge]


def test_the_activity_page_lists_only_the_account_s_own_keys(client: Client, world: World) -> None:
    """alice's page shows her keys' events, escaped, and nothing of bob's."""
    world.manager.create("bob", name="bob's project", scope=Scope.tenant("acme"))
    client.post("/console/", create_form(client, name="<script>x</script>"))
    reply = client.get("/console/activity")
    assert reply.status == 200
    assert reply.headers["content-security-policy"] == CSP
    assert reply.headers["cache-control"] == "no-store"
    assert "&lt;script&gt;x&lt;/script&gt;" in reply.text and "<script>x" not in reply.text
    assert reply.text.count('<tr data-event="') == 1
    assert "bob" not in reply.text
    client.account = "bob"
    assert "bob&#39;s project" in client.get("/console/activity").text


def test_the_activity_page_needs_a_sign_in_and_takes_no_form(client: Client) -> None:
    """Not signed in: to the sign-in page. A POST: 405."""
    client.account = None
    assert client.get("/console/activity").status == 303
    client.account = "alice"
    assert client.post("/console/activity", {"x": "1"}).status == 405


def test_a_store_without_the_record_says_so_and_the_keys_still_work() -> None:
    """A host store without the record: the key list and create work; Activity is a 501
    page that says why, never a 500."""
    from keyturn.stores.memory import MemoryMembership

    membership = MemoryMembership()
    membership.add_organization("acme-main", tenant_id="acme", default=True)
    membership.add_member("alice", "acme-main", role="admin")
    console = Console(
        KeyManager(HostStore(), membership),
        signed_in=lambda request: "alice",
        sign_in_url="/sign-in",
    )
    client = Client("wsgi", console)
    assert client.post("/console/", create_form(client)).status == 201
    reply = client.get("/console/activity")
    assert reply.status == 501
    assert "keeps no record of key actions" in reply.text
