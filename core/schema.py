"""The log row: its Arrow/Parquet schema, its WAL form and event ids.

A :class:`RowBatch` is what ingest makes of one accepted request: context values
shared by the batch, and one list per column for its events. It is written to the
WAL as is (msgpack) and appended to the live buffer without another conversion.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TS = pa.timestamp("ms", tz="UTC")


@dataclass(frozen=True)
class Column:
    """One column of the log row. ``name``: in Parquet, SQL and :class:`RowBatch`;
    ``shared``: one value per batch (the request's context), else one per event; ``api``:
    the field of the API row it fills (``query.rows.Row``, camelCase, ``error.*`` inside
    its error), None where rows do not show it; ``since``: the file layout that added it."""

    name: str
    type: pa.DataType
    nullable: bool = True
    shared: bool = False
    api: str | None = None
    since: int = 1


# The log row, once: the Arrow/Parquet schema, the batch's shared and per-event fields, what
# a read selects for a row (query.rows) and a tail frame (query.frames) are derived from it.
ROW = (
    Column("id", pa.int64(), nullable=False, api="id"),  # from the batch's id_start
    Column("ts", TS, nullable=False, api="ts"),
    Column("received", TS, nullable=False, shared=True),
    Column("level", pa.string(), nullable=False, api="level"),
    Column("message", pa.string(), nullable=False, api="message"),
    Column("box", pa.string(), shared=True, api="boxId"),
    Column("url", pa.string(), api="url"),
    Column("session_id", pa.string(), shared=True, api="sessionId"),
    Column("release", pa.string(), shared=True, api="release"),
    Column("user_agent", pa.string(), shared=True),
    Column("sdk", pa.string(), shared=True),
    Column("debug_ids", pa.string(), shared=True),  # JSON object {scriptUrl: debugId}
    Column("attrs", pa.string(), api="attrs"),  # JSON object of scalars
    Column("error_type", pa.string(), api="error.type"),
    Column("error_message", pa.string(), api="error.message"),
    Column("error_stack", pa.string(), api="error.stack"),
    Column("truncated", pa.string(), api="truncated"),  # comma-separated names cut to size
    # An error's frames as the client sent them structured (Sentry's SDKs), innermost first:
    # JSON of ``symbolicate.stack.Frame``s, read instead of parsing ``error_stack``. Files
    # written before it existed have no such column: readers take it as NULL.
    Column("error_frames", pa.string(), since=2),
)

SCHEMA = pa.schema([pa.field(c.name, c.type, nullable=c.nullable) for c in ROW])
COLUMNS = tuple(SCHEMA.names)
# What a read selects to build an API row, in this order (query.rows.to_row).
READ = tuple(c.name for c in ROW if c.api is not None)

# A Parquet file's layout: which of SCHEMA's columns it has, and how (the catalog keeps it
# per file). Readers select a column a file lacks as NULL, so nothing reads its footer to
# find out. Layout 3 stores the timestamps in microseconds, the one unit Iceberg knows
# (Spark's Iceberg reader takes milliseconds for microseconds: iceberg); rows, the WAL and
# the live buffer keep milliseconds, and files of layouts 1 and 2 have them. Files are
# written in layout 3 where Iceberg tables read them, else in layout 2: microseconds cost
# 9% more bytes (measured on the benchmark's rows: docs/iceberg.md).
MICROS_SINCE = 3
LAYOUT = max(MICROS_SINCE, *(c.since for c in ROW))  # the newest


def written_layout(micros: bool) -> int:
    """The layout files are written in: with timestamps in microseconds, or not."""
    return LAYOUT if micros else MICROS_SINCE - 1
# Columns added after layout 1, and the layout that added them (strings: read as NULL
# VARCHAR where absent, query.engine).
ADDED_IN = {c.name: c.since for c in ROW if c.since > 1}
# SCHEMA as files of layout 3 hold it.
MICROS_SCHEMA = pa.schema([f.with_type(pa.timestamp("us", tz="UTC")) if f.type == TS else f
                           for f in SCHEMA])


def missing(layout: int) -> tuple[str, ...]:
    """SCHEMA's columns a file of ``layout`` does not have."""
    return tuple(name for name, since in ADDED_IN.items() if since > layout)


def conform(table: pa.Table, layout: int) -> pa.Table:
    """A Parquet file's table (of ``layout``) as SCHEMA: the columns it lacks as NULL, its
    timestamps in milliseconds."""
    for name in missing(layout):
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, SCHEMA.field(name).type))
    return table.select(SCHEMA.names).cast(SCHEMA)


