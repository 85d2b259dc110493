"""A table's history, in process: a file boxtrail retired stays while any snapshot reads it
(time travel to before a compaction still works), snapshots expire on the setting, only then
may the file go, and the sweep deletes the metadata no snapshot reads and nothing else."""

from __future__ import annotations

import time

import pyarrow as pa

from core.storage import LocalStorage
from iceberg.tables import Tables, metadata_prefix
from iceberg.upkeep import Upkeep
from metadata.catalog import Catalog
from tests.iceberg.parts import write

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
