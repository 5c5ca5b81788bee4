"""Every in-process variant of the warm path, by name: one app, one request, its baseline.

The timed sections (``asgi``, ``wsgi``) and the instruction counts (``instructions``, one
variant per ``valgrind`` run through ``bench._count``) build their variants here, so both
measure exactly the same thing. A name is ``<framework>.<what>``, with ``+tenant`` when the
request uses the tenant-scoped key and names its organization in ``x-organization-id``.
Each variant's overhead is measured over its framework's bare app given the same request.

Only public entry points of keyturn are used: the middleware classes and ``Authenticator``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from bench._world import ACCOUNT, ORGANIZATION, OTHER_ORGANIZATION, TENANT, Keys, memory_world

__all__ = ["LABELS", "REFUSALS", "Variant", "World", "base_of", "build", "world"]

# name -> what the tables call it, in the order the tables print them.
LABELS: Final = {
    "starlette.bare": "starlette: bare",
    "starlette.floor": "starlette: floor, same work",
    "starlette.auth": "starlette: AuthenticationMiddleware, same work",
    "starlette.keyturn": "starlette: keyturn",
    "starlette.keyturn-limited": "starlette: keyturn with a rate limit (key and account)",
    "starlette.floor-trivial": "starlette: floor, trivial (lookup + headers)",
    "starlette.auth-trivial": "starlette: AuthenticationMiddleware, trivial",
    "starlette.bare+tenant": "starlette: bare (tenant request)",
    "starlette.floor+tenant": "starlette: floor, same work (tenant key)",
    "starlette.auth+tenant": "starlette: AuthenticationMiddleware, same work (tenant key)",
    "starlette.keyturn+tenant": "starlette: keyturn (tenant key)",
    "fastapi.bare": "fastapi: bare",
    "fastapi.bearer": "fastapi: HTTPBearer dependency, same work",
    "fastapi.keyturn": "fastapi: keyturn",
    "fastapi.keyturn-caller": "fastapi: keyturn + Caller (the documented set-up)",
    "fastapi.keyturn-depends": "fastapi: keyturn + Depends(current_principal)",
    "fastapi.keyturn-request": "fastapi: keyturn + principal(request), no dependency",
    "fastapi.bearer-trivial": "fastapi: HTTPBearer dependency, trivial",
    "fastapi.empty-depends": "fastapi: one empty async Depends(), no guard (FastAPI's own cost)",
    "flask.bare": "flask: bare",
    "flask.floor": "flask: floor, same work",
    "flask.httpauth": "flask: Flask-HTTPAuth, same work",
    "flask.keyturn": "flask: keyturn",
    "flask.keyturn-limited": "flask: keyturn with a rate limit (key and account)",
    "flask.floor-trivial": "flask: floor, trivial (lookup + headers)",
    "flask.httpauth-trivial": "flask: Flask-HTTPAuth, trivial",
    "flask.bare+tenant": "flask: bare (tenant request)",
    "flask.floor+tenant": "flask: floor, same work (tenant key)",
    "flask.httpauth+tenant": "flask: Flask-HTTPAuth, same work (tenant key)",
    "flask.keyturn+tenant": "flask: keyturn (tenant key)",
}
# The refused request, counted in instructions: keyturn's refusal of a mistyped key (the
# checksum fails) and of an unknown one (well formed, no such id) against the same-work
# floor's refusal (one sha256, a dict miss, a fixed 401). Each is measured over its
# framework's "refuse-all": a guard that answers a fixed 401 without reading anything.
REFUSALS: Final = {
    "starlette.refuse-all": "starlette: fixed 401, nothing read",
    "starlette.floor-refusal": "starlette: floor's refusal, same work",
    "starlette.keyturn-typo": "starlette: keyturn refuses a typo (bad checksum)",
    "starlette.keyturn-unknown": "starlette: keyturn refuses an unknown key",
    "flask.refuse-all": "flask: fixed 401, nothing read",
    "flask.floor-refusal": "flask: floor's refusal, same work",
    "flask.keyturn-typo": "flask: keyturn refuses a typo (bad checksum)",
    "flask.keyturn-unknown": "flask: keyturn refuses an unknown key",
}
# The trivial mechanisms of the frameworks add no service headers; every other guard does.
NO_HEADERS: Final = frozenset(
    {
        "starlette.auth-trivial",
        "fastapi.bearer-trivial",
        "fastapi.empty-depends",
        "flask.httpauth-trivial",
    }
)


def base_of(name: str) -> str:
    """The bare variant whose cost *name*'s overhead is measured over."""
    framework, _, rest = name.partition(".")
    if name in REFUSALS:
        return f"{framework}.refuse-all"
    return f"{framework}.bare+tenant" if rest.endswith("+tenant") else f"{framework}.bare"


@dataclass
class World:
    """The keys, the two tables of the hand-written checks, and one shared Authenticator."""

    keys: Keys
    authenticator: Any  # keyturn.Authenticator
    table: Any  # sha256(token) -> Who, with the organization rule's view of each key
    rule: Any  # bench._apps.Rule
    limited: Any = None  # an Authenticator over the same store, with a rate limiter


def world() -> World:
    from bench._apps import Rule, Who, sha256_keys
    from keyturn import Authenticator

    store, membership, keys = memory_world()
    table = sha256_keys(
        {
            keys.organization: Who(ACCOUNT, ORGANIZATION, TENANT),
            keys.tenant: Who(ACCOUNT, None, TENANT),
        }
    )
    rule = Rule(
        {ORGANIZATION: TENANT, OTHER_ORGANIZATION: TENANT},
        {(ACCOUNT, ORGANIZATION): "admin", (ACCOUNT, OTHER_ORGANIZATION): "member"},
    )
    return World(keys, Authenticator(store, membership), table, rule, limited(store, membership))


