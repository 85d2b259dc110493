"""Deletion jobs: made by a request, finished by the cluster, resumed after any crash.

A job is a row of ``deletions`` (made in the request's transaction; a project deletion's in
the one that removes the project and its keys). It ends ``done`` with ``purged_at``: the
moment no byte of the rows it selected is left in Parquet, in the WAL or live buffer of any
live node, or in another node's copy of them. Its steps:

1. **Every node** (:meth:`Eraser.round`, every :data:`POLL_S`) finds the jobs it has not
   acknowledged, adds their selectors to its :class:`Erasures` (from then on no flush of
   this node writes a selected row, and a deleted project's batches are refused), writes
   its buffer to Parquet without the selected rows (``IngestService.erase``), deletes the
   WAL segments that held them, ends a deleted project's tails, and acknowledges the job
   (``deletion_acks``, with the rows it removed). A node that is down does it when it
   starts, before it serves. A flush's publish is fenced (``Catalog.publish``): a node
   that has not seen a job under way cannot put rows in Parquet, so none written before
   it learnt of the job can escape the job's file step.
2. **One node** (the holder of the job's lease, :data:`LEASE_S`, renewed each round; any
   node takes a job over once its holder is gone) runs the job's own phases, each
   recorded before the next begins, so a restart resumes where it stopped:

   - ``nodes`` (a project deletion): wait until every live node acknowledged (at most
     :data:`WAIT_NODES_S`), so no node still answers for the project;
   - ``files``: each live Parquet file that may hold a selected row (by the catalog's
     box, day, time and id bounds) is retired whole when every row of it is selected
     (no read), else read and, if it holds any, rewritten without them: the new file and
     the old one's retirement in one catalog transaction (with the job's counts), so a
     read sees one or the other. A file another writer replaced meanwhile (a compaction)
     sends the step round again;
   - ``purge``: ``BOXTRAIL_DELETION_GRACE_S`` (5 s) after that, the retired files' objects
     are deleted (reads that planned them before the swap have had their time); for a
     project, every object under its prefixes, every file row and its source maps too;
   - ``acks``: done once every live node has acknowledged (or :data:`WAIT_NODES_S` has
     passed since the job began: the nodes that did not are named in the job) and, in a
     cluster, the stream's entries from before the job are past its retention
     (``BOXTRAIL_BUS_RETAIN_S``): they are then trimmed, exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.schema import conform, written_layout
from core.storage import Storage
from core.usage import Tally, minute_of
from erasure.selector import Selector, keep
from ingest.flusher import encode_parquet, partitions
from metadata.catalog import Catalog, FileEntry, StaleFiles
from metadata.db import Database
from metadata.postgres import patiently

if TYPE_CHECKING:
    from ingest.service import IngestService
    from query.tail import Tails
    from symbolicate.artifacts import ArtifactStore
    from tenancy.tenants import Tenancy

log = logging.getLogger("boxtrail.erasure")

POLL_S = 0.5
LEASE_S = 30.0
WAIT_NODES_S = 30.0
# How long after a job is done this node still filters its flushes with it: a batch given
# its ids before the job can reach the buffer after the node's acknowledgement.
KEEP_APPLYING_S = 300.0
MAX_PASSES = 10
BUS_MARGIN_MS = 1000
FILE_THREADS = 2  # reading, filtering and writing files (pyarrow and DuckDB let go of the GIL)


@dataclass(frozen=True)
class _Prepared:
    """One file read and filtered: its selected rows, and the copy without them (pending in
    the catalog, put in storage) if it keeps some; no copy and no rows: nothing to do."""

    entry: FileEntry
    gone: int
    copies: list[FileEntry]


class Bus(Protocol):
    """The cluster's stream (``cluster.bus.RedisBus``)."""

    retain_s: float

    async def trim_before(self, at_ms: int) -> None: ...


class Metering(Protocol):
    """Where usage is written (``usage.store``), in the caller's transaction."""

    def recorded(self, tally: Tally, tenant_id: str | None = None) -> Callable[[], None]: ...


class Removed(msgspec.Struct, kw_only=True, rename="camel"):
    """What a job removed so far."""

    rows: int = 0  # rows erased from Parquet files
    buffered_rows: int = 0  # rows erased from the nodes' live buffers
    files_deleted: int = 0  # files removed whole (every row selected)
    files_rewritten: int = 0  # files replaced by a copy without the selected rows
    bytes_deleted: int = 0  # Parquet bytes of the files removed or replaced
    bytes_written: int = 0  # Parquet bytes of the copies written
    objects_deleted: int = 0  # storage objects deleted (files, source maps, leftovers)
    source_maps: int = 0  # source map index rows removed (a project deletion)


