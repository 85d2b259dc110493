"""``create_app(config)``: the one place the service is assembled.

Who owns what. Each long-lived service gets what it calls through its constructor; the
order they are made in is the order below.

- ``metadata.db`` (SQLite or PostgreSQL) holds ``tenancy.tenants`` (tenants, keys,
  projects), ``metadata.catalog`` (Parquet files, WAL positions) and the source map index;
  ``cluster.nodes`` holds this node's id while it runs.
- ``ingest.buffer.LiveBuffer``: durable rows not yet in Parquet; ``ingest.ids.NodeIds``:
  their ids, and this node's floor.
- In a cluster, ``cluster.peers.Peers``: the other nodes' rows until they flush them.
- ``query.engine.QueryEngine`` reads the catalog's files, the buffer and the peers as one
  snapshot; ``query.tail.Tails`` runs the live tails over it, and watches the peers.
- ``cluster.bus.RedisBus`` carries this node's batches out and the others' in; it moves
  the live tails on as the cluster watermark moves, and shares the rate limits and tail
  counts.
- ``ingest.service.IngestService`` owns a batch from its ids to Parquet: the WAL, the
  flusher, the compactor. After a WAL commit it hands the batch on in one place, in this
  order: the buffer, the live tails, the node's floor, the bus; then the 202.
- ``usage.store.UsageStore`` is where usage is written: the flush adds ingest's counts in
  its publish, the readers note theirs in a ``core.usage.Meter``; ``usage.sink.Sink``
  pushes closed minutes to a webhook.
- ``ingest.routes.IngestEndpoint`` (``POST /v1/ingest``, in front of Litestar) and
  ``ingest.sentry`` admit requests into the service; ``query``'s and ``symbolicate``'s
  routers read; ``core.workers`` runs what would hold the GIL (``/errors`` answers, upload
  validation) beside the server.

A request passes the one tenancy guard (``tenancy.guard``); every error is rendered in the
one JSON shape here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
from litestar import Litestar, Request, Response, Router
from litestar._openapi.plugin import OpenAPIPlugin
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig
from litestar.routes import HTTPRoute
from litestar.status_codes import HTTP_204_NO_CONTENT, HTTP_500_INTERNAL_SERVER_ERROR
from litestar.types import BeforeRequestHookHandler

from boxtrail.routes import operations_router
from cluster.bus import RedisBus
from cluster.nodes import Membership, resolve_node_id
from cluster.peers import Peers
from console.routes import console_router
from core.config import Config
from core.errors import ApiError, ErrorBody, ErrorEnvelope
from core.metrics import Registry
from core.openapi import (
    ItemConstraints,
    NumberMaps,
    StrictStructs,
    security_components,
    state_empty_values,
)
from core.storage import S3Storage, StorageError, open_storage
from core.supervisor import Supervisor
from core.usage import Meter
from core.workers import Offload, WorkerLost
from erasure.jobs import Deletions, Eraser, Erasures
from erasure.routes import deletions_router, project_deletion
from ingest.buffer import LiveBuffer
from ingest.ids import NodeIds
from ingest.ratelimit import TokenBuckets
from ingest.routes import ASGIApp, IngestEndpoint, Receive, Scope, Send
from ingest.service import IngestService
from ingest.wal import read_record
from metadata.catalog import Catalog
from metadata.connect import open_database
from query.engine import QueryEngine
from query.errors_view import errors_router
from query.mcp_mount import LazyMcp  # query.mcp, imported on the first /mcp request
from query.routes import query_router
from query.tail import Tails
from symbolicate.artifacts import ArtifactRow, ArtifactStore
from symbolicate.routes import sourcemaps_router
from symbolicate.sentry_cli import sentry_cli_router  # sentry-cli sourcemaps upload (issue 11)
from symbolicate.side import SymbolicateSide
from symbolicate.staging import prebuild_job
from tenancy.changes import Changes
from tenancy.guard import PUBLIC, TenancyGuard
from tenancy.routes import keys_router, projects_router, session_router
from tenancy.tenants import Tenancy
from usage.routes import usage_router
from usage.sink import Pricing, Sink
from usage.store import UsageStore

log = logging.getLogger("boxtrail")

_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 413: "body_too_large", 415: "unsupported_media_type",
               429: "rate_limited", 503: "unavailable"}
_encode = msgspec.json.Encoder().encode


def _render(status: int, body: ErrorBody, headers: dict[str, str] | None = None
            ) -> Response[bytes]:
    return Response(_encode(ErrorEnvelope(body)), status_code=status,
                    media_type="application/json", headers=headers)


def _api_error(_: Request[object, object, State], exc: ApiError) -> Response[bytes]:
    return _render(exc.status_code, exc.envelope().error, exc.headers)


def _http_error(_: Request[object, object, State], exc: HTTPException) -> Response[bytes]:
    # Litestar's own refusals (unknown route, bad query parameter type, ...).
    status = exc.status_code
    detail: dict[str, object] = {}
    if isinstance(exc.extra, list | dict):
        detail["problems"] = exc.extra
    code = "invalid_parameter" if status == 400 else _HTTP_CODES.get(status, "http_error")
    return _render(status, ErrorBody(code=code, message=str(exc.detail), detail=detail),
                   exc.headers)


def _storage_error(_: Request[object, object, State], exc: StorageError) -> Response[bytes]:
    log.warning("storage unavailable: %s", exc)
    return _render(503, ErrorBody(code="storage_unavailable",
                                  message=f"storage is not reachable; retry later ({exc})"),
                   {"Retry-After": "5"})


def _internal_error(_: Request[object, object, State], exc: Exception) -> Response[bytes]:
    log.exception("internal error", exc_info=exc)
    return _render(HTTP_500_INTERNAL_SERVER_ERROR,
                   ErrorBody(code="internal_error", message="internal error; see the server log"))


def _allow_every_method(app: Litestar) -> BeforeRequestHookHandler:
    """``OPTIONS`` answered with ``Allow`` naming every method its path serves. Litestar's
    own answer names the methods of the path's first handler only: its route is built
    again as each further handler registers, keeping the OPTIONS handler made with the
    first (``OPTIONS /v1/projects`` said ``OPTIONS, POST``, without GET)."""
    allow = {route.path: ", ".join(sorted(route.methods)) for route in app.routes
             if isinstance(route, HTTPRoute)}

    async def answer(request: Request[object, object, State]) -> Response[None] | None:
        handler = request.route_handler
        if request.method != "OPTIONS" or handler.fn.__qualname__ != _LITESTAR_OPTIONS:
            return None  # another method, or an OPTIONS handler of ours (ingest's preflight)
        (path,) = handler.paths
        return Response(None, status_code=HTTP_204_NO_CONTENT, headers={"Allow": allow[path]})

    return answer


_LITESTAR_OPTIONS = "HTTPRoute.create_options_handler.<locals>.options_handler"


class Served:
    """What uvicorn serves: the app with ``POST /v1/ingest`` answered in front of it, and
    :meth:`stopping`, which the server calls as it begins to shut down, before it waits
    for open responses to end (``boxtrail.cli``): live tails end then, instead of holding
    the shutdown for its whole grace period."""

    def __init__(self, asgi: ASGIApp, tails: Tails) -> None:
        self.asgi = asgi
        self.tails = tails

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.asgi(scope, receive, send)

    def stopping(self) -> None:
        self.tails.end_streams()


async def _keep_membership(membership: Membership) -> None:
    while True:
        await asyncio.sleep(2.0)
        try:
            # In a thread: against a catalog that hangs, the check waits out its deadline
            # there, not on the loop (metadata.postgres).
            await asyncio.to_thread(membership.check)
        except Exception:
            log.exception("membership check failed")


def create_app(config: Config) -> Served:
    """What uvicorn serves (see :class:`Served`)."""
    return assemble(config)[1]


def assemble(config: Config) -> tuple[Litestar, Served]:
    """The Litestar app (its routes, its schema) and the same app as it is served."""
    data_dir = Path(config.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    db = open_database(config.catalog_url, data_dir)
    node_id = resolve_node_id(config.node_id, data_dir)
    membership = Membership(db, node_id)
    try:
        membership.join()
    except BaseException:
        db.close()
        raise
    metrics = Registry()
    supervisor = Supervisor(metrics)  # every long-lived loop below runs under it
    tenancy = Tenancy(db)
    catalog = Catalog(db, node_id)
    storage = open_storage(config)
    upkeep = tables = None
    if config.iceberg == "on":  # pyiceberg loaded only then: `make run` starts as before
        from iceberg.tables import open_tables
        from iceberg.upkeep import Upkeep

        tables = open_tables(config, db)
        catalog.mirror = tables
        upkeep = Upkeep(tables, catalog, storage, config.iceberg_snapshot_retain_s)
    # Who owns what, and how a row moves between them: the module docstring.
    buffer = LiveBuffer()
    ids = NodeIds(membership.index)
    peers = Peers(node_id) if config.bus_url else None  # a cluster: the other nodes' rows
    meter = Meter()  # what the readers used, until usage.store writes it
    deletions = Deletions(db)
    erasures = Erasures(deletions, node_id)  # the deletions this node applies
    engine = QueryEngine(catalog, buffer, storage, metrics, config.query_threads, peers,
                         erasures, meter)
    tails = Tails(config, engine, buffer, metrics, peers, ids.floor, supervisor=supervisor,
                  keys=tenancy.keys, meter=meter)
    changes = Changes(db, tenancy)  # what other nodes changed: a key, a project
    buckets = TokenBuckets(config.rate_limit_events, config.rate_limit_burst)
    bus: RedisBus | None = None
    if peers is not None:
        # Limits that hold cluster-wide: events admitted per project, open tails per tenant.
        bus = RedisBus(config.bus_url, node_id, peers, ids.floor, catalog.recent_positions,
                       config.buffer_max_rows, read_back=read_record, advanced=tails.advance,
                       shares={"u": buckets.report, "t": tails.shared_counts},
                       receives={"u": lambda _node, used: buckets.spend_all(used),
                                 "t": tails.others_counts},
                       supervisor=supervisor, retain_s=config.bus_retain_s)
        metrics.callback("boxtrail_bus_lost_rows",
                         "Rows since start this node let go of unsent while Redis was out, past "
                         "BOXTRAIL_BUFFER_MAX_ROWS queued (the other nodes read them from "
                         "Parquet once this node flushes them)", lambda: bus.outbox.lost_rows)
        metrics.callback("boxtrail_peer_rows", "Other nodes' rows held until they flush",
                         lambda: peers.rows)
        metrics.callback("boxtrail_bus_rows_answered",
                         "Rows sent bare, then sent again (read back from the WAL) because "
                         "another node asked for their project", lambda: bus.rows_answered)
    usage = UsageStore(db, catalog, meter)
    sink = Sink(config, db, catalog, metrics)
    service = IngestService(config, catalog, storage, metrics, buffer=buffer, ids=ids,
                            watcher=tails, publisher=bus, supervisor=supervisor,
                            erasures=erasures, usage=usage)
    ingest = IngestEndpoint(config, tenancy, service, metrics, buckets)
    # groupBy and upload validation, beside ingest
    offload = Offload(config, metrics, SymbolicateSide)

    async def prebuild(project_id: str, rows: list[ArtifactRow]) -> None:
        try:
            await offload.run(prebuild_job, project_id, rows)
        except WorkerLost:  # the upload is stored; the first read builds them instead
            log.warning("building an upload's lookups was cut short; reads will build them")

    artifacts = ArtifactStore(db, storage, uploaded=prebuild)
    eraser = Eraser(deletions, erasures, node_id, catalog, storage, service, artifacts,
                    tenancy, tails,
                    live_nodes=lambda: {node_id, *(peers.live() if peers is not None else ())},
                    grace_s=config.deletion_grace_s, bus=bus, usage=usage)
    mcp = LazyMcp(lambda endpoint: endpoint(tenancy, engine, buffer, tails, offload,
                                            artifacts))

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        if isinstance(storage, S3Storage):
            try:
                storage.ensure_bucket()
            except StorageError as exc:
                # Ingest stays up on the WAL; /readyz reports the outage until it ends.
                log.warning("storage not reachable at start: %s", exc)
        await service.start()
        if upkeep is not None:  # the tables in step with the catalog, before it serves
            await asyncio.to_thread(upkeep.repair)
        iceberg = supervisor.start("iceberg", upkeep.run) if upkeep is not None else None
        if bus is not None:
            await bus.start()
        await eraser.catch_up()  # deletions made while it was down, before it serves
        # After a catalog outage the node's id lock is taken again (cluster.nodes).
        keeper = supervisor.start("membership", lambda: _keep_membership(membership))
        feed = supervisor.start("tenancy-changes", changes.run)
        erasing = supervisor.start("deletions", eraser.run)
        metering = supervisor.start("usage", usage.run)
        sending = supervisor.start("usage-sink", sink.run) if config.usage_sink_url else None
        try:
            yield
        finally:
            keeper.cancel()
            feed.cancel()
            erasing.cancel()
            metering.cancel()
            if sending is not None:
                sending.cancel()
            if iceberg is not None:
                iceberg.cancel()
            await usage.write_meter()  # the readers' last second
            await tails.close()  # their hub tasks and filter thread, before what they read
            await service.stop()
            if bus is not None:
                await bus.close()
            engine.close()
            if tables is not None:
                tables.close()
            offload.close()
            storage.close()
            membership.leave()
            db.close()

    guard = TenancyGuard(tenancy)
    # Litestar would make this router itself; made here to declare the schema public.
    schema = Router("/schema", route_handlers=[], opt=PUBLIC, include_in_schema=False)
    app = Litestar(
        route_handlers=[projects_router(tenancy, [project_deletion(tenancy, deletions)]),
                        keys_router(tenancy), deletions_router(tenancy, deletions),
                        usage_router(tenancy, usage, Pricing(config)),
                        operations_router(storage, metrics, supervisor),
                        ingest.router(),
                        query_router(engine), errors_router(engine, offload, artifacts),
                        sourcemaps_router(artifacts, offload),
                        sentry_cli_router(tenancy, artifacts, offload, metrics),  # issue 11
                        tails.router(), mcp.handler(), console_router(),
                        session_router(guard, config.session_ttl_s)],  # console sign-in
        guards=[guard],  # every route, unless it is declared public (tenancy.guard)
        dependencies=guard.dependencies(),
        # The guard documents its 401 and 404; the others what Litestar leaves out.
        plugins=[guard, NumberMaps(), StrictStructs(), ItemConstraints()],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error,
                            StorageError: _storage_error,
                            Exception: _internal_error},
        lifespan=[lifespan, mcp.lifespan],  # MCP sessions end before the service stops
        openapi_config=OpenAPIConfig(title="boxtrail", version="1.0.0", openapi_router=schema,
                                     components=security_components()),
        request_max_body_size=max(config.max_body_bytes, 1 << 20) * 2,
        logging_config=None,
    )
    app.before_request = _allow_every_method(app)
    # Built now (~30 ms), not at the first /schema request, to be amended once.
    state_empty_values(app.plugins.get(OpenAPIPlugin).provide_openapi())
    return app, Served(ingest.asgi_first(app), tails)
