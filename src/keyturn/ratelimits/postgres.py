"""Counts shared on PostgreSQL: one statement per lease, for those who run no Redis.

::

    from keyturn.ratelimits import RateLimiter
    from keyturn.ratelimits.postgres import PostgresEngine

    limiter = RateLimiter(limits, engine=PostgresEngine("postgresql://app@db/app"))

The counts live in one ``UNLOGGED`` table, ``keyturn_rate_windows`` (a row per subject and
window; nothing worth a write-ahead log: a crash forgets the current windows' counts),
made by the engine on its first lease if it is missing (``CREATE ... IF NOT EXISTS``), in
the schema the URL's ``search_path`` names. A lease is one ``INSERT ... ON CONFLICT DO
UPDATE``: the row lock makes it atomic across every instance. Rows two windows old are
deleted every 1,024 leases. A statement may take *deadline* seconds (``statement_timeout``
and ``tcp_user_timeout``); connecting waits at most 2 seconds (libpq's least). A failed
connection is dropped and made anew on the next lease. Needs
``pip install 'keyturn[postgres]'``.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

try:
    import psycopg
except ImportError as exc:
    raise ImportError(
        "keyturn.ratelimits.postgres needs psycopg: pip install 'keyturn[postgres]'"
    ) from exc

from keyturn._core.fork import renew_in_child
from keyturn.ratelimits._counts import Grant

__all__ = ["PostgresEngine"]

TABLE: Final = """
CREATE UNLOGGED TABLE IF NOT EXISTS keyturn_rate_windows (
    subject text NOT NULL,
    window_index bigint NOT NULL,
    used bigint NOT NULL,
    granted bigint NOT NULL,
    expires_at double precision NOT NULL,
    PRIMARY KEY (subject, window_index)
)
"""

# What a lease of the previous window left unspent goes back first; the room is computed
# from the previous window's count, and the current count is read under the row lock
# (ON CONFLICT's row is the latest version).
_LEASE: Final = """
WITH back AS (
    UPDATE keyturn_rate_windows SET used = greatest(0, used - %(returned)s)
    WHERE %(returned)s > 0 AND subject = %(subject)s AND window_index = %(index)s - 1
    RETURNING used
), before AS (
    SELECT coalesce(
        (SELECT used FROM back),
        (SELECT used FROM keyturn_rate_windows
         WHERE subject = %(subject)s AND window_index = %(index)s - 1),
        0
    ) AS previous
), room AS (
    SELECT floor(%(quota)s - previous * %(weight)s + 1e-9)::bigint AS room, previous FROM before
)
INSERT INTO keyturn_rate_windows AS w (subject, window_index, used, granted, expires_at)
SELECT %(subject)s, %(index)s, greatest(0, least(%(want)s, room)),
       greatest(0, least(%(want)s, room)), %(expires)s
FROM room
ON CONFLICT (subject, window_index) DO UPDATE
SET granted = greatest(0, least(%(want)s, (SELECT room FROM room) - w.used)),
    used = w.used + greatest(0, least(%(want)s, (SELECT room FROM room) - w.used))
RETURNING w.granted, w.used, (SELECT previous FROM room)
"""

# The console's view: the counts of the windows asked for, nothing written.
_READ: Final = """
SELECT subject, window_index, used FROM keyturn_rate_windows
WHERE (subject, window_index) IN (SELECT * FROM unnest(%s::text[], %s::bigint[]))
"""

_SWEEP_EVERY: Final = 1024


class PostgresEngine:
    """Counts in a PostgreSQL table, on one connection of the engine's own.

    :param url: a ``postgresql://`` URL (its ``options`` may set ``search_path``).
    :param deadline: seconds a lease may take before it counts as failed.
    """

    shared = True

    def __init__(self, url: str, *, deadline: float = 0.25) -> None:
        self.url = url
        self.deadline = deadline
        self._connection: psycopg.Connection[Any] | None = None
        self._leases = 0
        self._lock = threading.Lock()
        renew_in_child(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._connection = None  # the parent's socket stays the parent's

    def __repr__(self) -> str:
        return f"PostgresEngine(deadline={self.deadline})"  # the URL may hold a password

    def _connect(self) -> psycopg.Connection[Any]:
        milliseconds = max(1, math.ceil(self.deadline * 1000))
        connection = psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=2,
            tcp_user_timeout=milliseconds,
            keepalives=1,
        )
        try:
            connection.execute(f"SET statement_timeout = {milliseconds}")
            row = connection.execute("SELECT to_regclass('keyturn_rate_windows')").fetchone()
            if row is None or row[0] is None:
                # Another instance may make it at the same moment: its table is as good.
                with contextlib.suppress(
                    psycopg.errors.UniqueViolation,
                    psycopg.errors.DuplicateTable,
                    psycopg.errors.DuplicateObject,
                ):
                    connection.execute(TABLE)
        except BaseException:
            connection.close()
            raise
        return connection

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
        """Take up to *want* from the subject's room in window *index*, in one statement."""
        with self._lock:
            try:
                if self._connection is None:
                    self._connection = self._connect()
                row = self._connection.execute(
                    _LEASE,
                    {
                        "subject": subject,
                        "index": index,
                        "quota": quota,
                        "weight": weight,
                        "want": want,
                        "returned": returned,
                        "expires": float((index + 2) * window),
                    },
                ).fetchone()
                self._leases += 1
                if self._leases % _SWEEP_EVERY == 0:
                    self._connection.execute(
                        "DELETE FROM keyturn_rate_windows WHERE expires_at < %s", (time.time(),)
                    )
            except BaseException:
                self._drop()
                raise
        assert row is not None  # INSERT ... RETURNING answers one row
        granted, used, previous = row
        return Grant(int(granted), int(used), int(previous))

    def read(self, windows: Sequence[tuple[str, int]]) -> list[tuple[int, int]]:
        """Each subject's count in window *index* and the one before, in one statement."""
        subjects = [subject for subject, index in windows for _ in (0, 1)]
        indexes = [index - back for _, index in windows for back in (0, 1)]
        with self._lock:
            try:
                if self._connection is None:
                    self._connection = self._connect()
                rows = self._connection.execute(_READ, (subjects, indexes)).fetchall()
            except BaseException:
                self._drop()
                raise
        found = {(subject, index): int(used) for subject, index, used in rows}
        return [(found.get((s, i), 0), found.get((s, i - 1), 0)) for s, i in windows]

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):  # a broken connection closes as it can
                connection.close()

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._drop()
