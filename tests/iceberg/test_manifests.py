"""The manifests boxtrail writes itself, for speed, are the manifests pyiceberg writes.

A flush's change writes its manifest with a writer built once per schema and spec, in one
Avro block, and remembers the manifest list and each manifest's live files as it wrote
them instead of reading them back (``iceberg.tables``). Checked against pyiceberg's own
writer and reader: any entries (paths, boxes and bounds as an attacker may choose them)
read back field by field the same from both writers' files, with the same header; and
after many flushes, merges and a replace, every remembered manifest list is, field by
field, the file on disk, and every manifest's remembered files are those it lists."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.avro.file import AvroFile
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    write_manifest,
)
from pyiceberg.typedef import Record

from core.storage import LocalStorage
from iceberg.tables import (
    _ENTRIES,
    _LIST,
    SCHEMA,
    SPEC,
    Tables,
    _ManifestWriter,
    _read,
)
from metadata.catalog import Catalog
from tests.iceberg.parts import write

NOW_MS = int(time.time() * 1000)


def plain(value: Any) -> Any:
    """A record as nested tuples of its fields (pyiceberg's data files and manifests compare
    by path alone)."""
    if isinstance(value, Record):
        return tuple(plain(v) for v in value._data)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


counts = st.dictionaries(st.integers(1, 18), st.integers(0, 2**62), max_size=5)
bounds = st.dictionaries(st.integers(1, 18), st.binary(max_size=40), max_size=4)


@st.composite
def data_files(draw: st.DrawFn) -> DataFile:
    return DataFile.from_args(
        content=DataFileContent.DATA, file_format=FileFormat.PARQUET,
        file_path=draw(st.text(min_size=1, max_size=80)),
        partition=Record(draw(st.none() | st.text(max_size=30)), draw(st.integers(0, 10**6))),
        record_count=draw(st.integers(0, 2**62)),
        file_size_in_bytes=draw(st.integers(0, 2**62)),
        column_sizes=draw(counts), value_counts=draw(counts), null_value_counts=draw(counts),
        nan_value_counts=draw(counts), lower_bounds=draw(bounds), upper_bounds=draw(bounds),
        split_offsets=draw(st.lists(st.integers(0, 2**40), max_size=3)),
        sort_order_id=None, spec_id=0, equality_ids=None, key_metadata=None)


def written(writer_class: Any, path: Path, files: list[DataFile],
            statuses: list[ManifestEntryStatus]) -> tuple[Any, dict[str, str], list[Any]]:
    """The manifest file, header metadata and entries (as read back) of ``files`` written
    by ``writer_class``."""
    io = PyArrowFileIO()
    writer = writer_class(spec=SPEC, schema=SCHEMA, output_file=io.new_output(str(path)),
                          snapshot_id=7, avro_compression="deflate")
    with writer:
        for data_file, status in zip(files, statuses, strict=True):
            entry = ManifestEntry.from_args(status=status, snapshot_id=7, sequence_number=3,
                                            file_sequence_number=3, data_file=data_file)
            writer.add_entry(entry)
    manifest = writer.to_manifest_file()
    with AvroFile[Any](io.new_input(str(path))) as avro:
        meta = dict(avro.header.meta)
    entries = manifest.fetch_manifest_entry(io, discard_deleted=False)
    return manifest, meta, entries


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=st.lists(data_files(), min_size=1, max_size=6), data=st.data())
def test_a_manifest_written_here_reads_back_as_pyiceberg_writes_it(
        tmp_path_factory: pytest.TempPathFactory, files: list[DataFile], data: Any) -> None:
    statuses = data.draw(st.lists(st.sampled_from(list(ManifestEntryStatus)),
                                  min_size=len(files), max_size=len(files)))
    tmp = tmp_path_factory.mktemp("m")
    ours = written(_ManifestWriter, tmp / "ours.avro", files, statuses)
    theirs = written(lambda **kw: write_manifest(format_version=2, **kw),
                     tmp / "theirs.avro", files, statuses)
    assert plain(ours[2]) == plain(theirs[2])  # every field of every entry
    assert [e.status for e in ours[2]] == statuses
    assert ours[1] == theirs[1]  # the header: Avro schema, table schema, spec, codec
    mine, its = ours[0], theirs[0]
    assert mine.manifest_path != its.manifest_path
    # All but the path and length (one block, not one per entry): counts, partition
    # summaries, sequence numbers.
    assert plain(mine)[2:] == plain(its)[2:]


def test_every_manifest_list_kept_in_memory_is_the_file_written(
        parts: tuple[Catalog, Tables, LocalStorage]) -> None:
    catalog, tables, storage = parts
    made = []
    for flush in range(105):  # past pyiceberg's 100 manifests: the flushes' are merged
        entries = [write(catalog, storage, 1000 * flush + 10 * i, 3, box)
                   for i, box in enumerate(("b1", "b2"))]
        catalog.publish([e.key for e in entries])
        made += entries
    merged = write(catalog, storage, 10**6, 9)  # as compaction writes them
    catalog.publish([merged.key], retire=[e.key for e in made[:6:2]])
    table = tables.table("p1", create=False)
    assert table is not None
    snapshots = table.snapshots()
    assert len(snapshots) == 106
    counts = set()
    for snapshot in snapshots:
        kept = tables._manifests.of(table, snapshot)
        on_disk = _read(table.io, snapshot.manifest_list, _LIST)
        assert plain(list(kept)) == plain(on_disk)
        counts.add(len(on_disk))
        for manifest in on_disk:  # the live files each lists, kept as it was written
            listed = {e.data_file.file_path: (plain(e.data_file.partition),
                                              e.data_file.record_count,
                                              e.data_file.file_size_in_bytes)
                      for e in _read(table.io, manifest.manifest_path, _ENTRIES)
                      if e.status != ManifestEntryStatus.DELETED}
            remembered = tables._manifests.paths(table, manifest)
            assert {k: (plain(p), r, b) for k, (p, r, b) in remembered.items()} == listed
    assert max(counts) >= 99 and min(counts) <= 2  # merged along the way
    assert len(tables.data_files(table)) == 2 * 105 - 3 + 1
