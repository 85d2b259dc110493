"""Projects, health and metrics endpoints."""

from __future__ import annotations

import asyncio

import msgspec
from litestar import Request, Response, Router, get, post
from litestar.datastructures import State
from litestar.params import JSONBody

from boxtrail.auth import PUBLIC, Tenant, TenantProject
from boxtrail.errors import ServiceUnavailable
from boxtrail.metrics import Registry
from boxtrail.openapi import error_responses
from boxtrail.storage import Storage, StorageError
from boxtrail.tenancy import Project, Tenancy


class NewProject(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    name: str
    allowed_origins: list[str] = []


class Health(msgspec.Struct, frozen=True):
    status: str


def _base(request: Request[object, object, State]) -> str:
    """``scheme://host[:port]`` as the client reached this server (its Host header)."""
    return str(request.base_url).rstrip("/")


def shell_router(tenancy: Tenancy, storage: Storage, metrics: Registry) -> Router:
    @post("/v1/projects", summary="Create a project", status_code=201,
          responses=error_responses(400, 409, 413))
    async def create_project(request: Request[object, object, State], tenant: Tenant,
                             data: JSONBody[NewProject]) -> Project:
        project = tenancy.create_project(tenant, data.name, data.allowed_origins)
        return project.with_dsn(_base(request))

    @get("/v1/projects", summary="List projects")
    async def list_projects(request: Request[object, object, State],
                            tenant: Tenant) -> list[Project]:
        base = _base(request)
        return [p.with_dsn(base) for p in tenancy.list_projects(tenant)]

    @get("/v1/projects/{project:str}", summary="Get a project by id or name",
         responses=error_responses(400))
    async def get_project(request: Request[object, object, State],
                          tenant_project: TenantProject) -> Project:
        return tenant_project.with_dsn(_base(request))

    @get("/healthz", summary="Liveness")
    async def healthz() -> Health:
        return Health("ok")

    @get("/readyz", summary="Readiness: storage reachable", responses=error_responses(503))
    async def readyz() -> Health:
        try:
            await asyncio.wait_for(asyncio.to_thread(storage.check), 5)
        except (StorageError, TimeoutError) as exc:
            raise ServiceUnavailable(f"storage is not reachable: {exc}") from exc
        return Health("ready")

    @get("/metrics", summary="Prometheus metrics", media_type="text/plain; version=0.0.4")
    async def metrics_text() -> Response[str]:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    # Probes and scrapers carry no key; nothing here names a tenant.
    operations = Router("", route_handlers=[healthz, readyz, metrics_text], opt=PUBLIC)
    return Router("", route_handlers=[create_project, list_projects, get_project, operations])
