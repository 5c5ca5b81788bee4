"""keyturn.redaction: a logging filter that takes keys out of every part of a log record."""

from __future__ import annotations

import io
import logging
import logging.config
import sys
from collections.abc import Callable, Iterator

import pytest

from keyturn import KeyManager, Scope
from keyturn.redaction import RedactKeys, redact
from keyturn.stores.memory import MemoryKeyStore, MemoryMembership
from tests.world import mistype


@pytest.fixture(scope="module")
def key() -> tuple[str, str]:
    """A real key's secret and id (test fixture: made here, never stored anywhere)."""
    store, membership = MemoryKeyStore(), MemoryMembership()
    membership.add_organization("org_main", tenant_id="acme", default=True)
    membership.add_member("alice", "org_main", role="admin")
    created = KeyManager(store, membership).create("alice", name="CI", scope=Scope.tenant("acme"))
    return created.secret, created.info.key_id


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger whose one handler writes through RedactKeys into a buffer."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s %(token)s"))
    handler.addFilter(RedactKeys())
    logger = logging.getLogger("tests.redaction")
    logger.propagate, logger.level = False, logging.INFO
    logger.addHandler(handler)
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)


def secret_parts(secret: str) -> list[str]:
    """Every 8 characters of the key after its id: none may survive."""
    return [secret[i : i + 8] for i in range(16, len(secret) - 7)]


def test_key_in_message_args_exception_and_extra_is_redacted(
    logged: tuple[logging.Logger, io.StringIO], key: tuple[str, str]
) -> None:
    """A record with the key in its message, its argument, its exception and an extra
    field comes out with none of it, and names the key by its id."""
    logger, out = logged
    secret, key_id = key

    try:
        raise ValueError(f"bad token {secret}")
    except ValueError:
        logger.exception(f"sent {secret} as %s", secret, extra={"token": secret})
    logger.info("in a mapping: %(token)s", {"token": secret, "unused": secret}, extra={"token": 1})
    logger.info("nothing to hide: %s", "rma_short", extra={"token": "-"})

    text = out.getvalue()
    assert not [part for part in secret_parts(secret) if part in text]
    assert text.count(f"[redacted key {key_id}]") == 5
    assert "ValueError: bad token [redacted key" in text
    assert "Traceback (most recent call last)" in text
    assert "nothing to hide: rma_short -" in text


def test_records_without_a_key_are_left_as_they_were(key: tuple[str, str]) -> None:
    """A key-free record keeps its message template and arguments (error trackers group by
    them) and its exception; one with a key loses exc_info, which still holds the key; an
    argument the format does not use is redacted too."""
    secret, key_id = key
    plain = logging.LogRecord("x", logging.INFO, __file__, 1, "user %s", ("alice",), None)
    mapping = {"name": "alice", "unused": secret}
    named = logging.LogRecord("x", logging.INFO, __file__, 1, "user %(name)s", (mapping,), None)
    try:
        raise RuntimeError(secret)
    except RuntimeError:
        holding = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())

    assert RedactKeys().filter(plain) is True
    assert RedactKeys().filter(holding) is True
    assert RedactKeys().filter(named) is True
    assert (plain.msg, plain.args) == ("user %s", ("alice",))
    assert holding.exc_info is None
    assert holding.exc_text is not None and secret[16:] not in holding.exc_text
    assert holding.msg == "failed"
    assert named.getMessage() == "user alice"
    assert named.args == {"name": "alice", "unused": f"[redacted key {key_id}]"}


class Holder:
    """An object whose repr holds a key, as a request or a client object's may."""

    def __init__(self, secret: str) -> None:
        self.secret = secret

    def __repr__(self) -> str:
        return f"Holder({self.secret})"


def test_arguments_shipped_apart_from_the_message_are_redacted(key: tuple[str, str]) -> None:
    """A format that renders part of a key (``%.12s``) or none of it leaves the whole key in
    record.args, which Sentry's logging integration and JSON formatters ship as they are:
    each argument holding a key is redacted there, a tuple's as a mapping's, and a single
    argument set by hand; the rendered message is still the one without the key."""
    secret, key_id = key
    redacted = f"[redacted key {key_id}]"
    cases = [
        ("calling with %.12s", (secret,), (redacted,)),
        ("%d calls with %.4s", (3, secret), (3, redacted)),
        ("object %.6r", (Holder(secret),), (f"Holder({redacted})",)),
        ("bytes %.3s", (secret.encode(),), (f"b'{redacted}'",)),
    ]
    for message, args, cleaned in cases:
        record = logging.LogRecord("x", logging.INFO, __file__, 1, message, args, None)
        rendered = record.getMessage()
        assert RedactKeys().filter(record) is True
        assert record.args == cleaned, message
        assert record.msg == message
        assert secret[16:] not in rendered
    single = logging.LogRecord("x", logging.INFO, __file__, 1, "nothing", (), None)
    single.args = secret  # type: ignore[assignment]  # a handler or library may set one
    RedactKeys().filter(single)
    assert single.args == redacted  # type: ignore[comparison-overlap]


def test_arguments_without_a_key_stay_the_same_objects(key: tuple[str, str]) -> None:
    """No key: the very tuple, and the very values, are kept."""
    args = ("alice", 3, 2.5, None, b"rma_", Holder("nothing"))
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "%s %d %f %s %s %r", args, None)
    RedactKeys().filter(record)
    assert record.args is args


@pytest.mark.parametrize(
    ("make", "becomes"),
    [
        (mistype, "[redacted]"),  # a typo: still nearly the whole secret
        (lambda s: s[:30], "[redacted]"),  # cut short, as by a log line's length limit
        (lambda s: "x" + s + "Z9", "x[redacted]"),  # glued to other text
        (lambda s: s, "[redacted key {key_id}]"),
    ],
    ids=["mistyped", "cut", "glued", "whole"],
)
def test_what_counts_as_a_key(
    make: Callable[[str], str], becomes: str, key: tuple[str, str]
) -> None:
    """A whole key is named by its id; anything else of the key's form is redacted whole."""
    secret, key_id = key
    assert redact(f"a {make(secret)} b") == f"a {becomes.format(key_id=key_id)} b"
    assert redact("rma_ and rma_0123456789abcde and sk-rma_") == (
        "rma_ and rma_0123456789abcde and sk-rma_"  # 15 characters: a key id and no secret
    )


def test_broken_format_is_reported_without_the_key(
    key: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A format that fails makes logging print the message and arguments to stderr: those
    are redacted first, and the filter itself does not raise."""
    secret, key_id = key
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RedactKeys())
    logger = logging.getLogger("tests.redaction.broken")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        logger.warning("two %s %s", secret)  # one argument short
    finally:
        logger.removeHandler(handler)

    reported = capsys.readouterr().err
    assert "Logging error" in reported
    assert secret[16:] not in reported + out.getvalue()
    assert f"[redacted key {key_id}]" in reported


def test_dict_config(key: tuple[str, str]) -> None:
    """The filter installs from logging.config.dictConfig by its dotted name."""
    secret, key_id = key
    out = io.StringIO()
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "filters": {"keys": {"()": "keyturn.redaction.RedactKeys"}},
            "handlers": {
                "buffer": {"class": "logging.StreamHandler", "stream": out, "filters": ["keys"]}
            },
            "loggers": {"tests.redaction.config": {"handlers": ["buffer"], "propagate": False}},
        }
    )
    logger = logging.getLogger("tests.redaction.config")
    try:
        logger.warning("key %s", secret)
    finally:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)

    assert out.getvalue() == f"key [redacted key {key_id}]\n"
