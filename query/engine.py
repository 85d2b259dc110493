"""Running a search: catalog pruning + the live buffer -> one DuckDB query.

The plan takes the buffered rows and the catalog's file list inside the live
buffer's reading section, so they are one consistent snapshot (a row is in
exactly one of them); a remote catalog is read in a thread. DuckDB then runs on
a worker thread with the exact file list: it never lists storage.
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.ipc

from cluster.peers import Peers, Positions, past
from core.metrics import Registry
from core.schema import LAYOUT, SCHEMA, missing
from core.storage import Storage, StorageError
from core.usage import Meter
from ingest.buffer import LiveBuffer, StillPublishing
from ingest.flusher import ROW_GROUP_ROWS  # rows per row group of the files read
from metadata.catalog import Catalog, FileEntry
from metadata.db import MetadataUnavailable
from metadata.postgres import promptly
from query.rows import SELECT, Cursor, Page, encode_cursor, to_row

FAR_FUTURE_MS = 1 << 62
# How long a search waits for a flush's commit on a remote catalog: one normally takes
# milliseconds; past this the catalog hangs, and the search is a 503 within ~2 s.
GATE_WAIT_S = 1.0
FETCH_ROWS = 250  # rows converted to Python per GIL hold (see _run)
ROWS_ON_LOOP = 1000  # pages up to this many rows are built on the event loop (no thread hop)

# What opening one more Parquet file costs DuckDB, in rows read (~0.25 ms): small files
# cost their number more than their rows.
FILE_ROWS = 16_000
# A compiled search-language filter: a SQL boolean expression with ``?`` and its values.
Filter = tuple[str, list[object]] | None


def _conditions(box: str | None, query: Filter) -> tuple[list[str], list[object]]:
    where: list[str] = []
    params: list[object] = []
    if box is not None:
        where.append("box = ?")
        params.append(box)
    if query is not None:
        where.append(f"({query[0]})")
        params += query[1]
    return where, params


def _window(box: str | None, query: Filter, since_ms: int, until_ms: int | None
            ) -> tuple[list[str], list[object]]:
    """The conditions of a search of ``[since_ms, until_ms)`` (no end when None)."""
    where, params = _conditions(box, query)
    where.append("ts >= ?")
    params.append(_dt(since_ms))
    if until_ms is not None:
        where.append("ts < ?")
        params.append(_dt(until_ms))
    return where, params


class Erasing(Protocol):
    """The deletions this node applies (``erasure.jobs.Erasures``)."""

    def keep(self, project_id: str, table: pa.Table) -> tuple[pa.Table, dict[str, int]]: ...


@dataclass(frozen=True)
class Plan:
    files: list[str]
    buffered: list[pa.Table]
    files_total: int
    older: dict[str, int] = field(default_factory=dict)  # layout of files not at LAYOUT
    # Per file (as ``files``): its newest and oldest row's ts (ms) and its row count.
    newest: list[int] = field(default_factory=list)
    oldest: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    scanned_bytes: int = 0  # the Parquet bytes of ``files``

    def newest_first(self) -> Plan:
        order = sorted(range(len(self.files)), key=lambda i: -self.newest[i])
        return replace(self, files=[self.files[i] for i in order],
                       newest=[self.newest[i] for i in order],
                       oldest=[self.oldest[i] for i in order],
                       rows=[self.rows[i] for i in order])

    def reads(self, count: int, start: int, top: int) -> int:
        """About what a read of ``start <= ts <= top`` over the first ``count`` files
        costs, in rows: the row groups it decodes (DuckDB skips those wholly outside;
        files are sorted by ts, ingest.flusher.ROW_GROUP_ROWS rows a group) and
        ``FILE_ROWS`` per file."""
        total = 0
        for rows, newest, oldest in zip(self.rows[:count], self.newest, self.oldest,
                                        strict=False):
            if rows > ROW_GROUP_ROWS:
                share = (min(newest, top) - start) / max(1, newest - oldest)
                groups = math.ceil(rows * min(1.0, max(0.0, share)) / ROW_GROUP_ROWS)
                rows = min(rows, groups * ROW_GROUP_ROWS)
            total += rows + FILE_ROWS
        return total

    def first(self, count: int) -> Plan:
        """The plan with only its first ``count`` files."""
        return replace(self, files=self.files[:count], newest=self.newest[:count],
                       oldest=self.oldest[:count], rows=self.rows[:count])


class QueryEngine:
    def __init__(self, catalog: Catalog, buffer: LiveBuffer, storage: Storage,
                 metrics: Registry, threads: int, peers: Peers | None = None,
                 erasures: Erasing | None = None, meter: Meter | None = None) -> None:
        self.catalog = catalog
        # What each read used (core.usage): queries, bytes scanned, tail-seconds, frames.
        self.meter = meter or Meter()
        self.buffer = buffer
        self.peers = peers  # in a cluster: the other nodes' unflushed rows
        # The deletions under way (erasure.jobs), applied to the rows a plan takes from
        # memory: this node's own that reached the buffer after it applied a job (its next
        # flush leaves them out), and the other nodes' held here, which their own node
        # erases when it applies the job (or, if it died meanwhile, when it starts again).
        self.erasures = erasures
        self.storage = storage
        self.db = duckdb.connect(config={"threads": threads,
                                         "autoinstall_known_extensions": False,
                                         "autoload_known_extensions": False})
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="query")
        # A remote catalog's reads for plans, apart from DuckDB's queries (a plan must not
        # queue behind a long query) and from the default pool (searches held by a hanging
        # catalog must not starve the flusher's calls).
        self.catalog_pool = ThreadPoolExecutor(4, thread_name_prefix="plan")
        self.m_files_scanned = metrics.counter(
            "boxtrail_query_files_scanned_total", "Parquet files handed to DuckDB by the planner")
        self.m_files_pruned = metrics.counter(
            "boxtrail_query_files_pruned_total", "Live files the catalog ruled out for a query")
        self.m_queries = metrics.counter("boxtrail_queries_total", "Queries run", ("kind",))

    async def plan(self, project_id: str, since_ms: int, box: str | None,
                   until_ms: int = FAR_FUTURE_MS) -> Plan:
        return await self._plan(project_id, 0, lambda: self.catalog.live_files(
            project_id, since_ms, until_ms, box))

    async def plan_after(self, project_id: str, after_id: int, box: str | None) -> Plan:
        """Rows with ids above ``after_id``: what a tail has not seen yet."""
        return await self._plan(project_id, after_id, lambda: self.catalog.live_files_after(
            project_id, after_id, box))

    async def _plan(self, project_id: str, after_id: int, files_of: Callable[[], list[FileEntry]]
                    ) -> Plan:
        """The buffer's rows, then the catalog's files, inside the buffer's reading section
        (:meth:`LiveBuffer.reading`): a row is in one or the other. A remote catalog is read
        in a thread, so one that hangs holds this plan until the call's deadline, never the
        event loop (and with it every ingest of the node)."""
        peers = self.peers
        if peers is not None:
            await peers.prepare(project_id)
        async with self._reading():
            buffered = self.buffer.snapshot(project_id, after_id)
            held = (peers.capture(project_id, after_id)
                    if peers is not None and peers.has_rows(project_id) else None)

            def read() -> tuple[list[FileEntry], Positions, int]:
                with promptly():  # the loop's deadline: what a search waited on the loop
                    if held is None:
                        return files_of(), {}, self.catalog.count_live(project_id)
                    # Other nodes' rows: the files and the WAL positions from one snapshot
                    # of the catalog, so a row is taken from a file or from a peer, never
                    # both.
                    with self.catalog.db.snapshot():
                        files = files_of()
                        positions = self.catalog.positions()
                    return files, positions, self.catalog.count_live(project_id)

            if self.catalog.db.remote:
                loop = asyncio.get_running_loop()
                files, positions, total = await loop.run_in_executor(self.catalog_pool, read)
            else:  # a local file's read takes ~0.1 ms and never waits on a network
                files, positions, total = read()
        if held:
            buffered += past(held, project_id, positions)
        if self.erasures is not None:  # rows older than a deletion under way, not erased yet
            buffered = [self.erasures.keep(project_id, t)[0] for t in buffered]
        self.m_files_scanned.inc(len(files))
        self.m_files_pruned.inc(total - len(files))
        return Plan([f.key for f in files], buffered, total,
                    {f.key: f.layout for f in files if f.layout != LAYOUT},
                    [f.max_ts for f in files], [f.min_ts for f in files],
                    [f.rows for f in files], sum(f.bytes for f in files))

    @asynccontextmanager
    async def _reading(self) -> AsyncIterator[None]:
        """:meth:`LiveBuffer.reading`; on a remote catalog the wait at its gate lasts no
        longer than ``GATE_WAIT_S``: a flush's commit that takes longer is one the catalog
        does not answer (it waits out its deadline, ``metadata.postgres``), and the search answers
        503 instead of waiting too."""
        try:
            async with self.buffer.reading(GATE_WAIT_S if self.catalog.db.remote else None):
                yield
        except StillPublishing:
            raise MetadataUnavailable(
                f"a flush's catalog commit has not ended within {GATE_WAIT_S:g} s") from None

    async def search(self, project_id: str, since_ms: int, box: str | None, limit: int,
                     cursor: Cursor | None, query: Filter = None,
                     until_ms: int | None = None, source: str = "search"
                     ) -> tuple[Page, Plan]:
        """Newest first, ``limit`` rows (older than ``until_ms`` when given) and the cursor
        of the next page."""
        # A later page reads only the files that can hold rows at or before its cursor, so
        # page 20 costs what page 1 does.
        newest = FAR_FUTURE_MS if until_ms is None else until_ms - 1
        if cursor is not None:
            newest = min(newest, cursor.ts)
        plan = await self.plan(project_id, since_ms, box, newest)
        self.m_queries.inc(1, "search")
        self.metered(project_id, plan, source)
        where, params = _window(box, query, since_ms, until_ms)
        if cursor is not None:
            # ``ts <= ?`` repeats the cursor for DuckDB, which skips row groups by a
            # plain comparison and not by an OR.
            where.append("ts <= ? AND (ts < ? OR (ts = ? AND id < ?))")
            params += [_dt(cursor.ts), _dt(cursor.ts), _dt(cursor.ts), cursor.id]
        rows, plan = await self._newest(plan, where, params, limit + 1, since_ms, newest,
                                        query is not None)
        if limit <= ROWS_ON_LOOP:
            page_rows = [to_row(r) for r in rows[:limit]]
        else:  # thousands of rows (errors grouped): milliseconds the event loop keeps for 202s
            page_rows = await asyncio.get_running_loop().run_in_executor(
                self.pool, lambda: [to_row(r) for r in rows[:limit]])
        next_cursor = None
        if len(rows) > limit:
            last = rows[limit - 1]
            next_cursor = encode_cursor(Cursor(ts=last[1], id=last[0]))  # type: ignore[arg-type]
        return Page(page_rows, next_cursor), plan

    async def _newest(self, plan: Plan, where: list[str], params: list[object], count: int,
                      since_ms: int, newest_ms: int, filtered: bool
                      ) -> tuple[list[tuple[object, ...]], Plan]:
        """The ``count`` newest matching rows (none newer than ``newest_ms``), and the plan
        that read them. Loki's way: the latest stretch of time first, as long as the
        files' rows per millisecond say holds the page twice over; if it holds fewer
        matches, a stretch as much longer as their rate says, and so on back to
        ``since_ms``. ``ts >= start`` is exact (a row left out is older than every row
        read), it leaves out the files that end before it, and DuckDB skips the row groups
        of the others that do (files are sorted by ts). A page deep into a long history,
        or into files that each span all of it, then reads about a page's worth."""
        plan = plan.newest_first()
        if not plan.files:
            return await self._select(plan, where, params, "ORDER BY ts DESC, id DESC LIMIT ?",
                                      [count]), plan
        top = min(newest_ms, plan.newest[0])
        # No row is older than ``oldest``: a stretch that reaches it reads everything.
        oldest = min(plan.oldest)
        for table in plan.buffered:  # late rows may be older than every file
            if table.num_rows:
                oldest = min(oldest, pc.min(table["ts"]).value)
        span = max(1, top - oldest + 1)
        everything = plan.reads(len(plan.files), oldest, top)
        parts = 16 if filtered else 4
        stretch = max(1, 2 * count * span // max(1, sum(plan.rows)))
        while True:
            start = top - stretch
            take = len(plan.newest) - bisect.bisect_left(plan.newest[::-1], start)
            if start <= max(since_ms, oldest) or (
                    parts * plan.reads(take, start, top) > everything):
                # All of it, or a stretch that would cost more than 1/parts of it (small
                # files are read whole): one query without the bound. A stretch that comes
                # back short then costs at most 1/parts more than one read of everything;
                # a filter makes that likely, so it takes 1/16 rather than 1/4.
                part, bound, values = plan, [], []
            else:
                part, bound, values = plan.first(take), ["ts >= ?"], [_dt(start)]
            rows = await self._select(part, where + bound, params + values,
                                      "ORDER BY ts DESC, id DESC LIMIT ?", [count])
            if not bound or len(rows) == count:
                return rows, part
            # Too few matches in ``stretch``: as long again as their rate says the page
            # needs, twice over; none at all: the filter is rare, read everything.
            stretch = stretch * 2 * count // len(rows) if rows else top - since_ms

    async def histogram(self, project_id: str, since_ms: int, until_ms: int,
                        box: str | None, query: Filter, width_ms: int
                        ) -> tuple[list[tuple[object, ...]], Plan]:
        """Matching rows in ``[since_ms, until_ms)`` counted per bucket of ``width_ms``
        (aligned to the epoch) and level: ``(bucket start // width_ms, level, count)``,
        oldest first, the buckets and levels with rows only."""
        plan = await self.plan(project_id, since_ms, box, until_ms - 1)
        self.m_queries.inc(1, "histogram")
        self.metered(project_id, plan, "histogram")
        where, params = _window(box, query, since_ms, until_ms)
        # The width is an int from a fixed ladder, never from the request's text.
        rows = await self._select(plan, where, params, "GROUP BY bucket, level ORDER BY bucket",
                                  [], select=f"epoch_ms(ts) // {int(width_ms)} AS bucket, "
                                             "level, count(*)")
        return rows, plan

    async def after(self, project_id: str, after_id: int, box: str | None, limit: int,
                    query: Filter = None, upto: int | None = None) -> list[tuple[object, ...]]:
        """Up to ``limit`` matching rows with ids above ``after_id`` (and at most ``upto``),
        oldest first."""
        self.m_queries.inc(1, "tail")
        where, params = _conditions(box, query)
        where.append("id > ?")
        params.append(after_id)
        if upto is not None:
            where.append("id <= ?")
            params.append(upto)
        plan = await self.plan_after(project_id, after_id, box)
        return await self._select(plan, where, params, "ORDER BY id LIMIT ?", [limit])

    async def count_between(self, project_id: str, after_id: int, upto_id: int,
                            box: str | None, query: Filter = None) -> int:
        """How many matching rows have ids in ``(after_id, upto_id]``."""
        where, params = _conditions(box, query)
        where.append("id > ? AND id <= ?")
        params += [after_id, upto_id]
        plan = await self.plan_after(project_id, after_id, box)
        rows = await self._select(plan, where, params, "", [], select="count(*)")
        return int(rows[0][0]) if rows else 0  # type: ignore[call-overload]

    def matching_ids(self, table: pa.Table, filters: list[tuple[str | None, Filter]]
                     ) -> list[list[int]]:
        """For each (box, query) filter, the ids of ``table``'s rows it matches, in table
        order: the conditions ``after`` puts in its WHERE, all filters in one scan. Blocking:
        call it from a worker thread."""
        exprs: list[str] = []
        params: list[object] = []
        for box, query in filters:
            where, values = _conditions(box, query)
            # WHERE keeps a row only when the condition is TRUE; NULL counts as no match.
            exprs.append(f"coalesce({' AND '.join(where) or 'TRUE'}, false)")
            params += values
        con = self.db.cursor()
        try:
            con.register("live", table)
            rows = con.execute(f"SELECT id, {', '.join(exprs)} FROM live", params).fetchall()
        finally:
            con.close()
        return [[r[0] for r in rows if r[k]] for k in range(1, len(filters) + 1)]

    def metered(self, project_id: str, plan: Plan, source: str) -> None:
        """A query's usage: itself and the Parquet bytes its plan reads."""
        self.meter.note(project_id, "query.requests", 1, source)
        self.meter.note(project_id, "query.scanned_bytes", plan.scanned_bytes, source)

    async def export(self, project_id: str, since_ms: int, box: str | None, limit: int,
                     query: Filter, columns: tuple[str, ...], path: Path,
                     source: str = "errors") -> tuple[Plan, int]:
        """Like :meth:`search` (newest first, no cursor), ``columns`` of up to ``limit`` rows
        written to ``path`` as an Arrow IPC file, for a worker process to read
        (``core.workers``): no row becomes a Python object here. Returns the plan and
        the number of rows written (none and no file when there is nothing to read)."""
        plan = await self.plan(project_id, since_ms, box)
        self.m_queries.inc(1, "search")
        self.metered(project_id, plan, source)
        where, params = _window(box, query, since_ms, None)
        count = await asyncio.get_running_loop().run_in_executor(
            self.pool, self._export, plan, where, [*params, limit], ", ".join(columns), path)
        return plan, count

    def _export(self, plan: Plan, where: list[str], params: list[object], select: str,
                path: Path) -> int:
        con = self.db.cursor()
        try:
            with _reading():
                source = self._source(con, plan)
                if source is None:
                    return 0
                # A relation, not a DB-API result: DuckDB warns that the latter's Arrow
                # output is one more copy of the rows (measured: the same time, 10,000 rows).
                table: pa.Table = con.sql(
                    f"SELECT {select} FROM {source} WHERE {' AND '.join(where)} "
                    "ORDER BY ts DESC, id DESC LIMIT ?", params=params).to_arrow_table()
            with pa.OSFile(str(path), "wb") as sink, \
                    pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            return int(table.num_rows)
        finally:
            con.close()

    async def _select(self, plan: Plan, where: list[str], params: list[object], tail: str,
                      tail_params: list[object], select: str = ", ".join(SELECT)
                      ) -> list[tuple[object, ...]]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, self._run, plan, where,
                                          [*params, *tail_params], tail, select)

    def _run(self, plan: Plan, where: list[str], params: list[object], tail: str,
             select: str) -> list[tuple[object, ...]]:
        con = self.db.cursor()
        try:
            with _reading():
                source = self._source(con, plan)
                if source is None:
                    return []
                sql = f"SELECT {select} FROM {source} WHERE {' AND '.join(where)} {tail}"
                result = con.execute(sql, params)
                # fetchall holds the GIL while it builds every row's Python objects: 10,000
                # error rows kept the event loop (and ingest's 202s) waiting ~15+ ms in one
                # piece. In pieces, the loop gets the GIL back between them.
                rows: list[tuple[object, ...]] = []
                while piece := result.fetchmany(FETCH_ROWS):
                    rows += piece
                return rows
        finally:
            con.close()

    def _source(self, con: duckdb.DuckDBPyConnection, plan: Plan) -> str | None:
        """Register the plan's inputs on ``con`` and return the FROM clause that unions them."""
        parts = []
        columns = ", ".join(SCHEMA.names)
        if plan.files:
            local = [self.storage.local_path(k) for k in plan.files]
            if all(p is not None for p in local):
                # Files by layout: a column a file was written without is selected as NULL
                # (the catalog knows which; reading every footer by name cost ~10 ms a query).
                by_layout: dict[int, list[str | None]] = {}
                for key, path in zip(plan.files, local, strict=True):
                    by_layout.setdefault(plan.older.get(key, LAYOUT), []).append(path)
                for layout, paths in sorted(by_layout.items()):
                    # The files sit under key=value directories: DuckDB would read them as
                    # hive partitions, typed by guessing (box=0123 -> 123), over the column.
                    parts.append(f"SELECT {_select(layout)} FROM read_parquet("
                                 f"{_sql_list(paths)}, hive_partitioning=false)")
            else:
                dataset = ds.dataset([self.storage.arrow_path(k) for k in plan.files],
                                     schema=SCHEMA, format="parquet",
                                     filesystem=self.storage.arrow_filesystem())
                con.register("stored", dataset)
                parts.append(f"SELECT {columns} FROM stored")
        if plan.buffered:
            con.register("buffered", pa.concat_tables(plan.buffered))
            parts.append(f"SELECT {columns} FROM buffered")
        if not parts:
            return None
        return "(" + " UNION ALL ".join(parts) + ")"

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.db.close()


@contextmanager
def _reading() -> Iterator[None]:
    """Storage failures while DuckDB reads, as :class:`StorageError` (503)."""
    try:
        yield
    except (OSError, duckdb.IOException) as exc:
        raise StorageError(f"cannot read log files: {exc}") from exc
    except duckdb.InvalidInputException as exc:
        # An S3 read failing inside the registered Arrow dataset reaches us as
        # "reading the stream registered as 'stored' failed: IOError: ...".
        if "IOError" not in str(exc):
            raise
        raise StorageError(f"cannot read log files: {exc}") from exc


def _select(layout: int) -> str:
    """SCHEMA's columns as a file of ``layout`` gives them: the ones it lacks as NULL."""
    absent = missing(layout)
    return ", ".join(f"CAST(NULL AS VARCHAR) AS {name}" if name in absent else name
                     for name in SCHEMA.names)


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _sql_list(paths: list[str | None]) -> str:
    # Paths come from the catalog (keys this server made), never from a request; quoting
    # still escapes them so a path is always one literal.
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"
