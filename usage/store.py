"""Usage in the metadata database: one row per (tenant, minute, project, box, kind, source,
reason) in ``usage_minutes``, each write adding to its quantity.

- :meth:`UsageStore.recorded`: ingest's tallies, added inside the transaction of the flush
  that publishes their rows (``ingest.service``), so they are exact across crashes.
- :meth:`UsageStore.run`: every second, what the readers noted (``core.usage.Meter``);
  every hour, a snapshot of each project's stored bytes (one node, by lease).
- :meth:`UsageStore.rows`: what ``GET /v1/usage`` and the outcomes read, summed per group.

The tenant of a row is its project's when the row is written, so a deleted project's usage
stays its tenant's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from core.usage import Meter, Tally
from metadata.catalog import Catalog
from metadata.db import Database
from metadata.postgres import patiently

log = logging.getLogger("boxtrail.usage")

WRITE_S = 1.0
SNAPSHOT_S = 3600  # storage is counted in byte-hours, one snapshot an hour
_SNAPSHOT_LEASE = "usage-storage"
_SNAPSHOT_MARK = "usage_snapshot_hour"  # cluster_settings: the last hour snapshotted

_ADD = (" ON CONFLICT (tenant_id, minute, project_id, box, kind, source, reason) "
        "DO UPDATE SET quantity = usage_minutes.quantity + excluded.quantity")
_COLUMNS = "tenant_id, minute, project_id, box, kind, source, reason, quantity"
# The project's tenant; a project deleted since its rows were accepted is its deletion job's.
_UPSERT = (f"INSERT INTO usage_minutes ({_COLUMNS}) VALUES (COALESCE((SELECT tenant_id FROM "
           f"projects WHERE id = ?), (SELECT MIN(tenant_id) FROM deletions WHERE project_id = "
           f"?), ''), ?, ?, ?, ?, ?, ?, ?){_ADD}")
_UPSERT_OF = f"INSERT INTO usage_minutes ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?){_ADD}"

# What a group may be made of, besides the time bucket and the kind.
GROUPS = ("project", "box", "source", "reason")
_COLUMN = {"project": "project_id", "box": "box", "source": "source", "reason": "reason"}


class UsageStore:
    def __init__(self, db: Database, catalog: Catalog, meter: Meter) -> None:
        self.db = db
        self.catalog = catalog
        self.meter = meter

    def recorded(self, tally: Tally, tenant_id: str | None = None) -> Callable[[], None]:
        """The step that adds ``tally``, for the caller's transaction; the tenant is each
        project's, or ``tenant_id`` (a project deleted already)."""
        if tenant_id is not None:
            given = [(tenant_id, minute, p, box, kind, source, reason, q)
                     for (p, box, minute, kind, source, reason), q in tally.items()]
            return lambda: self.db.executemany(_UPSERT_OF, given)
        rows = [(p, p, minute, p, box, kind, source, reason, q)
                for (p, box, minute, kind, source, reason), q in tally.items()]
        return lambda: self.db.executemany(_UPSERT, rows)

    def write(self, tally: Tally) -> None:
        if tally:
            with self.db.transaction():
                self.recorded(tally)()

    # The loop: the readers' tallies each second, the stored bytes each hour.

    async def run(self) -> None:
        with patiently():  # a writer's deadline for its catalog calls (metadata.postgres)
            last_snapshot = 0.0
            while True:
                await asyncio.sleep(WRITE_S)
                await self.write_meter()
                now = time.time()
                if now - last_snapshot >= 60:  # looks each minute; writes once an hour
                    last_snapshot = now
                    try:
                        await asyncio.to_thread(self.snapshot, int(now))
                    except Exception as exc:
                        log.warning("usage: storage snapshot failed, will retry: %s", exc)

    async def write_meter(self) -> None:
        tally = self.meter.take()
        try:
            await asyncio.to_thread(self.write, tally)
        except Exception as exc:
            self.meter.put_back(tally)
            log.warning("usage: could not write the readers' usage, will retry: %s", exc)

    def _snapshot_taken(self, hour: int) -> bool:
        row = self.db.execute("SELECT value FROM cluster_settings WHERE name = ?",
                              (_SNAPSHOT_MARK,)).fetchone()
        return row is not None and int(row[0]) >= hour

    def snapshot(self, now: int) -> bool:
        """Each project's stored bytes, once for the hour ``now`` is in, by one node:
        ``storage.parquet`` and ``storage.sourcemaps`` in byte-hours (bytes held x 1 h)."""
        hour = now // SNAPSHOT_S * SNAPSHOT_S
        if self._snapshot_taken(hour) or not self.catalog.try_lease(_SNAPSHOT_LEASE, 300):
            return False
        parquet = self.db.execute(
            "SELECT project_id, SUM(bytes) FROM files WHERE state = 'live' "
            "GROUP BY project_id").fetchall()
        maps = self.db.execute(
            "SELECT project_id, SUM(js_bytes + map_bytes) FROM sourcemap_artifacts "
            "GROUP BY project_id").fetchall()
        tally: Tally = {}
        for kind, found in (("storage.parquet", parquet), ("storage.sourcemaps", maps)):
            for project_id, size in found:
                tally[(project_id, "", hour, kind, "", "")] = int(size or 0)
        with self.db.transaction():
            self.db.serialize(_SNAPSHOT_MARK)
            # Twice in one hour (a lease lost mid-way) would count twice: once only.
            if self._snapshot_taken(hour):
                return False
            if tally:
                self.recorded(tally)()
            self.db.execute(
                "INSERT INTO cluster_settings (name, value) VALUES (?, ?) ON CONFLICT (name) "
                "DO UPDATE SET value = excluded.value", (_SNAPSHOT_MARK, str(hour)))
        return True

    # Reads.

    def rows(self, tenant_id: str, since_s: int, until_s: int, bucket_s: int,
             groups: Sequence[str], kinds: Sequence[str] = (),
             project_id: str | None = None, box: str | None = None,
             limit: int = 1000, offset: int = 0) -> list[tuple[object, ...]]:
        """``(at, kind, *groups, quantity)`` summed per bucket of ``bucket_s`` seconds, in
        time order."""
        columns = [_COLUMN[g] for g in groups]
        where = ["tenant_id = ?", "minute >= ?", "minute < ?"]
        params: list[object] = [tenant_id, since_s, until_s]
        if kinds:
            where.append(f"kind IN ({', '.join('?' * len(kinds))})")
            params += kinds
        if project_id is not None:
            where.append("project_id = ?")
            params.append(project_id)
        if box is not None:
            where.append("box = ?")
            params.append(box)
        keys = ", ".join(["kind", *columns])
        sql = (f"SELECT (minute / {int(bucket_s)}) * {int(bucket_s)} AS at, {keys}, "
               f"SUM(quantity) FROM usage_minutes WHERE {' AND '.join(where)} "
               f"GROUP BY at, {keys} ORDER BY at, {keys} LIMIT ? OFFSET ?")
        return [tuple(r) for r in self.db.execute(sql, (*params, limit, offset)).fetchall()]

    def tenant_name(self, tenant_id: str) -> str:
        row = self.db.execute("SELECT name FROM tenants WHERE id = ?", (tenant_id,)).fetchone()
        return str(row[0]) if row is not None else tenant_id
