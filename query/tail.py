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
from bisect import bisect_right
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing, contextmanager
from dataclasses import dataclass
from itertools import repeat

import msgspec
import pyarrow as pa
from litestar import Request, Router, get
from litestar.datastructures import State
from litestar.params import FromQuery
from litestar.response import Stream

from cluster.bus import Peers
from core.config import Config
from core.errors import ApiError
from core.metrics import Counter, Registry
from core.openapi import error_responses
from core.schema import SHARED, RowBatch, format_id, to_table
from core.supervisor import Supervisor
from ingest.buffer import LiveBuffer
from query.engine import Filter, QueryEngine
from query.language import compile_query
from query.routes import EventId, QueryText
from query.rows import COLUMNS, parse_event_id, to_row
from tenancy.guard import Tenant, TenantProject

PAGE = 500
HEARTBEAT = b": heartbeat\n\n"
# The first bytes of every tail, sent at once: the answer's headers go out with them (an
# EventSource is open, a proxy starts streaming), and a browser that loses the stream
# tries again after 2 s (its own default is 3 s), with its Last-Event-ID.
OPENING = b"retry: 2000\n: connected\n\n"
# SSE bytes a tail may have queued (besides tail_max_behind rows) before it is sent back
# to its cursor: bounds the memory a client that stopped reading can hold.
QUEUE_BYTES = 8 << 20
# Rows a hub may hold while it waits on DuckDB for a query filter; past this its tails
# fall back to their cursors and the rows are let go.
HUB_MAX_ROWS = 100_000
# Tails with a query have a hub of their own that gathers rows this long per wake-up:
# a DuckDB call costs ~3 ms of a core here whatever its size, so this caps them at ~50/s
# at any ingest rate. Tails without one are served as each batch lands.
QUERY_GATHER_S = 0.02

log = logging.getLogger("boxtrail.tail")
_encode = msgspec.json.Encoder().encode

Row = tuple[object, ...]
BOX = COLUMNS.index("box")
# How a tail sends a row: ``frame`` (SSE) or MCP's JSON line.
Encoder = Callable[[Row], bytes]
# What the hub groups tails by: encoder, box, query SQL, the query's parameters.
Key = tuple[Encoder, str | None, str | None, tuple[object, ...]]


class TooManyTails(ApiError):
    """The tenant has as many open tails as it may have."""

    status_code = 429
    code = "too_many_tails"


class Dropped(msgspec.Struct, frozen=True):
    count: int


@dataclass(frozen=True)
class Skipped:
    """Rows a tail skipped, more than ``tail_max_behind`` behind; ``upto`` is its cursor."""

    count: int
    upto: int


def frame(r: Row) -> bytes:
    row = to_row(r)
    return b"id: %s\nevent: log\ndata: %s\n\n" % (row.id.encode(), one_line(_encode(row)))


# JSON escapes the control characters, but not NEL, LINE SEPARATOR and PARAGRAPH
# SEPARATOR, which line readers built on str.splitlines (httpx's, for one) split on:
# a message holding one would cut its frame in two for such a client.
_LINE_BREAKS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"),
                (b"\xe2\x80\xa9", b"\\u2029"))


def one_line(data: bytes) -> bytes:
    """``data`` (JSON) with every character a line reader might break on escaped."""
    if b"\xc2\x85" in data or b"\xe2\x80\xa8" in data or b"\xe2\x80\xa9" in data:
        for raw, escaped in _LINE_BREAKS:
            data = data.replace(raw, escaped)
    return data


def batch_rows(batch: RowBatch) -> Iterator[Row]:
    """The batch's rows as the read's ``SELECT`` (query.rows.COLUMNS) returns them from the
    batch's Arrow form, column by column by name (a test holds the two equal)."""
    n = len(batch.ts)
    return zip(*(batch.ids() if name == "id"
                 else repeat(getattr(batch, name), n) if name in SHARED
                 else getattr(batch, name) for name in COLUMNS), strict=True)


@dataclass(frozen=True, eq=False)
class LivePage:
    """Encoded rows of one hub wake-up for one key, shared by every tail with that key."""

    frames: bytes
    ids: list[int]  # of the rows, ascending
    starts: list[int]  # where each row's frame starts in ``frames``

    def after(self, cursor: int) -> bytes:
        """The frames of the rows above ``cursor`` (a tail that also read them skips)."""
        if self.ids[0] > cursor:
            return self.frames
        i = bisect_right(self.ids, cursor)
        return self.frames[self.starts[i]:] if i < len(self.ids) else b""


