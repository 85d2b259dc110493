"""``sentry-cli sourcemaps upload`` against boxtrail: the part of Sentry's API it calls.

With ``--url http://boxtrail:8780 --auth-token btk_... --org any --project shop``, sentry-cli
3.x makes these calls (seen in its debug log, 3.8.0; its source: ``src/api/mod.rs``,
``src/utils/file_upload.rs``, ``src/api/data_types/chunking/``), answered here as follows:

1. ``GET /api/0/organizations/{org}/chunk-upload/`` -> :class:`ChunkOptions`. ``url`` is
   relative (sentry-cli resolves it against ``--url``, and sends the token to it), so a
   proxy in front needs no Host rewriting. ``compression: ["gzip"]`` makes it send each
   chunk gzipped as ``file_gzip``. 3.x reads no ``accept``; it is sent for 2.x, where
   ``artifact_bundles_v2`` selects this same flow.
2. It packs the files into one artifact bundle (``symbolicate.bundles``), cuts it into
   ``chunkSize`` pieces and SHA-1s each piece and the whole.
3. ``POST .../artifactbundle/assemble/`` ``{checksum, chunks, projects, version?, dist?}``:
   ``not_found`` with the ``missingChunks`` this tenant has not uploaded (it uploads only
   those; it reads nothing else from this first answer).
4. ``POST .../chunk-upload/`` (multipart, a part per chunk, field ``file_gzip`` or
   ``file``, filename = the chunk's SHA-1): each chunk inflated within ``chunkSize``, its
   SHA-1 checked against its filename, stored at ``sentry-chunks/<tenant id>/<sha1>``. The
   body is spooled to a file and read in the ``uploads`` worker lane (``core.workers``);
   a chunk is the most memory it holds. Chunks stored before a refused one stay: each was
   checked, and the upload is retried whole.
5. ``POST .../artifactbundle/assemble/`` again (then once a second while pending, with
   ``--wait``): assembled while the request waits, under the artifact store's lock: the
   chunks concatenated into a file in the worker, checked against ``checksum``, the bundle
   read (``symbolicate.bundles``), validated by ``plan_upload`` as a multipart upload is,
   its blobs stored, then indexed per project (``ArtifactStore.commit``) and announced.
   ``ok``, or ``error`` with ``detail`` (sentry-cli prints it and exits 1) and boxtrail's
   ``error {code, message, detail}`` beside it; nothing is stored then. The chunks are
   deleted after either. The answer is kept ``RESULT_TTL_S`` for the next poll (and for an
   upload of the same bundle again): an ``ok`` only while every row it indexed is still
   the live one (a delete or another upload at the same URL since means assembling anew).

No other call is made for ``sourcemaps upload`` in 3.x: no release is created (3.0 removed
the release-file flow), no org or project is looked up.

Mapping Sentry's model onto boxtrail's:
- auth: ``Authorization: Bearer <boxtrail API key>`` (the app's guard) gives the tenant.
- ``{org}``: boxtrail has no organizations; any slug is accepted and ignored. The tenant
  is the namespace: chunks are stored and looked up per tenant, so no tenant can assemble
  another's chunks.
- ``projects``: project names or ids of the tenant; one unknown (or another tenant's) is
  a 404 before anything is read or stored. Several projects each get the files.
- ``version`` is the release (empty when absent); ``dist`` is accepted and not kept
  (boxtrail matches frames by debug id, else release + URL).
- The URL prefix is taken from the manifest URLs (``~/`` or ``https://host/``).
- Bodies and errors: request problems (auth, body, project, a chunk) are 4xx in boxtrail's
  one error shape; a bundle's content that fails (bad checksum, ZIP, manifest, map) is
  Sentry's ``state: error``, which is what sentry-cli reports well.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Annotated, Literal, NamedTuple
from urllib.parse import quote

import msgspec
from litestar import Request, Router, get, post
from litestar.datastructures import State
from litestar.openapi.spec import (
    OpenAPIFormat,
    OpenAPIMediaType,
    OpenAPIType,
    Operation,
    RequestBody,
    Schema,
)
from litestar.params import FromPath, JSONBody

from core.errors import ApiError, ErrorBody, InvalidParameter
from core.metrics import Registry
from core.openapi import error_responses
from core.workers import Offload
from symbolicate.artifacts import ArtifactRow, ArtifactStore
from symbolicate.bundles import (
    HEADER_BYTES,
    BundleError,
)
from symbolicate.chunks import (
    CHUNK_BYTES,
    CHUNKS_PER_REQUEST,
    ChunkError,
    assemble_bundle,
    chunk_key,
    store_chunks,
)
from symbolicate.routes import multipart_boundary, spool
from symbolicate.side import SymbolicateSide
from symbolicate.sourcemaps import (
    MAX_UPLOAD_BYTES,
    InvalidUpload,
    SourceMapError,
    UploadTooLarge,
    check_release,
)
from tenancy.guard import Tenant, scope, tenant_project
from tenancy.keys import SOURCEMAPS_WRITE
from tenancy.tenants import Tenancy

MAX_REQUEST_BYTES = 32 << 20
CONCURRENCY = 4
MAX_CHUNKS = -(-(MAX_UPLOAD_BYTES + HEADER_BYTES) // CHUNK_BYTES)
MAX_PROJECTS = 100
MAX_ASSEMBLE_BODY = 64 << 10
RESULT_TTL_S = 600.0
RESULTS_KEPT = 1024

Sha1 = Annotated[str, msgspec.Meta(pattern="^[0-9a-fA-F]{40}$")]
AssembleState = Literal["ok", "created", "assembling", "not_found", "error"]


# What a bundle's content can fail with: answered as Sentry's ``state: error``.
BUNDLE_ERRORS = (BundleError, SourceMapError, InvalidUpload, UploadTooLarge)


class ChunkOptions(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    url: str
    chunk_size: int
    chunks_per_request: int
    max_file_size: int
    max_request_size: int
    max_wait: int
    concurrency: int
    hash_algorithm: str
    compression: list[str]
    accept: list[str]


class StoredChunks(msgspec.Struct, frozen=True):
    chunks: list[str]


class AssembleRequest(msgspec.Struct, frozen=True, kw_only=True):
    checksum: Sha1
    chunks: Annotated[list[Sha1], msgspec.Meta(min_length=1, max_length=MAX_CHUNKS)]
    # Required, and at least one (the schema says so; an empty list is refused by
    # Assembler.assemble, whose answer tells the sentry-cli flag to pass).
    projects: Annotated[list[str], msgspec.Meta(
        max_length=MAX_PROJECTS, extra_json_schema={"extra": {"minItems": 1}})]
    version: str | None = None
    dist: str | None = None


class AssembleAnswer(msgspec.Struct, frozen=True, kw_only=True, rename="camel",
                     omit_defaults=True):
    state: AssembleState
    missing_chunks: list[str]
    detail: str | None = None
    error: ErrorBody | None = None  # boxtrail's error, when state is "error"


# --- the server's side ----------------------------------------------------------------------


_Key = tuple[str, str, tuple[str, ...], tuple[str, ...], str]


class _Result(NamedTuple):
    expires: float
    answer: AssembleAnswer
    rows: list[ArtifactRow]  # what an ``ok`` indexed


class Assembler:
    """Assembles bundles, one at a time (under the artifact store's lock), and remembers
    each outcome for the client's next poll."""

    def __init__(self, tenancy: Tenancy, store: ArtifactStore, offload: Offload[SymbolicateSide],
                 metrics: Registry) -> None:
        self.tenancy = tenancy
        self.store = store
        self.offload = offload
        self.results: OrderedDict[_Key, _Result] = OrderedDict()
        self.m_bundles = metrics.counter(
            "boxtrail_sentry_bundles_total",
            "sentry-cli artifact bundles assembled, by outcome (ok or the error code)",
            ("outcome",))

    def _project_ids(self, tenant: str, refs: list[str]) -> list[str]:
        """The projects named (by name or id), each once, in the order named."""
        project_ids: list[str] = []
        for ref in refs:  # found as the guard finds a route's project
            project = tenant_project(self.tenancy, tenant, ref)
            if project.id not in project_ids:  # a name and an id of one project
                project_ids.append(project.id)
        return project_ids

    async def assemble(self, tenant: str, request: AssembleRequest) -> AssembleAnswer:
        if not request.projects:
            raise InvalidParameter("name the project: sentry-cli --project <boxtrail project>",
                                   detail={"field": "projects"})
        project_ids = await asyncio.to_thread(self._project_ids, tenant, request.projects)
        release = check_release(request.version)
        chunks = [c.lower() for c in request.chunks]
        key: _Key = (tenant, request.checksum.lower(), tuple(chunks), tuple(project_ids),
                     release)
        if (known := self._known(key)) is not None:
            return known
        committed: list[tuple[str, list[ArtifactRow]]] = []
        async with self.store.lock:
            if (known := self._known(key)) is not None:  # a concurrent poll assembled it
                return known
            missing = await asyncio.to_thread(self._missing, tenant, chunks)
            if missing:
                return AssembleAnswer(state="not_found", missing_chunks=missing)
            path = self.offload.temp_path("bundle")
            try:
                assembled = await self.offload.run(assemble_bundle, tenant, key[1], chunks,
                                                   project_ids, str(path), lane="uploads")
                for project_id, files in assembled.files.items():
                    committed.append((project_id,
                                      await self.store.commit(project_id, release, files)))
                answer = AssembleAnswer(state="ok", missing_chunks=[])
            except BUNDLE_ERRORS as exc:
                answer = AssembleAnswer(state="error", missing_chunks=[], detail=exc.message,
                                        error=exc.envelope().error)
            finally:
                path.unlink(missing_ok=True)
            self.m_bundles.inc(1, answer.error.code if answer.error else "ok")
            await asyncio.to_thread(self._delete, tenant, set(chunks))
            self._remember(key, answer, [r for _, rows in committed for r in rows])
        for project_id, rows in committed:
            await self.store.announce(project_id, rows)
        return answer

    def _missing(self, tenant: str, chunks: list[str]) -> list[str]:
        storage = self.store.storage
        return [sha1 for sha1 in dict.fromkeys(chunks)
                if storage.head(chunk_key(tenant, sha1)) is None]

    def _delete(self, tenant: str, chunks: set[str]) -> None:
        for sha1 in chunks:
            self.store.storage.delete(chunk_key(tenant, sha1))

    def _known(self, key: _Key) -> AssembleAnswer | None:
        found = self.results.get(key)
        if found is None or found.expires < time.monotonic():
            return None
        for row in found.rows:
            live = self.store.by_url(row.project_id, row.release, (row.url,))
            if live is None or live.seq != row.seq:
                return None
        return found.answer

    def _remember(self, key: _Key, answer: AssembleAnswer, rows: list[ArtifactRow]) -> None:
        self.results[key] = _Result(time.monotonic() + RESULT_TTL_S, answer, rows)
        self.results.move_to_end(key)
        while len(self.results) > RESULTS_KEPT:
            self.results.popitem(last=False)


@dataclass  # so that __post_init__ runs: Operation's own __init__ calls none
class _ChunksOperation(Operation):
    """The chunk upload's multipart body, documented: the handler spools the body instead
    of having it parsed, so Litestar would document none."""

    def __post_init__(self) -> None:
        binary = Schema(type=OpenAPIType.STRING, format=OpenAPIFormat.BINARY)
        parts = Schema(type=OpenAPIType.ARRAY, items=binary, max_items=CHUNKS_PER_REQUEST)
        # At least one chunk, as store_chunks requires. That each is named by its SHA-1
        # (and a file_gzip one is gzip) is the chunk's content, which no schema states.
        some = [Schema(required=[name], properties={name: Schema(min_items=1)})
                for name in ("file_gzip", "file")]
        form = Schema(type=OpenAPIType.OBJECT, properties={"file_gzip": parts, "file": parts},
                      any_of=some)
        self.request_body = RequestBody(
            content={"multipart/form-data": OpenAPIMediaType(schema=form)}, required=True)


def _boundary(content_type: str | None) -> str:
    boundary = multipart_boundary(content_type)
    if boundary is None:
        raise ChunkError("send the chunks as multipart/form-data",
                         detail={"contentType": (content_type or "")[:200]})
    return boundary


def sentry_cli_router(tenancy: Tenancy, store: ArtifactStore, offload: Offload[SymbolicateSide],
                      metrics: Registry) -> Router:
    assembler = Assembler(tenancy, store, offload, metrics)
    m_chunks = metrics.counter(
        "boxtrail_sentry_chunk_requests_total",
        "sentry-cli chunk upload requests, by outcome (ok or the error code)", ("outcome",))

    @get("/organizations/{org:str}/chunk-upload/", summary="sentry-cli: chunk upload options",
         description="`{org}` is accepted and ignored (boxtrail has no organizations).")
    async def options(tenant: Tenant, org: FromPath[str]) -> ChunkOptions:
        return ChunkOptions(
            url=f"/api/0/organizations/{quote(org, safe='')}/chunk-upload/", chunk_size=CHUNK_BYTES,
            chunks_per_request=CHUNKS_PER_REQUEST, max_file_size=MAX_UPLOAD_BYTES,
            max_request_size=MAX_REQUEST_BYTES, max_wait=0, concurrency=CONCURRENCY,
            hash_algorithm="sha1", compression=["gzip"],
            accept=["artifact_bundles", "artifact_bundles_v2"])

    @post("/organizations/{org:str}/chunk-upload/", summary="sentry-cli: upload chunks",
          status_code=200, request_max_body_size=MAX_REQUEST_BYTES + (1 << 20),
          operation_class=_ChunksOperation,
          description="multipart/form-data, a `file_gzip` (or `file`) part per chunk, its "
                      "filename the chunk's SHA-1; each is checked and kept for the assemble "
                      "call.",
          responses=error_responses(400, 413, 503))
    async def chunks(tenant: Tenant, org: FromPath[str],
                     request: Request[object, object, State]) -> StoredChunks:
        path = offload.temp_path("chunks")
        try:
            boundary = _boundary(request.headers.get("content-type"))
            await spool(request, path)
            stored = await offload.run(store_chunks, tenant, str(path), boundary,
                                       lane="uploads")
        except ApiError as exc:
            m_chunks.inc(1, exc.code)
            raise
        finally:
            path.unlink(missing_ok=True)
        m_chunks.inc(1, "ok")
        return StoredChunks(stored)

    @post("/organizations/{org:str}/artifactbundle/assemble/", status_code=200,
          summary="sentry-cli: assemble an artifact bundle",
          request_max_body_size=MAX_ASSEMBLE_BODY,
          description="`not_found` with `missingChunks` until every chunk is uploaded; then "
                      "the bundle is validated and stored as an upload to "
                      "/v1/projects/{p}/sourcemaps is (`ok`), or refused whole (`error`, "
                      "`detail`). `projects`: names or ids; `version`: the release.",
          responses=error_responses(400, 404, 503))
    async def assemble(tenant: Tenant, org: FromPath[str],
                       data: JSONBody[AssembleRequest]) -> AssembleAnswer:
        return await assembler.assemble(tenant, data)

    return Router("/api/0", route_handlers=[options, chunks, assemble],
                  opt=scope(SOURCEMAPS_WRITE))
