"""A table's history, in process: a file boxtrail retired stays while any snapshot reads it
(time travel to before a compaction still works), snapshots expire on the setting, only then
may the file go, and the sweep deletes the metadata no snapshot reads and nothing else."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest

from core.config import load
from core.schema import RowBatch, to_table
from core.storage import LocalStorage
from iceberg.tables import Tables, metadata_prefix, open_tables
from iceberg.upkeep import Upkeep
from ingest.flusher import encode_parquet, partitions
from metadata.catalog import Catalog, FileEntry
from metadata.sqlite import Sqlite

NOW_MS = int(time.time() * 1000)


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[Catalog, Tables, LocalStorage]]:
    config = load({"BOXTRAIL_DATA_DIR": str(tmp_path), "BOXTRAIL_ICEBERG": "on"})
    db = Sqlite(tmp_path / "meta.sqlite")
    storage = LocalStorage(str(tmp_path / "objects"))
    catalog = Catalog(db, "n1")
    tables = open_tables(config, db)
    catalog.mirror = tables
    yield catalog, tables, storage
    tables.close()
    db.close()


def write(catalog: Catalog, storage: LocalStorage, first_id: int, n: int) -> FileEntry:
    """A file of ``n`` rows of box b1, written and pending, as a flush leaves it."""
    batch = RowBatch(project_id="p1", box="b1", session_id=None, release=None,
                     user_agent=None, sdk=None, debug_ids=None, received=NOW_MS,
                     id_start=first_id, ts=[NOW_MS + i for i in range(n)],
                     level=["info"] * n, message=[f"m{first_id + i}" for i in range(n)],
                     url=[None] * n, attrs=[None] * n, error_type=[None] * n,
                     error_message=[None] * n, error_stack=[None] * n, truncated=[None] * n)
    [(entry, part)] = partitions("p1", to_table([batch]))
    data = encode_parquet(part)
    entry = msgspec.structs.replace(entry, bytes=len(data))
    catalog.add_pending([entry])
    storage.put(entry.key, data)
    return entry


ALL = sorted(f"m{i}" for i in range(30))


def messages(table: pa.Table) -> list[str]:
    return sorted(table["message"].to_pylist())


def test_a_retired_file_goes_only_once_no_snapshot_reads_it(
        parts: tuple[Catalog, Tables, LocalStorage]) -> None:
    catalog, tables, storage = parts
    small = [write(catalog, storage, 10 * i, 10) for i in range(3)]
    for entry in small:  # three flushes
        catalog.publish([entry.key])
    merged = write(catalog, storage, 0, 30)  # their rows, as compaction writes them
    catalog.publish([merged.key], retire=[e.key for e in small])
    table = tables.table("p1", create=False)
    assert table is not None
    assert len(table.snapshots()) == 4
    assert messages(table.scan().to_arrow()) == ALL
    before = table.snapshots()[2].snapshot_id  # time travel: the three small files
    assert messages(table.scan(snapshot_id=before).to_arrow()) == ALL

    keys = [e.key for e in small]
    assert catalog.unheld(keys) == []  # older snapshots read them: they stay
    upkeep = Upkeep(tables, catalog, storage, retain_s=3600)
    upkeep.round()  # none older than an hour
    assert catalog.unheld(keys) == []
    upkeep = Upkeep(tables, catalog, storage, retain_s=0)
    time.sleep(0.01)
    upkeep.round()  # every snapshot but the current one expires
    table = tables.table("p1", create=False)
    assert table is not None
    assert [s.snapshot_id for s in table.snapshots()] == [table.metadata.current_snapshot_id]
    assert catalog.unheld(keys) == keys
    assert catalog.unheld([merged.key]) == []  # the current snapshot reads it

    listed = {i.key for i in storage.list(metadata_prefix("p1"))}
    assert upkeep.sweep("p1", time.time() + 1, grace_s=3600) == 0  # not unread long enough
    swept = upkeep.sweep("p1", time.time() + 7200, grace_s=3600)
    kept = {i.key for i in storage.list(metadata_prefix("p1"))}
    assert swept == len(listed - kept) > 0
    assert {tables.key(u) for u in tables.metadata_files(table)} <= kept
    table = tables.table("p1", create=False)
    assert table is not None and messages(table.scan().to_arrow()) == ALL


def test_manifests_read_with_readers_kept_per_schema_are_what_pyiceberg_reads(
        parts: tuple[Catalog, Tables, LocalStorage]) -> None:
    from iceberg.tables import _ENTRIES, _LIST, _read

    catalog, tables, storage = parts
    small = [write(catalog, storage, 10 * i, 10) for i in range(3)]
    for entry in small:
        catalog.publish([entry.key])
    merged = write(catalog, storage, 0, 30)
    catalog.publish([merged.key], retire=[e.key for e in small])  # entries DELETED too
    table = tables.table("p1", create=False)
    assert table is not None
    statuses = set()
    for snapshot in table.snapshots():
        ours = _read(table.io, snapshot.manifest_list, _LIST)
        assert ours == list(snapshot.manifests(table.io))
        for manifest in ours:
            theirs = manifest.fetch_manifest_entry(table.io, discard_deleted=False)
            mine = _read(table.io, manifest.manifest_path, _ENTRIES)
            assert [(e.status, e.data_file.file_path, e.data_file.partition,
                     e.data_file.record_count, e.data_file.file_size_in_bytes) for e in mine] \
                == [(e.status, e.data_file.file_path, e.data_file.partition,
                     e.data_file.record_count, e.data_file.file_size_in_bytes) for e in theirs]
            statuses |= {e.status.name for e in mine}
    assert {"ADDED", "DELETED"} <= statuses  # both kinds of entry were compared