def live_page(rows: list[Row], indices: Iterable[int], encode: Encoder,
              frames: dict[int, bytes]) -> LivePage | None:
    """The page of ``rows[i]`` for ``indices``, each row encoded once per wake-up and
    encoder whatever the number of filters it matches (``frames`` caches them by index)."""
    parts: list[bytes] = []
    ids: list[int] = []
    starts: list[int] = []
    size = 0
    for i in indices:
        part = frames.get(i)
        if part is None:
            part = frames[i] = encode(rows[i])
        ids.append(rows[i][0])  # type: ignore[arg-type]
        starts.append(size)
        parts.append(part)
        size += len(part)
    return LivePage(b"".join(parts), ids, starts) if parts else None


class Subscriber:
    """One open tail: its cursor (the last id sent or skipped) and its queue of live pages."""

    def __init__(self, key: Key, cursor: int, max_rows: int, fallbacks: Counter,
                 backlogs: Counter | None = None) -> None:
        self.key = key
        self.cursor = cursor
        self.max_rows = max_rows
        self.fallbacks = fallbacks  # sent back by its own queue
        self.backlogs = backlogs  # sent back to read what the node held for it
        self.queue: deque[LivePage] = deque()
        self.rows = 0
        self.bytes = 0
        self.overflowed = False
        self.wake = asyncio.Event()
        # In a cluster: the id up to which this tail reads for itself; the hub's pages
        # hold the rows above it (ClusterHub).
        self.bound: int | None = None
        # Rows at or below this id were held back by the node (see the module docstring),
        # not left unread by this tail's client; ``credit`` is how many of them were ahead
        # of it (counted up to ``credited``), the lag allowed beyond tail_max_behind until
        # it is back at the live edge.
        self.excused = 0
        self.credited = 0
        self.credit = 0

    def push(self, page: LivePage) -> None:
        if self.overflowed:
            return
        self.rows += len(page.ids)
        self.bytes += len(page.frames)
        if self.rows > self.max_rows or self.bytes > QUEUE_BYTES:
            self.overflow()
        else:
            self.queue.append(page)
        self.wake.set()

    def overflow(self, excused: int | None = None) -> None:
        """Forget the queue: the tail reads again from its cursor. With ``excused``, the
        node let go of what it held for the tail up to that id (not the client's doing)."""
        if excused is not None:
            self.excused = max(self.excused, excused)
            if not self.overflowed and self.backlogs is not None:
                self.backlogs.inc()
        elif not self.overflowed:
            self.fallbacks.inc()
        self.overflowed = True
        self.queue.clear()
        self.rows = self.bytes = 0
        self.wake.set()

    def reset(self) -> None:
        self.overflowed = False
        self.queue.clear()
        self.rows = self.bytes = 0

    def take(self) -> bytes:
        """The queued frames above the cursor, the cursor moved past them."""
        parts = []
        while self.queue:
            page = self.queue.popleft()
            if part := page.after(self.cursor):
                parts.append(part)
                self.cursor = page.ids[-1]
        self.rows = self.bytes = 0
        return b"".join(parts)


