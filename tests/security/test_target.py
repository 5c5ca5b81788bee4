"""The pure reading of a request target (``_core/target.py``): properties and the attacks seen."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from keyturn._core.target import Paths, Unreadable, canonical, decoded, readings

PREFIX = "/managed-agents/v1/"
ROOT = "/managed-agents/v1"
paths = Paths(PREFIX, {"/managed-agents/v1/public"})

# Path text rich in what routers treat specially: slashes, dots, escapes, the prefix itself.
pieces = st.sampled_from(
    [
        "/",
        "//",
        ".",
        "..",
        "%",
        "%2F",
        "%2E",
        "%25",
        "%2f",
        "%2e",
        "\\",
        "http://h",
        "http:",
        "HTTP:/",
        "//h",
        "%3A",
        "?",
        ";",
        "managed-agents",
        "v1",
        "models",
        "admin",
        "public",
        "x",
        "%6D",
        "é",
        "%C3%A9",
        "%FF",
    ]
)
junk = st.lists(pieces, max_size=12).map("".join)
prefixes = st.sampled_from(
    [
        "/managed-agents/v1/",
        "managed-agents/v1",
        "//managed-agents//v1",
        "/managed-agents%2Fv1",
        "/x/../managed-agents/v1",
        "/managed-agents/./v1/",
        "%2Fmanaged-agents/v1",
        "/managed-",
        "http:/managed-agents/v1",
        "hTtP:managed-agents/v1",
        "//host/managed-agents/v1",
        "h+t.t-p://h:1/managed-agents/v1",
    ]
)
near = st.tuples(st.sampled_from(["", "/", "x", ".."]), prefixes, junk).map("".join)
targets = st.one_of(junk, near)


def under(path: str) -> bool:
    return path == ROOT or path.startswith(PREFIX)


@given(targets)
def test_canonical_is_a_clean_absolute_path(target: str) -> None:
    """A canonical path starts with one slash and has no empty, '.' or '..' segment."""
    path = canonical(target)

    assert path.startswith("/")
    assert canonical(path) == path  # idempotent
    assert not {"", ".", ".."} & set(path.strip("/").split("/")) or path == "/"


@given(near, st.sampled_from(["", "/", "//", "http://host", "https://h:1", "http:", "//h"]))
@example("managed-agents/v1/models", "")
@example("/managed-agents/v1/models", "http://host")
def test_every_reading_under_the_prefix_is_guarded(target: str, front: str) -> None:
    """If any router's reading (literal, canonical, decoded) is under the prefix and not
    public, the request is guarded or refused: never passed.
    """
    target = front + target
    layers, _ = decoded(target)
    every = {reading for layer in layers for reading in readings(layer)}
    literals = [layer if layer.startswith("/") else "/" + layer for layer in layers]
    exposed = any(map(under, literals)) or any(
        under(r) and r != "/managed-agents/v1/public" for r in every
    )
    if not exposed:
        return

    assert paths.read("", target) is not None


@given(targets)
def test_a_guarded_path_is_canonical_and_under_the_prefix(target: str) -> None:
    """What the policy sees is one canonical path under the prefix, whatever was sent."""
    verdict = paths.read("", target)
    if isinstance(verdict, str):
        assert canonical(verdict) == verdict
        assert under(verdict)


@given(near)
def test_a_mount_prefix_never_switches_the_guard_off(target: str) -> None:
    """A request whose full path (mount prefix + path) is guarded stays guarded, however the
    server split it into a mount prefix and a path.
    """
    full = "/" + target
    if paths.read("", full) is None:  # not ours at all: nothing to keep
        return
    for cut in range(len(full) + 1):
        assert paths.read(full[:cut], full[cut:]) is not None
        assert paths.read(full[:cut], full) is not None  # ASGI: path repeats root_path


@given(st.lists(st.sampled_from(["models", "admin", "a b", "é", "x.y", "_"]), max_size=5))
def test_plain_paths_outside_pass_and_inside_are_themselves(segments: list[str]) -> None:
    """Ordinary paths are read as sent: outside the prefix they pass, inside they are
    guarded under their own spelling.
    """
    rest = "/".join(segments)
    assert paths.read("", "/elsewhere/" + rest) is None
    assert paths.read("", PREFIX + rest) == PREFIX + rest


@given(st.text(alphabet=st.sampled_from("/.%2FEe5ab"), max_size=20))
def test_percent_encoding_of_a_guarded_path_is_never_passed(tail: str) -> None:
    """Any percent-encoding (once or twice) of a path under the prefix is guarded or refused."""
    path = PREFIX + "models" + tail
    once = quote(path, safe="")
    twice = quote(once, safe="")
    for spelling in (once, twice, "/" + once, "/" + twice):
        assert paths.read("", spelling) is not None


SEEN = {
    "no leading slash": ("", "managed-agents/v1/models", "/managed-agents/v1/models"),
    "absolute form": ("", "http://host/managed-agents/v1/models", "/managed-agents/v1/models"),
    "absolute form, https with port": (
        "",
        "https://h:8443//managed-agents/v1/models",
        "/managed-agents/v1/models",
    ),
    "daphne-root-path header": ("/managed-agents", "/v1/models", "/managed-agents/v1/models"),
    "SCRIPT_NAME from a header": ("/managed-agents/v1", "/models", "/managed-agents/v1/models"),
    "mounted at the prefix": ("/managed-agents/v1", "/managed-agents/v1/models", "/models"),
    "mount prefix and a path without its slash": ("/managed-agents", "v1/models", "/models"),
    "double slash": ("", "//managed-agents/v1/admin", "/managed-agents/v1/admin"),
    "scheme and an absolute path (Quart)": (
        "",
        "http:/managed-agents/v1/admin",
        "/managed-agents/v1/admin",
    ),
    "scheme and a relative path": ("", "http:managed-agents/v1/admin", "/managed-agents/v1/admin"),
    "scheme in mixed case": ("", "HtTpS://h/managed-agents/v1/admin", "/managed-agents/v1/admin"),
    "network-path reference": ("", "//host/managed-agents/v1/admin", "/managed-agents/v1/admin"),
    "network-path reference, no path after the prefix": (
        "",
        "//host/managed-agents/v1",
        "/managed-agents/v1",
    ),
    "scheme under a mount prefix": (
        "/managed-agents",
        "http:/v1/admin",
        "/managed-agents/v1/admin",
    ),
}


@pytest.mark.parametrize(("root", "path", "expected"), SEEN.values(), ids=SEEN.keys())
def test_attacks_seen_are_guarded_under_their_canonical_path(
    root: str, path: str, expected: str
) -> None:
    """Each walk-around found through real servers is guarded, under the path routers read."""
    verdict = paths.read(root, path)
    assert verdict in (expected, "/managed-agents/v1/models")


UNREADABLE_TARGETS = {
    "double-encoded slash": ("/managed-agents%252Fv1/models", Unreadable.ESCAPES),
    "escape left after decoding": ("/managed-agents/v1/%2E%2E/admin", Unreadable.ESCAPES),
    "climbing out of the prefix": ("/managed-agents/v1/../healthz", Unreadable.DOT_SEGMENTS),
    "invalid UTF-8 escape": ("/managed-agents/v1/%FF", Unreadable.NOT_UTF8),
    "climbing out once decoded": ("%2Fmanaged-agents%2Fv1%2F..%2Fx", Unreadable.ESCAPES),
    "escapes nested deeper than routers go": (
        "/managed-agents/v1/%" + "25" * 9 + "41",
        Unreadable.NESTED_ESCAPES,
    ),
    "an escaped scheme": ("http%3A/managed-agents/v1/models", Unreadable.ESCAPES),
    "climbing out after a scheme (Quart routes it as written)": (
        "http:/managed-agents/v1/../admin",
        Unreadable.DOT_SEGMENTS,
    ),
    "climbing out after leading slashes (Werkzeug drops them)": (
        "//managed-agents/v1/../admin",
        Unreadable.DOT_SEGMENTS,
    ),
}


@pytest.mark.parametrize(
    ("path", "why"), UNREADABLE_TARGETS.values(), ids=UNREADABLE_TARGETS.keys()
)
def test_paths_with_more_than_one_reading_under_the_prefix_are_refused(
    path: str, why: Unreadable
) -> None:
    """A path routers may read as different paths, one under the prefix, is refused, and
    the verdict says what is wrong with it.
    """
    assert paths.read("", path) is why


def test_a_target_with_two_readings_under_the_prefix_is_refused() -> None:
    """Where the target read as a path and read as a URI are two paths under the prefix,
    there is no one path to authenticate.
    """
    short = Paths("/v1/", ())

    assert short.read("", "//v1/v1/admin") is Unreadable.TWO_READINGS
    assert short.read("", "//v1/v1") is Unreadable.TWO_READINGS


def test_every_form_of_target_is_read() -> None:
    """As a path, as a URI with a scheme in any case, as a network-path reference."""
    assert readings("http:/x") == ("/http:/x", "/x")
    assert readings("http:x") == ("/http:x", "/x")
    assert readings("HTTP://host:80/x/") == ("/HTTP:/host:80/x/", "/x/")
    assert readings("http://host") == ("/http:/host", "/")
    assert readings("//host/x") == ("/host/x", "/x")
    assert readings("/x/../y") == ("/y",)
    assert readings("1http:/x") == ("/1http:/x",)  # a scheme starts with a letter


def test_odd_paths_outside_the_prefix_pass() -> None:
    """Escapes and dot segments far from the prefix are not ours to judge."""
    assert paths.read("", "/static/%2E%2E/a%20b") is None
    assert paths.read("", "/a/../b") is None
    assert paths.read("", "*") is None


def test_prefix_must_be_canonical() -> None:
    """A prefix no router would route to is refused at startup."""
    with pytest.raises(ValueError, match="canonical"):
        Paths("/managed-agents//v1/", ())


def test_the_unreadable_path_s_400_is_a_documented_decision() -> None:
    """The 400 keeps ``invalid_request`` (the spec ties that code to x-organization-id): its
    message names the path, never the header, and docs/decisions.md says why."""
    for why in Unreadable:
        refusal = why.refusal()
        assert (refusal.status, refusal.code) == (400, "invalid_request")
        assert str(refusal).startswith("The request path has no single reading")
        assert "x-organization-id" not in str(refusal)
    decisions = (Path(__file__).resolve().parents[2] / "docs" / "decisions.md").read_text()
    [row] = [line for line in decisions.splitlines() if line.startswith("| D20 |")]
    assert "A path that cannot be read" in row and "`invalid_request`" in row


def test_every_reason_a_path_is_unreadable_is_documented() -> None:
    """docs/errors.md lists the 400's message for each thing that can be wrong with a path."""
    errors = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()
    for why in Unreadable:
        assert f"The request path has no single reading: {why.value}." in errors


