"""The live path of the tails (see ``query.tail``): one :class:`Hub` per project and kind
of filter filters and encodes the new rows once for all its tails, and puts the same
pages in the bounded queue of each :class:`Subscriber`. A cluster's hub
(:class:`ClusterHub`) holds the rows until the cluster watermark passes them and releases
them in id order. Both deliver the same way (:meth:`Hub.deliver`)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import pyarrow as pa

from core.metrics import Counter
from core.schema import RowBatch, to_table
from core.supervisor import Supervisor
from ingest.buffer import LiveBuffer
from query.engine import QueryEngine
from query.frames import Encoder, LivePage, Row, batch_rows, live_page
from query.rows import COLUMNS

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

BOX = COLUMNS.index("box")
# What the hub groups tails by: encoder, box, query SQL, the query's parameters.
Key = tuple[Encoder, str | None, str | None, tuple[object, ...]]


@dataclass(frozen=True)
class Shared:
    """What every hub of the node reads, made once (``query.tail.Tails``)."""

    engine: QueryEngine
    buffer: LiveBuffer
    supervisor: Supervisor
    pool: ThreadPoolExecutor  # the hubs' DuckDB filters, apart from searches
    newest: Callable[[str], int]  # where a tail opened now starts (Tails.newest)
    backlog_rows: int  # a cluster hub's release bigger than this is read by its tails
    pages: Counter
    late: Counter


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
        # Why its caller's tail was ended (tenancy.keys.ApiKeys.hold), once it was.
        self.ended: str | None = None

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

    def __init__(self, project_id: str, queried: bool, shared: Shared) -> None:
        self.project_id = project_id
        self.queried = queried  # serves the tails with a query (else those without)
        self.shared = shared
        self.subscribers: set[Subscriber] = set()
        self.batches: list[RowBatch] = []
        self.rows = 0
        self.wake = asyncio.Event()
        self.task = shared.supervisor.start("tail-hub", self.run, on_death=self._died)

    def visible(self) -> int:
        """An id at or below which every row the hub was given is visible to a read."""
        return self.shared.buffer.last_id

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
        self.rows += len(batch)
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
            if batches and self.subscribers:
                await self.deliver([r for b in batches for r in batch_rows(b)],
                                   partial(_indices_of_box, batches), partial(to_table, batches))

    def groups(self) -> dict[Key, list[Subscriber]]:
        """The tails by what they want. Taken with the rows to deliver: a tail that joins
        later read those rows itself."""
        groups: dict[Key, list[Subscriber]] = {}
        for sub in self.subscribers:
            groups.setdefault(sub.key, []).append(sub)
        return groups

    async def deliver(self, rows: list[Row], of_box: Callable[[str], Iterable[int]],
                      table: Callable[[], pa.Table]) -> None:
        """``rows`` to the tails that want them: each row encoded once per encoder; the
        box filters decided here (``of_box(box)``: the indices of the box's rows), every
        query filter in one DuckDB scan of ``table()`` on the hubs' thread. A failure lets
        the tails read for themselves."""
        groups = self.groups()
        if not rows or not groups:
            return
        try:
            frames: dict[Encoder, dict[int, bytes]] = {}
            queried: list[Key] = []
            for key, subs in groups.items():
                encode, box, sql, _ = key
                if sql is not None:
                    queried.append(key)
                    continue
                picked = range(len(rows)) if box is None else of_box(box)
                self._send(live_page(rows, picked, encode, frames.setdefault(encode, {})),
                           subs)
            if not queried:
                return
            # One scan for every distinct filter, whatever the encoders.
            filters = list({(box, sql, params) for _, box, sql, params in queried})
            matched = await asyncio.get_running_loop().run_in_executor(
                self.shared.pool, lambda: self.shared.engine.matching_ids(
                    table(), [(box, (sql, list(params))) for box, sql, params in filters
                              if sql is not None]))
            index_of = {r[0]: i for i, r in enumerate(rows)}
            indices = {f: [index_of[i] for i in ids] for f, ids in zip(filters, matched,
                                                                       strict=True)}
            for key in queried:
                encode, box, sql, params = key
                self._send(live_page(rows, indices[box, sql, params], encode,
                                     frames.setdefault(encode, {})), groups[key])
        except Exception:
            log.exception("tail hub of %s failed; its tails read instead", self.project_id)
            self.let_go()

    def _send(self, page: LivePage | None, subs: list[Subscriber]) -> None:
        if page is None:
            return
        self.shared.pages.inc(1, "live")
        for sub in subs:
            sub.push(page)


class ClusterHub(Hub):
    """A hub of a cluster node: rows come from this node and from the others (over the
    bus) in no common order, so they are held until the cluster watermark passes them
    (``cluster.bus``) and released in id order. Every row with an id above
    :attr:`released` is held here or not yet visible: a tail reads up to it for itself
    (``Subscriber.bound``) and takes the rest from the pages."""

    def __init__(self, project_id: str, queried: bool, shared: Shared) -> None:
        self.held: dict[int, Row] = {}
        self.released = shared.newest(project_id)
        self.seeded = False
        # Past HUB_MAX_ROWS held (the watermark stuck: this node cannot read the stream,
        # or a node it waits for is silent) the hub lets its rows go and takes no more
        # until the watermark moves; then its tails read up to it for themselves and the
        # hub starts again from there, as it started.
        self.spilled = False
        super().__init__(project_id, queried, shared)

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
            self.shared.late.inc(late)
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
                seed = await self.shared.engine.after(self.project_id, self.released, None,
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
            mark = self.shared.newest(self.project_id)
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
            if len(ready) > self.shared.backlog_rows:
                # A backlog the watermark held (a cut healed): pushed whole, it would fill
                # the queue of a tail that was never slow, and be encoded all at once on
                # the event loop. Its tails read it from their cursors instead, in pages.
                for i in ready:
                    del self.held[i]
                self.let_go()
                continue
            rows = [self.held.pop(i) for i in ready]
            await self.deliver(rows, partial(_indices_in, rows), partial(_table_of, rows))

def _indices_of_box(batches: list[RowBatch], box: str) -> Iterator[int]:
    start = 0
    for b in batches:
        n = len(b)
        if b.box == box:  # a batch has one box: what ``box = ?`` decides row by row
            yield from range(start, start + n)
        start += n


def _indices_in(rows: list[Row], box: str) -> list[int]:
    return [i for i, r in enumerate(rows) if r[BOX] == box]


def _table_of(rows: list[Row]) -> pa.Table:
    """Rows as the filters read them (``query.rows.COLUMNS``)."""
    return pa.table({name: pa.array([r[i] for r in rows],
                                    pa.int64() if name in ("id", "ts") else pa.string())
                     for i, name in enumerate(COLUMNS)})