class Hub:
    """The live rows of one project, filtered and encoded once for all its tails."""

    def __init__(self, project_id: str, queried: bool, tails: Tails) -> None:
        self.project_id = project_id
        self.queried = queried  # serves the tails with a query (else those without)
        self.tails = tails
        self.subscribers: set[Subscriber] = set()
        self.batches: list[RowBatch] = []
        self.rows = 0
        self.wake = asyncio.Event()
        self.task = tails.supervisor.start("tail-hub", self.run, on_death=self._died)

    def visible(self) -> int:
        """An id at or below which every row the hub was given is visible to a read."""
        return self.tails.buffer.last_id

    def let_go(self) -> None:
        """The hub cannot deliver what it took (it died, a delivery failed, a filter is
        stuck): its tails read from their cursors, those rows excused."""
        upto = self.visible()
        for sub in self.subscribers:
            sub.overflow(upto)

    def _died(self) -> None:
        """The loop died (it is started again): what it held may be half delivered, so its
        tails read from their cursors, as after a failed delivery."""
        self.batches, self.rows = [], 0
        self.let_go()

    def feed(self, batch: RowBatch) -> None:
        self.batches.append(batch)
        self.rows += len(batch.ts)
        if self.rows > HUB_MAX_ROWS:  # stuck on a filter: the tails read for themselves
            self.batches, self.rows = [], 0
            self.let_go()
        self.wake.set()

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            # The 202s of the batches that woke us were woken by the same WAL commit: let
            # them go out first.
            await asyncio.sleep(QUERY_GATHER_S if self.queried else 0)
            self.wake.clear()
            batches, self.batches, self.rows = self.batches, [], 0
            # Taken with the batches: a tail that joins later read these rows itself.
            groups: dict[Key, list[Subscriber]] = {}
            for sub in self.subscribers:
                groups.setdefault(sub.key, []).append(sub)
            if not batches or not groups:
                continue
            try:
                await self.deliver(batches, groups)
            except Exception:
                log.exception("tail hub of %s failed; its tails read instead", self.project_id)
                self.let_go()

    async def deliver(self, batches: list[RowBatch], groups: dict[Key, list[Subscriber]]
                      ) -> None:
        rows = [r for b in batches for r in batch_rows(b)]
        frames: dict[Encoder, dict[int, bytes]] = {}
        queried: list[Key] = []
        for key, subs in groups.items():
            encode, box, sql, _ = key
            if sql is not None:
                queried.append(key)
                continue
            cache = frames.setdefault(encode, {})
            if box is None:
                page = live_page(rows, range(len(rows)), encode, cache)
            else:
                page = live_page(rows, _indices_of_box(batches, box), encode, cache)
            self._send(page, subs)
        if not queried:
            return
        # One scan for every distinct filter, whatever the encoders.
        filters = list({(box, sql, params) for _, box, sql, params in queried})
        matched = await asyncio.get_running_loop().run_in_executor(
            self.tails.pool, lambda: self.tails.engine.matching_ids(
                to_table(batches), [(box, (sql, list(params))) for box, sql, params in filters
                                    if sql is not None]))
        index_of = {r[0]: i for i, r in enumerate(rows)}
        indices = {f: [index_of[i] for i in ids] for f, ids in zip(filters, matched,
                                                                   strict=True)}
        for key in queried:
            encode, box, sql, params = key
            page = live_page(rows, indices[box, sql, params], encode,
                             frames.setdefault(encode, {}))
            self._send(page, groups[key])

    def _send(self, page: LivePage | None, subs: list[Subscriber]) -> None:
        if page is None:
            return
        self.tails.m_pages.inc(1, "live")
        for sub in subs:
            sub.push(page)


