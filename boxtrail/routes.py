"""Projects, health and metrics endpoints."""

from __future__ import annotations

import asyncio

import msgspec
from litestar import Request, Response, Router, get, post
from litestar.datastructures import State

from boxtrail.auth import require_project, require_tenant
from boxtrail.errors import ServiceUnavailable
from boxtrail.metrics import Registry
from boxtrail.storage import Storage, StorageError
from boxtrail.tenancy import Project, Tenancy


class NewProject(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    name: str
    allowed_origins: list[str] = []


class Health(msgspec.Struct, frozen=True):
    status: str


def shell_router(tenancy: Tenancy, storage: Storage, metrics: Registry) -> Router:
    @post("/v1/projects", summary="Create a project", status_code=201)
    async def create_project(request: Request[object, object, State], data: NewProject
                             ) -> Project:
        tenant = require_tenant(request.headers.get("authorization"), tenancy)
        return tenancy.create_project(tenant, data.name, data.allowed_origins)

    @get("/v1/projects", summary="List projects")
    async def list_projects(request: Request[object, object, State]) -> list[Project]:
        return tenancy.list_projects(require_tenant(request.headers.get("authorization"), tenancy))

    @get("/v1/projects/{project:str}", summary="Get a project by id or name")
    async def get_project(request: Request[object, object, State], project: str) -> Project:
        return require_project(request.headers.get("authorization"), tenancy, project)

    @get("/healthz", summary="Liveness")
    async def healthz() -> Health:
        return Health("ok")

    @get("/readyz", summary="Readiness: storage reachable")
    async def readyz() -> Health:
        try:
            await asyncio.wait_for(asyncio.to_thread(storage.check), 5)
        except (StorageError, TimeoutError) as exc:
            raise ServiceUnavailable(f"storage is not reachable: {exc}") from exc
        return Health("ready")

    @get("/metrics", summary="Prometheus metrics", media_type="text/plain; version=0.0.4")
    async def metrics_text() -> Response[str]:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    return Router("", route_handlers=[create_project, list_projects, get_project, healthz,
                                      readyz, metrics_text])
