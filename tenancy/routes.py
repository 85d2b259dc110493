"""The tenancy's endpoints: projects, API keys, and the web console's sign-in."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, TypeVar

import msgspec
from litestar import Request, Response, Router, delete, get, patch, post
from litestar.datastructures import State
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, JSONBody

from core.errors import InvalidParameter, Unauthorized
from core.openapi import error_responses
from tenancy.guard import (
    PUBLIC,
    TenancyGuard,
    Tenant,
    TenantProject,
    require_same_origin,
    scope,
    session_cookie,
)
from tenancy.keys import ADMIN, ANY, MAX_NAME, SCOPES, KeyInfo, NewKey
from tenancy.sessions import Session
from tenancy.tenants import (
    MAX_ALLOWED_ORIGINS,
    MAX_KEY_NAME,
    PROJECT_NAME_PATTERN,
    IngestKey,
    Project,
    Tenancy,
)

# The schema states the name's pattern and the list's length; Tenancy.create_project checks
# them (its refusal names the field). What an origin is (IDNA, IPv6) no pattern states.
_SCHEMA_ONLY = "extra"  # Litestar's key in extra_json_schema: schema, not decoding


class NewProject(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    name: Annotated[str, msgspec.Meta(
        extra_json_schema={_SCHEMA_ONLY: {"pattern": PROJECT_NAME_PATTERN}})]
    allowed_origins: Annotated[list[str], msgspec.Meta(
        extra_json_schema={_SCHEMA_ONLY: {"maxItems": MAX_ALLOWED_ORIGINS}})] = []


class ProjectChange(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """What ``PATCH /v1/projects/{p}`` changes: what is left out stays."""

    name: Annotated[str | None, msgspec.Meta(
        extra_json_schema={_SCHEMA_ONLY: {"pattern": PROJECT_NAME_PATTERN}})] = None
    allowed_origins: Annotated[list[str] | None, msgspec.Meta(
        extra_json_schema={_SCHEMA_ONLY: {"maxItems": MAX_ALLOWED_ORIGINS}})] = None


RateLimit = Annotated[float, msgspec.Meta(ge=0.01, le=10_000_000)]  # events/s


class NewIngestKey(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    name: Annotated[str, msgspec.Meta(max_length=MAX_KEY_NAME)] = ""
    rate_limit: RateLimit | None = None  # events/s; none: BOXTRAIL_RATE_LIMIT_EVENTS


class IngestKeyChange(msgspec.Struct, frozen=True, forbid_unknown_fields=True,
                      rename="camel"):
    """What left out stays; ``rateLimit: null``: back to BOXTRAIL_RATE_LIMIT_EVENTS."""

    name: Annotated[str, msgspec.Meta(max_length=MAX_KEY_NAME)] | None = None
    enabled: bool | None = None
    rate_limit: RateLimit | msgspec.UnsetType | None = msgspec.UNSET


T = TypeVar("T")


async def strictly(request: Request[object, object, State], kind: type[T]) -> T:
    """The body as ``kind``, decoded strictly. Litestar converts leniently (``"5"`` for a
    number, ``0`` for a bool), which the schema does not allow; it has decoded the body
    already, so only a body it took leniently is refused here."""
    try:
        return msgspec.json.decode(await request.body(), type=kind)
    except msgspec.ValidationError as exc:
        raise InvalidParameter(f"invalid body: {exc}", detail={"problem": str(exc)}) from None


def _with_dsn(key: IngestKey, project: Project, base: str) -> IngestKey:
    if "-" in key.key:  # made before version 3: not a DSN's public key
        return key
    scheme, _, host = base.rstrip("/").partition("://")
    return msgspec.structs.replace(key, dsn=f"{scheme}://{key.key}@{host}/{project.sentry_id}")


def _base(request: Request[object, object, State]) -> str:
    """``scheme://host[:port]`` as the client reached this server (its Host header)."""
    return str(request.base_url).rstrip("/")


