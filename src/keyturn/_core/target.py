"""Which requests the middleware guards: the request target, read the way any router might.

Rules of this file (keep them):

1. It decides one thing -- whether a request is ours to authenticate, and under which path
   -- and nothing else. No I/O, no framework: text in, a verdict out. Every middleware
   (ASGI, WSGI, Django) calls :meth:`Paths.read` with what its server delivered
   (``root_path`` and ``path``; ``SCRIPT_NAME`` and ``PATH_INFO``), and so does
   :mod:`keyturn.leaks`, to tell whether a path is under the API's prefix.
2. **Fail closed.** Servers and routers read a target differently: Werkzeug adds a missing
   leading slash and drops repeated ones, some routers collapse runs of slashes or resolve
   dot segments, some decode percent-escapes the server left in place, and servers pass on
   every form of target RFC 3986 allows, which routers read as a URI (Quart routes
   ``http:/managed-agents/v1/models`` to ``/managed-agents/v1/models``) or as a path. A
   request is guarded when *any* of these readings puts it under the prefix, either on the
   full path (mount prefix included) or on the path the app routes on (mount prefix
   removed).
3. Where the readings disagree about a path under the prefix (it climbs out with ``..``,
   still holds percent-escapes after the server decoded it, or reads as two different paths
   under the prefix), there is no one path to authenticate, so the request is refused with
   an :class:`Unreadable` verdict that says what was wrong, never passed: its 400 is made
   here (:meth:`Unreadable.refusal`).
4. A guarded request is authenticated under its canonical path (slashes collapsed, dot
   segments resolved, leading slash present): the path the role policy sees and the public
   paths are matched against.

The readings of a target, each made canonical (a missing leading slash added, runs of
slashes collapsed, ``.`` and ``..`` resolved, never above the root):

- as a path: the text as it is (``http:/x`` is the path ``/http:/x``);
- as a URI with a scheme (``http://host/x``, ``http:/x``, ``http:x``, any case): the scheme,
  and the authority after ``//``, dropped;
- as a network-path reference (``//host/x``): the authority dropped;
- and each of these again after percent-decoding (``%2F``, ``%2E``, ``%25``...) until nothing
  is left to decode.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Collection
from typing import Final
from urllib.parse import unquote

from keyturn.errors import InvalidRequest, Reason

__all__ = [
    "Paths",
    "PublicPaths",
    "Unreadable",
    "below",
    "canonical",
    "decoded",
    "forms",
    "readings",
]

PublicPaths = Collection[str] | Callable[[str], bool]

# RFC 3986 section 3.1: a scheme is a letter, then letters, digits, "+", "-" or ".".
_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_MAX_DECODING_ROUNDS: Final = 8  # "%252525..." unwraps one layer a round; more is refused
# Verdicts kept per target: a service answers few distinct paths; a flood of new ones only
# empties the table. Long targets are read afresh.
_KNOWN_TARGETS: Final = 1024
_KNOWN_LENGTH: Final = 256


class Unreadable(enum.Enum):
    """Why a target cannot be read as one path under the prefix; the value says so to the
    client, in the 400's message (it holds no request text).
    """

    DOT_SEGMENTS = "its '.' or '..' segments lead out of the path it starts with"
    ESCAPES = (
        "it holds percent-escapes that change the path once decoded (an escaped '/', '.' or '%')"
    )
    NOT_UTF8 = "it holds percent-escapes that are not UTF-8"
    NESTED_ESCAPES = "its percent-escapes are nested more than 8 deep"
    TWO_READINGS = (
        "it reads as two different paths under the prefix "
        "(a scheme such as 'http:' or a '//host' before the path)"
    )

    def refusal(self) -> InvalidRequest:
        """The 400 for a target with no single reading: it says what is wrong, and how to
        send the path instead; the adapters only pass it on."""
        return InvalidRequest(
            Reason.UNREADABLE_TARGET,
            f"The request path has no single reading: {self.value}. Send it as one path that "
            "starts with a single '/', with no '.' or '..' segments and no percent-escapes of "
            "its own.",
        )


def canonical(target: str) -> str:
    """*target* read as a path: a missing leading slash added, runs of slashes collapsed, dot
    segments resolved (never above the root).
    """
    segments: list[str] = []
    for segment in target.split("/"):
        if segment == "..":
            if segments:
                segments.pop()
        elif segment not in ("", "."):
            segments.append(segment)
    trailing = "/" if segments and target.endswith(("/", "/.", "/..")) else ""
    return "/" + "/".join(segments) + trailing


def _drop_authority(reference: str) -> str:
    """``//host/x`` is ``/x``; anything else is itself."""
    if not reference.startswith("//"):
        return reference
    end = reference.find("/", 2)
    return "" if end < 0 else reference[end:]


def forms(target: str) -> tuple[str, ...]:
    """The texts a router may take as the path of *target*, before it resolves anything:
    the target itself, then the path of it read as a URI (scheme and authority dropped) or
    as a network-path reference (authority dropped).
    """
    scheme = _SCHEME.match(target)
    if scheme is not None:
        return target, _drop_authority(target[scheme.end() :])
    if target.startswith("//"):
        return target, _drop_authority(target)
    return (target,)


def readings(target: str) -> tuple[str, ...]:
    """Every canonical path a router may read *target* as (no decoding), distinct, in the
    order of :func:`forms`.
    """
    return tuple(dict.fromkeys(map(canonical, forms(target))))


