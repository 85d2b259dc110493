"""The deletion endpoints: start a job (a project, or rows of it), read its status."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Annotated, ClassVar

import msgspec
from litestar import Request, Router, delete, get, post
from litestar.datastructures import State
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, JSONBody
from msgspec import UNSET, UnsetType

from core.errors import InvalidParameter, NotFound
from core.openapi import error_responses
from erasure.jobs import Deletions, Job, Removed
from erasure.selector import Selector, id_upto
from ingest.origin import BOX_ID
from query.language import MAX_LENGTH, compile_query
from query.since import TIME_PATTERN, parse_time
from tenancy.guard import Tenant, TenantProject, scope
from tenancy.keys import ADMIN
from tenancy.routes import strictly
from tenancy.tenants import Tenancy

_SCHEMA_ONLY = "extra"
_Time = Annotated[str, msgspec.Meta(extra_json_schema={_SCHEMA_ONLY: {"pattern": TIME_PATTERN}})]


class DeletionRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True,
                      rename="camel"):
    """Rows of the project to erase: those of ``box``, with ``since <= ts < until``,
    matching ``query`` (the search language: what a search for it returns; an empty query
    matches every row, as there), each if given, at least one given. Only rows ingested
    before the request are selected. The whole project: ``DELETE /v1/projects/{project}``."""

    min_fields: ClassVar[int] = 1  # the schema's minProperties (core.openapi)

    box: Annotated[str, msgspec.Meta(
        extra_json_schema={_SCHEMA_ONLY: {"pattern": f"^{BOX_ID.pattern}$"}})] | UnsetType = UNSET
    since: _Time | UnsetType = UNSET
    until: _Time | UnsetType = UNSET
    query: Annotated[str, msgspec.Meta(max_length=MAX_LENGTH)] | UnsetType = UNSET


class Selects(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """What a job selects, as a user reads it."""

    project: bool = False  # every row, source map and key of the project
    box: str | None = None
    since: str | None = None
    until: str | None = None
    query: str | None = None


class Deletion(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    id: str
    project: str  # the project's id
    project_name: str
    selects: Selects
    state: str  # queued | running | done
    created_at: str  # rows ingested after this are never selected
    started_at: str | None
    purged_at: str | None  # from here on no byte of a selected row is stored anywhere
    removed: Removed
    # Live nodes that had not acknowledged when the job ended: their buffers and WALs are
    # erased when they do (a node that is down, at its next start).
    unacknowledged_nodes: list[str]
    error: str | None


def _iso(at: float | None) -> str | None:
    if at is None:
        return None
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def _iso_ms(ms: int | None) -> str | None:
    return None if ms is None else _iso(ms / 1000)


def view(job: Job) -> Deletion:
    sel = job.selector
    return Deletion(
        id=job.id, project=job.project_id, project_name=job.project_name,
        selects=Selects(project=sel.project, box=sel.box, since=_iso_ms(sel.since_ms),
                        until=_iso_ms(sel.until_ms), query=sel.query),
        state=job.state, created_at=_iso(job.created_at) or "",
        started_at=_iso(job.started_at), purged_at=_iso(job.purged_at),
        removed=job.progress.removed, unacknowledged_nodes=job.progress.waited_for,
        error=job.error)


def selector_of(data: DeletionRequest, now_ms: int) -> Selector:
    """The request as a selector, every field checked."""
    box = None if isinstance(data.box, UnsetType) else data.box
    since_text = None if isinstance(data.since, UnsetType) else data.since
    until_text = None if isinstance(data.until, UnsetType) else data.until
    query = None if isinstance(data.query, UnsetType) else data.query
    if box is None and since_text is None and until_text is None and query is None:
        raise InvalidParameter(
            "a deletion names box, since, until or query (at least one); to delete the "
            "whole project, DELETE /v1/projects/{project}", detail={"field": "box"})
    if box is not None and not BOX_ID.fullmatch(box):
        raise InvalidParameter(f"box {box[:80]!r} must match {BOX_ID.pattern}",
                               detail={"field": "box"})
    since = None if since_text is None else parse_time(since_text, now_ms, "since")
    until = None if until_text is None else parse_time(until_text, now_ms, "until")
    if since is not None and until is not None and until <= since:
        raise InvalidParameter("until is not after since: the range would be empty",
                               detail={"field": "until"})
    if query is not None:
        compile_query(query)  # its syntax error, with where it is
    return Selector(upto_id=id_upto(now_ms), box=box, since_ms=since, until_ms=until,
                    query=query)


def deletions_router(tenancy: Tenancy, deletions: Deletions) -> Router:
    jobs = "/v1/projects/{project:str}/deletions"

    @post(jobs, summary="Erase rows of a project: a box, a time range, a query (a job)",
          status_code=202, responses=error_responses(400, 413))
    async def create_deletion(request: Request[object, object, State], tenant: Tenant,
                              tenant_project: TenantProject,
                              data: JSONBody[DeletionRequest]) -> Deletion:
        data = await strictly(request, DeletionRequest)
        selector = selector_of(data, int(time.time() * 1000))
        job = Deletions.new(tenant, tenant_project.id, tenant_project.name, selector)
        return view(await asyncio.to_thread(deletions.create, job))

    @get(jobs, summary="A project's deletion jobs, newest first")
    async def list_project_deletions(tenant: Tenant,
                                     tenant_project: TenantProject) -> list[Deletion]:
        return [view(j) for j in await asyncio.to_thread(deletions.of_tenant, tenant,
                                                         tenant_project.id)]

    @get("/v1/deletions", summary="The tenant's deletion jobs (deleted projects' too), "
         "newest first")
    async def list_deletions(tenant: Tenant) -> list[Deletion]:
        return [view(j) for j in await asyncio.to_thread(deletions.of_tenant, tenant)]

    @get("/v1/deletions/{deletion_id:str}", summary="A deletion job: its state, what it "
         "removed, when its rows were purged", responses=error_responses(404))
    async def get_deletion(tenant: Tenant, deletion_id: FromPath[str]) -> Deletion:
        job = await asyncio.to_thread(deletions.get, tenant, deletion_id)
        if job is None:
            raise NotFound(f"no deletion {deletion_id[:80]!r}",
                           detail={"deletion": deletion_id[:80]})
        return view(job)

    return Router("", route_handlers=[create_deletion, list_project_deletions,
                                      list_deletions, get_deletion], opt=scope(ADMIN))


def project_deletion(tenancy: Tenancy, deletions: Deletions) -> HTTPRouteHandler:
    """``DELETE /v1/projects/{project}``, served by the projects' router (one route per
    path: ``tenancy.routes``)."""

    @delete("/v1/projects/{project:str}", summary="Delete a project: at once a 404, its "
            "keys refused everywhere, its name free; its data erased by the job returned",
            status_code=202, opt=scope(ADMIN))
    async def delete_project(tenant: Tenant, tenant_project: TenantProject) -> Deletion:
        selector = Selector(upto_id=id_upto(int(time.time() * 1000)), project=True)
        job = Deletions.new(tenant, tenant_project.id, tenant_project.name, selector)
        await asyncio.to_thread(tenancy.delete_project, tenant, tenant_project,
                                lambda: deletions.insert(job))
        return view(job)

    return delete_project
