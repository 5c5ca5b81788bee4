"""Which requests the middleware guards: the request target, read the way any router might.

Rules of this file (keep them):

1. It decides one thing -- whether a request is ours to authenticate, and under which path
   -- and nothing else. No I/O, no framework: text in, a verdict out. Every middleware
   (ASGI, WSGI, Django) calls :meth:`Paths.read` with what its server delivered
   (``root_path`` and ``path``; ``SCRIPT_NAME`` and ``PATH_INFO``), and so does
   :mod:`keyturn.leaks`, to tell whether a path is under the API's prefix.
2. **Fail closed.** Servers and routers read a target differently: Werkzeug adds a missing
   leading slash and drops repeated ones, some routers collapse runs of slashes or resolve
   dot segments, some decode percent-escapes the server left in place, some servers keep
   the ``http://host`` of an absolute-form target in the path. A request is guarded when
   *any* of these readings puts it under the prefix, either on the full path (mount prefix
   included) or on the path the app routes on (mount prefix removed).
3. Where the readings disagree about a path under the prefix (it climbs out with ``..``,
   or still holds percent-escapes after the server decoded it), there is no one path to
   authenticate, so the request is refused: :data:`UNREADABLE`, never passed.
4. A guarded request is authenticated under its canonical path (slashes collapsed, dot
   segments resolved, leading slash present): the path the role policy sees and the public
   paths are matched against.

The canonical reading, step by step:

- drop the scheme and authority of an absolute-form target (``http://host/x`` is ``/x``);
- add a missing leading slash (``managed-agents/v1`` is ``/managed-agents/v1``);
- collapse runs of slashes; resolve ``.`` and ``..`` (never above the root);
- and, as a second reading, the same after percent-decoding (``%2F``, ``%2E``, ``%25``...)
  until nothing is left to decode.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Collection
from typing import Final, Literal
from urllib.parse import unquote

__all__ = ["UNREADABLE", "Paths", "PublicPaths", "Unreadable", "canonical", "decoded"]

PublicPaths = Collection[str] | Callable[[str], bool]

# RFC 3986 scheme, then "//" and an authority that ends at the first "/" (or the end).
_ABSOLUTE: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/]*")
_MAX_DECODING_ROUNDS: Final = 8  # "%252525..." unwraps one layer a round; more is refused


class Unreadable(enum.Enum):
    """The verdict on a target that cannot be read as one path under the prefix."""

    TARGET = "target"


UNREADABLE: Final = Unreadable.TARGET


def canonical(target: str) -> str:
    """*target* as a path: absolute form dropped, leading slash added, slashes and dots resolved."""
    absolute = _ABSOLUTE.match(target)
    if absolute is not None:
        target = target[absolute.end() :]
    segments: list[str] = []
    for segment in target.split("/"):
        if segment == "..":
            if segments:
                segments.pop()
        elif segment not in ("", "."):
            segments.append(segment)
    trailing = "/" if segments and target.endswith(("/", "/.", "/..")) else ""
    return "/" + "/".join(segments) + trailing


def decoded(target: str) -> tuple[list[str], bool]:
    """Every layer of percent-decoding of *target*, the last fully decoded; and whether that
    is clean: the layers end, and each is UTF-8 (a router reads it one way only).

    Bytes that are not UTF-8 decode to U+FFFD, as most routers decode them.
    """
    layers = [target]
    for _ in range(_MAX_DECODING_ROUNDS):
        if "%" not in target:
            return layers, True
        plain = unquote(target, errors="replace")
        if plain == target:
            return layers, True
        clean = "\ufffd" not in plain or "\ufffd" in target
        layers.append(plain)
        target = plain
        if not clean:
            return layers, False
    return layers, False


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

    def read(self, root: str, path: str) -> str | Literal[Unreadable.TARGET] | None:
        """The canonical path to authenticate the request under; ``None`` if it is not ours
        (outside the prefix, or public); :data:`UNREADABLE` if it must be refused.

        *root* is the mount prefix the server or a parent app set (ASGI ``root_path``, WSGI
        ``SCRIPT_NAME``), *path* the rest as delivered (ASGI ``path``, which may or may not
        repeat *root*; WSGI ``PATH_INFO``). The request is guarded if the path the app routes
        on or the full path is; the first of these that is guarded is the path returned.
        """
        if not root:
            return self._verdict(path)
        # ASGI servers differ on whether ``path`` repeats ``root_path``: read it both ways.
        spellings = [path, root + path]
        if path[:1] != "/":  # and a router may join the two with a slash
            spellings.append(root + "/" + path)
        if _starts(path, root):
            spellings.insert(0, path[len(root) :])
        guarded = None
        for spelling in spellings:
            verdict = self._verdict(spelling)
            if verdict is UNREADABLE:
                return verdict
            guarded = guarded or verdict
        return guarded

    def _verdict(self, path: str) -> str | Literal[Unreadable.TARGET] | None:
        # The common case: every reading is the path itself. (Four substring tests inline:
        # a regex alternation, or a call, costs several times more per request.)
        if "//" not in path and "/." not in path and "%" not in path and path[:1] in ("/", ""):
            return path if self._guards(path) else None
        layers, clean = decoded(path)
        readings = {canonical(layer) for layer in layers}
        # A router that matches the prefix on the text as it is (Starlette's Mount) goes in
        # wherever a literal layer starts with it, whatever its dot segments say.
        literal = any(
            self._under_prefix(layer if layer[:1] == "/" else "/" + layer) for layer in layers
        )
        if len(readings) > 1 or not clean:
            if literal or any(map(self._under_prefix, readings)):
                return UNREADABLE
            return None
        (reading,) = readings
        if literal and not self._under_prefix(reading):
            return UNREADABLE  # a prefix-matching router goes in, the canonical path does not
        return reading if self._guards(reading) else None

    def _under_prefix(self, path: str) -> bool:
        return path.startswith(self._under) or path == self._root

    def _guards(self, path: str) -> bool:
        return (path.startswith(self._under) or path == self._root) and not self._public(path)


def _starts(path: str, root: str) -> bool:
    return path.startswith(root) and path[len(root) : len(root) + 1] in ("/", "")
