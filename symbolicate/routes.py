"""``/v1/projects/{project}/sourcemaps``: upload from CI (multipart), list, delete by release."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Annotated

import msgspec
from litestar import Router, delete, get, post
from litestar.datastructures import UploadFile
from litestar.enums import RequestEncodingType
from litestar.params import Body, FromQuery

from boxtrail.auth import TenantProject
from boxtrail.openapi import error_responses
from symbolicate.artifacts import ArtifactRow, ArtifactStore
from symbolicate.sourcemaps import (
    MAX_FILE_BYTES,
    MAX_UPLOAD_BYTES,
    UploadedFile,
    UploadTooLarge,
    UploadWarning,
    check_release,
    normalize_prefix,
    plan_upload,
)


@dataclass
class UploadForm:
    file: list[UploadFile] = field(default_factory=list)
    release: str | None = None
    urlPrefix: str | None = None  # the form field's name


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


async def _read(upload: UploadFile) -> UploadedFile:
    data = await upload.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise UploadTooLarge(f"{upload.filename}: larger than {MAX_FILE_BYTES} bytes",
                             detail={"file": upload.filename})
    return UploadedFile(upload.filename, data)


def sourcemaps_router(store: ArtifactStore) -> Router:
    @post("/v1/projects/{project:str}/sourcemaps", summary="Upload built JS and source maps",
          status_code=201, request_max_body_size=MAX_UPLOAD_BYTES,
          description="multipart/form-data: `release` (optional), `urlPrefix` (default ~/), "
                      "one `file` part per .js and .map file, named by its path relative to "
                      "the build directory. Atomic: an invalid map fails the whole upload "
                      "with 400 naming the file.",
          responses=error_responses(400, 413, 503))
    async def upload(tenant_project: TenantProject,
                     data: Annotated[UploadForm,
                                     Body(media_type=RequestEncodingType.MULTI_PART)]
                     ) -> Uploaded:
        try:
            release = check_release(data.release)
            prefix = normalize_prefix(data.urlPrefix)
            files = [await _read(f) for f in data.file]
        finally:
            for f in data.file:
                await f.close()
        # Validating a map costs ~0.2 s per 10 MB (JSON, mappings, symbolic's parse): a
        # worker thread's job, so ingest and reads go on meanwhile.
        plan = await asyncio.to_thread(plan_upload, files, prefix)
        rows = await store.upload(tenant_project.id, release, plan)
        return Uploaded(release=release or None, url_prefix=prefix,
                        files=[_stored(r) for r in rows], warnings=plan.warnings)

    @get("/v1/projects/{project:str}/sourcemaps", summary="List uploaded files",
         description="`release`: only that release (empty: files uploaded without one).",
         responses=error_responses(400))
    async def listing(tenant_project: TenantProject,
                      release: FromQuery[str | None] = None) -> Listing:
        return Listing([_stored(r) for r in store.rows(tenant_project.id, release)])

    @delete("/v1/projects/{project:str}/sourcemaps", summary="Delete a release's files",
            status_code=200,
            description="`release` is required (empty: the files uploaded without one).",
            responses=error_responses(400, 503))
    async def remove(tenant_project: TenantProject, release: FromQuery[str]) -> Deleted:
        return Deleted(await store.delete(tenant_project.id, release))

    return Router("", route_handlers=[upload, listing, remove])