# Limits no benchmark reaches: every request is admitted from the process's own lease.
UNREACHED: Final = 10**9


def limited(store: Any, membership: Any, engine: Any = None, instances: int = 4) -> Any:
    """An Authenticator with a rate limit per key and per account (an hour's window)."""
    from keyturn import Authenticator
    from keyturn.ratelimits import Rate, RateLimiter, RateLimits

    limits = RateLimits(key=Rate(UNREACHED, 3600), account=Rate(UNREACHED, 3600))
    limiter = RateLimiter(limits, engine=engine, instances=instances)
    return Authenticator(store, membership, rate_limiter=limiter)


@dataclass
class Variant:
    name: str
    kind: str  # "asgi" or "wsgi"
    app: Any
    request: dict[str, Any]  # the ASGI scope or WSGI environ each call gets a copy of
    status: int = 200  # what each call answers

    @property
    def label(self) -> str:
        return LABELS.get(self.name) or REFUSALS[self.name]

    @property
    def headers(self) -> bool:
        """Whether this variant promises the two service headers."""
        return (
            self.name != base_of(self.name)
            and self.name not in NO_HEADERS
            and self.name not in REFUSALS
        )


def _asgi(name: str, w: World) -> Any:
    from starlette.middleware import Middleware

    from bench import _apps
    from keyturn.asgi import ApiKeyMiddleware

    trivial_table = _apps.sha256_keys(
        {w.keys.organization: _apps.Who(ACCOUNT, ORGANIZATION, TENANT)}
    )
    guard = name.partition(".")[2].removesuffix("+tenant")
    keyturn = Middleware(ApiKeyMiddleware, authenticator=w.authenticator)
    middleware: dict[str, Callable[[], list[Middleware]]] = {
        "bare": list,
        "refuse-all": lambda: [Middleware(_apps.RefuseAllASGI)],
        "floor-refusal": lambda: [Middleware(_apps.SameWorkFloorASGI, keys=w.table, rule=w.rule)],
        "keyturn-typo": lambda: [keyturn],
        "keyturn-unknown": lambda: [keyturn],
        "floor": lambda: [Middleware(_apps.SameWorkFloorASGI, keys=w.table, rule=w.rule)],
        "floor-trivial": lambda: [Middleware(_apps.FloorASGI, keys=trivial_table)],
        "auth": lambda: _apps.starlette_auth_same_work(w.table, w.rule),
        "auth-trivial": lambda: [_apps.starlette_auth_backend(trivial_table)],
        "keyturn": lambda: [keyturn],
        "keyturn-limited": lambda: [Middleware(ApiKeyMiddleware, authenticator=w.limited)],
    }
    if name.startswith("starlette."):
        return _apps.starlette_app(*middleware[guard]())
    if guard == "bearer":
        return _apps.fastapi_bearer_same_work_app(w.table, w.rule)
    if guard == "bearer-trivial":
        return _apps.fastapi_bearer_app(trivial_table)
    if guard == "keyturn-caller":
        return _apps.fastapi_caller_app(keyturn)
    if guard == "keyturn-depends":
        return _apps.fastapi_depends_app(keyturn)
    if guard == "empty-depends":
        return _apps.fastapi_empty_depends_app()
    if guard == "keyturn-request":
        return _apps.fastapi_request_app(keyturn)
    return _apps.fastapi_app(*middleware[guard]())


def _wsgi(name: str, w: World) -> Any:
    from bench import _apps
    from keyturn.wsgi import ApiKeyMiddleware

    trivial_table = _apps.sha256_keys(
        {w.keys.organization: _apps.Who(ACCOUNT, ORGANIZATION, TENANT)}
    )
    guard = name.partition(".")[2].removesuffix("+tenant")
    inner = _apps.flask_app().wsgi_app
    if guard == "bare":
        return inner
    if guard == "refuse-all":
        return _apps.RefuseAllWSGI(inner)
    if guard in ("floor", "floor-refusal"):
        return _apps.SameWorkFloorWSGI(inner, keys=w.table, rule=w.rule)
    if guard == "floor-trivial":
        return _apps.FloorWSGI(inner, keys=trivial_table)
    if guard == "httpauth":
        return _apps.flask_httpauth_same_work_app(w.table, w.rule).wsgi_app
    if guard == "httpauth-trivial":
        return _apps.flask_httpauth_app(trivial_table).wsgi_app
    if guard == "keyturn-limited":
        return ApiKeyMiddleware(inner, authenticator=w.limited)
    return ApiKeyMiddleware(inner, authenticator=w.authenticator)


def build(name: str, w: World) -> Variant:
    """The variant called *name*, in world *w* (imports only that framework)."""
    if name not in LABELS and name not in REFUSALS:
        raise ValueError(f"unknown variant {name!r}; known: {', '.join([*LABELS, *REFUSALS])}")
    from bench._world import mistype, unknown_token

    tenant = name.endswith("+tenant")
    token = w.keys.tenant if tenant else w.keys.organization
    if name.endswith(("-typo", "-refusal", "-all")):
        token = mistype(w.keys.organization)
    elif name.endswith("-unknown"):
        token = unknown_token()
    status = 401 if name in REFUSALS else 200
    headers = {"authorization": f"Bearer {token}"}
    if tenant:
        headers["x-organization-id"] = ORGANIZATION
    if name.startswith("flask."):
        from bench._apps import wsgi_environ

        environ = wsgi_environ({k.title(): v for k, v in headers.items()})
        return Variant(name, "wsgi", _wsgi(name, w), environ, status)
    from bench._apps import http_scope

    scope = http_scope(list(headers.items()))
    return Variant(name, "asgi", _asgi(name, w), scope, status)
