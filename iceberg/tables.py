"""One Apache Iceberg table per project over the Parquet files boxtrail wrote, no byte copied.

The tables live in an Iceberg SQL catalog (pyiceberg's ``SqlCatalog``: the tables
``iceberg_tables`` and ``iceberg_namespace_properties``) inside boxtrail's own metadata
database, SQLite or PostgreSQL. That is what lets a change reach both catalogs at once:
:meth:`Tables.stage` writes the new Iceberg metadata (manifests, a manifest list, a
``metadata.json``) beside the data, which no reader sees yet, and returns the one statement
that moves the table's pointer to it (compare-and-set on the pointer it was built from);
``metadata.catalog.Catalog.publish`` runs that statement in the transaction that makes the
files live in boxtrail. Both commit or neither does, so no reader of the table sees a file
boxtrail has not published or has retired. A pointer another commit moved meanwhile fails
the statement (:class:`TableMoved`) and the publish is staged again.

A table's files are boxtrail's: ``<storage root>/logs/project=<id>/box=.../*.parquet``,
added by path. The table's location is the project's prefix, its metadata under
``<storage root>/logs/project=<id>/metadata/``. Its schema is
``core.schema.ROW`` (field ids in that order, ``ts`` and ``received`` as ``timestamptz``:
the files' millisecond timestamps read as such), columns found by name (the files carry no
field ids: the table's name mapping). It is partitioned by ``box`` (identity) and the day
of ``ts``: the partition of a file comes from boxtrail's catalog (its box and date), for
every file holds one box and one day (``ingest.flusher.partitions``), and the files have
no statistics on ``box`` that pyiceberg could infer it from. Column bounds are kept for
``id``, ``ts`` and ``level`` only, the columns the files have statistics for.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import date as date_type
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy.exc
from pyiceberg.avro.codecs import AVRO_CODEC_KEY, CODEC_MAPPING_ICEBERG_TO_AVRO
from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.file import (
    _SCHEMA_KEY,
    MAGIC,
    META_SCHEMA,
    SYNC_SIZE,
    AvroFile,
    AvroFileHeader,
    AvroOutputFile,
)
from pyiceberg.avro.reader import Reader
from pyiceberg.avro.resolver import (
    construct_reader,
    construct_writer,
    resolve_reader,
    resolve_writer,
)
from pyiceberg.avro.writer import Writer
from pyiceberg.catalog import Catalog as IcebergCatalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
)
from pyiceberg.io import FileIO, OutputFile
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_ENTRY_SCHEMAS,
    MANIFEST_LIST_FILE_SCHEMAS,
    UNASSIGNED_SEQ,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
    PartitionFieldSummary,
    _inherit_from_manifest,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import CommitTableResponse, Table, Transaction
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import Operation, Snapshot
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.table.update.snapshot import (
    ExpireSnapshots,
    _MergeAppendFiles,
    _OverwriteFiles,
    _SnapshotProducer,
)
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType
from pyiceberg.utils.concurrent import ExecutorFactory
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

from core.config import Config
from core.schema import ROW
from metadata.catalog import MIRROR_TRIES, FileEntry, MirrorMoved
from metadata.db import Database

NAMESPACE = "boxtrail"
EPOCH_DAY = date_type(1970, 1, 1)
CATALOG_NAME = "boxtrail"
BOUNDED = ("id", "ts", "level")  # the columns with statistics in every file (flusher)


def schema() -> Schema:
    """``core.schema.ROW`` as an Iceberg schema, field ids 1.. in its order."""
    types = {pa.int64(): LongType(), pa.string(): StringType()}
    fields = [NestedField(i, c.name, TimestamptzType() if pa.types.is_timestamp(c.type)
                          else types[c.type], required=not c.nullable)
              for i, c in enumerate(ROW, 1)]
    return Schema(*fields)


SCHEMA = schema()
SPEC = PartitionSpec(
    PartitionField(SCHEMA.find_field("box").field_id, 1000, IdentityTransform(), "box"),
    PartitionField(SCHEMA.find_field("ts").field_id, 1001, DayTransform(), "ts_day"))
PROPERTIES = {
    "schema.name-mapping.default": SCHEMA.name_mapping.model_dump_json(),
    "write.metadata.metrics.default": "none",
    **{f"write.metadata.metrics.column.{name}": "full" for name in BOUNDED},
    # Each flush appends a manifest; merged once enough have gathered.
    "commit.manifest-merge.enabled": "true",
    # The metadata log each metadata.json carries (the files themselves go with the sweep).
    "write.metadata.previous-versions-max": "20",
    # A compaction's or a deletion's replace retires the files it names, whatever a flush
    # added to the same partition meanwhile: no conflict (serializable, the default, failed
    # every compaction of a partition a flush had just written to).
    "write.update.isolation-level": "snapshot",
    "write.delete.isolation-level": "snapshot",
}
# Snapshots a table keeps at most, whatever BOXTRAIL_ICEBERG_SNAPSHOT_RETAIN_S says: staging a
# change copies the table's metadata, which grows with them (a flush every 5 s keeps 720 an
# hour: ~0.5 s a publish, measured; 100: ~0.1 s).
MAX_SNAPSHOTS = 100


class TableMoved(MirrorMoved):
    """A table's pointer is no longer the one a staged change was built on."""