def projects_router(tenancy: Tenancy, more: Sequence[HTTPRouteHandler] = ()) -> Router:
    """``/v1/projects``, and ``more`` handlers of its paths from other stages (a path's
    handlers must share one router: each router makes the path's OPTIONS handler)."""
    @post("/v1/projects", summary="Create a project", status_code=201,
          responses=error_responses(400, 409, 413), opt=scope(ADMIN))
    async def create_project(request: Request[object, object, State], tenant: Tenant,
                             data: JSONBody[NewProject]) -> Project:
        # Catalog calls of a handler run in a thread: one that waits for the catalog (a
        # commit, a cut link) holds this request, never the loop's 202s (metadata.postgres).
        project = await asyncio.to_thread(tenancy.create_project, tenant, data.name,
                                          data.allowed_origins)
        return project.with_dsn(_base(request))

    @get("/v1/projects", summary="List projects", opt=scope(ANY))
    async def list_projects(request: Request[object, object, State],
                            tenant: Tenant) -> list[Project]:
        base = _base(request)
        return [p.with_dsn(base) for p in await asyncio.to_thread(tenancy.list_projects, tenant)]

    @get("/v1/projects/{project:str}", summary="Get a project by id or name",
         responses=error_responses(400), opt=scope(ANY))
    async def get_project(request: Request[object, object, State],
                          tenant_project: TenantProject) -> Project:
        return tenant_project.with_dsn(_base(request))

    @patch("/v1/projects/{project:str}", summary="Rename a project or set its allowed "
           "origins (at once, on every node)", responses=error_responses(400, 409, 413),
           opt=scope(ADMIN))
    async def update_project(request: Request[object, object, State], tenant: Tenant,
                             tenant_project: TenantProject,
                             data: JSONBody[ProjectChange]) -> Project:
        project = await asyncio.to_thread(tenancy.update_project, tenant, tenant_project,
                                          data.name, data.allowed_origins)
        return project.with_dsn(_base(request))

    ingest_keys = "/v1/projects/{project:str}/ingest-keys"

    @get(ingest_keys, summary="List a project's ingest keys", opt=scope(ADMIN))
    async def list_ingest_keys(request: Request[object, object, State],
                               tenant_project: TenantProject) -> list[IngestKey]:
        base = _base(request)
        return [_with_dsn(k, tenant_project, base)
                for k in await asyncio.to_thread(tenancy.ingest_keys, tenant_project)]

    @post(ingest_keys, summary="Add an ingest key (rotation: add, redeploy, delete the old)",
          status_code=201, responses=error_responses(400, 413), opt=scope(ADMIN))
    async def add_ingest_key(request: Request[object, object, State],
                             tenant_project: TenantProject,
                             data: JSONBody[NewIngestKey]) -> IngestKey:
        data = await strictly(request, NewIngestKey)
        key = await asyncio.to_thread(tenancy.add_ingest_key, tenant_project, data.name,
                                      data.rate_limit)
        return _with_dsn(key, tenant_project, _base(request))

    @patch(ingest_keys + "/{key:str}", summary="Rename, disable or enable an ingest key, or "
           "set its rate limit (at once, on every node)", responses=error_responses(400, 413),
           opt=scope(ADMIN))
    async def change_ingest_key(request: Request[object, object, State],
                                tenant_project: TenantProject, key: FromPath[str],
                                data: JSONBody[IngestKeyChange]) -> IngestKey:
        data = await strictly(request, IngestKeyChange)
        rate = data.rate_limit
        changed = await asyncio.to_thread(
            lambda: tenancy.change_ingest_key(
                tenant_project, key, name=data.name, enabled=data.enabled,
                rate_limit=None if isinstance(rate, msgspec.UnsetType) else rate,
                clear_rate_limit=rate is None))
        return _with_dsn(changed, tenant_project, _base(request))

    @delete(ingest_keys + "/{key:str}", summary="Delete an ingest key (at once, on every "
            "node)", status_code=204, opt=scope(ADMIN))
    async def delete_ingest_key(tenant_project: TenantProject, key: FromPath[str]) -> None:
        await asyncio.to_thread(tenancy.delete_ingest_key, tenant_project, key)

    return Router("", route_handlers=[create_project, list_projects, get_project,
                                      update_project, list_ingest_keys, add_ingest_key,
                                      change_ingest_key, delete_ingest_key, *more])


MAX_EXPIRES_IN_S = 10 * 366 * 86_400


class NewKeyRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    name: Annotated[str, msgspec.Meta(max_length=MAX_NAME)]
    scopes: Annotated[list[str], msgspec.Meta(
        extra_json_schema={_SCHEMA_ONLY: {"items": {"enum": list(SCOPES)}, "minItems": 1}})]
    # Seconds from now; none: never. (A time would let a request name one in the past.)
    expires_in: Annotated[float, msgspec.Meta(ge=1, le=MAX_EXPIRES_IN_S)] | None = None