class ClusterHub(Hub):
    """A hub of a cluster node: rows come from this node and from the others (over the
    bus) in no common order, so they are held until the cluster watermark passes them
    (``cluster.bus``) and released in id order. Every row with an id above
    :attr:`released` is held here or not yet visible: a tail reads up to it for itself
    (``Subscriber.bound``) and takes the rest from the pages."""

    def __init__(self, project_id: str, queried: bool, tails: Tails) -> None:
        self.held: dict[int, Row] = {}
        self.released = tails.newest(project_id)
        self.seeded = False
        # Past HUB_MAX_ROWS held (the watermark stuck: this node cannot read the stream,
        # or a node it waits for is silent) the hub lets its rows go and takes no more
        # until the watermark moves; then its tails read up to it for themselves and the
        # hub starts again from there, as it started.
        self.spilled = False
        super().__init__(project_id, queried, tails)

    def feed(self, batch: RowBatch) -> None:
        if self.spilled:
            return
        late = 0
        for row in batch_rows(batch):
            if row[0] > self.released:  # type: ignore[operator]
                self.held[row[0]] = row  # type: ignore[index]
            else:
                late += 1
        if late:  # a node's rows after the watermark passed them (it was taken for dead)
            self.tails.m_late.inc(late)
        if len(self.held) > HUB_MAX_ROWS:
            self._spill()
        self.wake.set()

    def visible(self) -> int:
        return self.released

    async def _seed(self) -> None:
        """Hold the rows above :attr:`released` that were visible before the hub held
        what arrives (it does from here on: a row in both is held once, by id). More than
        HUB_MAX_ROWS of them: the hub spills at once (its tails read them)."""
        while True:
            try:
                seed = await self.tails.engine.after(self.project_id, self.released, None,
                                                     HUB_MAX_ROWS + 1)
                break
            except Exception as exc:  # storage or the catalog out: the tails wait, and retry
                log.warning("tail hub of %s cannot read its first rows yet: %s",
                            self.project_id, exc)
                await asyncio.sleep(1.0)
        self.seeded = True
        if len(seed) > HUB_MAX_ROWS:
            self._spill()
            return
        for row in seed:
            self.held.setdefault(row[0], row)  # type: ignore[arg-type]

    def _spill(self) -> None:
        log.warning("tail hub of %s has more than %d rows the watermark has not passed; "
                    "letting them go, its tails will read them", self.project_id, HUB_MAX_ROWS)
        self.held.clear()
        self.spilled = True

    def reread(self) -> None:
        """Rows of the project reached Parquet without passing here (another node sent
        them bare and flushed them before they came: ``PeerWatcher.lost``). Let go as a spill
        does: the tails read up to the next mark for themselves, from the files."""
        log.info("tail hub of %s: rows of another node went to Parquet first; its tails "
                 "read them", self.project_id)
        self.held.clear()
        self.spilled = True
        self.wake.set()

    async def run(self) -> None:
        await self._seed()
        while True:
            await self.wake.wait()
            await asyncio.sleep(QUERY_GATHER_S if self.queried else 0)
            self.wake.clear()
            mark = self.tails.newest(self.project_id)
            if mark <= self.released:
                continue
            if self.spilled:
                # Everything up to the mark is visible: the tails read it for themselves
                # (Subscriber.bound), and the hub holds what comes above it again.
                self.released, self.spilled = mark, False
                self.let_go()
                await self._seed()
                continue
            ready = sorted(i for i in self.held if i <= mark)
            # Moved with the rows taken, before any await: a tail that joins from here on
            # reads up to the new mark itself, and is not among these groups.
            self.released = mark
            if len(ready) > self.tails.backlog_rows:
                # A backlog the watermark held (a cut healed): pushed whole, it would fill
                # the queue of a tail that was never slow, and be encoded all at once on
                # the event loop. Its tails read it from their cursors instead, in pages.
                for i in ready:
                    del self.held[i]
                self.let_go()
                continue
            rows = [self.held.pop(i) for i in ready]
            groups: dict[Key, list[Subscriber]] = {}
            for sub in self.subscribers:
                groups.setdefault(sub.key, []).append(sub)
            if not rows or not groups:
                continue
            try:
                await self.deliver_rows(rows, groups)
            except Exception:
                log.exception("tail hub of %s failed; its tails read instead", self.project_id)
                self.let_go()

    async def deliver_rows(self, rows: list[Row], groups: dict[Key, list[Subscriber]]
                           ) -> None:
        frames: dict[Encoder, dict[int, bytes]] = {}
        queried: list[Key] = []
        for key, subs in groups.items():
            encode, box, sql, _ = key
            if sql is not None:
                queried.append(key)
                continue
            picked = range(len(rows)) if box is None else [
                i for i, r in enumerate(rows) if r[BOX] == box]
            self._send(live_page(rows, picked, encode, frames.setdefault(encode, {})), subs)
        if not queried:
            return
        filters = list({(box, sql, params) for _, box, sql, params in queried})
        table = pa.table({name: pa.array([r[i] for r in rows],
                                         pa.int64() if name in ("id", "ts") else pa.string())
                          for i, name in enumerate(COLUMNS)})
        matched = await asyncio.get_running_loop().run_in_executor(
            self.tails.pool, lambda: self.tails.engine.matching_ids(
                table, [(box, (sql, list(params))) for box, sql, params in filters
                        if sql is not None]))
        index_of = {r[0]: i for i, r in enumerate(rows)}
        indices = {f: [index_of[i] for i in ids] for f, ids in zip(filters, matched,
                                                                   strict=True)}
        for key in queried:
            encode, box, sql, params = key
            self._send(live_page(rows, indices[box, sql, params], encode,
                                 frames.setdefault(encode, {})), groups[key])


def _indices_of_box(batches: list[RowBatch], box: str) -> Iterator[int]:
    start = 0
    for b in batches:
        n = len(b.ts)
        if b.box == box:  # a batch has one box: what ``box = ?`` decides row by row
            yield from range(start, start + n)
        start += n


