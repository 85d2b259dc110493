"""The ingest service: owns the WAL, the live buffer, the flusher and the compactor.

Handlers call :meth:`IngestService.accept`; everything after the durable ack runs
in this service's background tasks (the WAL's commit loop, the flusher, the compactor),
started and stopped by the app's lifespan, each under the node's supervisor
(``core.supervisor``): restarted if it dies of what its loop does not handle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from core.config import Config
from core.metrics import Registry
from core.schema import ID_STEP, LAYOUT, RowBatch, conform, written_layout
from core.storage import Storage, StorageError
from core.supervisor import Supervisor
from core.usage import Tally, client_discards, merge
from ingest.buffer import Chunk, LiveBuffer
from ingest.errors import Overloaded, StorageUnavailable, UnknownIngestKey
from ingest.flusher import ROW_GROUP_ROWS, encode_parquet, partitions
from ingest.ids import NodeIds
from ingest.wal import Place, Wal, WalError
from metadata.catalog import Catalog, FileEntry, StaleFiles, UnseenDeletion
from metadata.postgres import patiently

log = logging.getLogger("boxtrail.ingest")

TICK_S = 0.25
# A file this large, in bytes or in rows, is left alone: logs compress so well that a
# file of millions of rows can be a few MB, and a merge's cost is in its rows.
COMPACT_MAX_BYTES = 16 << 20
COMPACT_MAX_ROWS = 1 << 20
COMPACT_CHEAP_ROWS = ROW_GROUP_ROWS  # a merge of this many rows costs tens of ms
RETIRED_GRACE_S = 120.0
# A file pending this long was being written by a node that died and never came back (a
# write takes seconds); any node removes it. A node's own are removed at its start.
ABANDONED_PENDING_S = 3600.0
# A compaction holds its partition's lease this long at most (it takes seconds); past it,
# another node may compact the partition, and the later publish loses (StaleFiles).
COMPACT_LEASE_S = 600.0
# Partitions whose merges one publish makes live at most (IngestService.compact).
COMPACT_BATCH = 32


class Publisher(Protocol):
    """Where a durable batch goes next in a cluster: to the other nodes (``cluster.bus``).
    ``epoch`` names this node's WAL in what it sends."""

    epoch: str

    def publish(self, batch: RowBatch, payload: bytes, place: Any = None) -> None: ...


class Watcher(Protocol):
    """Who takes note of each batch once it is searchable (``query.tail``: the live
    tails). It runs on ingest's path, before the 202: it must only take note and return."""

    def appended(self, batch: RowBatch) -> None: ...


class Erasing(Protocol):
    """The deletions this node applies (``erasure.jobs.Erasures``): rows they select never
    reach Parquet from here, and a deleted project's batches are refused."""

    def applied(self) -> Collection[str]: ...

    def gone(self, project_id: str) -> bool: ...

    def keep(self, project_id: str, table: pa.Table) -> tuple[pa.Table, dict[str, int]]:
        """``table`` without the selected rows, and how many each deletion selected."""

    def counted(self, counts: dict[str, int]) -> Callable[[], None]:
        """What records ``counts`` in the transaction of the flush that left them out."""


class Metering(Protocol):
    """Where usage is written (``usage.store``): ``recorded(tally)`` is the step that adds
    ``tally`` in the transaction of the flush that publishes its rows."""

    def recorded(self, tally: Tally) -> Callable[[], None]: ...


class _NoErasures:
    def applied(self) -> Collection[str]:
        return ()

    def gone(self, project_id: str) -> bool:
        return False

    def keep(self, project_id: str, table: pa.Table) -> tuple[pa.Table, dict[str, int]]:
        return table, {}

    def counted(self, counts: dict[str, int]) -> Callable[[], None]:
        return lambda: None