@dataclass(frozen=True)
class Move:
    """A staged change of one table: its pointer from ``old`` to ``new``."""

    project_id: str
    old: str
    new: str


class Staged:
    """A staged change: :meth:`__call__` commits it (in the caller's transaction),
    :meth:`abandon` deletes its ``metadata.json`` once the transaction surely did not commit,
    so that readers that list the metadata directory for the newest version (ClickHouse's
    ``icebergLocal``) never take it for the table's."""

    def __init__(self, tables: Tables, moves: list[Move]) -> None:
        self.tables = tables
        self.moves = moves

    def __call__(self) -> None:
        self.tables.swap(self.moves)

    def abandon(self) -> None:
        for move in self.moves:
            with contextlib.suppress(OSError):  # left to the sweep
                self.tables.catalog._load_file_io(location=move.new).delete(move.new)


def day_of(date: str) -> int:
    """Days since 1970-01-01 of a ``YYYY-MM-DD`` date (Iceberg's ``day`` transform)."""
    return (date_type.fromisoformat(date) - EPOCH_DAY).days


def updated(base: TableMetadata, updates: Sequence[TableUpdate],
            metadata_location: str | None = None) -> TableMetadata:
    """``base`` with ``updates`` applied: pyiceberg's ``update_table_metadata`` (0.12) but
    for its last step, a deep copy of the whole result. That copy was 60% of a publish's CPU
    (profiled: three per change, each of every snapshot the table keeps), and nothing here
    changes a metadata object once built (pydantic models, frozen): each update makes a new
    one with new lists."""
    context = _TableMetadataUpdateContext()
    new = base
    for update in updates:
        new = _apply_table_update(update, new, context)
    if context.has_changes():
        if metadata_location:
            new = _update_table_metadata_log(new, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == new.last_updated_ms:
            new = new.model_copy(update={"last_updated_ms": int(time.time() * 1000)})
    new.spec().check_compatible(new.schema())
    new.sort_order().check_compatible(new.schema())
    return new


class _Transaction(Transaction):
    """pyiceberg's transaction, its metadata built once per change instead of at each read
    and without a deep copy (see :func:`updated`)."""

    _built: tuple[int, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        if self._built is None or self._built[0] != len(self._updates):
            self._built = (len(self._updates), updated(self._table.metadata, self._updates))
        return self._built[1]


class _Producing(_SnapshotProducer[Any]):
    """What boxtrail's snapshot producers change in pyiceberg's (0.12): the manifests a
    change writes are written by :class:`_ManifestWriter`, which remembers what they list
    in :class:`_Manifests`, and the manifests a merge rewrites are read by :func:`_read`,
    their readers built once, not at each file."""

    operation: Operation  # each producer's

    def __init__(self, manifests: _Manifests, table: Table, tx: Transaction,
                 properties: dict[str, str]) -> None:
        super().__init__(operation=self.operation, transaction=tx, io=table.io,
                         branch=MAIN_BRANCH, snapshot_properties=properties)
        self._listing = manifests
        self._table = table

    def new_manifest_writer(self, spec: PartitionSpec) -> ManifestWriterV2:
        if self._transaction.table_metadata.format_version != 2:
            return super().new_manifest_writer(spec)  # type: ignore[return-value]
        writer = _ManifestWriter(spec, self.schema(), self.new_manifest_output(),
                                 self._snapshot_id, self._compression)
        writer.listing = self._listing
        return writer

    def fetch_manifest_entry(self, manifest: ManifestFile, discard_deleted: bool = True
                             ) -> list[ManifestEntry]:
        return [_inherit_from_manifest(entry, manifest)
                for entry in _read(self._io, manifest.manifest_path, _ENTRIES)
                if not discard_deleted or entry.status != ManifestEntryStatus.DELETED]


class _Append(_Producing, _MergeAppendFiles):
    """pyiceberg's merging append (0.12), the table's current manifests taken from
    :class:`_Manifests` (pyiceberg read the manifest list again at each flush)."""

    operation = Operation.APPEND

    def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        self._listed = super()._process_manifests(manifests)
        return self._listed

    def _commit(self) -> Any:
        updates, requirements = super()._commit()
        added = updates[0]  # the snapshot, its manifest list just written
        assert isinstance(added, AddSnapshotUpdate)
        snapshot = added.snapshot
        self._listing.remember(snapshot.manifest_list,
                               [_as_listed(m, snapshot) for m in self._listed])
        return updates, requirements

    def _existing_manifests(self) -> list[ManifestFile]:
        if self._parent_snapshot_id is None:
            return []
        parent = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id)
        if parent is None:
            raise ValueError(f"snapshot {self._parent_snapshot_id} not found")
        return [m for m in self._listing.of(self._table, parent)
                if m.has_added_files() or m.has_existing_files()
                or m.added_snapshot_id == self._snapshot_id]


def _as_listed(manifest: ManifestFile, snapshot: Snapshot) -> ManifestFile:
    """``manifest`` as the manifest list of ``snapshot`` lists it: pyiceberg's v2 list writer
    gives the manifests this change wrote the snapshot's sequence number (0.12 does it in
    the objects themselves, through a shallow copy that shares their fields)."""
    number = snapshot.sequence_number
    assert number is not None  # always, in a v2 table
    if manifest.sequence_number == UNASSIGNED_SEQ:
        manifest.sequence_number = number
    if manifest.min_sequence_number == UNASSIGNED_SEQ:
        manifest.min_sequence_number = number
    return manifest


class _ManifestWriter(ManifestWriterV2):
    """pyiceberg's v2 manifest writer whose Avro writer, header schema and metadata are
    built once per table schema and partition spec (pyiceberg resolves a writer, converts
    the schema to Avro and serialises the table schema at each manifest: a third of writing
    a flush's manifest, profiled). With a ``listing``, the live files it lists are
    remembered there once it is written (a replace looks up which manifests list the files
    it retires, and the sweep which files any snapshot reads: neither reads it back)."""

    listing: _Manifests | None = None
    _live: dict[str, Listed] | None = None

    def add_entry(self, entry: ManifestEntry) -> ManifestWriterV2:
        super().add_entry(entry)
        if entry.status != ManifestEntryStatus.DELETED:
            if self._live is None:
                self._live = {}
            data_file = entry.data_file
            self._live[data_file.file_path] = (data_file.partition, data_file.record_count,
                                               data_file.file_size_in_bytes)
        return self

    def __exit__(self, exc_type: type[BaseException] | None,
                 exc_value: BaseException | None, traceback: TracebackType | None) -> None:
        super().__exit__(exc_type, exc_value, traceback)
        if exc_type is None and self.listing is not None:
            self.listing.remember_paths(self._output_file.location, self._live or {})

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        built = next((b for schema, spec, b in _built
                      if (schema is self._schema or schema == self._schema)
                      and (spec is self._spec or spec == self._spec)), None)
        if built is None:
            file_schema = self._with_partition(self.version)
            built = (resolve_writer(record_schema=self._with_partition(DEFAULT_READ_VERSION),
                                    file_schema=file_schema),
                     json.dumps(AvroSchemaConversion().iceberg_to_avro(
                         file_schema, schema_name="manifest_entry")),
                     self._meta)
            if len(_built) >= PARSED:
                _built.clear()
            _built.append((self._schema, self._spec, built))
        writer, avro_schema, meta = built
        meta = dict(meta)
        meta[AVRO_CODEC_KEY] = self._compression  # in its place: the same header as pyiceberg
        return _AvroOutput(self._output_file, writer, avro_schema, meta)


class _AvroOutput(AvroOutputFile[Any]):
    """pyiceberg's Avro output file, given its writer and header schema already built."""

    def __init__(self, output_file: OutputFile, writer: Writer, avro_schema: str,
                 metadata: dict[str, str]) -> None:
        self.output_file = output_file
        self.schema_name = "manifest_entry"
        self.sync_bytes = os.urandom(SYNC_SIZE)
        self.writer = writer
        self.metadata = metadata
        self._avro_schema = avro_schema

        self._pending: list[Any] = []

    def write_block(self, objects: list[Any]) -> None:
        """Kept, and written as one block when the file closes (pyiceberg's manifest writer
        makes a block of each entry, each compressed on its own)."""
        self._pending += objects

    def _write_pending(self) -> None:
        if self._pending:
            objects, self._pending = self._pending, []
            super().write_block(objects)

    def tell(self) -> int:
        self._write_pending()
        return super().tell()

    def __exit__(self, exctype: type[BaseException] | None, excinst: BaseException | None,
                 exctb: TracebackType | None) -> None:
        try:
            if exctype is None:
                self._write_pending()
        finally:
            super().__exit__(exctype, excinst, exctb)

    def _write_header(self) -> None:
        codec = self.metadata[AVRO_CODEC_KEY]
        codec = CODEC_MAPPING_ICEBERG_TO_AVRO.get(codec) or codec
        meta = {**self.metadata, _SCHEMA_KEY: self._avro_schema, AVRO_CODEC_KEY: codec}
        _META_WRITER.write(self.encoder, AvroFileHeader(MAGIC, meta, self.sync_bytes))


_built: list[tuple[Schema, PartitionSpec, tuple[Writer, str, dict[str, str]]]] = []
_META_WRITER = construct_writer(META_SCHEMA)


class _Replace(_Producing, _OverwriteFiles):
    """pyiceberg's overwrite (0.12), reading only the manifests that list a file it deletes.

    pyiceberg reads every manifest whose partition range may hold one, twice (for the
    entries it deletes, then to rewrite the manifests without them). A flush's manifest
    spans that day and the boxes it flushed, so a compaction of one box read every
    manifest of the day: 4% of the server's CPU under load, most of it parsing each
    manifest's Avro header. Which files a manifest lists is known (:class:`_Manifests`,
    read once per manifest: a manifest never changes)."""

    operation = Operation.OVERWRITE

    def _build_manifest_evaluator(self, spec_id: int) -> Callable[[ManifestFile], bool]:
        may_hold = super()._build_manifest_evaluator(spec_id)
        deleted = {f.file_path for f in self._deleted_data_files}

        def lists_one(manifest: ManifestFile) -> bool:
            if deleted.isdisjoint(self._listing.paths(self._table, manifest).keys()):
                return False
            return may_hold(manifest)

        return lists_one


class _Staging(SqlCatalog):
    """A SQL catalog whose ``commit_table``, inside :meth:`capturing`, writes the new
    metadata file and records the pointer's move instead of making it; and which parses a
    ``metadata.json`` once (a file is never rewritten: each version has its own name), not
    at every load of its table (each flush loads it)."""

    def __init__(self, name: str, **properties: str) -> None:
        super().__init__(name, **properties)
        self._local = threading.local()
        self._parsed: dict[str, TableMetadata] = {}
        self._parsed_lock = threading.Lock()

    def _remember(self, location: str, metadata: TableMetadata) -> None:
        with self._parsed_lock:
            if len(self._parsed) >= PARSED:  # old versions among them: start over
                self._parsed.clear()
            self._parsed[location] = metadata

    def _convert_orm_to_iceberg(self, orm_table: Any) -> Table:
        table = self.parsed(orm_table.table_name, orm_table.metadata_location)
        if table is None:
            table = super()._convert_orm_to_iceberg(orm_table)
            self._remember(table.metadata_location, table.metadata)
        return table

    def parsed(self, name: str, location: str | None) -> Table | None:
        """The table ``name`` at the ``metadata.json`` at ``location``, if parsed already."""
        with self._parsed_lock:
            metadata = self._parsed.get(location) if location else None
        if metadata is None or location is None:
            return None
        return Table(identifier=(NAMESPACE, name), metadata=metadata,
                     metadata_location=location,
                     io=self._load_file_io(metadata.properties, location), catalog=self)

    def capturing(self) -> list[Move]:
        moves: list[Move] = []
        self._local.moves = moves
        return moves

    def done_capturing(self) -> None:
        self._local.moves = None

    def commit_table(self, table: Table, requirements: Any, updates: Any
                     ) -> CommitTableResponse:
        moves: list[Move] | None = getattr(self._local, "moves", None)
        if moves is None:
            return super().commit_table(table, requirements, updates)
        # Built on the table as loaded: the pointer's compare-and-set finds out if it moved.
        for requirement in requirements:
            requirement.validate(table.metadata)
        metadata = updated(table.metadata, updates, table.metadata_location)
        location = load_location_provider(
            metadata.location, metadata.properties).new_table_metadata_file_location(
                self._parse_metadata_version(table.metadata_location) + 1)
        self._write_metadata(metadata=metadata,
                             io=self._load_file_io(metadata.properties, location),
                             metadata_path=location)
        self._remember(location, metadata)  # no pointer names it unless it commits
        moves.append(Move(IcebergCatalog.table_name_from(table.name()),
                          table.metadata_location, location))
        return CommitTableResponse(  # type: ignore[call-arg]  # by name, as pyiceberg's own
            metadata=metadata, metadata_location=location)


class Tables:
    """The projects' tables (see the module docstring). ``root``: the storage root as a URI
    (``file:///...`` or ``s3://bucket/prefix``); ``sql_url``: boxtrail's metadata database as
    a SQLAlchemy URL; ``io``: pyiceberg's FileIO properties (S3's endpoint, region)."""

    def __init__(self, db: Database, sql_url: str, root: str, io: dict[str, str]) -> None:
        # pyiceberg 0.12 evaluates manifests against a partition filter on its thread pool
        # with one evaluator that keeps the manifest it is looking at in itself: two threads
        # at once, and a replace missed the files it retires (1 run in 5 of
        # tests/iceberg/test_tables.py's busy compactions). One worker: no such race.
        os.environ["PYICEBERG_MAX_WORKERS"] = "1"
        ExecutorFactory._instance = None
        self.db = db
        self.root = root.rstrip("/")
        self._manifests = _Manifests()
        # The nodes of a cluster start at once: each may find the catalog's tables or the
        # namespace half made by another (a duplicate key); looking again finds them made.
        for attempt in range(5):
            try:
                self.catalog = _Staging(CATALOG_NAME, uri=sql_url, warehouse=self.root, **io)
                with contextlib.suppress(NamespaceAlreadyExistsError):
                    self.catalog.create_namespace(NAMESPACE)
                break
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
                if attempt == 4:
                    raise
                time.sleep(0.2)

    def close(self) -> None:
        self.catalog.engine.dispose()

    def uri(self, key: str) -> str:
        """A storage key's URI, as the tables name their files."""
        return f"{self.root}/{key}"

    def key(self, uri: str) -> str | None:
        """The storage key of a URI under the root, or None."""
        prefix = self.root + "/"
        return uri[len(prefix):] if uri.startswith(prefix) else None

    def location(self, project_id: str) -> str:
        """The table's location: the project's own prefix, which holds its data files
        (engines such as ClickHouse's ``icebergLocal`` read only files under it) and, in
        ``metadata/``, the table's metadata."""
        return f"{self.root}/{metadata_prefix(project_id).removesuffix('/metadata/')}"

    def table(self, project_id: str, *, create: bool = True) -> Table | None:
        # The pointer read here, not by pyiceberg's SQLAlchemy query (a tenth of staging a
        # flush's change, profiled); its metadata.json is parsed once in any case.
        row = self.db.execute(
            "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = ? AND "
            "table_namespace = ? AND table_name = ?",
            (CATALOG_NAME, NAMESPACE, project_id)).fetchone()
        if row is not None and (table := self.catalog.parsed(project_id, row[0])) is not None:
            return table
        ident = (NAMESPACE, project_id)
        try:
            return self.catalog.load_table(ident)
        except NoSuchTableError:
            if not create:
                return None
        return self.catalog.create_table_if_not_exists(
            ident, schema=SCHEMA, partition_spec=SPEC, location=self.location(project_id),
            properties=PROPERTIES)

    def projects(self) -> list[str]:
        return [IcebergCatalog.table_name_from(t) for t in self.catalog.list_tables(NAMESPACE)]

    def drop(self, project_id: str) -> None:
        """The project's table forgotten (its files are the deletion's to remove)."""
        with contextlib.suppress(NoSuchTableError):
            self.catalog.drop_table((NAMESPACE, project_id))

    def expire(self, project_id: str, before: float, keep: int = MAX_SNAPSHOTS) -> int:
        """Expire the table's snapshots made before ``before`` (epoch seconds) and those
        past the newest ``keep``, all but the current one; return how many. The files only
        they read are then no longer :meth:`held`, and boxtrail deletes them as it deletes
        retired files."""
        for _ in range(MIRROR_TRIES):
            table = self.table(project_id, create=False)
            if table is None:
                return 0
            current = table.metadata.current_snapshot_id
            newest = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms)[-keep:]
            kept = {s.snapshot_id for s in newest if s.timestamp_ms >= before * 1000}
            old = [s.snapshot_id for s in table.metadata.snapshots
                   if s.snapshot_id not in kept and s.snapshot_id != current]
            if not old:
                return 0
            try:
                # pyiceberg's own (table.maintenance) rebuilt and deep-copied the metadata
                # twice per snapshot named: ~30 ms each, a second a round (profiled).
                ExpireSnapshots(_Transaction(table, autocommit=True)).by_ids(old).commit()
            except CommitFailedException:
                continue  # a publish moved the table meanwhile: read it again
            return len(old)
        return 0

    # Changes.

    def stage(self, made: Sequence[FileEntry], gone: Iterable[str]) -> Staged:
        """The tables' change for files ``made`` live and files ``gone`` (keys) retired,
        written, and the statement that commits it (see the module docstring): to run
        inside the transaction that makes the same change in boxtrail's catalog."""
        by_project: dict[str, tuple[list[FileEntry], list[str]]] = {}
        for entry in made:
            by_project.setdefault(entry.project_id, ([], []))[0].append(entry)
        for key in gone:
            by_project.setdefault(project_of(key), ([], []))[1].append(key)
        moves: list[Move] = []
        for project_id, (added, removed) in by_project.items():
            moves += self._stage(project_id, added, removed)
        return Staged(self, moves)

    def _stage(self, project_id: str, added: list[FileEntry], removed: list[str]
               ) -> list[Move]:
        table = self.table(project_id)
        assert table is not None
        present = self._listed(table, {self.uri(k) for k in removed}) if removed else []
        metadata = table.metadata
        plan = compute_statistics_plan(metadata.schema(), metadata.properties)
        columns = parquet_path_to_id_mapping(metadata.schema())
        files = [self.data_file(table, e, plan, columns) for e in added]
        if not files and not present:
            return []
        moves = self.catalog.capturing()
        try:
            tx = _Transaction(table)
            properties = {"boxtrail.operation": "replace" if present else "append"}
            if present:
                with _Replace(self._manifests, table, tx, properties) as overwrite:
                    for data_file in present:
                        overwrite.delete_data_file(data_file)
                    for data_file in files:
                        overwrite.append_data_file(data_file)
            else:
                with _Append(self._manifests, table, tx, properties) as append:
                    for data_file in files:
                        append.append_data_file(data_file)
            tx.commit_transaction()
        finally:
            self.catalog.done_capturing()
        return moves

    def swap(self, moves: Sequence[Move]) -> None:
        """Move each table's pointer (inside the caller's transaction), or raise
        :class:`TableMoved` if one is no longer where its change was built."""
        for move in moves:
            moved = self.db.execute(
                "UPDATE iceberg_tables SET metadata_location = ?, "
                "previous_metadata_location = ? WHERE catalog_name = ? AND "
                "table_namespace = ? AND table_name = ? AND metadata_location = ?",
                (move.new, move.old, CATALOG_NAME, NAMESPACE, move.project_id, move.old)
            ).rowcount
            if moved != 1:
                raise TableMoved(f"the table of project {move.project_id} changed meanwhile")

    def held(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` a snapshot of their project's table still reads."""
        by_project: dict[str, list[str]] = {}
        for key in keys:
            if key.startswith("logs/project="):
                by_project.setdefault(project_of(key), []).append(key)
        out: set[str] = set()
        for project_id, group in by_project.items():
            table = self.table(project_id, create=False)
            if table is not None:
                read = self._manifests.files(table)
                out |= {k for k in group if self.uri(k) in read}
        return out

    def metadata_files(self, table: Table) -> set[str]:
        """The metadata files the table's current state reads: its ``metadata.json``, and
        each snapshot's manifest list and manifests."""
        out = {table.metadata_location}
        for snapshot in table.metadata.snapshots:
            out.add(snapshot.manifest_list)
            out |= {m.manifest_path for m in self._manifests.of(table, snapshot)}
        return out

    def data_file(self, table: Table, entry: FileEntry, plan: dict[int, Any],
                  columns: dict[str, int]) -> DataFile:
        """``entry``'s file as the table lists it: its footer's row count and bounds (of
        the columns ``plan`` names; ``columns``: the table's column ids by Parquet path),
        and its partition from the catalog."""
        uri = self.uri(entry.key)
        source = table.io.new_input(uri)
        with source.open() as stream:
            footer = pq.read_metadata(stream)
        metadata = table.metadata
        stats = data_file_statistics_from_parquet_metadata(
            parquet_metadata=footer, stats_columns=plan, parquet_column_mapping=columns)
        return DataFile.from_args(
            content=DataFileContent.DATA, file_path=uri, file_format=FileFormat.PARQUET,
            partition=Record(None if entry.box == "_" else entry.box, day_of(entry.date)),
            file_size_in_bytes=len(source), sort_order_id=None,
            spec_id=metadata.default_spec_id, equality_ids=None, key_metadata=None,
            **stats.to_serialized_dict())

    def _listed(self, table: Table, uris: set[str]) -> list[DataFile]:
        """Those of ``uris`` the table's current snapshot lists, as a replace names the files
        it deletes: pyiceberg finds them in the manifests by path, and the manifests that
        can hold them by partition, so a path and a partition are all it needs (found in
        :class:`_Manifests`' cache, no manifest read again: a compaction's replace read
        each manifest of the table three times, 4% of the server's CPU under load)."""
        snapshot = table.current_snapshot()
        if snapshot is None:
            return []
        out = []
        spec_id = table.metadata.default_spec_id  # the only spec a table ever has
        for manifest in self._manifests.of(table, snapshot):
            listed = self._manifests.paths(table, manifest)
            for uri in uris & listed.keys():
                partition, rows, size = listed[uri]
                named = DataFile.from_args(  # and what the snapshot's summary subtracts
                    content=DataFileContent.DATA, file_path=uri, partition=partition,
                    record_count=rows, file_size_in_bytes=size)
                named.spec_id = spec_id  # not a field: set as pyiceberg's reader sets it
                out.append(named)
        return out

    def data_files(self, table: Table, uris: set[str] | None = None) -> dict[str, DataFile]:
        """The data files of the table's current snapshot (those among ``uris``)."""
        snapshot = table.current_snapshot()
        if snapshot is None:
            return {}
        out = {}
        for manifest in self._manifests.of(table, snapshot):
            if uris is not None and uris.isdisjoint(self._manifests.paths(table, manifest)):
                continue  # none of them: not read again
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if uris is None or entry.data_file.file_path in uris:
                    out[entry.data_file.file_path] = entry.data_file
        return out


Listed = tuple[Record, int, int]  # a data file's partition, rows and bytes
PARSED = 64  # metadata.json versions remembered, at most (a few per table are in use)
CACHED = 20_000  # manifest lists and manifests remembered, at most


class _Manifests:
    """The manifests each snapshot lists and the data files each manifest lists (neither
    file ever changes: each is read once)."""

    def __init__(self) -> None:
        self._lists: dict[str, tuple[ManifestFile, ...]] = {}
        self._files: dict[str, dict[str, Listed]] = {}
        self._lock = threading.Lock()

    def remember(self, manifest_list: str, manifests: Sequence[ManifestFile]) -> None:
        """What the manifest list just written at ``manifest_list`` lists (it is not read
        back: the next flush starts from it)."""
        with self._lock:
            if len(self._lists) >= CACHED:
                self._lists.clear()
            self._lists[manifest_list] = tuple(manifests)

    def of(self, table: Table, snapshot: Snapshot) -> tuple[ManifestFile, ...]:
        with self._lock:
            listed = self._lists.get(snapshot.manifest_list)
        if listed is None:
            listed = tuple(_read(table.io, snapshot.manifest_list, _LIST))
            with self._lock:
                if len(self._lists) >= CACHED:  # expired snapshots' among them: start over
                    self._lists.clear()
                self._lists[snapshot.manifest_list] = listed
        return listed

    def remember_paths(self, manifest_path: str, listed: dict[str, Listed]) -> None:
        """What the manifest just written at ``manifest_path`` lists (see :meth:`paths`)."""
        with self._lock:
            if len(self._files) >= CACHED:
                self._files.clear()
            self._files[manifest_path] = listed

    def paths(self, table: Table, manifest: ManifestFile) -> dict[str, Listed]:
        """The live data files a manifest lists: by path, their partition, rows and size
        (not the ``DataFile`` objects: pyiceberg changes those it commits)."""
        path = manifest.manifest_path
        with self._lock:
            listed = self._files.get(path)
        if listed is None:
            listed = {e.data_file.file_path: (e.data_file.partition, e.data_file.record_count,
                                              e.data_file.file_size_in_bytes)
                      for e in _read(table.io, path, _ENTRIES)
                      if e.status != ManifestEntryStatus.DELETED}
            with self._lock:
                if len(self._files) >= CACHED:
                    self._files.clear()
                self._files[path] = listed
        return listed

    def files(self, table: Table) -> set[str]:
        """The data files that any snapshot of ``table`` reads."""
        out: set[str] = set()
        seen: set[str] = set()
        for snapshot in table.metadata.snapshots:
            for manifest in self.of(table, snapshot):
                if manifest.manifest_path not in seen:
                    seen.add(manifest.manifest_path)
                    out.update(self.paths(table, manifest))
        return out


# What a manifest list and a manifest are read as (pyiceberg's ``read_manifest_list`` and
# ``ManifestFile.fetch_manifest_entry``).
_LIST = (MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION],
         {-1: ManifestFile, 508: PartitionFieldSummary}, {517: ManifestContent})
_ENTRIES = (MANIFEST_ENTRY_SCHEMAS[DEFAULT_READ_VERSION], {-1: ManifestEntry, 2: DataFile},
            {0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent})
_HEADER = construct_reader(META_SCHEMA, {-1: AvroFileHeader})
_readers: dict[tuple[str, int], Reader] = {}  # by (the file's Avro schema, id of the read)


def _read(io: FileIO, path: str, read: tuple[Schema, dict[int, Any], dict[int, Any]]
          ) -> list[Any]:
    """The records of the Avro file at ``path``, as pyiceberg's ``AvroFile`` reads them, its
    reader built once per schema the files are written in (pyiceberg converts the header's
    schema and resolves a reader at each file: 70% of reading a manifest, profiled). A
    reader holds no state between records."""
    avro = AvroFile[Any](io.new_input(path), *read)
    with avro.input_file.open() as stream:
        avro.decoder = new_decoder(stream.read())
    avro.header = _HEADER.read(avro.decoder)
    key = (avro.header.meta.get(_SCHEMA_KEY, ""), id(read))
    reader = _readers.get(key)
    if reader is None:
        avro.schema = avro.header.get_schema()
        if len(_readers) >= PARSED:  # a few schemas in use at most; never grows unbounded
            _readers.clear()
        reader = _readers[key] = resolve_reader(avro.schema, read[0], read[1], read[2])
    avro.reader = reader
    return list(avro)


def open_tables(config: Config, db: Database) -> Tables:
    """The tables of ``BOXTRAIL_ICEBERG=on``: in the metadata database the config names,
    over its storage."""
    url = db.url
    if url.startswith("sqlite:"):
        sql_url = "sqlite:///" + os.path.abspath(url.removeprefix("sqlite:"))
    else:
        sql_url = "postgresql+psycopg://" + url.split("://", 1)[1]
    io: dict[str, str] = {}
    if config.storage == "s3":
        root = "s3://" + "/".join(p for p in (config.s3_bucket, config.s3_prefix.strip("/")) if p)
        io["s3.region"] = config.s3_region
        if config.s3_endpoint:
            io["s3.endpoint"] = config.s3_endpoint
    else:
        root = "file://" + os.path.abspath(os.path.join(config.data_dir, "objects"))
    return Tables(db, sql_url, root, io)


def metadata_prefix(project_id: str) -> str:
    """The storage prefix of a project's table metadata."""
    return f"logs/project={project_id}/metadata/"


def project_of(key: str) -> str:
    """The project of a data file's key (``logs/project=<id>/...``)."""
    first = key.split("/")[1]
    return first.removeprefix("project=")
