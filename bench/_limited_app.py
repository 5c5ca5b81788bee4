"""The app each worker of the accuracy run serves: ``uvicorn bench._limited_app:app``.

keyturn's ASGI middleware over a SQLite file the parent seeded, with a rate limiter on a
shared engine (Redis or PostgreSQL), configured by the environment the parent sets:

- ``KEYTURN_BENCH_LIMIT_STORE``: the SQLite file holding the key;
- ``KEYTURN_BENCH_LIMIT_ENGINE``: ``redis`` or ``postgres``; ``KEYTURN_BENCH_LIMIT_URL``
  its URL, ``KEYTURN_BENCH_LIMIT_PREFIX`` the Redis key prefix;
- ``KEYTURN_BENCH_LIMIT_QUOTA`` and ``KEYTURN_BENCH_LIMIT_WINDOW``: the key's and the
  account's limit, *quota* requests per *window* seconds; ``KEYTURN_BENCH_LIMIT_INSTANCES``
  the processes sharing the engine;
- ``KEYTURN_BENCH_LIMIT_LOG``: a directory; each worker appends one line per decided
  request to a file of its own: the instant the limiter decided for, and the status.

The instant is the limiter's own clock reading for that request (kept in a context
variable the request's task reads back), so the parent can replay every window exactly.
"""

from __future__ import annotations

import contextvars
import os
import time
from typing import Any, Final

from keyturn import Authenticator
from keyturn.asgi import ApiKeyMiddleware
from keyturn.ratelimits import Rate as _Rate
from keyturn.ratelimits import RateEngine, RateLimiter, RateLimits

__all__ = ["app"]

_decided: Final[contextvars.ContextVar[float]] = contextvars.ContextVar("decided")


def _clock() -> float:
    now = time.time()
    _decided.set(now)  # the request's task reads it back once the middleware answered
    return now


def _engine() -> RateEngine:
    url = os.environ["KEYTURN_BENCH_LIMIT_URL"]
    if os.environ["KEYTURN_BENCH_LIMIT_ENGINE"] == "redis":
        from keyturn.ratelimits.redis import RedisEngine

        return RedisEngine(url, prefix=os.environ["KEYTURN_BENCH_LIMIT_PREFIX"], deadline=2.0)
    from keyturn.ratelimits.postgres import PostgresEngine

    return PostgresEngine(url, deadline=2.0)


async def _models(scope: Any, receive: Any, send: Any) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": b'{"data":[]}'})


class _Logged:
    """Writes each decided request's instant and status to this worker's file."""

    def __init__(self, inner: Any, directory: str) -> None:
        self.inner = inner
        self.directory = directory
        self.fd: int | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        status = 0

        async def sent(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        token = _decided.set(0.0)
        try:
            await self.inner(scope, receive, sent)
            decided = _decided.get()
        finally:
            _decided.reset(token)
        if decided:
            if self.fd is None:  # opened in the worker, not in the process that imported us
                path = os.path.join(self.directory, f"worker-{os.getpid()}.log")
                self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.write(self.fd, f"{decided!r} {status}\n".encode("ascii"))


def _build() -> Any:
    from keyturn.stores.sqlite import SQLiteDatabase

    quota = int(os.environ["KEYTURN_BENCH_LIMIT_QUOTA"])
    window = int(os.environ["KEYTURN_BENCH_LIMIT_WINDOW"])
    limiter = RateLimiter(
        RateLimits(key=_Rate(quota, window), account=_Rate(quota, window)),
        engine=_engine(),
        instances=int(os.environ["KEYTURN_BENCH_LIMIT_INSTANCES"]),
        clock=_clock,
    )
    database = SQLiteDatabase(os.environ["KEYTURN_BENCH_LIMIT_STORE"])
    authenticator = Authenticator(database.keys, database.membership, rate_limiter=limiter)
    guarded = ApiKeyMiddleware(_models, authenticator=authenticator)
    return _Logged(guarded, os.environ["KEYTURN_BENCH_LIMIT_LOG"])


app: Final = _build() if "KEYTURN_BENCH_LIMIT_STORE" in os.environ else None