class IngestService:
    """Owns a batch from its ids to Parquet. After its WAL commit, in this order and before
    its 202 (:meth:`_durable`): the live buffer appends it (searchable here), the watcher
    (live tails) takes note, its ids are settled (this node's floor may pass them), and the
    publisher sends it to the other nodes."""

    def __init__(self, config: Config, catalog: Catalog, storage: Storage,
                 metrics: Registry, *, buffer: LiveBuffer | None = None,
                 ids: NodeIds | None = None, watcher: Watcher | None = None,
                 publisher: Publisher | None = None,
                 supervisor: Supervisor | None = None,
                 erasures: Erasing | None = None,
                 usage: Metering | None = None) -> None:
        self.config = config
        # The node's (boxtrail.app); a service made alone (tests) has one of its own.
        self.supervisor = supervisor or Supervisor(metrics)
        self.catalog = catalog
        self.storage = storage
        self.buffer = buffer or LiveBuffer()
        self.ids = ids or NodeIds()
        self.watcher = watcher
        self.publisher = publisher
        self.erasures = erasures or _NoErasures()
        self.usage = usage
        self.wal = Wal(Path(config.data_dir) / "wal", config.wal_segment_bytes,
                       self._durable,
                       metrics.summary("boxtrail_wal_fsync_seconds", "WAL fdatasync latency"),
                       supervisor=self.supervisor)
        self._tasks: list[asyncio.Task[None]] = []
        self._flush_now = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._unsure: tuple[list[Chunk], int, list[str], dict[str, int]] | None = None
        self._retire_later = 0
        self._flushed_lsn = 0  # the WAL position the last publish of this node recorded
        self.erased_rows = 0  # buffered rows a deletion kept out of Parquet, since start
        self._put_off = False  # the last flush waits for this node to read a new deletion
        m = metrics
        self.m_flush_seconds = m.summary("boxtrail_flush_seconds", "Time to write one flush")
        self.m_flush_failures = m.counter("boxtrail_flush_failures_total",
                                          "Flushes that failed and will be retried")
        self.m_rows_written = m.counter("boxtrail_parquet_rows_written_total",
                                        "Rows written to Parquet by flushes")
        self.m_files_written = m.counter("boxtrail_parquet_files_written_total",
                                         "Parquet files written", ("by",))
        self.m_replayed = m.counter("boxtrail_wal_replayed_events_total",
                                    "Events replayed from the WAL at start")
        self.m_torn = m.callback("boxtrail_wal_torn_records", "Torn WAL tails dropped at start",
                                 lambda: self.wal.torn_records)
        m.callback("boxtrail_wal_bytes", "Bytes in live WAL segments", lambda: self.wal.bytes)
        m.callback("boxtrail_buffer_seal_failures",
                   "Times since start a project's buffered batches could not become Arrow "
                   "(they stay in the WAL and replay at the next start)",
                   lambda: self.buffer.seal_failures)
        m.callback("boxtrail_buffer_rows", "Durable rows not yet in Parquet",
                   lambda: self.buffer.rows)
        m.callback("boxtrail_parquet_files", "Live Parquet files in the catalog",
                   lambda: self.catalog.count_live())

    # Lifecycle.

    async def start(self) -> None:
        # Before the node serves: its catalog calls may take a writer's time (metadata.postgres).
        with patiently():
            self.catalog.claim()
            self._recover_files()
            flushed = self.catalog.flushed_lsn()
            # The flushed position stays below a batch the buffer could not seal
            # (LiveBuffer.take), so other projects' batches after it may be in Parquet
            # already: the catalog keeps how far each such project got, and those are not
            # applied twice.
            ahead = self.catalog.flushed_projects()
            max_id = self.catalog.max_id()
        self._flushed_lsn = flushed
        # An empty WAL (a new volume) numbers on from every position the catalog has for
        # this node, so none of them can cover a batch it has not flushed.
        replayed = [b for b in self.wal.replay(flushed, max([flushed, *ahead.values()]))
                    if b.lsn > ahead.get(b.project_id, 0)]
        if self.publisher is not None:  # every entry names the WAL it comes from
            self.publisher.epoch = self.wal.epoch
        self.ids.advance_past(max_id)
        self.buffer.last_id = max_id
        for batch in replayed:
            self.buffer.append(batch)
            if self.publisher is not None and len(batch):  # peers drop what they hold (by LSN)
                self.publisher.publish(batch, msgspec.msgpack.encode(batch))
            self.ids.advance_past(batch.last_id)
            self.m_replayed.inc(len(batch))
        if replayed:
            log.info("wal: replayed %d batches (%d events)", len(replayed),
                     sum(len(b) for b in replayed))
        await self.wal.start()
        # A round of each can take its interval: one that dies every round is failing.
        self._tasks = [
            self.supervisor.start("flush", self._flush_loop,
                                  period_s=self.config.flush_interval_s),
            self.supervisor.start("compact", self._compact_loop,
                                  period_s=self.config.compact_interval_s),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # The HTTP server has stopped taking requests; what is still buffered goes to
        # Parquet now (if that fails, the WAL still has it and the next start replays it).
        try:
            await self.flush()
        except Exception as exc:
            log.warning("final flush failed, rows stay in the WAL: %s", exc)
        await self.wal.close()

    def _recover_files(self) -> None:
        """This node's files whose write never finished, and files compaction replaced
        long enough ago that no reader still has them: delete them."""
        self.storage.recover()
        # A retired file an Iceberg snapshot still reads stays until it expires (iceberg).
        leftovers = self.catalog.files_in_state("pending", own=True) + self.catalog.unheld(
            self.catalog.files_in_state("retired", older_than=time.time() - RETIRED_GRACE_S))
        deleted = []
        try:
            for key in leftovers:
                self.storage.delete(key)
                deleted.append(key)
        except StorageError as exc:  # storage down: start on the WAL, clean up next time
            log.warning("could not remove %d unfinished files: %s",
                        len(leftovers) - len(deleted), exc)
        self.catalog.forget(deleted)

    # The durable ack.

    async def accept(self, batch: RowBatch) -> None:
        if self.erasures.gone(batch.project_id):  # deleted; its keys may linger a moment
            raise UnknownIngestKey("the project of this ingest key was deleted")
        if self.buffer.rows > self.config.buffer_max_rows:
            raise Overloaded(
                "the service is writing a backlog to storage; retry later",
                headers={"Retry-After": str(max(1, int(self.config.flush_interval_s)))})
        batch.id_start = self.ids.take(len(batch))
        batch.id_step = ID_STEP
        try:
            await self.wal.append(batch)
        except WalError as exc:
            self.ids.settle(batch.id_start)
            raise StorageUnavailable(f"could not make the events durable: {exc}",
                                     headers={"Retry-After": "5"}) from exc
        if self.buffer.rows >= self.config.flush_max_rows:
            self._flush_now.set()

    async def note(self, record: RowBatch) -> None:
        """A request's usage record without rows (one refused, or whose every event was
        rejected) made durable, so its count survives a crash as an accepted batch's does
        (``core.usage``). It takes no ids and goes no further than the buffer's tally."""
        assert not len(record)
        if self.erasures.gone(record.project_id):
            return
        try:
            await self.wal.append(record)
        except WalError as exc:
            raise StorageUnavailable(f"could not record the request: {exc}",
                                     headers={"Retry-After": "5"}) from exc

    def _durable(self, batch: RowBatch, payload: bytes, place: Place) -> None:
        """The WAL made ``batch`` durable; its 202 follows this call (see the class). A
        step that fails is logged and the next ones still run: the batch replays from the
        WAL at the next start whatever happens here."""
        try:
            self.buffer.append(batch)
        except Exception:
            log.exception("batch %d is durable but could not be made searchable", batch.lsn)
        if not len(batch):  # a usage record (note): counted by the flush, seen by nobody
            return
        if self.watcher is not None:
            try:
                self.watcher.appended(batch)
            except Exception:  # a live tail's bug must not fail ingest
                log.exception("the live tails could not take batch %d", batch.lsn)
        self.ids.settle(batch.id_start)
        if self.publisher is not None:
            self.publisher.publish(batch, payload, place)

    # Buffer -> Parquet.

    async def _flush_loop(self) -> None:
        backoff = 1.0
        last = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flush_now.wait(), TICK_S)
            due = time.monotonic() - last >= self.config.flush_interval_s
            if not (self._flush_now.is_set() or due):
                continue
            self._flush_now.clear()
            last = time.monotonic()
            try:
                await self.flush()
                backoff = 1.0
                if self._put_off:  # due again at the next tick, not at once
                    self._put_off, last = False, 0.0
            except Exception as exc:
                self.m_flush_failures.inc()
                log.warning("flush failed (retrying in %.0fs): %s", backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def flush(self) -> int:
        """Write every buffered row to Parquet; return how many rows were written."""
        # Its catalog calls run in threads, with a writer's deadline (metadata.postgres).
        with patiently():
            return await self._flush()

    async def _flush(self) -> int:
        async with self._flush_lock:
            if self._unsure is not None:
                await self._settle(*self._unsure)
            chunks, lsn = self.buffer.take()
            if not chunks:
                return 0
            started = time.perf_counter()
            by_project: dict[str, list[Chunk]] = {}
            for chunk in chunks:
                by_project.setdefault(chunk.project_id, []).append(chunk)
            parts, erased, usage = await asyncio.to_thread(_encode_all, by_project,
                                                           self.erasures, self._layout())
            entries = [entry for entry, _ in parts]
            # Catalog writes from a thread: each commit waits for an fsync, which a disk
            # busy with other writes can stretch to seconds (metadata.postgres).
            await asyncio.to_thread(self.catalog.add_pending, entries)
            # Every put ends before a failure is handled, so the clean-up below cannot
            # run ahead of a put still writing its file.
            results = await asyncio.gather(
                *(asyncio.to_thread(self.storage.put, entry.key, data) for entry, data in parts),
                return_exceptions=True)
            if failed := [r for r in results if isinstance(r, BaseException)]:
                await self._discard([e.key for e in entries])
                raise failed[0]
            projects: dict[str, int] = {}
            for chunk in chunks:
                projects[chunk.project_id] = max(projects.get(chunk.project_id, 0),
                                                 chunk.max_lsn)
            keys = [e.key for e in entries]
            # Not cut short by a cancel (at stop): the final flush must not find these
            # chunks still in the buffer once their files are live.
            try:
                await _whole(self._publish(chunks, lsn, keys, projects, erased, usage))
            except UnseenDeletion as exc:
                # A deletion made a moment ago that this node has not read yet (it does
                # within erasure.jobs.POLL_S): nothing was committed; the rows stay buffered
                # and the flush loop's next tick (TICK_S) writes them again, filtered by it.
                log.info("flush put off: %s", exc)
                await self._discard(keys)
                self._put_off = True
                return 0
            self.erased_rows += sum(erased.values())
            await self.wal.retire(max(lsn, self._retire_later))
            rows = sum(e.rows for e in entries)
            self.m_rows_written.inc(rows)
            self.m_files_written.inc(len(entries), "flush")
            self.m_flush_seconds.observe(time.perf_counter() - started)
            return rows

    async def _publish(self, chunks: list[Chunk], lsn: int, keys: list[str],
                       projects: dict[str, int], erased: dict[str, int], usage: Tally
                       ) -> None:
        """The flushed files live and their chunks out of the buffer; queries wait. In
        the same transaction: what deletions left out of them, and their usage."""
        steps = [self.erasures.counted(erased)] if erased else []
        if usage and self.usage is not None:
            steps.append(self.usage.recorded(usage))
        async with self.buffer.publishing():
            try:
                await asyncio.to_thread(self.catalog.publish, keys, flushed_lsn=lsn,
                                        flushed_projects=projects,
                                        applied=self.erasures.applied(),
                                        also=_each(steps) if steps else None)
            except UnseenDeletion:
                raise  # refused before anything changed: nothing to settle
            except Exception:
                # The commit may have happened with only its answer lost (the catalog's
                # connection broke): the next flush looks before it writes these rows again.
                self._unsure = (chunks, lsn, keys, projects)
                raise
            self.buffer.drop(chunks)
            self._flushed_lsn = max(self._flushed_lsn, lsn)

    async def erase(self) -> int:
        """After a deletion was added to :attr:`erasures`: every buffered row written to
        Parquet without the rows it selects, and every WAL segment that held them deleted,
        the one being written included. Returns how many buffered rows it removed. Rows
        still on their way to the buffer are filtered by the flush that takes them."""
        before = self.erased_rows
        await self.flush()
        await self.wal.retire(max(self._flushed_lsn, self._retire_later), current=True)
        return self.erased_rows - before

    async def _settle(self, chunks: list[Chunk], lsn: int, keys: list[str],
                      projects: dict[str, int]) -> None:
        """After a publish whose outcome is unknown: if it committed, its rows are in
        Parquet (drop them from the buffer); if not, its files are deleted and the rows
        are written again. The WAL positions it would have moved tell which: each of its
        projects' batches was past the catalog's position for it before the publish."""
        # From a thread, as every catalog call of the flusher and the compactor: a catalog
        # that hangs holds the thread until the call's deadline, never the loop (metadata.postgres).
        node = await asyncio.to_thread(self.catalog.flushed_lsn)
        ahead = await asyncio.to_thread(self.catalog.flushed_projects)
        self._unsure = None
        if all(max(node, ahead.get(p, 0)) >= top for p, top in projects.items()):
            log.info("a flush that looked failed had committed; its %d files are live",
                     len(keys))
            self.buffer.drop(chunks)
            self._retire_later = max(self._retire_later, lsn)
        else:
            await self._discard(keys)

    async def _discard(self, keys: list[str]) -> None:
        try:
            await asyncio.to_thread(self._delete_objects, keys)
            await asyncio.to_thread(self.catalog.forget, keys)
        except Exception as exc:  # left as 'pending'; removed at the next start
            log.warning("could not clean up a failed write: %s", exc)

    def _retired_unheld(self, before: float) -> list[str]:
        """Files retired at or before ``before`` that no Iceberg snapshot reads (iceberg)."""
        return self.catalog.unheld(self.catalog.files_in_state("retired", before))

    def _delete_objects(self, keys: list[str]) -> None:
        for key in keys:
            self.storage.delete(key)

    # Compaction: many small files of one (project, box, date) -> one file.

    async def _compact_loop(self) -> None:
        with patiently():  # its catalog calls: a writer's deadline (metadata.db)
            await self._compact_rounds()

    async def _compact_rounds(self) -> None:
        while True:
            await asyncio.sleep(self.config.compact_interval_s)
            try:
                await self.compact()
            except Exception as exc:  # the catalog out of reach: the next round tries again
                log.warning("compaction round failed, will retry: %s", exc)
            try:
                now = time.time()
                gone = await asyncio.to_thread(self._retired_unheld, now - RETIRED_GRACE_S)
                gone += await asyncio.to_thread(self.catalog.files_in_state, "pending",
                                                now - ABANDONED_PENDING_S)
                await asyncio.to_thread(self._delete_objects, gone)
                await asyncio.to_thread(self.catalog.forget, gone)
            except Exception as exc:
                log.warning("could not delete replaced files, will retry: %s", exc)

    async def compact(self) -> int:
        """Merge small files per partition; return how many partitions were compacted.

        A round's merges go live together, ``COMPACT_BATCH`` partitions to a publish: with
        Iceberg tables each publish is a replace commit, which rewrites every manifest that
        lists a retired file, and those are the merged manifests that list nearly every
        file of the table (iceberg); one replace per partition rewrote them once per box.
        Refused as a whole (a file another node or a deletion retired meanwhile), each
        partition goes alone, and only the one that lost is given up."""
        done = 0
        merged: list[_Merged] = []
        try:
            for project_id, box, date in await asyncio.to_thread(
                    self.catalog.small_partitions, self.config.compact_min_files,
                    COMPACT_MAX_BYTES, COMPACT_MAX_ROWS):
                # One partition failing (a bad read, storage down) leaves the others to go on.
                try:
                    if (one := await self._merge_partition(project_id, box, date)) is not None:
                        merged.append(one)
                except Exception as exc:
                    log.warning("compaction of %s/%s/%s failed, will retry: %s",
                                project_id, box, date, exc)
                if len(merged) >= COMPACT_BATCH:
                    batch, merged = merged, []
                    done += await self._publish_merged(batch)
            batch, merged = merged, []
            done += await self._publish_merged(batch)
            if self.catalog.mirror is not None:
                # Iceberg tables (iceberg): files of an older layout (milliseconds) rewritten
                # in the current one, which every engine reads right (after the merges
                # above are live: they may have rewritten some already).
                for project_id, box, date in await asyncio.to_thread(
                        self.catalog.old_layout_partitions, LAYOUT):
                    try:
                        one = await self._merge_partition(project_id, box, date,
                                                          relayout=True)
                        if one is not None:
                            merged.append(one)
                    except Exception as exc:
                        log.warning("rewriting %s/%s/%s in layout %d failed, will retry: %s",
                                    project_id, box, date, LAYOUT, exc)
                    if len(merged) >= COMPACT_BATCH:
                        batch, merged = merged, []
                        done += await self._publish_merged(batch)
            batch, merged = merged, []
            done += await self._publish_merged(batch)
        finally:
            if merged:  # the round ended early (stopped, the catalog out of reach)
                await self._give_up(merged)
        return done

    async def _merge_partition(self, project_id: str, box: str, date: str, *,
                               relayout: bool = False) -> _Merged | None:
        """The partition's small files merged into a file written and pending, its lease
        held; None if another node holds it or nothing is to merge."""
        # One node at a time per partition; the lease only saves work: correctness comes
        # from publish, which retires nothing that is no longer live.
        lease = f"compact:{project_id}/{box}/{date}"
        if not await asyncio.to_thread(self.catalog.try_lease, lease, COMPACT_LEASE_S):
            return None
        try:
            if relayout:
                old = await asyncio.to_thread(
                    lambda: self.catalog.partition_files(project_id, box, date, 0, 0, 1,
                                                         below_layout=LAYOUT))
            else:
                old = merge_set(await asyncio.to_thread(
                    self.catalog.partition_files, project_id, box, date, COMPACT_MAX_BYTES,
                    COMPACT_MAX_ROWS))
            if len(old) < (1 if relayout else 2):
                await asyncio.to_thread(self.catalog.release, lease)
                return None
            entry, data = await asyncio.to_thread(self._merge, old)
            await asyncio.to_thread(self.catalog.add_pending, [entry])
        except BaseException:
            await asyncio.to_thread(self.catalog.release, lease)
            raise
        one = _Merged(lease, entry, old, f"{project_id}/{box}/{date}")
        try:
            await asyncio.to_thread(self.storage.put, entry.key, data)
        except BaseException:
            await self._give_up([one])
            raise
        return one

    async def _publish_merged(self, merged: list[_Merged]) -> int:
        """Make the merges live (see :meth:`compact`) and release their leases; return how
        many went live."""
        if not merged:
            return 0
        live: list[_Merged] = []
        try:
            # One transaction swaps the files: a query sees the old ones or the new.
            await asyncio.to_thread(self.catalog.publish, [m.entry.key for m in merged],
                                    retire=[e.key for m in merged for e in m.old])
            live = merged
        except StaleFiles as exc:
            if len(merged) == 1:
                log.info("compaction of %s lost to another: %s", merged[0].label, exc)
            else:
                live = await self._publish_alone(merged)
        except Exception:
            await self._give_up(merged)
            raise
        # (Cancelled mid-publish, they stay pending: the thread may still commit them.)
        await self._give_up([m for m in merged if m not in live])
        for one in live:
            await asyncio.to_thread(self.catalog.release, one.lease)
        self.m_files_written.inc(len(live), "compaction")
        return len(live)

    async def _publish_alone(self, merged: list[_Merged]) -> list[_Merged]:
        """Each merge published on its own; return those that went live."""
        live = []
        for one in merged:
            try:
                await asyncio.to_thread(self.catalog.publish, [one.entry.key],
                                        retire=[e.key for e in one.old])
                live.append(one)
            except StaleFiles as exc:
                log.info("compaction of %s lost to another: %s", one.label, exc)
            except Exception:
                await self._give_up([m for m in merged if m not in live])
                for done in live:
                    await asyncio.to_thread(self.catalog.release, done.lease)
                raise
        return live

    async def _give_up(self, merged: list[_Merged]) -> None:
        """Merges that will not go live: their files removed, their leases released."""
        if merged:
            await self._discard([m.entry.key for m in merged])
        for one in merged:
            with contextlib.suppress(Exception):  # it lapses in any case
                await asyncio.to_thread(self.catalog.release, one.lease)

    def _merge(self, files: list[FileEntry]) -> tuple[FileEntry, bytes]:
        # Files of older layouts lack later columns (null there) and hold milliseconds.
        tables = [conform(pq.read_table(pa.BufferReader(self.storage.get(f.key))), f.layout)
                  for f in files]
        table = pa.concat_tables(tables)  # partitions() sorts it
        first = files[0]
        [(entry, part)] = partitions(first.project_id, table, self._layout())
        data = encode_parquet(part, entry.layout)
        return msgspec.structs.replace(entry, bytes=len(data)), data

    def _layout(self) -> int:
        """The layout files are written in: timestamps in microseconds where Iceberg tables
        read them (iceberg)."""
        return written_layout(self.catalog.mirror is not None)


@dataclass(frozen=True, eq=False)
class _Merged:
    """A partition's merge, written and pending, its lease held (``IngestService.compact``)."""

    lease: str
    entry: FileEntry
    old: list[FileEntry]
    label: str  # project/box/date, for the log


def merge_set(files: list[FileEntry]) -> list[FileEntry]:
    """Which of a partition's small files one compaction merges: from the smallest up, the
    longest run whose merge stays cheap (one row group, ``COMPACT_CHEAP_ROWS``) or whose
    largest file is no larger than the others together. So each file merged at a cost at
    least doubles: a row is rewritten about log2(rows / rows per flush) times, not at every
    round; and each file left apart holds more than all the smaller ones together, so few
    are left (stopping at the first file larger than those before it left behind any
    number of equal files above it, while a trickle of tiny ones kept arriving)."""
    ordered = sorted(files, key=lambda e: (e.rows, e.min_ts, e.key))
    end = rows = 0
    for i, entry in enumerate(ordered):
        rows += entry.rows
        if i == 0 or rows <= COMPACT_CHEAP_ROWS or rows >= 2 * entry.rows:
            end = i + 1
    return sorted(ordered[:end], key=lambda e: (e.min_ts, e.key))


def _encode_all(by_project: dict[str, list[Chunk]], erasures: Erasing, layout: int
                ) -> tuple[list[tuple[FileEntry, bytes]], dict[str, int], Tally]:
    """Each project's rows as files, without what a deletion selects (how many, per
    deletion), and the chunks' usage with the SDKs' drop reports among their rows."""
    out: list[tuple[FileEntry, bytes]] = []
    erased: dict[str, int] = {}
    usage: Tally = {}
    for project_id, chunks in by_project.items():
        table = pa.concat_tables([c.table for c in chunks])
        for chunk in chunks:
            merge(usage, chunk.usage)
        client_discards(project_id, table, usage)
        if not table.num_rows:  # only usage records
            continue
        table, counts = erasures.keep(project_id, table)
        for job_id, n in counts.items():
            erased[job_id] = erased.get(job_id, 0) + n
        for entry, part in partitions(project_id, table, layout):
            data = encode_parquet(part, layout)
            out.append((msgspec.structs.replace(entry, bytes=len(data)), data))
    return out, erased, usage


def _each(steps: list[Callable[[], None]]) -> Callable[[], None]:
    def run() -> None:
        for step in steps:
            step()
    return run


async def _whole(step: Coroutine[Any, Any, None]) -> None:
    """Run ``step`` to its end even if the caller is cancelled meanwhile; the cancel is
    raised after it."""
    task = asyncio.ensure_future(step)
    cancelled = False
    while True:
        try:
            await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
