"""
FastAPI dependency and OpenAPI declaration
==========================================

The :class:`~keyturn.Principal` the ASGI middleware set, as a FastAPI dependency, and the
OpenAPI document told how a request is authenticated. ::

    from keyturn.asgi import ApiKeyMiddleware
    from keyturn.fastapi import Caller, document

    app = FastAPI()
    app.add_middleware(ApiKeyMiddleware, authenticator=authenticator)
    document(app)

    @app.get("/managed-agents/v1/models")
    async def list_models(caller: Caller) -> dict[str, str]:
        return {"organization": caller.organization_id}

``Caller`` is ``Annotated[Principal, Depends(api_key)]``; use ``Depends(api_key)`` where
you need the dependency itself (``dependencies=[Depends(api_key)]`` on a router).

Rules of this file:

1. The middleware decides; ``api_key`` only reads its answer, as one ``async`` call with
   no sub-dependency (no thread-pool hop, nothing parsed). It does not read the
   ``Authorization`` header (the middleware removes it before the app), and on a path the
   middleware does not guard it raises :class:`~keyturn.MissingPrincipal`: a setup bug,
   surfaced as a 500, never an anonymous request.
2. The OpenAPI declaration costs nothing per request. ``api_key`` is itself the bearer
   security scheme (FastAPI lists it on every operation that uses it); :func:`document`
   amends the generated document once, when it is first asked for: two alternative
   security requirements, the key alone (an organization-scoped key need not name its
   organization: spec section 5) or the key with the ``x-organization-id`` header (a
   tenant-scoped key needs it); the header as an optional parameter whose schema is its
   syntax (design D8: ``default`` or an organization id), so a value that matches is one
   the middleware reads; and the middleware's answers -- 400, 401, 403, 404, 503 with the
   error body's schema. FastAPI cannot say these through dependencies: it takes responses
   only from routes and routers, and a scheme's header has no schema.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the annotations of
# ``api_key.__call__`` at route creation, and an instance has no globals to resolve text in.

import copy
from typing import Annotated, Any, Final

try:
    from fastapi import Depends, FastAPI
    from fastapi.openapi.models import HTTPBearer as HTTPBearerModel
    from fastapi.security.base import SecurityBase
    from starlette.requests import HTTPConnection
except ImportError as exc:
    raise ImportError("keyturn.fastapi needs FastAPI: pip install 'keyturn[fastapi]'") from exc

from keyturn._core.decision import DEFAULT_ORGANIZATION_PATTERN
from keyturn._core.model import Principal
from keyturn._web import principal_in

__all__ = ["ERROR_RESPONSES", "Caller", "api_key", "current_principal", "document"]

KEY_SCHEME: Final = "apiKey"
ORGANIZATION_SCHEME: Final = "organization"
ERROR_SCHEMA_NAME: Final = "KeyturnError"

_ORGANIZATION_DEFINITION: Final = {
    "type": "apiKey",
    "in": "header",
    "name": "x-organization-id",
    "description": (
        "The organization the request acts in: its id, or `default`. Required with a "
        "tenant-scoped key; an organization-scoped key may send its own organization."
    ),
}
_ERROR_SCHEMA: Final = {
    "title": ERROR_SCHEMA_NAME,
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string", "title": "Code"},
                "message": {"type": "string", "title": "Message"},
            },
        }
    },
}


def _answer(description: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "description": description,
        "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{ERROR_SCHEMA_NAME}"}}
        },
    }
    if headers:
        answer["headers"] = {
            name: {"description": text, "schema": {"type": "string"}}
            for name, text in headers.items()
        }
    return answer


ERROR_RESPONSES: Final[dict[str, dict[str, Any]]] = {
    "400": _answer(
        "`invalid_request`: `x-organization-id` is missing (a tenant-scoped key needs it) "
        "or is not an organization id, or the path has no single reading."
    ),
    "401": _answer(
        "`unauthorized`: the key is missing, mistyped, expired, revoked or inactive.",
        {
            "WWW-Authenticate": (
                'The challenge: `Bearer realm="..."`, plus `error="invalid_token"` when a key '
                "was sent."
            )
        },
    ),
    "403": _answer("`permission_denied`: the service's role policy refused the key's creator."),
    "404": _answer(
        "`not_found`: `x-organization-id` names an organization the key or its creator "
        "cannot reach."
    ),
    "429": _answer(
        "`rate_limited`: the key, its account or its organization has no room left in its "
        "rate limit (only when the service sets rate limits).",
        {
            "Retry-After": "Seconds to wait before retrying.",
            "RateLimit-Policy": "Each limit's quota `q` per window `w` seconds.",
            "RateLimit": "Each limit's room `r` and the seconds `t` until it grows.",
        },
    ),
    "503": _answer(
        "`service_unavailable`: keys cannot be checked right now; retry with the same key.",
        {"Retry-After": "Seconds to wait before retrying."},
    ),
}
"""The middleware's answers as OpenAPI responses, by status; :func:`document` adds them."""