class Progress(msgspec.Struct, kw_only=True):
    """A job's stored result: its counts and where its phases stand."""

    removed: Removed = msgspec.field(default_factory=Removed)
    files_done_at: float | None = None
    waited_for: list[str] = []  # live nodes that had not acknowledged when it ended


class Job(msgspec.Struct, kw_only=True):
    id: str
    tenant_id: str
    project_id: str
    project_name: str
    selector: Selector
    state: str  # queued | running | done | failed
    phase: str  # nodes | files | purge | acks
    created_at: float
    started_at: float | None = None
    purged_at: float | None = None
    progress: Progress = msgspec.field(default_factory=Progress)
    error: str | None = None


_COLUMNS = ("id, tenant_id, project_id, project_name, selector, state, phase, created_at, "
            "started_at, purged_at, result, error")


def _job(row: tuple[object, ...]) -> Job:
    (id_, tenant, project, name, selector, state, phase, created, started, purged, result,
     error) = row
    return Job(id=str(id_), tenant_id=str(tenant), project_id=str(project),
               project_name=str(name),
               selector=msgspec.json.decode(str(selector), type=Selector),
               state=str(state), phase=str(phase), created_at=float(created),  # type: ignore[arg-type]
               started_at=None if started is None else float(started),  # type: ignore[arg-type]
               purged_at=None if purged is None else float(purged),  # type: ignore[arg-type]
               progress=msgspec.json.decode(str(result), type=Progress),
               error=None if error is None else str(error))


class Deletions:
    """The job table."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @staticmethod
    def new(tenant_id: str, project_id: str, project_name: str, selector: Selector) -> Job:
        return Job(id="del_" + secrets.token_hex(8), tenant_id=tenant_id,
                   project_id=project_id, project_name=project_name, selector=selector,
                   state="queued", phase="nodes" if selector.project else "files",
                   created_at=time.time())

    def insert(self, job: Job) -> None:
        """In the caller's transaction."""
        self.db.execute(
            f"INSERT INTO deletions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (job.id, job.tenant_id, job.project_id, job.project_name,
             msgspec.json.encode(job.selector).decode(), job.state, job.phase, job.created_at,
             None, None, msgspec.json.encode(job.progress).decode(), None))

    def create(self, job: Job) -> Job:
        with self.db.transaction():
            self.insert(job)
        return job

    def by_id(self, job_id: str) -> Job | None:
        row = self.db.execute(f"SELECT {_COLUMNS} FROM deletions WHERE id = ?",
                              (job_id,)).fetchone()
        return None if row is None else _job(tuple(row))

    def get(self, tenant_id: str, job_id: str) -> Job | None:
        row = self.db.execute(f"SELECT {_COLUMNS} FROM deletions WHERE id = ? AND tenant_id = ?",
                              (job_id, tenant_id)).fetchone()
        return None if row is None else _job(tuple(row))

    def of_tenant(self, tenant_id: str, project_id: str | None = None, limit: int = 100
                  ) -> list[Job]:
        sql = f"SELECT {_COLUMNS} FROM deletions WHERE tenant_id = ?"
        params: list[object] = [tenant_id]
        if project_id is not None:
            sql += " AND project_id = ?"
            params.append(project_id)
        rows = self.db.execute(sql + " ORDER BY created_at DESC, id LIMIT ?", (*params, limit))
        return [_job(tuple(r)) for r in rows]

    def unfinished(self) -> list[Job]:
        rows = self.db.execute(f"SELECT {_COLUMNS} FROM deletions WHERE state IN "
                               "('queued', 'running') ORDER BY created_at, id")
        return [_job(tuple(r)) for r in rows]

    def unacknowledged(self, node_id: str) -> list[Job]:
        """Jobs, whatever their state, that ``node_id`` has not acknowledged."""
        rows = self.db.execute(
            f"SELECT {_COLUMNS} FROM deletions d WHERE NOT EXISTS (SELECT 1 FROM "
            "deletion_acks a WHERE a.deletion_id = d.id AND a.node_id = ?) "
            "ORDER BY created_at, id", (node_id,))
        return [_job(tuple(r)) for r in rows]

    def recent(self, since: float) -> list[Job]:
        rows = self.db.execute(f"SELECT {_COLUMNS} FROM deletions WHERE created_at >= ? "
                               "ORDER BY created_at, id", (since,))
        return [_job(tuple(r)) for r in rows]

    def acknowledge(self, job_ids: Collection[str], node_id: str) -> None:
        now = time.time()
        with self.db.transaction():
            self.db.executemany(
                "INSERT INTO deletion_acks (deletion_id, node_id, at) VALUES (?, ?, ?) "
                "ON CONFLICT (deletion_id, node_id) DO NOTHING",
                [(job_id, node_id, now) for job_id in job_ids])

    def acks(self, job_id: str) -> set[str]:
        return {str(node) for (node,) in self.db.execute(
            "SELECT node_id FROM deletion_acks WHERE deletion_id = ?", (job_id,))}

    def add_counts(self, counts: dict[str, int], node_id: str) -> None:
        """In the transaction of the flush that left these rows out."""
        self.db.executemany(
            "INSERT INTO deletion_counts (deletion_id, node_id, rows) VALUES (?, ?, ?) "
            "ON CONFLICT (deletion_id, node_id) DO UPDATE SET "
            "rows = deletion_counts.rows + excluded.rows",
            [(job_id, node_id, n) for job_id, n in counts.items() if n])

    def buffered_rows(self, job_id: str) -> int:
        row = self.db.execute("SELECT coalesce(sum(rows), 0) FROM deletion_counts "
                              "WHERE deletion_id = ?", (job_id,)).fetchone()
        return int(row[0])

    def save(self, job: Job) -> None:
        """The job's state, phase, times and progress (in the caller's transaction, if any)."""
        self.db.execute(
            "UPDATE deletions SET state = ?, phase = ?, started_at = ?, purged_at = ?, "
            "result = ?, error = ? WHERE id = ?",
            (job.state, job.phase, job.started_at, job.purged_at,
             msgspec.json.encode(job.progress).decode(), job.error, job.id))

    def saved(self, job: Job, also: Callable[[], None] | None = None) -> None:
        with self.db.transaction():
            self.save(job)
            if also is not None:
                also()


