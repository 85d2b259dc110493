"""``GET /v1/projects/{project}/tail``: live rows over Server-Sent Events.

Two paths deliver rows, and a tail moves between them:

- **Live.** While a project has open tails it has a :class:`Hub` (two: see below):
  the ingest service hands it each batch as the batch becomes visible
  (``IngestService._durable``; the other nodes' batches come through ``Peers``), and
  the hub, once per wake-up, filters the new rows once per distinct filter (box and
  query), encodes each matching row once into an SSE frame, and puts the same bytes in
  the bounded queue of every tail with that filter.
  No read, no per-tail encoding.
- **Catch-up.** A tail reads "matching rows with id above my cursor" from the buffer and
  Parquet (``QueryEngine.after``): when it starts (``Last-Event-ID`` resumes here), when
  its queue overflowed because its client did not read, and when its hub lets it read
  what the node held back for it (below). More than ``tail_max_behind`` rows behind by its
  own doing, it gets ``event: dropped`` with their count and jumps to the newest row, so
  a slow client costs neither memory nor ingest's time.

A backlog the node held is not its readers' doing: rows a cluster hub held while the
watermark was stuck (this node cut from Redis, a node it waits for silent: issue 35 saw
18,600 rows and a ``dropped`` for a reader that was never slow), a hub that spilled or
died, a filter stuck on DuckDB. Such rows are *excused* (``Subscriber.excused``): the tail
reads them from its cursor in pages, as a resume does, and may be that many rows more
behind than ``tail_max_behind`` until it is back at the live edge. So a reader that reads
faster than rows come is never skipped for the node's backlog, and one slower than that
still is, once it falls ``tail_max_behind`` rows further behind.

The handover: a tail joins its hub *before* it reads, so each row is in the read (it was
visible before the read) or in the queue (it was appended after joining), maybe in both.
Ids grow in the order rows become visible, so cutting the frames at or below the cursor
from queued pages sends every row once, in order, none skipped.

A query filter is evaluated by DuckDB over the hub's batches as one small Arrow table,
with the very conditions the read uses (``QueryEngine.matching_ids``), all distinct
queries in one scan, on a thread of its own so a long search cannot hold the live path
up. Tails with a query have their own hub, which gathers rows for ``QUERY_GATHER_S`` so
the DuckDB calls stay few; box filters and no filter are decided in Python on the
batch's shared box, as each batch lands.

A hub's loop runs under the node's supervisor (``core.supervisor``), as task
``tail-hub`` (project ids are no metric label): if it dies, its tails go back to their
cursors, as after a failed delivery, and the loop is started again; without that, its
tails would have waited on heartbeats for good.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing, contextmanager

import msgspec
from litestar import Request, Router, get
from litestar.datastructures import State
from litestar.params import FromQuery
from litestar.response import Stream

from cluster.peers import Peers
from core.config import Config
from core.errors import ApiError, ServiceUnavailable
from core.metrics import Registry
from core.openapi import error_responses
from core.schema import RowBatch, format_id
from core.storage.base import StorageError
from core.supervisor import Supervisor
from core.usage import Meter
from ingest.buffer import LiveBuffer
from query.engine import Filter, QueryEngine
from query.frames import HEARTBEAT, OPENING, PAGE, Closed, Dropped, Encoder, Skipped, frame
from query.hubs import ClusterHub, Hub, Shared, Subscriber
from query.language import compile_query
from query.routes import EventId, QueryText
from query.rows import parse_event_id
from tenancy.guard import CallerOf, TenantProject, scope
from tenancy.keys import READ, ApiKeys

log = logging.getLogger("boxtrail.tail")
RETRY_S = 0.5  # a catch-up read that failed is tried again after this long
_encode = msgspec.json.Encoder().encode


class TooManyTails(ApiError):
    """The tenant has as many open tails as it may have."""

    status_code = 429
    code = "too_many_tails"


class Tails:
    def __init__(self, config: Config, engine: QueryEngine,
                 buffer: LiveBuffer, metrics: Registry, peers: Peers | None = None,
                 floor: Callable[[], int] | None = None, *,
                 supervisor: Supervisor | None = None, keys: ApiKeys | None = None,
                 meter: Meter | None = None) -> None:
        self.config = config
        self.meter = meter or Meter()  # tail-seconds (core.usage)
        # The API keys: a tail ends when the key it was opened with is revoked or expires.
        self.keys = keys
        # The node's (boxtrail.app); tails made alone (tests) have one of their own.
        self.supervisor = supervisor or Supervisor(metrics)
        self.engine = engine
        self.buffer = buffer
        # In a cluster: the other nodes' rows, and this node's floor (cluster.bus).
        self.peers = peers
        self.floor = floor
        self.open: dict[str, int] = {}  # tenant -> open tails, SSE and MCP alike
        # In a cluster: the other nodes' open tails per tenant, as they last said.
        self.remote_open: dict[str, dict[str, int]] = {}
        self._sent_counts: dict[str, int] = {}
        self._sent_at = 0.0
        self.hubs: dict[tuple[str, bool], Hub] = {}  # (project, for tails with a query)
        # The hubs' DuckDB filters run here, not behind searches in the query pool.
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="tail")
        self.ending = False  # the server is shutting down: every tail ends
        # A cluster hub's release bigger than this is read by its tails from their cursors
        # (ClusterHub.run): so no single release fills more than a quarter of a queue, and
        # a tail is sent back by itself only after leaving several unread.
        self.backlog_rows = max(1, config.tail_max_behind // 4)
        if peers is not None:
            peers.watch(self)  # the other nodes' rows of the projects tailed here
        metrics.callback("boxtrail_tail_subscribers", "Open tails",
                         lambda: sum(self.open.values()))
        self.m_dropped = metrics.counter("boxtrail_tail_dropped_total",
                                         "Rows skipped for tails that fell too far behind")
        self.m_pages = metrics.counter(
            "boxtrail_tail_pages_total",
            "Tail pages: built once by a hub for all tails of a filter (live), or read "
            "from a cursor by one tail (read)", ("source",))
        self.m_late = metrics.counter(
            "boxtrail_tail_late_rows_total",
            "Rows that reached this node's live tails after the cluster watermark had passed "
            "them (their node was taken for dead); searches have them")
        self.m_fallbacks = metrics.counter(
            "boxtrail_tail_fallbacks_total",
            "Times a tail left the live path (its queue overflowed: its client read too "
            "slowly) to read from its cursor")
        self.m_backlogs = metrics.counter(
            "boxtrail_tail_backlog_reads_total",
            "Times a tail read from its cursor what its hub held back for it (a backlog the "
            "cluster watermark held, a hub that spilled, died or waited on a filter); those "
            "rows never count as the tail being behind")
        self.shared = Shared(engine, buffer, self.supervisor, self.pool, self.newest,
                             self.backlog_rows, self.m_pages, self.m_late)

    def newest(self, project_id: str) -> int:
        """Where a tail of the project opened now starts: every row at or below it exists
        already (one node: the newest visible row; a cluster: the watermark, and below
        any row of it another node sent bare and has not sent again)."""
        if self.peers is None or self.floor is None:
            return self.buffer.last_id
        return min(self.peers.watermark(self.floor()), self.peers.hold(project_id))

    async def start(self, project_id: str) -> int:
        """:meth:`newest`, once this node holds the other nodes' rows of the project."""
        if self.peers is not None and self.peers.need is not None:
            await self.peers.need(project_id)
        return self.newest(project_id)

    def advance(self) -> None:
        """The watermark may have moved (the bus read entries): wake the cluster hubs."""
        for hub in self.hubs.values():
            hub.wake.set()

    def router(self) -> Router:
        @get("/v1/projects/{project:str}/tail", summary="Live tail (logs_tail)",
             description="Server-Sent Events: `event: log` rows with `id:`; resume with "
                         "Last-Event-ID; `event: dropped` when a slow reader was skipped ahead.",
             media_type="text/event-stream",
             responses=error_responses(400, described={
                 429: "Too many tails open for this tenant; retry after Retry-After"}))
        async def tail(request: Request[object, object, State], caller: CallerOf,
                       tenant_project: TenantProject, boxId: FromQuery[str | None] = None,
                       text: QueryText = "", lastEventId: EventId = "") -> Stream:
            where = compile_query(text) if text else None
            last = request.headers.get("last-event-id") or lastEventId
            cursor = (parse_event_id(last, "Last-Event-ID") if last
                      else await self.start(tenant_project.id))
            # Counted now, not when the stream first sends: tails opened at the same moment
            # must not all pass the cap. The stream gives the slot back when it ends, or
            # the finalizer does if it is never started (the client left first).
            release = self._reserve(caller.tenant)
            stream = self.stream(release, tenant_project.id, boxId or None, where, cursor,
                                 caller.holder)
            weakref.finalize(stream, release)
            return Stream(stream, media_type="text/event-stream",
                          headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

        return Router("", route_handlers=[tail], opt=scope(READ))

    def end_streams(self) -> None:
        """End every open tail now (the server is shutting down, and waits for responses
        to finish): each stream ends as an EventSource sees a closed connection, and
        reconnects elsewhere with its Last-Event-ID."""
        self.ending = True
        for hub in self.hubs.values():
            for sub in hub.subscribers:
                sub.wake.set()

    async def close(self) -> None:
        """After the server stopped: the hubs' tasks and the filter thread."""
        self.end_streams()
        hubs = list(self.hubs.values())
        for hub in hubs:
            hub.task.cancel()
        await asyncio.gather(*(hub.task for hub in hubs), return_exceptions=True)
        self.hubs.clear()
        self.pool.shutdown(wait=True)

    def shared_counts(self) -> dict[str, int] | None:
        """This node's open tails per tenant, for the other nodes (cluster.bus): when they
        changed, and every second (a node that joins learns them)."""
        now = time.monotonic()
        counts = {tenant: n for tenant, n in self.open.items() if n}
        if counts == self._sent_counts and now - self._sent_at < 1.0:
            return None
        self._sent_counts, self._sent_at = counts, now
        return counts

    def others_counts(self, node: str, counts: dict[str, int]) -> None:
        self.remote_open[node] = counts

    def _open_in_cluster(self, tenant: str) -> int:
        here = self.open.get(tenant, 0)
        if self.peers is None:
            return here
        return here + sum(self.remote_open.get(n, {}).get(tenant, 0) for n in self.peers.live()
                          if n != self.peers.node_id)

    def _check_cap(self, tenant: str) -> None:
        if self._open_in_cluster(tenant) >= self.config.tail_max_per_tenant:
            raise TooManyTails(
                f"{self.config.tail_max_per_tenant} tails are open for this tenant; "
                "close one first", headers={"Retry-After": "5"})

    def _reserve(self, tenant: str) -> Callable[[], None]:
        """Take one of the tenant's tails, or raise TooManyTails; call the result (once or
        more) to give it back."""
        self._check_cap(tenant)
        self.open[tenant] = self.open.get(tenant, 0) + 1
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self.open[tenant] -= 1

        return release

    @contextmanager
    def slot(self, tenant: str) -> Iterator[None]:
        """Hold one of the tenant's tails (MCP's ``logs_tail``), or raise TooManyTails."""
        release = self._reserve(tenant)
        try:
            yield
        finally:
            release()

    # What the ingest service (ingest.service.Watcher) and the other nodes' rows
    # (cluster.peers.PeerWatcher) hand the hubs.

    def watching(self, project_id: str) -> bool:
        return (project_id, False) in self.hubs or (project_id, True) in self.hubs

    def watched(self) -> set[str]:
        return {project_id for project_id, _ in self.hubs}

    def peer_appended(self, node: str, batch: RowBatch) -> None:
        self.appended(batch)

    def lost(self, project_id: str) -> None:
        for queried in (False, True):
            if isinstance(hub := self.hubs.get((project_id, queried)), ClusterHub):
                hub.reread()

    def appended(self, batch: RowBatch) -> None:
        for queried in (False, True):
            if (hub := self.hubs.get((batch.project_id, queried))) is not None:
                hub.feed(batch)

    def _join(self, project_id: str, sub: Subscriber) -> Hub:
        hub_key = (project_id, sub.key[2] is not None)
        hub = self.hubs.get(hub_key)
        if hub is None:
            kind = Hub if self.peers is None else ClusterHub
            hub = self.hubs[hub_key] = kind(project_id, hub_key[1], self.shared)
        hub.subscribers.add(sub)
        return hub

    def end_project(self, project_id: str, reason: str = "project_deleted") -> None:
        """The project was deleted: each of its tails gets its closing event and ends."""
        for (project, _), hub in list(self.hubs.items()):
            if project == project_id:
                for sub in list(hub.subscribers):
                    sub.ended = reason
                    sub.wake.set()

    def _leave(self, hub: Hub, sub: Subscriber) -> None:
        hub.subscribers.discard(sub)
        hub_key = (hub.project_id, hub.queried)
        if not hub.subscribers and self.hubs.get(hub_key) is hub:
            hub.task.cancel()
            del self.hubs[hub_key]

    async def stream(self, release: Callable[[], None], project_id: str, box: str | None,
                     where: Filter, cursor: int, holder: str = "") -> AsyncIterator[bytes]:
        try:
            yield OPENING
            async with aclosing(self.follow(project_id, box, where, cursor, frame,
                                            self.config.tail_heartbeat_s, holder)) as parts:
                async for part in parts:
                    if part is None:
                        yield HEARTBEAT
                    elif isinstance(part, Closed):
                        yield part.event()
                    elif isinstance(part, Skipped):
                        yield b"id: %s\nevent: dropped\ndata: %s\n\n" % (
                            format_id(part.upto).encode(), _encode(Dropped(part.count)))
                    else:
                        yield part
        finally:
            release()

    async def follow(self, project_id: str, box: str | None, where: Filter, cursor: int,
                     encode: Encoder, idle_s: float, holder: str = ""
                     ) -> AsyncGenerator[bytes | Skipped | Closed | None, None]:
        """The rows above ``cursor`` matching ``box`` and ``where``, now and as they come,
        each encoded by ``encode``, several rows to a piece; :class:`Skipped` where rows
        were skipped, None after ``idle_s`` without any. If the API key ``holder`` (its
        hash) is revoked or expires, :class:`Closed` and the end. Close it (``aclosing``)."""
        key = (encode, box, where[0] if where else None, tuple(where[1]) if where else ())
        sub = Subscriber(key, cursor, self.config.tail_max_behind, self.m_fallbacks,
                         self.m_backlogs)

        def end(reason: str) -> None:
            sub.ended = reason
            sub.wake.set()

        unhold = self.keys.hold(holder, end) if holder and self.keys is not None else None
        hub = self._join(project_id, sub)  # before reading: see the module's docstring
        opened = time.monotonic()
        try:
            while not self.ending and sub.ended is None:
                sub.reset()
                if isinstance(hub, ClusterHub):
                    sub.bound = hub.released
                async for part in self._catch_up(sub, project_id, box, where, encode):
                    yield part
                while not sub.overflowed and not self.ending and sub.ended is None:
                    if sub.queue:
                        if rows := sub.take():
                            yield rows
                        continue
                    sub.wake.clear()
                    try:
                        await asyncio.wait_for(sub.wake.wait(), idle_s)
                    except TimeoutError:
                        yield None
            if sub.ended is not None:
                yield Closed(sub.ended)
        finally:
            if unhold is not None:
                unhold()
            self._leave(hub, sub)
            self.meter.note(project_id, "tail.seconds", round(time.monotonic() - opened))

    async def _catch_up(self, sub: Subscriber, project_id: str, box: str | None,
                        where: Filter, encode: Encoder
                        ) -> AsyncIterator[bytes | Skipped | None]:
        """Read from the cursor until a page comes back short: the live edge.

        A read the catalog or storage cannot answer yet (a flush's commit holding the
        buffer past its wait, a slow catalog link) is tried again in place, a heartbeat
        (None) sent meanwhile: the tail waits, it does not end. The cursor moves only past
        rows sent, so nothing is sent twice or skipped (the stream used to end there, and
        a tail caught up after a cut stopped short of the rows it was owed)."""
        failing = False
        while not self.ending and sub.ended is None:
            try:
                rows = await self.engine.after(project_id, sub.cursor, box, PAGE, where,
                                               sub.bound)
                self.m_pages.inc(1, "read")
                behind = 0
                if len(rows) == PAGE:
                    newest = self.buffer.last_id if sub.bound is None else sub.bound
                    if sub.excused > sub.credited:
                        # Held back by the node, not left unread (Subscriber.excused).
                        sub.credit += await self.engine.count_between(
                            project_id, max(sub.cursor, sub.credited), sub.excused, box,
                            where)
                        sub.credited = sub.excused
                    behind = await self.engine.count_between(project_id, sub.cursor, newest,
                                                             box, where)
            except (ServiceUnavailable, StorageError) as exc:
                if not failing:
                    log.warning("a tail of %s cannot read yet; trying again: %s",
                                project_id, exc)
                failing = True
                yield None
                await asyncio.sleep(RETRY_S)
                continue
            failing = False
            if len(rows) == PAGE:
                if behind > self.config.tail_max_behind + sub.credit:
                    self.m_dropped.inc(behind)
                    sub.cursor = newest
                    sub.credit = 0
                    yield Skipped(behind, newest)
                    continue
            elif not sub.overflowed:  # at the live edge: what the node held is behind it
                sub.credit = 0
            if rows:
                sub.cursor = rows[-1][0]  # type: ignore[assignment]
                yield b"".join(map(encode, rows))
            if len(rows) < PAGE:
                return
