"""
Redacting keys in logs
======================

A :class:`logging.Filter` that takes keyturn keys out of every log record it sees, so that
a key your code (or a library) logs by mistake never reaches a log file, a terminal or a
log shipper. Attach it to the handlers that write::

    import logging
    from keyturn.redaction import RedactKeys

    handler = logging.StreamHandler()
    handler.addFilter(RedactKeys())
    logging.basicConfig(handlers=[handler], level=logging.INFO)

Rules of this file:

1. What is a key: ``rma_`` followed by 16 or more letters and digits, wherever it stands
   (glued to other text too). A whole key with a valid checksum becomes
   ``[redacted key <key id>]``, so you can revoke it by its id; anything else of that form
   -- a mistyped key, a key cut short, a longer run -- becomes ``[redacted]``: it may still
   hold most of a secret.
2. Where: the message and its arguments as the record renders them, each argument on its
   own (handlers such as Sentry's ship them apart from the message, and a format such as
   ``%.12s`` renders only part of one), the exception text, the stack text, and every text
   attribute (``extra={...}`` values included). An argument that holds a key is replaced
   by its text, redacted. A record
   whose rendered message holds a key gets the redacted message and no arguments; one
   whose exception text holds a key gets the redacted text and loses ``exc_info``, since
   the exception object itself still holds the key and some handlers send it on. Records
   with no key are left exactly as they were.
3. It never raises and never drops a record: ``filter`` returns true.
"""

from __future__ import annotations

import logging
import operator
import re
from collections.abc import Mapping
from typing import Any, Final

from keyturn._core import token as _token

__all__ = ["RedactKeys", "redact"]

_PREFIX: Final = _token.PREFIX
# Longer than a key id: whatever follows the id is part of a secret.
_CANDIDATE: Final = re.compile(rf"{_PREFIX}[A-Za-z0-9]{{16,}}", re.ASCII)
_DEFAULT_FORMATTER: Final = logging.Formatter()


def _replacement(match: re.Match[str]) -> str:
    parsed = _token.parse(match.group())
    if isinstance(parsed, _token.ParsedToken):
        return f"[redacted key {parsed.key_id}]"
    return "[redacted]"


def redact(text: str) -> str:
    """*text* with every keyturn key, and anything shaped like part of one, redacted."""
    if _PREFIX not in text:
        return text
    return _CANDIDATE.sub(_replacement, text)


def _holds_key(text: str) -> bool:
    return _PREFIX in text and _CANDIDATE.search(text) is not None


def _shown(value: object) -> str:
    """*value* as a text for a broken record: its repr, or a stand-in if that fails."""
    try:
        return redact(value if isinstance(value, str) else repr(value))
    except Exception:  # a repr that raises: say so rather than fail the log call
        return f"<{type(value).__name__}>"


class RedactKeys(logging.Filter):
    """Redact keyturn keys in each record: message, arguments, exception and stack text,
    and text attributes. Attach it to handlers (a logger's own filters do not see records
    from its child loggers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message: str | None = record.getMessage()
        except Exception:  # a broken format: logging reports it with msg and args, so
            message = None  # those must be clean on their own
        if message is None:
            record.msg = _shown(record.msg)
            record.args = _broken_args(record.args)
        elif _holds_key(message):
            record.msg, record.args = redact(message), ()
        elif record.args:  # the format cut a key short, or left it out: args ship apart
            record.args = _clean_args(record.args)
        self._exception(record)
        for name, value in vars(record).items():
            if isinstance(value, str) and name != "msg" and _PREFIX in value:
                setattr(record, name, redact(value))
        return True

    @staticmethod
    def _exception(record: logging.LogRecord) -> None:
        text = record.exc_text
        if not text and record.exc_info and record.exc_info[0] is not None:
            try:
                text = _DEFAULT_FORMATTER.formatException(record.exc_info)
            except Exception:  # unreadable: fail closed, keep the type only
                text = f"{record.exc_info[0].__name__}: (its traceback could not be formatted)"
                record.exc_text, record.exc_info = text, None
        if text and _holds_key(text):
            # The exception still holds the key: only the redacted text goes on.
            record.exc_text, record.exc_info = redact(text), None


def _clean(value: object) -> object:
    """*value*, or its text redacted if that holds a key: Sentry's logging integration and
    JSON formatters ship a record's arguments apart from its message."""
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, int | float):  # never a key: no repr to build
        return value
    try:
        text = repr(value)
    except Exception:  # a repr that raises: no handler ships its text either
        return value
    return redact(text) if _holds_key(text) else value


def _clean_args(args: Any) -> Any:
    """The arguments of a record, each value holding a key redacted; the same object when
    none does (a record with no key is left exactly as it was)."""
    if isinstance(args, Mapping):
        values = {key: _clean(value) for key, value in args.items()}
        return values if any(values[k] is not v for k, v in args.items()) else args
    if isinstance(args, tuple):
        cleaned = tuple(map(_clean, args))
        return cleaned if any(map(operator.is_not, cleaned, args)) else args
    return _clean(args)  # one argument, set by hand


def _broken_args(args: Any) -> Any:
    if isinstance(args, Mapping):
        return {key: _shown(value) for key, value in args.items()}
    if isinstance(args, tuple):
        return tuple(_shown(value) for value in args)
    return args
