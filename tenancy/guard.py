"""Tenancy, decided in one place for every route.

The app's one guard (:class:`TenancyGuard`, on the ``Litestar`` object itself) runs for
every route handler, before any parameter is parsed or any body is read:

1. a handler declared public (``opt=PUBLIC``, on it or on its router) passes;
2. every other one needs ``Authorization: Bearer <API key>``, or, without that header,
   the ``boxtrail_session`` cookie of a live web console session (``tenancy.sessions``):
   401 without either, with a key that is not known, or with a cookie whose session
   expired or was signed out;
3. a request by cookie whose method is not GET, HEAD or OPTIONS must also send the
   session's CSRF token as ``X-Boxtrail-CSRF`` and, if it has an ``Origin``, come from
   this server's own origin: 403 ``csrf_failed`` otherwise. A browser adds the cookie to
   another site's requests by itself, never that header; a bearer request needs neither;
4. a route whose path names a ``{project}`` (id or name) gets it among the caller's
   tenant's projects: another tenant's is a 404, exactly as one that does not exist;
5. the key (or the key that opened the session) must have the scope the route declares
   (``opt={"scope": ...}``, ``tenancy.keys``): 403 ``insufficient_scope`` naming it
   otherwise. A route that declares none fails the app's start, so none is left open.

Handlers read the outcome through the app's dependencies: a parameter
``tenant: Tenant`` (the tenant's id), ``tenant_project: TenantProject`` (the
:class:`Project` the path names) or ``caller: CallerOf`` (all of it, with the key's hash
that streams hold, :meth:`tenancy.keys.ApiKeys.hold`). As a plugin, the guard also
documents its answers (401, 403; 404 where the path names a project) and each route's scope
(``security``) on each route it covers, in the schema.

A new route is guarded unless it says otherwise; ``tests/tenancy/test_tenancy_guard.py`` walks
every route of the app to hold that. The MCP tools name their project in their
arguments, not in a path: they resolve it with :func:`require_project` from the same
request's header, so ``/mcp`` (a mount) takes the bearer key only, never the cookie.
"""

from __future__ import annotations

import hmac
from typing import Any, Final, TypeAlias

import msgspec
from litestar import Request
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.handlers import BaseRouteHandler, HTTPRouteHandler
from litestar.plugins import ReceiveRoutePlugin
from litestar.routes import BaseRoute, HTTPRoute

from core.errors import CsrfFailed, InsufficientScope, NotFound, Unauthorized
from core.openapi import SECURITY_SCHEME, error_responses
from tenancy.keys import ADMIN, ANY, SCOPES, USAGE_READ, ApiKey
from tenancy.sessions import Session, Sessions, cookie_name, is_https
from tenancy.tenants import Project, Tenancy

PUBLIC: Final = {"public": True}
"""``opt`` of a handler or router anyone may call without an API key."""


Tenant: TypeAlias = NamedDependency[str]
TenantProject: TypeAlias = NamedDependency[Project]


def scope(name: str) -> dict[str, str]:
    """``opt`` of a handler or router that needs a key with scope ``name``."""
    assert name in (*SCOPES, ANY), name
    return {"scope": name}

_CALLER = "boxtrail.caller"  # the guard's decision, in the connection's scope state
CSRF_HEADER = "X-Boxtrail-CSRF"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def require_key(authorization: str | None, tenancy: Tenancy) -> ApiKey:
    header = authorization or ""
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Unauthorized("send the API key as 'Authorization: Bearer <key>'")
    key = tenancy.keys.authenticate(secret.strip())
    if key is None:
        raise Unauthorized("unknown API key (or revoked, or expired)")
    return key


def require_scope(scopes: frozenset[str], needed: str) -> None:
    if needed == USAGE_READ and ADMIN in scopes:  # what admin may see anyway
        return
    if needed != ANY and needed not in scopes:
        raise InsufficientScope(f"this API key lacks the scope {needed!r} (it has: "
                                f"{', '.join(sorted(scopes))}); make one that has it "
                                "(POST /v1/keys)", detail={"scope": needed})


def tenant_project(tenancy: Tenancy, tenant: str, id_or_name: str) -> Project:
    project = tenancy.get_project(tenant, id_or_name)
    if project is None:
        raise NotFound(f"no project {id_or_name!r}", detail={"project": id_or_name})
    return project


def require_project(authorization: str | None, tenancy: Tenancy, id_or_name: str,
                    needed: str) -> Project:
    key = require_key(authorization, tenancy)
    require_scope(key.scopes, needed)
    return tenant_project(tenancy, key.tenant_id, id_or_name)


class Caller(msgspec.Struct, frozen=True):
    tenant: str
    project: Project | None  # the route's {project}, if its path names one
    scopes: frozenset[str]
    holder: str  # the hash of the key it calls with ('' for a session from before keys)
    session: Session | None = None  # the console session, if it called by cookie


CallerOf: TypeAlias = NamedDependency[Caller]


# Litestar's own ``Guard`` type: a request or websocket of any handler.
Connection = ASGIConnection[Any, Any, Any, Any]


def session_cookie(connection: Connection) -> str:
    """The name of the session cookie for this request (``tenancy.sessions``)."""
    return cookie_name(is_https(connection.url.scheme,
                                connection.headers.get("x-forwarded-proto")))


