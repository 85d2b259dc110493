"""The file catalog: every Parquet file with its project, box, date, time range and size.

Queries never list storage: they ask the catalog for the live files whose
``[min_ts, max_ts]`` overlaps the requested range, so the cost of "last 10 minutes"
does not grow with a project's history. Files move pending -> live -> retired;
the WAL position a flush covers is committed in the same transaction that makes
its files live, so a replay after a crash never duplicates rows.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable

import msgspec

from boxtrail.schema import LAYOUT


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
    layout: int = LAYOUT  # the SCHEMA columns it has (boxtrail.schema.LAYOUT)


_COLUMNS = "key, project_id, box, date, min_ts, max_ts, min_id, max_id, rows, bytes, layout"


def _entry(row: tuple[object, ...]) -> FileEntry:
    return FileEntry(**dict(zip(_COLUMNS.split(", "), row, strict=True)))  # type: ignore[arg-type]


class Catalog:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def flushed_lsn(self) -> int:
        return int(self.db.execute("SELECT flushed_lsn FROM wal_state").fetchone()[0])

    def max_id(self) -> int:
        row = self.db.execute("SELECT max(max_id) FROM files").fetchone()
        return int(row[0] or 0)

    def max_ids(self) -> dict[str, int]:
        """Per project, the highest event id in a live file: every batch of a project with
        ids up to it is in Parquet (a flush writes all of a project's buffered rows)."""
        rows = self.db.execute(
            "SELECT project_id, max(max_id) FROM files WHERE state = 'live' GROUP BY project_id")
        return {str(project): int(top) for project, top in rows}

    def add_pending(self, entries: Iterable[FileEntry]) -> None:
        """Record files about to be written, so a crash mid-write leaves no orphan behind."""
        now = time.time()
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany(
                f"INSERT INTO files ({_COLUMNS}, state, changed_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?)",
                [(*msgspec.structs.astuple(e), now) for e in entries],
            )

    def publish(self, keys: Iterable[str], *, retire: Iterable[str] = (),
                flushed_lsn: int | None = None) -> None:
        """Make written files live (and retire the ones they replace) in one transaction."""
        now = time.time()
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany("UPDATE files SET state = 'live', changed_at = ? WHERE key = ?",
                                [(now, k) for k in keys])
            self.db.executemany("UPDATE files SET state = 'retired', changed_at = ? WHERE key = ?",
                                [(now, k) for k in retire])
            if flushed_lsn is not None:
                self.db.execute("UPDATE wal_state SET flushed_lsn = max(flushed_lsn, ?)",
                                (flushed_lsn,))

    def forget(self, keys: Iterable[str]) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany("DELETE FROM files WHERE key = ?", [(k,) for k in keys])

    def files_in_state(self, state: str, older_than: float | None = None) -> list[str]:
        cutoff = time.time() if older_than is None else older_than
        rows = self.db.execute("SELECT key FROM files WHERE state = ? AND changed_at <= ?",
                               (state, cutoff))
        return [r[0] for r in rows]

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

    def count_live(self, project_id: str | None = None) -> int:
        if project_id is None:
            row = self.db.execute("SELECT count(*) FROM files WHERE state = 'live'").fetchone()
        else:
            row = self.db.execute(
                "SELECT count(*) FROM files WHERE state = 'live' AND project_id = ?",
                (project_id,)).fetchone()
        return int(row[0])

    def small_partitions(self, min_files: int, max_bytes: int
                         ) -> list[tuple[str, str, str]]:
        """(project, box, date) partitions with at least ``min_files`` small live files."""
        rows = self.db.execute(
            "SELECT project_id, box, date FROM files WHERE state = 'live' AND bytes < ? "
            "GROUP BY project_id, box, date HAVING count(*) >= ?",
            (max_bytes, min_files),
        )
        return [(r[0], r[1], r[2]) for r in rows]

    def partition_files(self, project_id: str, box: str, date: str, max_bytes: int
                        ) -> list[FileEntry]:
        rows = self.db.execute(
            f"SELECT {_COLUMNS} FROM files WHERE state = 'live' AND project_id = ? AND box = ? "
            "AND date = ? AND bytes < ? ORDER BY min_ts",
            (project_id, box, date, max_bytes),
        )
        return [_entry(r) for r in rows]
