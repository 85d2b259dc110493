"""The file catalog: every Parquet file with its project, box, date, time range and size.

Queries never list storage: they ask the catalog for the live files whose
``[min_ts, max_ts]`` overlaps the requested range, so the cost of "last 10 minutes"
does not grow with a project's history. Files move pending -> live -> retired;
the WAL position a flush covers is committed in the same transaction that makes
its files live, so a replay after a crash never duplicates rows.

One catalog serves every node of a cluster (``metadata.db``: SQLite for one node,
PostgreSQL for many). What is a node's own is keyed by its id: its WAL position, and the
files it is writing (``pending``), which only it removes at start. A compaction runs under
a lease (:meth:`Catalog.try_lease`), and its publish retires only files that are still
live: of two compactions of the same files, whatever their timing, one wins and the
other's output is thrown away (:class:`StaleFiles`), so no row is ever live twice.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Protocol

import msgspec

from core.schema import LAYOUT
from metadata.db import Database, MetadataUnavailable


class FileEntry(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    project_id: str
    box: str
    date: str
    min_ts: int
    max_ts: int
    min_id: int
    max_id: int
    rows: int
    bytes: int
    layout: int = LAYOUT  # the SCHEMA columns it has (core.schema.LAYOUT)


class StaleFiles(Exception):
    """A publish would retire files that are no longer live (another node's compaction
    retired them first), or make live files that are no longer pending; nothing changed."""


class UnseenDeletion(StaleFiles):
    """A flush's publish found a deletion job this node has not applied; nothing changed."""


class MirrorMoved(Exception):
    """A mirror's table changed between its staging and the publish; nothing changed."""


class Staged(Protocol):
    """A mirror's prepared change."""

    def __call__(self) -> None:
        """Commit it, inside :meth:`Catalog.publish`'s transaction, raising
        :class:`MirrorMoved` if the mirror changed since it was prepared."""

    def abandon(self) -> None:
        """Forget it: the transaction it was for did not commit."""


