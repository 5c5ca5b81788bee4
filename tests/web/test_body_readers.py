"""The body readers every edge uses (``keyturn._web``): the limit, ``more_body``, a
disconnect, a chunked WSGI body, a declared length, and what the app gets afterwards."""

from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace
from typing import Any

import pytest

from keyturn._web import Body, Message, read_asgi_body, read_django_body, read_wsgi_body


def asgi(messages: list[Message], length: str | None = None) -> tuple[Any, Any, list[Message]]:
    """A scope and a ``receive`` that answers *messages*, then a disconnect, forever."""
    headers = [] if length is None else [(b"Content-Length", length.encode())]
    pending = list(messages)

    async def receive() -> Message:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    return {"type": "http", "headers": headers}, receive, pending


def read(
    messages: list[Message], limit: int, length: str | None = None
) -> tuple[Body, list[Message]]:
    """The body read, and every message the app's ``receive`` then answers up to the end."""
    scope, receive, _ = asgi(messages, length)

    async def run() -> tuple[Body, list[Message]]:
        body, then = await read_asgi_body(scope, receive, limit)
        seen = [await then()]
        while seen[-1]["type"] != "http.disconnect":
            seen.append(await then())
        return body, seen

    return asyncio.run(run())


def chunk(data: bytes, more: bool) -> Message:
    return {"type": "http.request", "body": data, "more_body": more}


def test_asgi_body_in_pieces_reaches_the_app_as_one_message() -> None:
    body, seen = read([chunk(b"ab", True), chunk(b"", True), chunk(b"cd", False)], limit=4)

    assert body == Body(b"abcd")
    assert seen == [chunk(b"abcd", False), {"type": "http.disconnect"}]


def test_asgi_body_over_the_limit_keeps_its_first_bytes() -> None:
    body, seen = read([chunk(b"abc", True), chunk(b"de", True), chunk(b"f", False)], limit=4)

    assert body == Body(b"abcd", over=True)
    assert seen[0] == chunk(b"f", False)  # not replayed: the server's own receive goes on


def test_asgi_declared_length_over_the_limit_reads_nothing() -> None:
    scope, receive, pending = asgi([chunk(b"abcde", False)], length=" 5 ")

    body, then = asyncio.run(read_asgi_body(scope, receive, 4))

    assert body == Body(b"", over=True, read=False)
    assert then is receive
    assert len(pending) == 1


def test_asgi_disconnect_reaches_the_app_first() -> None:
    body, seen = read([chunk(b"ab", True)], limit=4)

    assert body == Body(b"ab")
    assert seen == [{"type": "http.disconnect"}]


def test_asgi_endless_empty_messages_end_over_the_limit() -> None:
    body, _ = read([chunk(b"", True)] * 10, limit=3)

    assert body.over


def environ(data: bytes, length: str | None, terminated: bool = False) -> dict[str, Any]:
    found: dict[str, Any] = {"wsgi.input": io.BytesIO(data)}
    if length is not None:
        found["CONTENT_LENGTH"] = length
    if terminated:
        found["wsgi.input_terminated"] = True
    return found


@pytest.mark.parametrize(
    ("data", "length", "terminated", "limit", "expected"),
    [
        (b"abcd", "4", False, 4, Body(b"abcd")),
        (b"abcdef", "4", False, 8, Body(b"abcd")),  # read to its length, never past
        (b"ab", "4", False, 8, Body(b"ab")),  # a stream that ends early
        (b"abcde", "5", False, 4, Body(b"", over=True, read=False)),
        (b"abcd", None, True, 4, Body(b"abcd")),  # chunked: to the stream's end
        (b"abcde", None, True, 4, Body(b"abcd", over=True)),
        (b"abcd", None, False, 4, Body(b"", read=False)),  # no body (PEP 3333)
        (b"abcd", "", False, 4, Body(b"", read=False)),
        (b"abcd", "+4", True, 4, None),  # int() reads it; servers may not
        (b"abcd", "\u0664", False, 4, None),
    ],
)
def test_wsgi_body(
    data: bytes, length: str | None, terminated: bool, limit: int, expected: Body | None
) -> None:
    assert read_wsgi_body(environ(data, length, terminated), limit) == expected


@pytest.mark.parametrize(
    ("body", "length", "expected"),
    [
        (b"abcd", "4", Body(b"abcd")),
        (b"abcde", "", Body(b"abcd", over=True)),  # what Django read, whatever it was told
        (b"abcde", " 5", Body(b"", over=True, read=False)),
    ],
)
def test_django_body(body: bytes, length: str, expected: Body) -> None:
    request = SimpleNamespace(META={"CONTENT_LENGTH": length}, body=body)

    assert read_django_body(request, 4) == expected
