"""``keyturn.asgi.current_principal``, built when first asked for: the one part of the ASGI
adapter that stays interpreted in the compiled build.

FastAPI finds the request to pass a dependency by reading the parameter's annotation, and
a compiled function has no signature to read. Starlette is imported here, on that first
use, never with ``keyturn.asgi``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["asgi_attribute"]


def asgi_attribute(name: str) -> Any:
    """The module ``__getattr__`` (PEP 562) of ``keyturn.asgi``."""
    if name != "current_principal":
        raise AttributeError(f"module 'keyturn.asgi' has no attribute {name!r}")
    try:
        from starlette.requests import HTTPConnection
    except ImportError as exc:
        raise ImportError(
            "keyturn.asgi.current_principal needs Starlette: pip install 'keyturn[asgi]'"
        ) from exc
    from keyturn import asgi
    from keyturn._model import Principal

    # async: FastAPI runs a plain def in its thread pool, a hop on every request.
    async def current_principal(connection: HTTPConnection) -> Principal:
        """:func:`~keyturn.asgi.principal` as a FastAPI dependency:
        ``Depends(current_principal)``."""
        return asgi.principal(connection)

    current_principal.__annotations__ = {"connection": HTTPConnection, "return": Principal}
    current_principal.__module__ = "keyturn.asgi"
    setattr(asgi, name, current_principal)
    return current_principal