class Strings(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """A string column as Arrow lays it out: int32 ``offsets`` (one more than rows) into
    ``data``, and a validity bitmap (None: no value is null). Written by the compiled core
    (``ingest/_core.c``); Arrow takes its buffers as they are."""

    offsets: bytes
    data: bytes
    valid: bytes | None = None

    def array(self, n: int) -> pa.Array:
        return pa.Array.from_buffers(pa.string(), n, [
            None if self.valid is None else pa.py_buffer(self.valid),
            pa.py_buffer(self.offsets), pa.py_buffer(self.data)])


class Packed(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """A batch's per-event columns as the compiled core made them: what ``RowBatch``'s lists
    hold for the other batches, in buffers the WAL writes and the seal hands to Arrow
    without a value-by-value pass in Python."""

    ts: bytes  # int64 epoch milliseconds, native order (little-endian: the hosts we run on)
    level: Strings
    message: Strings
    url: Strings  # null where the event had none: url_default stands in
    attrs: Strings
    error_type: Strings | None  # None: no event had an error
    error_message: Strings | None
    error_stack: Strings | None
    url_default: str | None  # the context's URL
    truncated: str | None  # every row's (the context's cut fields)

    def __len__(self) -> int:
        return len(self.ts) >> 3

    def array(self, name: str) -> pa.Array:
        """Column ``name`` (one of ``RowBatch``'s per-event ones) as Arrow."""
        n = len(self)
        if name == "ts":
            return pa.Array.from_buffers(TS, n, [None, pa.py_buffer(self.ts)])
        if name == "truncated":
            return (pa.nulls(n, pa.string()) if self.truncated is None
                    else pa.array([self.truncated] * n, pa.string()))
        strings: Strings | None = getattr(self, name, None)
        if strings is None:  # no errors, and never structured frames
            return pa.nulls(n, pa.string())
        column = strings.array(n)
        if name == "url" and self.url_default is not None and column.null_count:
            column = pc.fill_null(column, self.url_default)
        return column


class RowBatch(msgspec.Struct, array_like=True, gc=False, kw_only=True):
    lsn: int = 0  # set by the WAL
    project_id: str
    box: str | None
    session_id: str | None
    release: str | None
    user_agent: str | None
    sdk: str | None
    debug_ids: str | None
    received: int
    id_start: int  # events get ids id_start, id_start + 1, ...
    ts: list[int]
    level: list[str]
    message: list[str]
    url: list[str | None]
    attrs: list[str | None]
    error_type: list[str | None]
    error_message: list[str | None]
    error_stack: list[str | None]
    truncated: list[str | None]
    # Last, with a default: WAL records written before it existed decode without it. Empty
    # means NULL for every row (the common case: a stack sent as text).
    error_frames: list[str | None] = []
    # The step between the ids of the batch's events (ID_STEP; 1 in records written before
    # ids carried the node's number).
    id_step: int = 1
    # What usage counts of the request (core.usage.tally_batch); defaults in older records.
    source: str = ""  # the intake: ingest, envelope, store
    wire_bytes: int = 0  # the body as received ...
    body_bytes: int = 0  # ... and inflated
    rejected: dict[str, int] = {}  # events rejected alone, by reason
    # A refused request's record (no events): its reason and how many events it held.
    refused: str = ""
    refused_events: int = 0
    # Events the client says it dropped before sending, by reason (a Sentry client report).
    discarded: dict[str, int] = {}
    # The per-event columns in buffers, as the compiled core reads a body (the lists above
    # are then empty); None in every other batch, and in records written before it.
    packed: Packed | None = None

    def __len__(self) -> int:
        return len(self.ts) if self.packed is None else len(self.packed)

    @property
    def last_id(self) -> int:
        return self.id_start + (len(self) - 1) * self.id_step

    def ids(self) -> range:
        return range(self.id_start, self.id_start + len(self) * self.id_step, self.id_step)

    def column(self, name: str) -> list[Any]:
        """The values of per-event column ``name``, one per event (ts in epoch ms)."""
        if self.packed is not None:
            if name == "ts":
                return np.frombuffer(self.packed.ts, dtype=np.int64).tolist()  # type: ignore[no-any-return]
            return self.packed.array(name).to_pylist()  # type: ignore[no-any-return]
        values: list[Any] = getattr(self, name)
        return values or [None] * len(self.ts) if name == "error_frames" else values


# RowBatch fields (named as SCHEMA's columns): one value for the batch, or a list per event.
SHARED = tuple(c.name for c in ROW if c.shared)
_PER_EVENT = tuple(c.name for c in ROW if not c.shared and c.name != "id")


def to_table(batches: list[RowBatch]) -> pa.Table:
    """Columns of many batches as one Arrow table (the one place rows become Arrow).

    Values shared by a batch are built once per batch and spread with ``take``; the
    per-event lists are chained. About 0.4 us a row, half of the naive row loop.
    """
    counts = np.fromiter((len(b) for b in batches), dtype=np.int64, count=len(batches))
    total = int(counts.sum())
    owner = pa.array(np.repeat(np.arange(len(batches)), counts))
    starts = np.fromiter((b.id_start for b in batches), dtype=np.int64, count=len(batches))
    steps = np.fromiter((b.id_step for b in batches), dtype=np.int64, count=len(batches))
    offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    columns: dict[str, pa.Array] = {
        "id": pa.array(np.repeat(starts, counts) + offsets * np.repeat(steps, counts))}
    for name in SHARED:
        values = pa.array([getattr(b, name) for b in batches], type=SCHEMA.field(name).type)
        columns[name] = values.take(owner)
    if batches and all(b.packed is not None for b in batches):
        columns |= _packed_columns([b.packed for b in batches], counts, owner)  # type: ignore[misc]
    else:
        for name in _PER_EVENT:
            columns[name] = _mixed_column(batches, name)
    return pa.Table.from_arrays([columns[name] for name in COLUMNS], schema=SCHEMA)


def _mixed_column(batches: list[RowBatch], name: str) -> pa.Array:
    """Runs of batches with lists chained into one array each; packed ones as they are."""
    parts: list[pa.Array] = []
    listed: list[RowBatch] = []
    for b in [*batches, None]:
        if b is not None and b.packed is None:
            listed.append(b)
            continue
        if listed:
            parts.append(pa.array(list(itertools.chain.from_iterable(
                b.column(name) for b in listed)), type=SCHEMA.field(name).type))
            listed = []
        if b is not None and b.packed is not None:
            parts.append(b.packed.array(name))
    if not parts:
        return pa.array([], type=SCHEMA.field(name).type)
    return parts[0] if len(parts) == 1 else pa.concat_arrays(parts)


def _packed_columns(packs: list[Packed], counts: np.ndarray, owner: pa.Array
                    ) -> dict[str, pa.Array]:
    """The per-event columns of packed batches, each made once from the batches' buffers
    joined (what a seal of ~80 ingest requests does on the event loop: an Arrow array per
    batch and column, then a concatenation, cost three times as much)."""
    total = int(counts.sum())
    out = {"ts": pa.Array.from_buffers(TS, total, [None, pa.py_buffer(
        b"".join(p.ts for p in packs))])}
    for name in ("level", "message", "url", "attrs", "error_type", "error_message",
                 "error_stack"):
        out[name] = _joined([getattr(p, name) for p in packs], counts, total)
    defaults = [p.url_default for p in packs]
    if out["url"].null_count and any(d is not None for d in defaults):
        out["url"] = pc.coalesce(out["url"], pa.array(defaults, pa.string()).take(owner))
    out["truncated"] = pa.array([p.truncated for p in packs], pa.string()).take(owner)
    out["error_frames"] = pa.nulls(total, pa.string())
    return out


def _joined(columns: list[Strings | None], counts: np.ndarray, total: int) -> pa.Array:
    """String columns of consecutive batches as one array (None: a batch's all null), made
    with a few numpy operations over the batches' buffers joined, not one per batch."""
    present = [Strings(bytes(4 * (n + 1)), b"", bytes((n + 7) // 8)) if c is None else c
               for c, n in zip(columns, counts.tolist(), strict=True)]
    sizes = np.fromiter((len(c.data) for c in present), dtype=np.int64, count=len(present))
    if int(sizes.sum()) > np.iinfo(np.int32).max:  # past int32 offsets: Arrow says so
        return pa.concat_arrays([c.array(n) for c, n in zip(present, counts.tolist(),
                                                            strict=True)])
    # Each batch's offsets (n + 1 of them, from 0) moved by the bytes before it; the first
    # of each but the first batch's dropped (it repeats the previous batch's last).
    offsets = np.frombuffer(b"".join(c.offsets for c in present), dtype=np.int32)
    bases = np.cumsum(sizes) - sizes
    offsets = offsets + np.repeat(bases.astype(np.int32), counts + 1)
    starts = np.cumsum(counts + 1) - (counts + 1)
    keep = np.ones(len(offsets), dtype=bool)
    keep[starts[1:]] = False
    valid = None
    if any(c.valid is not None for c in present):
        # Each batch's bitmap is whole bytes: its first n bits are its rows.
        nbytes = (counts + 7) // 8
        bits = np.unpackbits(np.frombuffer(b"".join(
            c.valid if c.valid is not None else b"\xff" * int(k)
            for c, k in zip(present, nbytes.tolist(), strict=True)), dtype=np.uint8),
            bitorder="little")
        first = np.repeat(np.cumsum(nbytes * 8) - nbytes * 8, counts)
        row = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        valid = pa.py_buffer(np.packbits(bits[first + row], bitorder="little").tobytes())
    return pa.Array.from_buffers(pa.string(), total, [
        valid, pa.py_buffer(offsets[keep].tobytes()),
        pa.py_buffer(b"".join(c.data for c in present))])


# Event ids, unique across the nodes of a cluster and sortable by when they were made:
#
#     | 41 bits: ms since 2024-01-01 | 12 bits: sequence | 10 bits: node number |
#
# A node's ids grow in the order its rows become visible; a batch's events take
# consecutive values of the node's counter (ms and sequence), so their ids are ID_STEP
# apart. The node number (cluster.nodes: 1..1023) makes two nodes' ids differ even in
# the same millisecond. Ids are carried through the WAL, so replays keep them. Ids made
# before the node number existed (ms << 20 | sequence) are all below any made since.
ID_EPOCH_MS = 1_704_067_200_000
SEQ_BITS = 12
NODE_BITS = 10
ID_STEP = 1 << NODE_BITS


class IdGenerator:
    def __init__(self, node: int = 1) -> None:
        if not 0 < node < ID_STEP:
            raise ValueError(f"node number {node} is outside 1..{ID_STEP - 1}")
        self.node = node
        self.last = 0  # the counter (ms << SEQ_BITS | sequence) of the last id given

    def advance_past(self, used: int) -> None:
        """Give only ids above ``used`` (any node's id) from now on."""
        self.last = max(self.last, used >> NODE_BITS)

    def take(self, n: int) -> int:
        """Reserve ``n`` ids (``ID_STEP`` apart) greater than any given before; return the
        first."""
        now = (int(time.time() * 1000) - ID_EPOCH_MS) << SEQ_BITS
        start = max(now, self.last + 1)
        self.last = start + n - 1
        return (start << NODE_BITS) | self.node

    def floor(self) -> int:
        """An id that every id this generator gives from now on is above (no id is
        reserved by this call; the clock's present is taken as given)."""
        self.last = max(self.last, (int(time.time() * 1000) - ID_EPOCH_MS) << SEQ_BITS)
        return (self.last << NODE_BITS) | (ID_STEP - 1)


def format_id(event_id: int) -> str:
    return f"{event_id:016x}"


def parse_id(text: str) -> int:
    return int(text, 16)