def require_same_origin(connection: Connection) -> None:
    """403 if the request has an ``Origin`` whose host and port are not this server's as
    the client reached it (its Host header). The scheme is left out: behind a proxy that
    ends TLS the page is https and this server hears http, and a page of another scheme on
    this very host is this host's own."""
    origin = connection.headers.get("origin")
    if origin is None:
        return
    own = connection.base_url.netloc.lower()
    scheme, _, rest = origin.lower().partition("://")
    host = rest if scheme in ("http", "https") else None
    if scheme == "http":
        host = host.removesuffix(":80") if host else host
    elif scheme == "https":
        host = host.removesuffix(":443") if host else host
    if host is None or host not in (own, own.removesuffix(":80"), own.removesuffix(":443")):
        raise CsrfFailed(f"a console request must come from the console's own origin (host "
                         f"{own}), not {origin[:200]}", detail={"origin": origin[:200]})


def _require_csrf(connection: Connection, session: Session) -> None:
    sent = connection.headers.get(CSRF_HEADER, "")
    if not hmac.compare_digest(sent.encode(), session.csrf.encode()):
        raise CsrfFailed(f"a request by session cookie that changes something must send "
                         f"'{CSRF_HEADER}: <csrfToken>', the token POST or GET /v1/session "
                         "answers", detail={"header": CSRF_HEADER})
    require_same_origin(connection)


def _litestar_options(handler: BaseRouteHandler) -> bool:
    return isinstance(handler, HTTPRouteHandler) and handler.http_methods == {"OPTIONS"}


class TenancyGuard(ReceiveRoutePlugin):
    def __init__(self, tenancy: Tenancy) -> None:
        self.tenancy = tenancy
        self.sessions = Sessions(tenancy.db)

    def __call__(self, connection: Connection, handler: BaseRouteHandler) -> None:
        if not handler.opt.get("public"):
            caller = self.caller(connection)
            # Litestar's own OPTIONS answer (every path has one) declares nothing: any key.
            require_scope(caller.scopes, handler.opt.get("scope", ANY))

    def caller(self, connection: Connection) -> Caller:
        """Who calls, decided once per request (the guard first, dependencies after)."""
        state = connection.scope["state"]
        if (known := state.get(_CALLER)) is not None:
            return known  # type: ignore[no-any-return]
        session = self._session(connection)
        if session is not None:
            tenant, scopes, holder = session.tenant_id, session.scopes, session.key_hash
        else:
            key = require_key(connection.headers.get("authorization"), self.tenancy)
            tenant, scopes, holder = key.tenant_id, key.scopes, key.hash
        ref = connection.path_params.get("project")
        caller = Caller(tenant, None if ref is None
                        else tenant_project(self.tenancy, tenant, ref), scopes, holder,
                        session)
        state[_CALLER] = caller
        return caller

    def _session(self, connection: Connection) -> Session | None:
        """The console session a request without an Authorization header calls by
        (checked as rule 3 says), or None: it is a bearer request."""
        token = connection.cookies.get(session_cookie(connection))
        if (token is None or "authorization" in connection.headers
                or not isinstance(connection.route_handler, HTTPRouteHandler)):
            return None  # /mcp, a mount, is not an HTTP route: bearer only
        session = self.sessions.lookup(token)
        if session is None:
            raise Unauthorized("the console session expired or was signed out: sign in again "
                               "(POST /v1/session) or send 'Authorization: Bearer <key>'")
        if connection.scope.get("method", "GET") not in _SAFE_METHODS:
            _require_csrf(connection, session)
        return session

    def receive_route(self, route: BaseRoute) -> None:
        handlers = route.route_handlers if isinstance(route, HTTPRoute) else [
            getattr(route, "route_handler", None)]
        for handler in handlers:
            if handler is None or handler.opt.get("public") or _litestar_options(handler):
                continue
            needed = handler.opt.get("scope")
            if needed not in (*SCOPES, ANY):
                raise RuntimeError(f"{route.path}: a route that is not public declares the "
                                   f"scope it needs (opt=scope(...)), not {needed!r}")
        if not isinstance(route, HTTPRoute):
            return  # /mcp: a mount, not in the schema
        statuses = (401, 404) if "project" in route.path_parameters else (401,)
        for handler in route.route_handlers:
            if not handler.opt.get("public") and not _litestar_options(handler):
                handler.responses = {**error_responses(*statuses, described={
                    403: "The API key lacks the scope this operation needs "
                         "(insufficient_scope; its security names it)"}),
                    **(handler.responses or {})}
                scopes = [] if handler.opt["scope"] == ANY else [handler.opt["scope"]]
                handler.security = [{SECURITY_SCHEME: scopes}]

    def dependencies(self) -> dict[str, Provide]:
        return {"tenant": Provide(self._tenant, sync_to_thread=False),
                "tenant_project": Provide(self._project, sync_to_thread=False),
                "caller": Provide(self._caller, sync_to_thread=False)}

    def _caller(self, request: Request[object, object, State]) -> Caller:
        return self.caller(request)

    def _tenant(self, request: Request[object, object, State]) -> str:
        return self.caller(request).tenant

    def _project(self, request: Request[object, object, State]) -> Project:
        project = self.caller(request).project
        if project is None:
            raise RuntimeError(f"{request.url.path}: tenant_project needs a {{project}} in "
                               "the route's path")
        return project
