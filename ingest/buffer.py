"""The live buffer: durable rows not yet in Parquet, searchable in place.

Ingest appends each WAL-durable :class:`RowBatch` in WAL order. Every ``SEAL_ROWS``
rows of a project are sealed into one Arrow table (cheap to scan, few live Python
objects); sealing as rows arrive keeps each seal a few milliseconds of the event
loop's time, where sealing 100k rows at once stalled it for 100+ ms. The flusher
takes sealed chunks, writes them, and drops them only once their files are live in
the catalog, so a query sees every row exactly once: either in a chunk or in a
catalogued file, never both. The catalog's commit runs in a thread (it waits for an
fsync), so the flusher closes the buffer's gate around it and the drop. A query plan
reads inside a *reading* section (:meth:`LiveBuffer.reading`): it enters once the gate is
open, takes the buffer's rows on the loop, then reads the catalog wherever it must (in a
thread, when the catalog is remote and may hang) before it leaves. A publish closes the
gate to new readers and begins only once those inside have left, so no file becomes live
and no chunk is dropped between a plan's two reads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pyarrow as pa

from core.schema import RowBatch, to_table
from core.usage import Tally, tally_batch

log = logging.getLogger("boxtrail.buffer")

SEAL_ROWS = 8192


class StillPublishing(Exception):
    """A reader waited its limit at the gate: a publish's catalog commit has not ended."""


@dataclass(eq=False)
class Chunk:
    project_id: str
    table: pa.Table
    max_lsn: int
    max_id: int
    # What its WAL records count (core.usage): written by the flush that publishes it.
    usage: Tally = field(default_factory=dict)


@dataclass
class _Pending:
    batches: list[RowBatch] = field(default_factory=list)
    rows: int = 0