class Erasures:
    """The deletions this node applies: flushes leave out the rows they select
    (``ingest.service``), and a deleted project's batches are refused."""

    def __init__(self, deletions: Deletions, node_id: str) -> None:
        self.deletions = deletions
        self.node_id = node_id
        self._jobs: dict[str, tuple[str, Selector]] = {}  # job id -> (project id, selector)
        self._since: dict[str, float] = {}  # job id -> when it was done (or seen done)
        self._gone: set[str] = set()

    def add(self, job: Job) -> None:
        if job.id not in self._jobs:
            self._jobs[job.id] = (job.project_id, job.selector)
            if job.purged_at is not None:
                self._since[job.id] = job.purged_at
        if job.selector.project:
            self._gone.add(job.project_id)

    def project_of(self, job_id: str) -> tuple[str, bool] | None:
        """The job's project, and whether the job deletes it."""
        found = self._jobs.get(job_id)
        return None if found is None else (found[0], found[1].project)

    def ended(self, job_id: str, now: float) -> None:
        """The job is done: :data:`KEEP_APPLYING_S` after that, stop filtering with it."""
        since = self._since.setdefault(job_id, now)
        if now - since >= KEEP_APPLYING_S:
            self._jobs.pop(job_id, None)
            self._since.pop(job_id, None)

    def applied(self) -> Collection[str]:
        return list(self._jobs)

    def gone(self, project_id: str) -> bool:
        return project_id in self._gone

    def keep(self, project_id: str, table: pa.Table) -> tuple[pa.Table, dict[str, int]]:
        """``table`` (rows of ``project_id``) without what any job selects, and how many
        rows each selected. Any thread."""
        mine = [(job_id, sel) for job_id, (p, sel) in list(self._jobs.items())
                if p == project_id]
        if mine and table.num_rows:  # rows made after a job are never its: no need to look
            first = pc.min(table["id"]).as_py()
            mine = [(job_id, sel) for job_id, sel in mine if sel.upto_id >= first]
        if not mine or table.num_rows == 0:
            return table, {}
        selected = np.zeros(table.num_rows, dtype=bool)
        counts = {}
        for job_id, sel in mine:
            mask = sel.mask(table)
            counts[job_id] = int(mask.sum())
            selected |= mask
        if not selected.any():
            return table, {}
        return table.filter(pa.array(~selected)), counts

    def counted(self, counts: dict[str, int]) -> Callable[[], None]:
        return lambda: self.deletions.add_counts(counts, self.node_id)


