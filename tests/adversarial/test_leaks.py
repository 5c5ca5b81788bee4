"""What leaves the library: never a secret, and no unbounded or forged log line.

The canary (see ``conftest.py``) checks every test's logs, output, replies and objects;
these tests make sure it hears what it must, and attack the places a secret or request
text could slip out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from keyturn import (
    AuthRequest,
    KeyNotFound,
    KeyNotRevocable,
    Principal,
    Scope,
)
from keyturn._core.token import parse
from tests.adversarial.support import SECRET, Canary, Target, bearer
from tests.web.web_support import MODELS, Reply, admins_only_on_admin
from tests.world import World


def test_canary_finds_a_secret_and_ignores_hints(world: World) -> None:
    """The canary flags a secret inside any text, alone or in a key, and nothing else."""
    canary = Canary()
    key = world.keys["research"]
    canary.secret(key)
    canary.saw("hint", f"key {parse(key).hint} (id {key[4:16]})")  # type: ignore[union-attr]
    canary.saw("checksum-free key", key[:-6])
    canary.saw("secret", f"token={key[SECRET]}!")
    canary.saw("full key", f"Bearer {key}")

    assert canary.leaks() == ["checksum-free key", "secret", "full key"]


def test_canary_hears_every_logger(target: Target, world: World, canary: Canary) -> None:
    """Refusals reach the canary through the keyturn logger, at DEBUG on the root."""
    since = len(canary.texts)

    target.send(bearer(world.keys["tenant_typo"]))

    assert any(where == "log keyturn" for where, _ in canary.texts[since:])
    assert logging.getLogger().isEnabledFor(logging.DEBUG)


def test_auth_request_repr_hides_the_key(
    attack: Callable[..., Target], world: World, canary: Canary
) -> None:
    """The AuthRequest a policy receives holds no key: the method, the path and the
    organization header are all a policy needs (the key's id is on the principal).
    """
    seen: list[AuthRequest] = []

    def policy(principal: Principal, request: AuthRequest) -> bool:
        seen.append(request)
        return admins_only_on_admin(principal, request)

    target = attack(authenticator=world.authenticator(policy=policy))
    key = world.keys["tenant"]
    target.send(bearer(key, ("x-organization-id", "default")))

    (request,) = seen
    canary.observe(request)
    shown = key[SECRET] in repr(request) + str(request)
    assert not shown  # a boolean, so a failure report does not print the secret either
    assert request.authorization == ()
    assert (request.method, request.organization) == ("GET", ("default",))


@pytest.mark.parametrize(
    "path",
    [MODELS + "/" + "x" * 65_536, MODELS + "/\r\nINFO forged line", MODELS + "/\x1b[31mred"],
    ids=["64 KiB path", "CRLF in the path", "terminal escape in the path"],
)
def test_refusal_log_line_is_one_short_line(
    target: Target, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """A refusal's log line stays short and on one line whatever the request path holds."""
    caplog.set_level(logging.INFO, logger="keyturn")

    reply = target.send([("authorization", "Bearer junk")], path=path)

    assert reply.status == 401
    (record,) = [r for r in caplog.records if r.name == "keyturn"]
    message = record.getMessage()
    assert len(message) < 500
    assert message.isprintable()


def test_console_objects_and_errors_show_hints(world: World, canary: Canary) -> None:
    """Created keys, key lists and console errors name keys by hint and id only."""
    created = world.manager.create("alice", name="ci", scope=Scope.tenant("acme"))
    canary.secret(created.secret)
    world.manager.revoke("alice", created.info.key_id)
    errors: list[Exception] = []
    for account, key_id in [
        ("alice", created.info.key_id),  # already revoked
        ("bob", created.info.key_id),  # not bob's
        ("alice", created.secret),  # the whole key pasted where its id belongs
    ]:
        with pytest.raises((KeyNotRevocable, KeyNotFound)) as raised:
            world.manager.revoke(account, key_id)
        errors.append(raised.value)
    since = len(canary.texts)

    canary.observe(created, created.info, *errors, *world.manager.list("alice"))

    assert canary.leaks(since) == []
    assert created.info.hint in repr(created)


def test_reflection_check_catches_an_echo(target: Target, world: World) -> None:
    """The Target's response-splitting check fails a reply that echoes request text in a
    header, and accepts the middleware's own text and canonical ids.
    """
    lines = [("x-organization-id", "org_main\r\nset-cookie: x"), ("authorization", "Bearer")]
    own = Reply(401, [("www-authenticate", 'Bearer realm="agents-api"')], b"{}")
    canonical = Reply(200, [("service-organization-id", "org_main")], b"{}")
    echo = Reply(400, [("x-debug", "bad header org_main\r\nset-cookie: x")], b"{}")
    invented = Reply(200, [("service-organization-id", "org_nope")], b"{}")

    target.seen(lines, own)
    target.seen(lines, canonical)
    with pytest.raises(AssertionError, match="carries request text"):
        target.seen(lines, echo)
    with pytest.raises(AssertionError, match="not a canonical id"):
        target.seen(lines, invented)
