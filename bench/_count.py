"""One variant's warm requests, for ``valgrind --tool=callgrind``: ``python -m bench._count``.

``python -m bench._count VARIANT N`` builds one variant of ``bench._variants``, checks
that it answers as it should (200 with the service headers, where it promises them, for
keyturn the key's one cold verification; 401 for a refusal), runs warm-up requests, and
then runs *N* warm requests between two calls of ``os.getppid()``. Run under callgrind with
``--dump-before=getppid``, the counts are dumped at those two calls: the second of the
three parts holds the *N* requests and nothing else -- start-up, imports, the first
decision and the warm-up fall in the first part, shutting down in the third. The garbage
collector stays on.

It prints one JSON line: the variant, *N*, and the status of the checking request.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from bench._apps import asgi_batch, asgi_call, wsgi_batch, wsgi_call
from bench._variants import build, world

__all__ = ["main"]

MARKER = "getppid"  # the libc function whose calls separate the parts


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: python -m bench._count VARIANT N")
    name, n = argv[0], int(argv[1])
    w = world()
    variant = build(name, w)
    loop = asyncio.new_event_loop()
    try:
        if variant.kind == "asgi":
            reply = loop.run_until_complete(asgi_call(variant.app, variant.request))
            batch = asgi_batch(loop.run_until_complete, variant.app, variant.request)
        else:
            reply = wsgi_call(variant.app, variant.request)
            batch = wsgi_batch(variant.app, variant.request)
        if reply.status != variant.status:
            raise SystemExit(f"{name} answered {reply.status}: {reply.body!r}")
        if variant.headers and reply.header("service-organization-id") is None:
            raise SystemExit(f"{name} did not set the service headers")
        batch(max(20, n // 4))  # warm-up: caches, lazy imports, first allocations
        os.getppid()  # part 1 ends
        batch(n)
        os.getppid()  # part 2 (the n requests) ends
    finally:
        loop.close()
        w.authenticator.close()
    print(json.dumps({"variant": name, "n": n, "status": reply.status}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