# --- verdicts kept per target ----------------------------------------------------------------


@given(st.sampled_from(["", "/", "/api", "/managed-agents"]), targets)
def test_a_kept_verdict_is_the_verdict_read_afresh(root: str, target: str) -> None:
    """The verdict kept for a target is the one a fresh reading gives, on every later ask."""
    kept = Paths(PREFIX, {"/managed-agents/v1/public"})
    first = kept.read(root, target)
    fresh = Paths(PREFIX, {"/managed-agents/v1/public"})._read(root, target)
    assert first == fresh
    assert kept.read(root, target) == fresh


def test_a_public_paths_predicate_is_asked_on_every_request() -> None:
    """A host's predicate may change its mind: its verdicts are never kept."""
    public = {"/managed-agents/v1/status"}
    paths = Paths(PREFIX, lambda path: path in public)
    assert paths.read("", "/managed-agents/v1/status") is None
    public.clear()
    assert paths.read("", "/managed-agents/v1/status") == "/managed-agents/v1/status"


def test_the_kept_verdicts_are_bounded() -> None:
    """A flood of distinct targets costs at most the table's bound; long ones are not kept."""
    paths = Paths(PREFIX, ())
    for n in range(5000):
        assert paths.read("", f"/managed-agents/v1/models/{n}") == f"/managed-agents/v1/models/{n}"
    assert 0 < len(paths._known) <= 1024
    long = "/managed-agents/v1/" + "x" * 300
    assert paths.read("", long) == long
    assert ("", long) not in paths._known