class _ApiKey(SecurityBase):
    """The caller as a dependency, and the bearer key as the security scheme it declares."""

    def __init__(self) -> None:
        self.model = HTTPBearerModel(
            bearerFormat="rma_...",
            description="A personal API key, sent as `Authorization: Bearer rma_...`.",
        )
        self.scheme_name = KEY_SCHEME

    async def __call__(self, connection: HTTPConnection) -> Principal:
        """The authenticated caller, as the middleware decided it.

        :raises MissingPrincipal: the middleware did not authenticate this request.
        """
        return principal_in(connection.get("state"))

    def __repr__(self) -> str:
        return "keyturn.fastapi.api_key"


api_key: Final = _ApiKey()
"""The dependency: ``Depends(api_key)``. Declares the bearer key on the operations using it."""

Caller = Annotated[Principal, Depends(api_key)]


# async: FastAPI runs a plain def in its thread pool, a hop on every request.
async def current_principal(connection: HTTPConnection) -> Principal:
    """:func:`keyturn.asgi.principal` as a FastAPI dependency: ``Depends(current_principal)``,
    for HTTP and WebSocket routes alike, without the security schemes.

    FastAPI passes the request (or the WebSocket) by this parameter's annotation.

    :raises MissingPrincipal: the middleware did not authenticate this request.
    """
    return principal_in(connection.get("state"))


def document(
    app: FastAPI,
    *,
    organization_header: bool = True,
    organization_pattern: str = DEFAULT_ORGANIZATION_PATTERN,
) -> None:
    """Complete *app*'s OpenAPI document for the operations that use :data:`api_key`.

    On each, two alternative security requirements: the key alone, or the key with
    ``x-organization-id`` (the key alone with ``organization_header=False``, for a service
    whose keys are all organization-scoped); the header as an optional parameter whose
    schema is its syntax, ``default`` or an id matching *organization_pattern* (give the
    ``Authenticator``'s own if you changed it); and :data:`ERROR_RESPONSES`, except a status
    the operation already declares itself. Done once, when the document is first generated,
    so routes added later are covered and requests pay nothing.
    """
    header = _organization_parameter(organization_pattern) if organization_header else None
    if app.openapi_schema is not None:  # generated already: amend that one
        _declare(app.openapi_schema, header)
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _declare(generate(), header)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's way to extend the document


def _organization_parameter(pattern: str) -> dict[str, Any]:
    """The ``x-organization-id`` header as an operation parameter: its syntax (design D8)."""
    return {
        "name": _ORGANIZATION_DEFINITION["name"],
        "in": "header",
        "required": False,
        "description": _ORGANIZATION_DEFINITION["description"],
        "schema": {"type": "string", "pattern": f"^(default|{pattern})$"},
    }


def _declare(openapi: dict[str, Any], header: dict[str, Any] | None) -> dict[str, Any]:
    """*openapi* with keyturn's requirements, the organization *header* (unless ``None``)
    and the middleware's answers on the operations using the key."""
    declared = False
    for path_item in openapi.get("paths", {}).values():
        for operation in path_item.values():
            requirements = operation.get("security") if isinstance(operation, dict) else None
            if not requirements or not any(KEY_SCHEME in each for each in requirements):
                continue
            declared = True
            if header is not None:
                with_header: dict[str, list[str]] = {KEY_SCHEME: [], ORGANIZATION_SCHEME: []}
                if with_header not in requirements:
                    requirements.append(with_header)
                parameters = operation.setdefault("parameters", [])
                named = {(p.get("in"), str(p.get("name", "")).lower()) for p in parameters}
                if ("header", header["name"]) not in named:
                    parameters.append(copy.deepcopy(header))
            responses = operation.setdefault("responses", {})
            for status, answer in ERROR_RESPONSES.items():
                responses.setdefault(status, copy.deepcopy(answer))
            operation["responses"] = dict(sorted(responses.items()))
    if declared:
        components = openapi.setdefault("components", {})
        components.setdefault("schemas", {})[ERROR_SCHEMA_NAME] = copy.deepcopy(_ERROR_SCHEMA)
        if header is not None:
            schemes = components.setdefault("securitySchemes", {})
            schemes[ORGANIZATION_SCHEME] = dict(_ORGANIZATION_DEFINITION)
    return openapi
