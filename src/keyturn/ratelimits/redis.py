"""Counts shared on Redis: one Lua script per lease, atomic across every instance.

::

    from keyturn.ratelimits import RateLimiter, RateLimits, Rate
    from keyturn.ratelimits.redis import RedisEngine

    limiter = RateLimiter(limits, engine=RedisEngine("redis://127.0.0.1:6379/0"))

Each subject's window is one integer key, ``<prefix><subject>:<window index>``, kept two
windows long. The script reads the previous window's count, adds what fits to the current
one and answers in one round trip. The client waits at most *deadline* seconds (connect
and read alike) and never retries: a failure is the limiter's to handle (fail open or
closed), never a hang. Needs ``pip install 'keyturn[redis]'``.
"""

from __future__ import annotations

from collections.abc import Sequence

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError as exc:
    raise ImportError("keyturn.ratelimits.redis needs redis: pip install 'keyturn[redis]'") from exc

from keyturn._core.fork import renew_in_child
from keyturn.ratelimits._counts import Grant

__all__ = ["RedisEngine"]

# KEYS: current window, previous window. ARGV: quota, weight, want, seconds to keep,
# returned (what a lease of the previous window left unspent).
_LEASE = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local previous = tonumber(redis.call('GET', KEYS[2]) or '0')
local returned = math.min(tonumber(ARGV[5]), previous)
if returned > 0 then
  previous = redis.call('DECRBY', KEYS[2], returned)
end
local room = math.floor(tonumber(ARGV[1]) - previous * tonumber(ARGV[2]) + 1e-9) - used
local granted = math.max(0, math.min(tonumber(ARGV[3]), room))
if granted > 0 then
  used = redis.call('INCRBY', KEYS[1], granted)
  redis.call('EXPIRE', KEYS[1], ARGV[4])
end
return {granted, used, previous}
"""


class RedisEngine:
    """Counts on a Redis server (or any server speaking its protocol with Lua scripts).

    :param url: ``redis://host:port/db`` (``rediss://`` for TLS).
    :param prefix: put before every key, so several services can share a database.
    :param deadline: seconds a connection or a lease may take before it counts as failed.
    """

    shared = True

    def __init__(self, url: str, *, prefix: str = "keyturn:rl:", deadline: float = 0.25) -> None:
        self.url = url
        self.prefix = prefix
        self.deadline = deadline
        self._connect()
        renew_in_child(self)

    def _connect(self) -> None:
        self._client = redis.Redis.from_url(
            self.url,
            socket_timeout=self.deadline,
            socket_connect_timeout=self.deadline,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self._script = self._client.register_script(_LEASE)

    def _after_fork(self) -> None:
        self._connect()  # the parent's sockets stay the parent's

    def __repr__(self) -> str:
        # The URL may hold a password: show the host part only.
        host = self.url.rpartition("@")[2]
        return f"RedisEngine({host!r}, prefix={self.prefix!r})"

    def lease(
        self,
        subject: str,
        *,
        quota: int,
        window: int,
        index: int,
        weight: float,
        want: int,
        returned: int = 0,
    ) -> Grant:
        """Take up to *want* from the subject's room in window *index*, in one round trip."""
        # One hash tag per subject: both windows live in one cluster slot.
        base = f"{self.prefix}{{{subject}}}:"
        granted, used, previous = self._script(
            keys=[f"{base}{index}", f"{base}{index - 1}"],
            args=[quota, repr(weight), want, 2 * window + 1, returned],
        )
        return Grant(int(granted), int(used), int(previous))

    def read(self, windows: Sequence[tuple[str, int]]) -> list[tuple[int, int]]:
        """Each subject's count in window *index* and the one before: one round trip of
        ``GET`` commands (a pipeline, no transaction), nothing written."""
        pipe = self._client.pipeline(transaction=False)
        for subject, index in windows:
            base = f"{self.prefix}{{{subject}}}:"
            pipe.get(f"{base}{index}")
            pipe.get(f"{base}{index - 1}")
        values = [int(value or 0) for value in pipe.execute()]
        return list(zip(values[::2], values[1::2], strict=True))

    def close(self) -> None:
        """Close the connections."""
        self._client.close()