class Tails:
    def __init__(self, config: Config, engine: QueryEngine,
                 buffer: LiveBuffer, metrics: Registry, peers: Peers | None = None,
                 floor: Callable[[], int] | None = None, *,
                 supervisor: Supervisor | None = None) -> None:
        self.config = config
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
        async def tail(request: Request[object, object, State], tenant: Tenant,
                       tenant_project: TenantProject, boxId: FromQuery[str | None] = None,
                       text: QueryText = "", lastEventId: EventId = "") -> Stream:
            where = compile_query(text) if text else None
            last = request.headers.get("last-event-id") or lastEventId
            cursor = (parse_event_id(last, "Last-Event-ID") if last
                      else await self.start(tenant_project.id))
            # Counted now, not when the stream first sends: tails opened at the same moment
            # must not all pass the cap. The stream gives the slot back when it ends, or
            # the finalizer does if it is never started (the client left first).
            release = self._reserve(tenant)
            stream = self.stream(release, tenant_project.id, boxId or None, where, cursor)
            weakref.finalize(stream, release)
            return Stream(stream, media_type="text/event-stream",
                          headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

        return Router("", route_handlers=[tail])

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
    # (cluster.bus.PeerWatcher) hand the hubs.

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
            hub = self.hubs[hub_key] = kind(project_id, hub_key[1], self)
        hub.subscribers.add(sub)
        return hub

    def _leave(self, hub: Hub, sub: Subscriber) -> None:
        hub.subscribers.discard(sub)
        hub_key = (hub.project_id, hub.queried)
        if not hub.subscribers and self.hubs.get(hub_key) is hub:
            hub.task.cancel()
            del self.hubs[hub_key]

    async def stream(self, release: Callable[[], None], project_id: str, box: str | None,
                     where: Filter, cursor: int) -> AsyncIterator[bytes]:
        try:
            yield OPENING
            async with aclosing(self.follow(project_id, box, where, cursor, frame,
                                            self.config.tail_heartbeat_s)) as parts:
                async for part in parts:
                    if part is None:
                        yield HEARTBEAT
                    elif isinstance(part, Skipped):
                        yield b"id: %s\nevent: dropped\ndata: %s\n\n" % (
                            format_id(part.upto).encode(), _encode(Dropped(part.count)))
                    else:
                        yield part
        finally:
            release()

    async def follow(self, project_id: str, box: str | None, where: Filter, cursor: int,
                     encode: Encoder, idle_s: float
                     ) -> AsyncGenerator[bytes | Skipped | None, None]:
        """The rows above ``cursor`` matching ``box`` and ``where``, now and as they come,
        each encoded by ``encode``, several rows to a piece; :class:`Skipped` where rows
        were skipped, None after ``idle_s`` without any. Close it (``aclosing``)."""
        key = (encode, box, where[0] if where else None, tuple(where[1]) if where else ())
        sub = Subscriber(key, cursor, self.config.tail_max_behind, self.m_fallbacks,
                         self.m_backlogs)
        hub = self._join(project_id, sub)  # before reading: see the module's docstring
        try:
            while not self.ending:
                sub.reset()
                if isinstance(hub, ClusterHub):
                    sub.bound = hub.released
                async for part in self._catch_up(sub, project_id, box, where, encode):
                    yield part
                while not sub.overflowed and not self.ending:
                    if sub.queue:
                        if rows := sub.take():
                            yield rows
                        continue
                    sub.wake.clear()
                    try:
                        await asyncio.wait_for(sub.wake.wait(), idle_s)
                    except TimeoutError:
                        yield None
        finally:
            self._leave(hub, sub)

    async def _catch_up(self, sub: Subscriber, project_id: str, box: str | None,
                        where: Filter, encode: Encoder) -> AsyncIterator[bytes | Skipped]:
        """Read from the cursor until a page comes back short: the live edge."""
        while True:
            rows = await self.engine.after(project_id, sub.cursor, box, PAGE, where, sub.bound)
            self.m_pages.inc(1, "read")
            if len(rows) == PAGE:
                newest = self.buffer.last_id if sub.bound is None else sub.bound
                if sub.excused > sub.credited:
                    # Held back by the node, not left unread (Subscriber.excused): allowed.
                    sub.credit += await self.engine.count_between(
                        project_id, max(sub.cursor, sub.credited), sub.excused, box, where)
                    sub.credited = sub.excused
                behind = await self.engine.count_between(project_id, sub.cursor, newest, box,
                                                         where)
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