class Eraser:
    """This node's part of every job, and the phases of the jobs whose lease it holds."""

    def __init__(self, deletions: Deletions, erasures: Erasures, node_id: str,
                 catalog: Catalog, storage: Storage, service: IngestService,
                 artifacts: ArtifactStore, tenancy: Tenancy, tails: Tails,
                 live_nodes: Callable[[], Collection[str]], grace_s: float = 5.0,
                 bus: Bus | None = None, usage: Metering | None = None) -> None:
        self.deletions = deletions
        self.erasures = erasures
        self.node_id = node_id
        self.catalog = catalog
        self.storage = storage
        self.service = service
        self.artifacts = artifacts
        self.tenancy = tenancy
        self.tails = tails
        self.live_nodes = live_nodes  # this node and the others that are up
        self.grace_s = grace_s  # BOXTRAIL_DELETION_GRACE_S
        self.bus = bus  # in a cluster: the stream that carried the rows to the other nodes
        self.usage = usage  # where a finished job's rows are counted (deleted.events)
        self._acked: set[str] = set()
        self._waited: dict[str, bool] = {}  # done jobs: whether a node never acknowledged
        with patiently():  # at start, before the WAL replays: what its flushes must filter
            owed = deletions.unacknowledged(node_id)
            for job in owed + deletions.recent(time.time() - KEEP_APPLYING_S):
                erasures.add(job)
        self._owed = {job.id for job in owed}  # to apply here and acknowledge

    async def catch_up(self) -> None:
        """At start, before the node serves: apply the jobs it has not acknowledged."""
        try:
            await self._apply_here()
        except Exception as exc:  # storage down: the loop tries again
            log.warning("deletions could not be applied at start, will retry: %s", exc)

    async def run(self) -> None:
        said = 0.0  # when a failed round was last logged: once a minute through an outage
        while True:
            try:
                await self.round()
            except Exception as exc:
                if time.monotonic() - said > 60:
                    said = time.monotonic()
                    log.warning("deletion round failed, will retry every %g s: %s", POLL_S,
                                exc)
            await asyncio.sleep(POLL_S)

    async def round(self) -> None:
        """One pass: this node's part of new jobs, then the phases of jobs it can lease.
        The poll is a read with a request's terms (as the change feed's): against a catalog
        that hangs it gives up within a second, never holding the read connection for the
        reads of requests. What writes runs with a writer's (``patiently``)."""
        jobs = await asyncio.to_thread(self.deletions.unfinished)
        if not jobs and not self._owed and not self.erasures.applied():
            return  # nothing under way: the usual round, one read
        with patiently():
            await self._steps(jobs)

    async def _steps(self, jobs: list[Job]) -> None:
        for job in jobs:
            if job.id not in self._acked:
                self.erasures.add(job)
                self._owed.add(job.id)
        await self._apply_here()
        unfinished = {job.id for job in jobs}
        now = time.time()
        for job_id in self.erasures.applied():
            if job_id in unfinished or job_id in self._owed:
                continue
            if job_id not in self._waited:
                ended = await asyncio.to_thread(self.deletions.by_id, job_id)
                self._waited[job_id] = ended is None or bool(ended.progress.waited_for)
            # A job done without a node's acknowledgement: that node's rows (its WAL, and
            # copies of them held here) may come back, so this node keeps applying it until
            # it restarts (at start it reads only recent jobs and its own).
            if not self._waited[job_id]:
                self.erasures.ended(job_id, now)
        for job in jobs:
            lease = "deletion:" + job.id
            if not await asyncio.to_thread(self.catalog.try_lease, lease, LEASE_S):
                continue
            try:
                # As it is now: another node may have moved it on since the list was read.
                fresh = await asyncio.to_thread(self.deletions.by_id, job.id)
                if fresh is not None and fresh.state in ("queued", "running"):
                    await self._advance(fresh)
            except Exception as exc:
                log.warning("deletion %s: %s phase failed, will retry: %s", job.id,
                            job.phase, exc)
            finally:
                await asyncio.to_thread(self.catalog.release, lease)

    async def _apply_here(self) -> None:
        owed = sorted(self._owed - self._acked)
        if not owed:
            return
        await self.service.erase()
        for job_id in owed:
            found = self.erasures.project_of(job_id)
            if found is not None and found[1]:  # a project deletion
                self.tails.end_project(found[0])
                self.tenancy.changed(found[0])
        await asyncio.to_thread(self.deletions.acknowledge, owed, self.node_id)
        self._acked.update(owed)
        self._owed.difference_update(owed)

    # The job's own phases (this node holds its lease).

    async def _advance(self, job: Job) -> None:
        if job.state == "queued":
            job.state, job.started_at = "running", time.time()
            await asyncio.to_thread(self.deletions.saved, job)
        if job.phase == "nodes":
            if self._waiting(job) and time.time() - (job.started_at or 0) < WAIT_NODES_S:
                return
            job.phase = "files"
            await asyncio.to_thread(self.deletions.saved, job)
        if job.phase == "files":
            await asyncio.to_thread(self._files, job)
            job.progress.files_done_at = time.time()
            job.phase = "purge"
            await asyncio.to_thread(self.deletions.saved, job)
        if job.phase == "purge":
            done_at = job.progress.files_done_at or 0.0
            if time.time() < done_at + self.grace_s:
                return
            await self._purge(job, done_at)
            job.phase = "acks"
            await asyncio.to_thread(self.deletions.saved, job)
        if job.phase == "acks":
            acks = await asyncio.to_thread(self.deletions.acks, job.id)
            waiting = [n for n in self.live_nodes() if n not in acks]
            if waiting and time.time() - (job.started_at or 0) < WAIT_NODES_S:
                return
            if self.bus is not None:
                # The stream's entries from before the job (and a second after: a batch
                # given its ids before the job is published as it becomes durable) go
                # once no node needs them any more.
                trim_ms = int(job.created_at * 1000) + BUS_MARGIN_MS
                if time.time() * 1000 < trim_ms + self.bus.retain_s * 1000:
                    return
                await self.bus.trim_before(trim_ms)
            job.progress.removed.buffered_rows = await asyncio.to_thread(
                self.deletions.buffered_rows, job.id)
            job.progress.waited_for = sorted(waiting)
            job.state, job.purged_at = "done", time.time()
            removed = job.progress.removed
            counted = None if self.usage is None else self.usage.recorded(
                {(job.project_id, "", minute_of(int(job.purged_at * 1000)), "deleted.events",
                  "", ""): removed.rows + removed.buffered_rows}, job.tenant_id)
            await asyncio.to_thread(self.deletions.saved, job, counted)
            log.info("deletion %s done: %s", job.id, job.progress.removed)

    def _waiting(self, job: Job) -> list[str]:
        acks = self.deletions.acks(job.id)
        return [n for n in self.live_nodes() if n not in acks]

    def _files(self, job: Job) -> None:
        """The ``files`` phase (a thread): until a pass finds nothing more to remove. Files
        are read, filtered and written by :data:`FILE_THREADS` threads, a few ahead of the
        commits, which go one by one, in order."""
        sel = job.selector
        for _ in range(MAX_PASSES):
            files = [e for e in self.catalog.live_files(
                job.project_id, sel.since_ms if sel.since_ms is not None else 0,
                sel.until_ms - 1 if sel.until_ms is not None else 1 << 62, sel.box)
                if sel.may_touch(e.box, e.min_ts, e.max_ts, e.min_id)]
            stale = False
            with ThreadPoolExecutor(FILE_THREADS, thread_name_prefix="erase") as pool:
                ahead: deque[Future[_Prepared]] = deque()
                todo = iter(files)
                try:
                    while True:
                        while len(ahead) < 2 * FILE_THREADS and (entry := next(todo, None)):
                            ahead.append(pool.submit(self._prepare, sel, entry))
                        if not ahead:
                            break
                        prepared = ahead.popleft().result()
                        # Renewed as it goes: a long step keeps the job from a second runner.
                        if not self.catalog.try_lease("deletion:" + job.id, LEASE_S):
                            self._abandon(prepared)
                            raise RuntimeError("the job's lease was taken over")
                        try:
                            self._commit(job, prepared)
                        except StaleFiles:
                            stale = True  # another writer replaced it: the next pass sees it
                finally:  # what was written ahead of a failure is never published
                    for future in ahead:
                        if future.exception() is None:  # waits for it
                            self._abandon(future.result())
            if not stale:
                return
        raise RuntimeError(f"files kept changing under {MAX_PASSES} passes")

    def _prepare(self, sel: Selector, entry: FileEntry) -> _Prepared:
        """Read ``entry`` and, if it holds selected rows that not all of it is, write its
        copy without them (pending in the catalog first)."""
        if sel.whole_file(entry.box, entry.min_ts, entry.max_ts, entry.max_id):
            return _Prepared(entry, entry.rows, [])
        table = conform(pq.read_table(pa.BufferReader(self.storage.get(entry.key))),
                        entry.layout)
        kept, gone = keep(table, [sel])
        if not gone or kept.num_rows == 0:
            return _Prepared(entry, gone, [])
        written = []
        layout = written_layout(self.catalog.mirror is not None)  # as the flusher writes
        for new, part in partitions(entry.project_id, kept, layout):
            data = encode_parquet(part, layout)
            written.append((msgspec.structs.replace(new, bytes=len(data)), data))
        copies = [e for e, _ in written]
        self.catalog.add_pending(copies)
        prepared = _Prepared(entry, gone, copies)
        try:
            for new, data in written:
                self.storage.put(new.key, data)
        except Exception:
            self._abandon(prepared)
            raise
        return prepared

    def _commit(self, job: Job, prepared: _Prepared) -> None:
        entry, gone, copies = prepared.entry, prepared.gone, prepared.copies
        if not gone:
            return
        removed = job.progress.removed
        if copies:
            counts = msgspec.structs.replace(
                removed, rows=removed.rows + gone,
                files_rewritten=removed.files_rewritten + 1,
                bytes_deleted=removed.bytes_deleted + entry.bytes,
                bytes_written=removed.bytes_written + sum(c.bytes for c in copies))
        else:  # every row selected: the file goes whole
            counts = msgspec.structs.replace(
                removed, rows=removed.rows + gone, files_deleted=removed.files_deleted + 1,
                bytes_deleted=removed.bytes_deleted + entry.bytes)
        try:
            self._swap(job, [c.key for c in copies], entry, counts)
        except Exception:
            self._abandon(prepared)
            raise

    def _abandon(self, prepared: _Prepared) -> None:
        """A copy that will not be published: gone (or, failing that, left pending for the
        clean-up of a crashed write)."""
        if prepared.copies:
            with contextlib.suppress(Exception):
                for copy in prepared.copies:
                    self.storage.delete(copy.key)
                self.catalog.forget([c.key for c in prepared.copies])

    def _swap(self, job: Job, keys: list[str], old: FileEntry, counts: Removed) -> None:
        """``keys`` live and ``old`` retired, with the job's counts, in one transaction."""
        before = job.progress.removed
        job.progress.removed = counts
        try:
            self.catalog.publish(keys, retire=[old.key], also=lambda: self.deletions.save(job))
        except BaseException:
            job.progress.removed = before
            raise

    async def _purge(self, job: Job, done_at: float) -> None:
        removed = job.progress.removed
        mirror = self.catalog.mirror
        if mirror is not None:  # its older snapshots read the erased rows' files: gone
            def expire() -> None:
                with self.catalog.mirroring:  # not while this node publishes
                    mirror.expire(job.project_id, time.time())
            await asyncio.to_thread(expire)
        gone = await asyncio.to_thread(
            lambda: self.catalog.unheld(self.catalog.retired_of(job.project_id, done_at)))
        await asyncio.to_thread(self._delete, gone)
        await asyncio.to_thread(self.catalog.forget, gone)
        removed.objects_deleted += len(gone)
        if job.selector.project:
            if mirror is not None:  # its metadata is under the project's prefix too
                await asyncio.to_thread(mirror.drop, job.project_id)
            leftovers = await asyncio.to_thread(
                lambda: [i.key for i in self.storage.list(f"logs/project={job.project_id}/")])
            await asyncio.to_thread(self._delete, leftovers)
            await asyncio.to_thread(self.catalog.forget_project, job.project_id)
            removed.objects_deleted += len(leftovers)
            maps, objects = await self.artifacts.delete_project(job.project_id)
            removed.source_maps += maps
            removed.objects_deleted += objects

    def _delete(self, keys: list[str]) -> None:
        for key in keys:
            self.storage.delete(key)