class LiveBuffer:
    def __init__(self) -> None:
        self._pending: dict[str, _Pending] = {}
        self._sealed: dict[str, list[Chunk]] = {}
        self.rows = 0
        self.pending_rows = 0
        self.max_lsn = 0
        # Ids grow with the WAL order rows become visible in, so a reader that has seen
        # every row up to ``last_id`` has missed none below it (what tails rely on).
        self.last_id = 0
        self.seal_failures = 0
        self._open = asyncio.Event()  # the gate: no publish between catalog and buffer
        self._open.set()
        self._readers = 0  # plans between their read of the buffer and of the catalog
        self._no_readers = asyncio.Event()
        self._no_readers.set()

    @asynccontextmanager
    async def publishing(self) -> AsyncIterator[None]:
        """Around a commit that makes chunks' rows live in the catalog and the drop of
        those chunks: until it ends, a reader would find them in both. New readers wait
        at the gate from the start; those inside are waited for (each is bounded by its
        catalog call's deadline), so a stream of searches never starves a flush."""
        self._open.clear()
        try:
            while self._readers:
                await self._no_readers.wait()
            yield
        finally:
            self._open.set()

    @asynccontextmanager
    async def reading(self, wait_s: float | None = None) -> AsyncIterator[None]:
        """A plan's section: inside, read the buffer (before any ``await``), then the
        catalog; no publish falls between the two reads. Entering waits for a publish
        under way, at most ``wait_s`` (then :class:`StillPublishing`)."""
        try:
            async with asyncio.timeout(wait_s):  # its exit never suspends
                while not self._open.is_set():  # woken late, a later publish may have begun
                    await self._open.wait()
        except TimeoutError:
            raise StillPublishing(wait_s) from None
        self._readers += 1  # no await since the gate was seen open
        self._no_readers.clear()
        try:
            yield
        finally:
            self._readers -= 1
            if not self._readers:
                self._no_readers.set()

    def append(self, batch: RowBatch) -> None:
        pending = self._pending.get(batch.project_id)
        if pending is None:
            pending = self._pending[batch.project_id] = _Pending()
        pending.batches.append(batch)
        n = len(batch)
        pending.rows += n
        self.rows += n
        self.pending_rows += n
        self.max_lsn = max(self.max_lsn, batch.lsn)
        self.last_id = max(self.last_id, batch.last_id)
        if pending.rows >= SEAL_ROWS:
            self._seal(batch.project_id)

    def seal(self) -> None:
        for project_id in list(self._pending):
            self._seal(project_id)

    def _seal(self, project_id: str) -> None:
        """The project's pending batches as one chunk. Converted before anything changes:
        if the conversion fails (of each batch alone too), the batches stay pending (and
        :meth:`take` holds the WAL position below them), so a bug here can cost a flush,
        never an acknowledged row."""
        pending = self._pending[project_id]
        try:
            table = to_table(pending.batches)
        except Exception:
            # Batch by batch, as snapshot() reads them: what only the whole seal overflows
            # (a column past Arrow's 2 GiB) still seals, in pieces.
            tables = [_table_or_none(b) for b in pending.batches]
            if any(t is None for t in tables):
                self.seal_failures += 1
                log.exception("buffer: %d rows of project %s cannot become Arrow; they stay "
                              "in the WAL", pending.rows, project_id)
                return
            table = pa.concat_tables(tables)
        del self._pending[project_id]
        usage: Tally = {}
        for batch in pending.batches:
            tally_batch(batch, usage)
        # A refused request's record holds no rows (and no ids).
        chunk = Chunk(project_id, table, pending.batches[-1].lsn,
                      max(b.last_id for b in pending.batches), usage)
        self._sealed.setdefault(project_id, []).append(chunk)
        self.pending_rows -= pending.rows

    def snapshot(self, project_id: str, after_id: int = 0) -> list[pa.Table]:
        """The project's buffered rows as Arrow tables (pending ones converted now); with
        ``after_id``, only the chunks and batches that hold rows above it."""
        tables = [c.table for c in self._sealed.get(project_id, ()) if c.max_id > after_id]
        pending = self._pending.get(project_id)
        if pending is not None:
            batches = [b for b in pending.batches if b.last_id > after_id]
            if batches:
                try:
                    tables.append(to_table(batches))
                except Exception:  # as in _seal: the others still answer
                    tables += [t for t in map(_table_or_none, batches) if t is not None]
        return tables

    def take(self) -> tuple[list[Chunk], int]:
        """Seal and return every chunk with the WAL position up to which every batch is in
        them; they stay visible. A project whose batches could not be sealed is left out,
        and the position stays below its first batch, so its WAL segment is kept and
        replayed at the next start."""
        self.seal()
        chunks = [c for chunks in self._sealed.values() for c in chunks]
        stuck = [p.batches[0].lsn for p in self._pending.values()]
        return chunks, min([self.max_lsn, *(lsn - 1 for lsn in stuck)])

    def drop(self, flushed: list[Chunk]) -> None:
        """Forget chunks whose rows are now live in Parquet."""
        gone = set(map(id, flushed))
        for project_id in list(self._sealed):
            kept = [c for c in self._sealed[project_id] if id(c) not in gone]
            self.rows -= sum(c.table.num_rows for c in self._sealed[project_id]) - sum(
                c.table.num_rows for c in kept)
            if kept:
                self._sealed[project_id] = kept
            else:
                del self._sealed[project_id]


    def drop_through(self, project_id: str, lsn: int) -> None:
        """Forget the project's chunks and batches wholly at or below WAL position ``lsn``
        (another node's rows, now in Parquet: ``cluster.bus``). A chunk that reaches past
        it stays; its readers filter it by id."""
        sealed = self._sealed.get(project_id, [])
        kept = [c for c in sealed if c.max_lsn > lsn]
        self.rows -= sum(c.table.num_rows for c in sealed) - sum(c.table.num_rows for c in kept)
        if kept:
            self._sealed[project_id] = kept
        else:
            self._sealed.pop(project_id, None)
        pending = self._pending.get(project_id)
        if pending is not None:
            gone = [b for b in pending.batches if b.lsn <= lsn]
            if gone:
                n = sum(len(b) for b in gone)
                pending.batches = [b for b in pending.batches if b.lsn > lsn]
                pending.rows -= n
                self.rows -= n
                self.pending_rows -= n
                if not pending.batches:
                    del self._pending[project_id]


def _table_or_none(batch: RowBatch) -> pa.Table | None:
    try:
        return to_table([batch])
    except Exception:
        return None