class Mirror(Protocol):
    """Another catalog over the same files, changed in the transaction that changes this
    one (``iceberg``: the projects' Iceberg tables)."""

    def stage(self, made: Sequence[FileEntry], gone: Sequence[str]) -> Staged:
        """Prepare the change that makes ``made`` live and retires ``gone`` (keys)."""
        ...

    def held(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` (retired files) the mirror still reads: not to be deleted."""
        ...

    def expire(self, project_id: str, before: float) -> int:
        """Let go of the project's history from before ``before`` (epoch seconds), so the
        files only it read are no longer :meth:`held`."""
        ...

    def drop(self, project_id: str) -> None:
        """Forget a deleted project."""
        ...


_COLUMNS = "key, project_id, box, date, min_ts, max_ts, min_id, max_id, rows, bytes, layout"
_MARKS = ", ".join("?" * len(_COLUMNS.split(", ")))


def _entry(row: Sequence[object]) -> FileEntry:
    return FileEntry(**dict(zip(_COLUMNS.split(", "), row, strict=True)))  # type: ignore[arg-type]


def _both(first: Callable[[], None] | None, second: Callable[[], None]
          ) -> Callable[[], None]:
    def run() -> None:
        if first is not None:
            first()
        second()
    return run


def _in(values: Sequence[object]) -> str:
    return "(" + ", ".join("?" * len(values)) + ")"


# How many times a publish is staged again for a mirror that another commit changed.
MIRROR_TRIES = 8


class Catalog:
    # How old the positions :meth:`recent_positions` answers may be before it has them
    # read again (the bus's trim cadence, cluster.bus.TRIM_S).
    POSITIONS_REFRESH_S = 0.25

    def __init__(self, db: Database, node_id: str = "") -> None:
        self.db = db
        self.node_id = node_id
        self._recent: tuple[float, dict[str, tuple[int, dict[str, int]]]] | None = None
        self._reading: threading.Thread | None = None
        self.mirror: Mirror | None = None  # set by the app when one is on (iceberg)
        self.mirroring = threading.Lock()

    # This node's WAL state.

    def claim(self) -> None:
        """Take over what a metadata database from before cluster mode kept for its one
        node (node id ''). SQLite only: there, every row is this node's."""
        if self.db.dialect != "sqlite" or not self.node_id:
            return
        with self.db.transaction():
            if self.db.execute("SELECT 1 FROM wal_state WHERE node_id = ?",
                               (self.node_id,)).fetchone() is None:
                self.db.execute("UPDATE wal_state SET node_id = ? WHERE node_id = ''",
                                (self.node_id,))
            self.db.execute("DELETE FROM wal_state WHERE node_id = ''")
            self.db.execute("UPDATE files SET node_id = ? WHERE node_id = ''", (self.node_id,))

    def flushed_lsn(self) -> int:
        """The WAL position up to which every batch of this node is in Parquet."""
        row = self.db.execute("SELECT flushed_lsn FROM wal_state WHERE node_id = ?",
                              (self.node_id,)).fetchone()
        return int(row[0]) if row else 0

    def flushed_projects(self) -> dict[str, int]:
        """Per project, a WAL position past :meth:`flushed_lsn` up to which this node's
        batches of that project are in Parquet."""
        rows = self.db.execute(
            "SELECT project_id, flushed_lsn FROM wal_projects WHERE node_id = ?",
            (self.node_id,))
        return {str(project): int(lsn) for project, lsn in rows}

    def positions(self) -> dict[str, tuple[int, dict[str, int]]]:
        """Every node's WAL position and its projects' positions past it (``cluster.bus``)."""
        out: dict[str, tuple[int, dict[str, int]]] = {}
        for node, lsn in self.db.execute("SELECT node_id, flushed_lsn FROM wal_state"):
            out[str(node)] = (int(lsn), {})
        for node, project, lsn in self.db.execute(
                "SELECT node_id, project_id, flushed_lsn FROM wal_projects"):
            out.setdefault(str(node), (0, {}))[1][str(project)] = int(lsn)
        return out

    def recent_positions(self) -> dict[str, tuple[int, dict[str, int]]]:
        """:meth:`positions` as a thread last read them, never waiting for the catalog: for
        the bus, which reads them on the event loop every 0.25 s, and to which positions a
        little old only mean holding a batch a little longer. Each call past
        ``POSITIONS_REFRESH_S`` has them read again; MetadataUnavailable until the first
        read is in."""
        recent = self._recent
        due = recent is None or time.monotonic() - recent[0] >= self.POSITIONS_REFRESH_S
        if due and (self._reading is None or not self._reading.is_alive()):
            self._reading = threading.Thread(target=self._read_positions,
                                             name="catalog-positions", daemon=True)
            self._reading.start()
        if recent is None:
            raise MetadataUnavailable("the catalog's positions are not read yet")
        return recent[1]

    def _read_positions(self) -> None:
        started = time.monotonic()
        # Out of reach: the last positions stand, and the next call tries again.
        with contextlib.suppress(Exception):
            self._recent = (started, self.positions())

    def max_id(self) -> int:
        row = self.db.execute("SELECT max(max_id) FROM files").fetchone()
        return int(row[0] or 0)

    # Files.

    def add_pending(self, entries: Iterable[FileEntry]) -> None:
        """Record files about to be written, so a crash mid-write leaves no orphan behind."""
        now = time.time()
        rows = [(*msgspec.structs.astuple(e), now, self.node_id) for e in entries]
        with self.db.transaction():
            self.db.executemany(
                f"INSERT INTO files ({_COLUMNS}, state, changed_at, node_id) "
                f"VALUES ({_MARKS}, 'pending', ?, ?)", rows)

    def publish(self, keys: Sequence[str], *, retire: Sequence[str] = (),
                flushed_lsn: int | None = None,
                flushed_projects: dict[str, int] | None = None,
                applied: Collection[str] | None = None,
                also: Callable[[], None] | None = None) -> None:
        """Make written files live, retire the ones they replace and move this node's WAL
        position, in one transaction (with ``also``, the caller's own step). Raises
        :class:`StaleFiles`, changing nothing, if a file to retire is no longer live or a
        file to publish no longer pending.

        ``applied``: a flush's fence. The deletions this node filters its rows with
        (``erasure``); a deletion job under way that is not among them, nor acknowledged by
        this node, raises :class:`UnseenDeletion`: the node must learn of it before its
        rows reach Parquet, or it could write back rows the job has erased already.

        With a :attr:`mirror`, its change is staged first and committed in the same
        transaction; staged again if another commit changed the mirror meanwhile."""
        keys, retire = list(keys), list(retire)
        if self.mirror is None or not (keys or retire):
            self._publish(keys, retire, flushed_lsn, flushed_projects, applied, also)
            return
        for attempt in range(MIRROR_TRIES):
            # One at a time in this process (a flush, a compaction, a deletion's swap): a
            # change staged while another commits would be built on a stale table.
            with self.mirroring:
                staged = self.mirror.stage(self.pending(keys), retire)
                try:
                    self._publish(keys, retire, flushed_lsn, flushed_projects, applied,
                                  _both(also, staged))
                    return
                except MirrorMoved:  # another node's commit came first: stage again
                    staged.abandon()
                    if attempt + 1 == MIRROR_TRIES:
                        raise
                except StaleFiles:  # refused inside the transaction: surely not committed
                    staged.abandon()
                    raise

    def _publish(self, keys: list[str], retire: list[str], flushed_lsn: int | None,
                 flushed_projects: dict[str, int] | None, applied: Collection[str] | None,
                 also: Callable[[], None] | None) -> None:
        now = time.time()
        with self.db.transaction():
            if applied is not None:
                known = set(applied)
                for (job_id,) in self.db.execute(
                        "SELECT d.id FROM deletions d WHERE d.state IN ('queued', 'running') "
                        "AND NOT EXISTS (SELECT 1 FROM deletion_acks a WHERE "
                        "a.deletion_id = d.id AND a.node_id = ?)", (self.node_id,)):
                    if job_id not in known:
                        raise UnseenDeletion(f"deletion {job_id} is not applied here yet")
            if keys:
                made = self.db.execute(
                    f"UPDATE files SET state = 'live', changed_at = ? WHERE key IN {_in(keys)} "
                    "AND state = 'pending'", (now, *keys)).rowcount
                if made != len(keys):
                    raise StaleFiles(f"{len(keys) - made} of {len(keys)} written files are "
                                     "no longer pending")
            if retire:
                gone = self.db.execute(
                    f"UPDATE files SET state = 'retired', changed_at = ? WHERE key IN "
                    f"{_in(retire)} AND state = 'live'", (now, *retire)).rowcount
                if gone != len(retire):
                    raise StaleFiles(f"{len(retire) - gone} of {len(retire)} files to replace "
                                     "are no longer live")
            if flushed_lsn is not None:
                self.db.execute(
                    "INSERT INTO wal_state (node_id, flushed_lsn) VALUES (?, ?) "
                    "ON CONFLICT (node_id) DO UPDATE SET flushed_lsn = excluded.flushed_lsn "
                    "WHERE wal_state.flushed_lsn < excluded.flushed_lsn",
                    (self.node_id, flushed_lsn))
                # Positions at or below the node's own say nothing more.
                self.db.execute("DELETE FROM wal_projects WHERE node_id = ? AND flushed_lsn <= ?",
                                (self.node_id, flushed_lsn))
            ahead = {p: lsn for p, lsn in (flushed_projects or {}).items()
                     if flushed_lsn is None or lsn > flushed_lsn}
            if ahead:
                self.db.executemany(
                    "INSERT INTO wal_projects (node_id, project_id, flushed_lsn) VALUES (?, ?, ?) "
                    "ON CONFLICT (node_id, project_id) DO UPDATE SET "
                    "flushed_lsn = excluded.flushed_lsn "
                    "WHERE wal_projects.flushed_lsn < excluded.flushed_lsn",
                    [(self.node_id, p, lsn) for p, lsn in ahead.items()])
            if also is not None:
                also()

    def pending(self, keys: Sequence[str]) -> list[FileEntry]:
        """The entries of ``keys`` that are pending."""
        out: list[FileEntry] = []
        for start in range(0, len(keys), 500):
            part = list(keys[start:start + 500])
            out += [_entry(r) for r in self.db.execute(
                f"SELECT {_COLUMNS} FROM files WHERE state = 'pending' AND key IN {_in(part)}",
                part)]
        return out

    def unheld(self, keys: Sequence[str]) -> list[str]:
        """``keys`` (retired or abandoned files) but those a :attr:`mirror` still reads."""
        if self.mirror is None or not keys:
            return list(keys)
        held = self.mirror.held(keys)
        return [k for k in keys if k not in held]

    def forget(self, keys: Sequence[str]) -> None:
        keys = list(keys)
        with self.db.transaction():
            for start in range(0, len(keys), 500):
                part = keys[start:start + 500]
                self.db.execute(f"DELETE FROM files WHERE key IN {_in(part)}", part)

    def files_in_state(self, state: str, older_than: float | None = None,
                       *, own: bool = False) -> list[str]:
        """Keys of files in ``state`` changed at or before ``older_than`` (default: now);
        with ``own``, only this node's."""
        cutoff = time.time() if older_than is None else older_than
        sql = "SELECT key FROM files WHERE state = ? AND changed_at <= ?"
        params: list[object] = [state, cutoff]
        if own:
            sql += " AND node_id = ?"
            params.append(self.node_id)
        return [r[0] for r in self.db.execute(sql, params)]

    def retired_of(self, project_id: str, older_than: float) -> list[str]:
        """Keys of the project's retired files, retired at or before ``older_than``."""
        return [r[0] for r in self.db.execute(
            "SELECT key FROM files WHERE project_id = ? AND state = 'retired' "
            "AND changed_at <= ?", (project_id, older_than))]

    def forget_project(self, project_id: str) -> int:
        """Every file row of a deleted project, whatever its state (its objects are gone);
        a node's flush of it still pending then fails its publish."""
        with self.db.transaction():
            count: int = self.db.execute("DELETE FROM files WHERE project_id = ?",
                                         (project_id,)).rowcount
        return count

    def live_files(self, project_id: str, min_ts: int, max_ts: int,
                   box: str | None = None) -> list[FileEntry]:
        """Live files of a project that may hold rows with ``min_ts <= ts <= max_ts``."""
        sql = (f"SELECT {_COLUMNS} FROM files WHERE state = 'live' AND project_id = ? "
               "AND max_ts >= ? AND min_ts <= ?")
        params: list[object] = [project_id, min_ts, max_ts]
        if box is not None:
            sql += " AND box = ?"
            params.append(box)
        return [_entry(r) for r in self.db.execute(sql + " ORDER BY max_ts DESC", params)]

    def live_files_after(self, project_id: str, after_id: int,
                         box: str | None = None) -> list[FileEntry]:
        """Live files of a project holding rows with ids above ``after_id`` (tail resume)."""
        sql = (f"SELECT {_COLUMNS} FROM files WHERE state = 'live' AND project_id = ? "
               "AND max_id > ?")
        params: list[object] = [project_id, after_id]
        if box is not None:
            sql += " AND box = ?"
            params.append(box)
        return [_entry(r) for r in self.db.execute(sql + " ORDER BY min_id", params)]

    def live_projects(self) -> list[str]:
        return [r[0] for r in self.db.execute(
            "SELECT DISTINCT project_id FROM files WHERE state = 'live'")]

    def count_live(self, project_id: str | None = None) -> int:
        if project_id is None:
            row = self.db.execute("SELECT count(*) FROM files WHERE state = 'live'").fetchone()
        else:
            row = self.db.execute(
                "SELECT count(*) FROM files WHERE state = 'live' AND project_id = ?",
                (project_id,)).fetchone()
        return int(row[0])

    def small_partitions(self, min_files: int, max_bytes: int, max_rows: int
                         ) -> list[tuple[str, str, str]]:
        """(project, box, date) partitions with at least ``min_files`` small live files
        (under ``max_bytes`` and ``max_rows``)."""
        rows = self.db.execute(
            "SELECT project_id, box, date FROM files WHERE state = 'live' AND bytes < ? "
            "AND rows < ? GROUP BY project_id, box, date HAVING count(*) >= ?",
            (max_bytes, max_rows, min_files),
        )
        return [(r[0], r[1], r[2]) for r in rows]

    def partition_files(self, project_id: str, box: str, date: str, max_bytes: int,
                        max_rows: int, limit: int = 1000, *, below_layout: int | None = None
                        ) -> list[FileEntry]:
        """The partition's live files under ``max_bytes`` and ``max_rows``; with
        ``below_layout``, its files of an older layout instead, whatever their size."""
        if below_layout is not None:
            rows = self.db.execute(
                f"SELECT {_COLUMNS} FROM files WHERE state = 'live' AND project_id = ? "
                "AND box = ? AND date = ? AND layout < ? ORDER BY min_ts, key LIMIT ?",
                (project_id, box, date, below_layout, limit))
            return [_entry(r) for r in rows]
        rows = self.db.execute(
            f"SELECT {_COLUMNS} FROM files WHERE state = 'live' AND project_id = ? AND box = ? "
            "AND date = ? AND bytes < ? AND rows < ? ORDER BY min_ts, key LIMIT ?",
            (project_id, box, date, max_bytes, max_rows, limit),
        )
        return [_entry(r) for r in rows]

    def old_layout_partitions(self, layout: int, limit: int = 100
                              ) -> list[tuple[str, str, str]]:
        """(project, box, date) partitions with live files of a layout before ``layout``."""
        rows = self.db.execute(
            "SELECT DISTINCT project_id, box, date FROM files WHERE state = 'live' "
            "AND layout < ? LIMIT ?", (layout, limit))
        return [(r[0], r[1], r[2]) for r in rows]

    # Leases: a job that one node at a time should do.

    def try_lease(self, name: str, ttl_s: float) -> bool:
        """Hold ``name`` for ``ttl_s`` seconds (or renew it) unless another node holds it."""
        now = time.time()
        with self.db.transaction():
            taken = self.db.execute(
                "INSERT INTO leases (name, holder, expires_at) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, "
                "expires_at = excluded.expires_at "
                "WHERE leases.expires_at < ? OR leases.holder = excluded.holder",
                (name, self.node_id, now + ttl_s, now)).rowcount
        return taken == 1

    def release(self, name: str) -> None:
        with self.db.transaction():
            self.db.execute("DELETE FROM leases WHERE name = ? AND holder = ?",
                            (name, self.node_id))
