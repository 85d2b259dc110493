"""Keeping the tables in step with boxtrail's catalog, and their history bounded.

- :meth:`Upkeep.repair` (at start, before the node serves): every project's table lists
  exactly the project's live files. Publishes change both catalogs in one transaction
  (``iceberg.tables``), so this finds work only where the tables were off (turned on over
  existing data, or off for a while) or changed by hand; it adds what is missing and
  drops what is extra, compare-and-set like every change.
- :meth:`Upkeep.round` (under a lease, every ``ROUND_S``): snapshots older than
  ``BOXTRAIL_ICEBERG_SNAPSHOT_RETAIN_S`` expire; the metadata files no snapshot reads any
  more (old ``metadata.json``, manifest lists and manifests, and those a publish staged but
  never committed) are deleted once they have been seen unread for ``SWEEP_GRACE_S``, so
  a reader that loaded the table a moment before has time to finish. Data files are
  boxtrail's own: a retired file is deleted only once no snapshot reads it
  (``Catalog.unheld``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

from core.storage import Storage
from iceberg.tables import TableMoved, Tables, metadata_prefix
from metadata.catalog import MIRROR_TRIES, Catalog

log = logging.getLogger("boxtrail.iceberg")
_VERSION = re.compile(r"(\d+)-[^/]*\.metadata\.json$")

ROUND_S = 30.0
LEASE_S = 120.0
SWEEP_GRACE_S = 600.0


class Upkeep:
    def __init__(self, tables: Tables, catalog: Catalog, storage: Storage,
                 retain_s: float) -> None:
        self.tables = tables
        self.catalog = catalog
        self.storage = storage
        self.retain_s = retain_s
        self._unread: dict[str, float] = {}  # metadata key -> when first seen unread

    def repair(self) -> int:
        """Every table listing exactly its project's live files, and its ``metadata.json``
        the newest in its directory; return how many files were added or dropped."""
        changed = 0
        for project_id in sorted(set(self.catalog.live_projects()) | set(self.tables.projects())):
            changed += self._repair(project_id)
            self._past_strays(project_id)
        return changed

    def _past_strays(self, project_id: str) -> None:
        """A change staged by a process killed before its transaction committed left a
        ``metadata.json`` of the next version, which no snapshot reads, but which readers
        that take the newest version in the directory (ClickHouse's ``icebergLocal``) would
        take, with files never published: commit (a property) until the table's own is
        newer than every other."""
        for _ in range(MIRROR_TRIES):
            table = self.tables.table(project_id, create=False)
            if table is None:
                return
            current = metadata_version(table.metadata_location)
            others = [v for info in self.storage.list(metadata_prefix(project_id))
                      if (v := metadata_version(info.key)) >= current
                      and self.tables.uri(info.key) != table.metadata_location]
            if not others:
                return
            with self.catalog.mirroring:
                table.transaction().set_properties(
                    {"boxtrail.past-strays": str(time.time_ns())}).commit_transaction()
        log.warning("iceberg: the table of project %s kept changing while moving past "
                    "stray metadata", project_id)

    def _repair(self, project_id: str) -> int:
        for _ in range(MIRROR_TRIES):
            # The table first: a publish between the two reads moves its pointer, and the
            # change below then fails its compare-and-set and is made again.
            table = self.tables.table(project_id)
            assert table is not None
            listed = set(self.tables.data_files(table))
            live = {e.key: e for e in self.catalog.live_files(project_id, 0, 1 << 62)}
            missing = [e for key, e in live.items() if self.tables.uri(key) not in listed]
            extra = [k for k in (self.tables.key(u) for u in listed) if k is not None
                     and k not in live]
            if not missing and not extra:
                return 0
            with self.catalog.mirroring:  # as a publish does
                staged = self.tables.stage(missing, extra)
                try:
                    with self.catalog.db.transaction():
                        staged()
                except TableMoved:
                    staged.abandon()
                    continue
            log.info("iceberg: table of project %s repaired: %d files added, %d dropped",
                     project_id, len(missing), len(extra))
            return len(missing) + len(extra)
        raise TableMoved(f"the table of project {project_id} kept changing")

    def round(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        for project_id in self.tables.projects():
            with self.catalog.mirroring:  # not while this node publishes
                self.tables.expire(project_id, now - self.retain_s)
            self.sweep(project_id, now)

    def sweep(self, project_id: str, now: float, grace_s: float = SWEEP_GRACE_S) -> int:
        """Delete the project's metadata files that no snapshot reads, once seen unread for
        ``grace_s``; return how many."""
        table = self.tables.table(project_id, create=False)
        if table is None:
            return 0
        read = self.tables.metadata_files(table)
        prefix = metadata_prefix(project_id)
        gone = []
        for info in self.storage.list(prefix):
            if self.tables.uri(info.key) in read:
                self._unread.pop(info.key, None)
                continue
            first = self._unread.setdefault(info.key, now)
            if now - first >= grace_s:
                self.storage.delete(info.key)
                self._unread.pop(info.key)
                gone.append(info.key)
        return len(gone)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(ROUND_S)
            try:
                if await asyncio.to_thread(self.catalog.try_lease, "iceberg", LEASE_S):
                    await asyncio.to_thread(self.round)
            except Exception as exc:  # the catalog or storage out of reach: next round
                log.warning("iceberg upkeep failed, will retry: %s", exc)


def metadata_version(path: str) -> int:
    """The version in a ``metadata.json``'s name (``00042-<uuid>.metadata.json``), or -1."""
    match = _VERSION.search(path)
    return int(match.group(1)) if match else -1
