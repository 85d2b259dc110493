"""``/v1/projects/{project}/sourcemaps``: upload from CI (multipart), list, delete by release."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import msgspec
from litestar import Request, Router, delete, get, post
from litestar.datastructures import State
from litestar.openapi.spec import (
    OpenAPIFormat,
    OpenAPIMediaType,
    OpenAPIType,
    Operation,
    RequestBody,
    Schema,
)
from litestar.params import FromQuery
from multipart import parse_options_header  # type: ignore[import-untyped]

from core.openapi import error_responses
from core.workers import Offload
from symbolicate.artifacts import ArtifactRow, ArtifactStore
from symbolicate.side import SymbolicateSide
from symbolicate.sourcemaps import MAX_UPLOAD_BYTES, InvalidUpload, UploadWarning
from symbolicate.staging import stage_upload
from tenancy.guard import TenantProject, scope
from tenancy.keys import SOURCEMAPS_WRITE


@dataclass  # so that __post_init__ runs: Operation's own __init__ calls none
class _UploadOperation(Operation):
    """The upload's operation with its multipart body documented: the handler streams the
    body to a file instead of having it parsed, so Litestar would document none."""

    def __post_init__(self) -> None:
        binary = Schema(type=OpenAPIType.STRING, format=OpenAPIFormat.BINARY)
        text = Schema(one_of=[Schema(type=OpenAPIType.STRING), Schema(type=OpenAPIType.NULL)])
        form = Schema(type=OpenAPIType.OBJECT, required=["file"], properties={
            "file": Schema(type=OpenAPIType.ARRAY, items=binary, min_items=1),
            "release": text, "urlPrefix": text})
        self.request_body = RequestBody(
            content={"multipart/form-data": OpenAPIMediaType(schema=form)}, required=True)


class StoredFile(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    url: str
    name: str
    map_name: str
    release: str | None
    debug_id: str | None
    has_js: bool
    sources_content: bool
    js_bytes: int
    map_bytes: int
    uploaded_at: str


class Uploaded(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    release: str | None
    url_prefix: str
    files: list[StoredFile]
    warnings: list[UploadWarning]


class Listing(msgspec.Struct, frozen=True):
    files: list[StoredFile]


class Deleted(msgspec.Struct, frozen=True):
    deleted: int


def _stored(row: ArtifactRow) -> StoredFile:
    return StoredFile(url=row.url, name=row.name, map_name=row.map_name,
                      release=row.release or None, debug_id=row.debug_id,
                      has_js=row.js_sha256 is not None, sources_content=row.sources_content,
                      js_bytes=row.js_bytes, map_bytes=row.map_bytes,
                      uploaded_at=row.uploaded_at)


def multipart_boundary(content_type: str | None) -> str | None:
    """The boundary of a ``multipart/form-data`` body (1-200 characters), or None."""
    kind, options = parse_options_header(content_type or "")
    boundary = str(options.get("boundary", ""))
    if kind != "multipart/form-data" or not 0 < len(boundary) <= 200:
        return None
    return boundary


def _boundary(content_type: str | None) -> str:
    boundary = multipart_boundary(content_type)
    if boundary is None:
        raise InvalidUpload("send the files as multipart/form-data (a `file` part per file)",
                            detail={"contentType": (content_type or "")[:200]})
    return boundary


SPOOL_BYTES = 1 << 20


async def spool(request: Request[object, object, State], path: Path) -> None:
    """The body into ``path`` as it arrives (at most ``MAX_UPLOAD_BYTES``: Litestar answers
    413 past it), the only work an upload costs the server. A write per MiB received, from
    a thread: a disk busy with write-back can hold a write() for a long time."""
    out = await asyncio.to_thread(path.open, "wb")
    try:
        held: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            held.append(chunk)
            size += len(chunk)
            if size >= SPOOL_BYTES:
                await asyncio.to_thread(out.write, b"".join(held))
                held, size = [], 0
        if held:
            await asyncio.to_thread(out.write, b"".join(held))
    finally:
        await asyncio.to_thread(out.close)


def sourcemaps_router(store: ArtifactStore, offload: Offload[SymbolicateSide]) -> Router:
    @post("/v1/projects/{project:str}/sourcemaps", summary="Upload built JS and source maps",
          status_code=201, request_max_body_size=MAX_UPLOAD_BYTES,
          operation_class=_UploadOperation,
          description="multipart/form-data: `release` (optional), `urlPrefix` (default ~/), "
                      "one `file` part per .js and .map file, named by its path relative to "
                      "the build directory. Atomic: an invalid map fails the whole upload "
                      "with 400 naming the file.",
          responses=error_responses(400, 413, 503))
    async def upload(tenant_project: TenantProject,
                     request: Request[object, object, State]) -> Uploaded:
        boundary = _boundary(request.headers.get("content-type"))
        path = offload.temp_path("upload")
        try:
            await spool(request, path)
            # Validating a map costs ~0.2 s per 10 MB (JSON, mappings, symbolic's parse),
            # hashing and storing more: a worker process's job (core.workers). Under
            # the lock, a delete cannot collect a blob this upload found stored.
            async with store.lock:
                staged = await offload.run(stage_upload, tenant_project.id, str(path),
                                           boundary, lane="uploads")
                rows = await store.commit(tenant_project.id, staged.release, staged.files)
        finally:
            path.unlink(missing_ok=True)
        await store.announce(tenant_project.id, rows)
        return Uploaded(release=staged.release or None, url_prefix=staged.url_prefix,
                        files=[_stored(r) for r in rows], warnings=staged.warnings)

    @get("/v1/projects/{project:str}/sourcemaps", summary="List uploaded files",
         description="`release`: only that release (empty: files uploaded without one).",
         responses=error_responses(400))
    async def listing(tenant_project: TenantProject,
                      release: FromQuery[str | None] = None) -> Listing:
        rows = await asyncio.to_thread(store.rows, tenant_project.id, release)
        return Listing([_stored(r) for r in rows])

    @delete("/v1/projects/{project:str}/sourcemaps", summary="Delete a release's files",
            status_code=200,
            description="`release` is required (empty: the files uploaded without one).",
            responses=error_responses(400, 503))
    async def remove(tenant_project: TenantProject, release: FromQuery[str]) -> Deleted:
        return Deleted(await store.delete(tenant_project.id, release))

    return Router("", route_handlers=[upload, listing, remove], opt=scope(SOURCEMAPS_WRITE))