def decoded(target: str) -> tuple[list[str], Unreadable | None]:
    """Every layer of percent-decoding of *target*, the last fully decoded; and what is
    wrong with them, if anything: the layers do not end, or one is not UTF-8 (a router
    reads it in more than one way).

    Bytes that are not UTF-8 decode to U+FFFD, as most routers decode them.
    """
    layers = [target]
    for _ in range(_MAX_DECODING_ROUNDS):
        if "%" not in target:
            return layers, None
        plain = unquote(target, errors="replace")
        if plain == target:
            return layers, None
        layers.append(plain)
        if "\ufffd" in plain and "\ufffd" not in target:
            return layers, Unreadable.NOT_UTF8
        target = plain
    return layers, Unreadable.NESTED_ESCAPES


class Paths:
    """Which request paths the middleware authenticates.

    Every path under *prefix* is guarded, and so is the prefix without its trailing slash
    (``/managed-agents/v1``): a path that could reach the API is never left open by a
    missing slash. *public_paths* (exact canonical paths, or a predicate on the canonical
    path) are exempt.
    """

    def __init__(self, prefix: str, public_paths: PublicPaths) -> None:
        if not prefix.startswith("/"):
            raise ValueError(f"prefix must start with '/', got {prefix!r}")
        if canonical(prefix).rstrip("/") != prefix.rstrip("/"):
            raise ValueError(f"prefix must be a canonical path, got {prefix!r}")
        if isinstance(public_paths, str):  # "in" on one string would test substrings
            raise TypeError("public_paths must be a collection of paths or a predicate")
        self.prefix = prefix
        self._root = prefix.rstrip("/")
        self._under = self._root + "/"
        self._public = (
            public_paths if callable(public_paths) else frozenset(public_paths).__contains__
        )
        # The verdict is a function of the target alone, unless a predicate of the host's
        # decides the public paths (it may change its mind): then nothing is kept.
        self._keeps = not callable(public_paths)
        self._known: dict[tuple[str, str], tuple[str | Unreadable | None]] = {}

    def read(self, root: str, path: str) -> str | Unreadable | None:
        """The canonical path to authenticate the request under; ``None`` if it is not ours
        (outside the prefix, or public); an :class:`Unreadable` if it must be refused.

        *root* is the mount prefix the server or a parent app set (ASGI ``root_path``, WSGI
        ``SCRIPT_NAME``), *path* the rest as delivered (ASGI ``path``, which may or may not
        repeat *root*; WSGI ``PATH_INFO``). The request is guarded if the path the app routes
        on or the full path is; the first of these that is guarded is the path returned.
        """
        kept = self._known.get((root, path))
        if kept is not None:
            return kept[0]
        verdict = self._read(root, path)
        if self._keeps and len(root) + len(path) <= _KNOWN_LENGTH:
            if len(self._known) >= _KNOWN_TARGETS:
                self._known.clear()
            self._known[root, path] = (verdict,)
        return verdict

    def _read(self, root: str, path: str) -> str | Unreadable | None:
        if not root:
            return self._verdict(path)
        # ASGI servers differ on whether ``path`` repeats ``root_path``: read it both ways.
        spellings = [path, root + path]
        if path[:1] != "/" or path[:2] == "//":
            # A router may join the two with a slash, or read the path as a URI first.
            spellings.append(root + "/" + path)
            spellings += [root + reading for reading in readings(path)[1:]]
        if (rest := below(root, path)) is not None:
            spellings.insert(0, rest)
        guarded = None
        for spelling in spellings:
            verdict = self._verdict(spelling)
            if isinstance(verdict, Unreadable):
                return verdict
            guarded = guarded or verdict
        return guarded

    def _verdict(self, path: str) -> str | Unreadable | None:
        # The common case: every reading is the path itself. (Four substring tests inline:
        # a regex alternation, or a call, costs several times more per request.)
        if "//" not in path and "/." not in path and "%" not in path and path[:1] in ("/", ""):
            return path if self._guards(path) else None
        layers, wrong = decoded(path)
        texts = [text for layer in layers for text in forms(layer)]
        each = [readings(layer) for layer in layers]
        under = {reading for found in each for reading in found if self._under_prefix(reading)}
        # A router that matches the prefix on the text as it is (Starlette's Mount; Quart on
        # a URI's path; Werkzeug once leading slashes are dropped) goes in wherever a text
        # starts with it, whatever its dot segments say.
        literal = any(self._under_prefix("/" + text.lstrip("/")) for text in texts)
        if not under and not literal:
            return None
        if wrong is not None:
            return wrong
        if any(found != each[0] for found in each):
            return Unreadable.ESCAPES
        if not under:  # a prefix-matching router goes in, no canonical reading does
            return Unreadable.DOT_SEGMENTS
        if len(under) > 1:
            return Unreadable.TWO_READINGS
        (reading,) = under
        return None if self._public(reading) else reading

    def _under_prefix(self, path: str) -> bool:
        return path.startswith(self._under) or path == self._root

    def _guards(self, path: str) -> bool:
        return (path.startswith(self._under) or path == self._root) and not self._public(path)


def below(root: str, path: str) -> str | None:
    """*path* without the mount prefix *root*, when *path* repeats it (whole segments); else
    ``None``. The path an app routes on, when the server's ``path`` holds ``root_path``."""
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("/", ""):
        return path[len(root) :]
    return None