def keys_router(tenancy: Tenancy) -> Router:
    """``/v1/keys``: a tenant's API keys, made, listed and revoked by an admin key."""
    keys = tenancy.keys

    @post("/v1/keys", summary="Create an API key (shown once)", status_code=201,
          responses=error_responses(400, 413))
    async def create_key(request: Request[object, object, State], tenant: Tenant,
                         data: JSONBody[NewKeyRequest]) -> NewKey:
        data = await strictly(request, NewKeyRequest)
        expires = None if data.expires_in is None else time.time() + data.expires_in
        secret, key = await asyncio.to_thread(keys.create, tenant, data.name, data.scopes,
                                              expires)
        return NewKey(**msgspec.structs.asdict(keys.info(key)), key=secret)

    @get("/v1/keys", summary="List the tenant's API keys (never the keys themselves)")
    async def list_keys(tenant: Tenant) -> list[KeyInfo]:
        return await asyncio.to_thread(keys.list, tenant)

    @delete("/v1/keys/{key_id:str}", summary="Revoke an API key, at once, on every node",
            responses=error_responses(400, 404), status_code=204)
    async def revoke_key(tenant: Tenant, key_id: FromPath[str]) -> None:
        digest = await asyncio.to_thread(keys.revoke, tenant, key_id)
        keys.forget(digest)  # here, now; the other nodes by the change feed

    return Router("", route_handlers=[create_key, list_keys, revoke_key], opt=scope(ADMIN))


class SignIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    api_key: str


class SessionInfo(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    tenant_id: str
    tenant_name: str
    csrf_token: str
    expires_at: str  # ISO 8601, UTC
    scopes: list[str]  # the key's that opened it

    @classmethod
    def of(cls, session: Session) -> SessionInfo:
        expires = datetime.fromtimestamp(session.expires_at, UTC)
        return cls(tenant_id=session.tenant_id, tenant_name=session.tenant_name,
                   csrf_token=session.csrf,
                   expires_at=expires.isoformat(timespec="seconds").replace("+00:00", "Z"),
                   scopes=sorted(session.scopes))


def _cookie(request: Request[object, object, State], token: str, max_age: int) -> str:
    name = session_cookie(request)
    secure = "; Secure" if name.startswith("__Host-") else ""
    return f"{name}={token}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}{secure}"


def session_router(guard: TenancyGuard, ttl_s: int) -> Router:
    """``/v1/session``: the web console signs in with an API key once and holds a cookie
    (read by the guard, ``tenancy.guard``). Left out of the schema: only the console
    calls it; an API client sends its key on every request."""

    @post("/v1/session", opt=PUBLIC, status_code=201)
    async def sign_in(request: Request[object, object, State],
                      data: JSONBody[SignIn]) -> Response[SessionInfo]:
        require_same_origin(request)
        key = await asyncio.to_thread(guard.tenancy.keys.authenticate, data.api_key)
        if key is None:
            raise Unauthorized("unknown API key (or revoked, or expired)")
        if (previous := request.cookies.get(session_cookie(request))) is not None:
            # Signing in again ends the session it replaces.
            await asyncio.to_thread(guard.sessions.revoke, previous)
        token, session = await asyncio.to_thread(guard.sessions.create, key, ttl_s)
        return Response(SessionInfo.of(session), status_code=201,
                        headers={"Set-Cookie": _cookie(request, token, ttl_s)})

    @get("/v1/session", opt=scope(ANY))
    async def current(request: Request[object, object, State]) -> SessionInfo:
        session = guard.caller(request).session
        if session is None:  # called with a bearer key
            raise Unauthorized("no console session: sign in with POST /v1/session")
        return SessionInfo.of(session)

    @delete("/v1/session", opt=scope(ANY))
    async def sign_out(request: Request[object, object, State]) -> Response[None]:
        if (token := request.cookies.get(session_cookie(request))) is not None:
            await asyncio.to_thread(guard.sessions.revoke, token)
        return Response(None, status_code=204, headers={"Set-Cookie": _cookie(request, "", 0)})

    return Router("", route_handlers=[sign_in, current, sign_out], include_in_schema=False)
