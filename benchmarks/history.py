"""Synthetic log history for a project, stored the way boxtrail stores it.

Rows are cut into one Parquet file per (box, day) by ``ingest.flusher.partitions``,
encoded by ``ingest.flusher.encode_parquet``, put with the storage backend and made live
in the catalog (pending first, then published), exactly as a flush followed by
compaction leaves them. Only the rows are synthetic: each is drawn from a per-box pool
of events made by ``datagen.make_event`` (the SDK's shape: realistic messages, URLs and
attrs, ~5% errors with V8 stacks), so ten million rows take seconds to draw, not the
hour that calling ``make_event`` per row would.

Ids follow ``core.schema``: milliseconds since ``ID_EPOCH_MS`` above the sequence and
node bits (here one sequence over both), so they grow with ts, as the service's do.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import msgspec
import numpy as np
import pyarrow as pa

from benchmarks.datagen import RELEASES, SDK, USER_AGENTS, make_box_id, make_event
from core.schema import ID_EPOCH_MS, NODE_BITS, SCHEMA, SEQ_BITS, TS
from core.storage import Storage
from ingest.flusher import DAY_MS, encode_parquet, partitions
from metadata.catalog import Catalog, FileEntry

# Rows drawn and written at a time: bounds memory (~100 MB) whatever the history.
CHUNK_ROWS = 250_000
SESSION_MS = 30 * 60_000  # a page session lasts about half an hour
SESSIONS_PER_BOX = 512
RELEASE_EVERY_MS = 14 * DAY_MS
MAX_PROJECTS = 16  # the id sequence is interleaved by project so ids never collide


@dataclass(frozen=True)
class Pool:
    """Per-event columns of ``per_box`` events for each box; row ``b * per_box + k``."""

    box_ids: list[str]
    weights: np.ndarray  # share of the rows each box sends
    per_box: int
    columns: dict[str, pa.Array]  # level, message, url, attrs, error_type/message/stack
    sessions: pa.Array  # box * SESSIONS_PER_BOX + s

    def text_fraction(self, word: str) -> float:
        """Expected share of rows whose message or error text contains ``word``."""
        word = word.lower()
        hits = np.zeros(len(self.box_ids) * self.per_box, dtype=bool)
        for name in ("message", "error_type", "error_message"):
            values = self.columns[name].to_pylist()
            hits |= np.array([v is not None and word in v.lower() for v in values])
        per_box = hits.reshape(len(self.box_ids), self.per_box).mean(axis=1)
        return float(per_box @ self.weights)


def make_pool(seed: int, boxes: int, per_box: int) -> Pool:
    rng = random.Random(seed)
    box_ids = [make_box_id(rng) for _ in range(boxes)]
    names = ("level", "message", "url", "attrs", "error_type", "error_message", "error_stack")
    values: dict[str, list[str | None]] = {name: [] for name in names}
    encode = msgspec.json.Encoder().encode
    for box_id in box_ids:
        for _ in range(per_box):
            event = make_event(rng, 0, box_id)
            error = event.get("error") or {}
            values["level"].append(event["level"])
            values["message"].append(event["message"])
            values["url"].append(event["url"])
            values["attrs"].append(encode(event["attrs"]).decode())  # as ingest stores them
            values["error_type"].append(error.get("type"))
            values["error_message"].append(error.get("message"))
            values["error_stack"].append(error.get("stack"))
    sessions = [f"{rng.getrandbits(64):016x}" for _ in range(boxes * SESSIONS_PER_BOX)]
    # A few busy boxes and a long tail of quiet ones (Zipf-like), as on a real platform.
    weights = 1.0 / np.arange(1, boxes + 1) ** 0.8
    return Pool(box_ids=box_ids, weights=weights / weights.sum(), per_box=per_box,
                columns={name: pa.array(v, pa.string()) for name, v in values.items()},
                sessions=pa.array(sessions, pa.string()))


@dataclass
class Written:
    rows: int = 0
    files: int = 0
    bytes: int = 0


def _table(pool: Pool, rng: np.random.Generator, ts: np.ndarray, project_index: int
           ) -> pa.Table:
    """Rows at the given (ascending) timestamps, with ids that grow with ts."""
    n = len(ts)
    first = np.r_[True, ts[1:] != ts[:-1]]
    rank = np.arange(n) - np.maximum.accumulate(np.where(first, np.arange(n), 0))
    ids = ((ts - ID_EPOCH_MS) << (SEQ_BITS + NODE_BITS)) | (rank * MAX_PROJECTS + project_index)
    box = rng.choice(len(pool.box_ids), size=n, p=pool.weights)
    event = pa.array(box * pool.per_box + rng.integers(0, pool.per_box, size=n))
    slot = ts // SESSION_MS
    session = box * SESSIONS_PER_BOX + (slot * 7919 + box * 31) % SESSIONS_PER_BOX
    release = pa.array(RELEASES, pa.string()).take(
        pa.array((ts // RELEASE_EVERY_MS) % len(RELEASES)))
    agent = pa.array(USER_AGENTS, pa.string()).take(pa.array(session % len(USER_AGENTS)))
    columns = {
        "id": pa.array(ids, pa.int64()),
        "ts": pa.array(ts, pa.int64()).view(TS),
        "received": pa.array(ts + rng.integers(5, 400, size=n), pa.int64()).view(TS),
        "box": pa.array(pool.box_ids, pa.string()).take(pa.array(box)),
        "session_id": pool.sessions.take(pa.array(session)),
        "release": release,
        "user_agent": agent,
        "sdk": pa.array([f"{SDK['name']}/{SDK['version']}"] * n, pa.string()),
        "debug_ids": pa.nulls(n, pa.string()),
        "truncated": pa.nulls(n, pa.string()),
        "error_frames": pa.nulls(n, pa.string()),  # stacks sent as text, not Sentry frames
        **{name: values.take(event) for name, values in pool.columns.items()},
    }
    return pa.Table.from_arrays([columns[name] for name in SCHEMA.names], schema=SCHEMA)


def write_history(pool: Pool, catalog: Catalog, storage: Storage, project_id: str,
                  project_index: int, start_ms: int, end_ms: int, rows_per_day: float,
                  seed: int, progress: Callable[[str], None] | None = None) -> Written:
    """Rows at ``rows_per_day`` over ``[start_ms, end_ms)``, stored and made live."""
    if not 0 <= project_index < MAX_PROJECTS:
        raise ValueError(f"project_index must be 0..{MAX_PROJECTS - 1}")
    rng = np.random.default_rng([seed, project_index, start_ms])
    total = round(rows_per_day * (end_ms - start_ms) / DAY_MS)
    span = end_ms - start_ms
    # Whole days per chunk, so a (box, day) never spans two chunks: one file each.
    chunk_days = max(1, int(CHUNK_ROWS // max(rows_per_day, 1)))
    edges = list(range((start_ms // DAY_MS + 1) * DAY_MS, end_ms, chunk_days * DAY_MS))
    edges = [start_ms, *edges, end_ms]
    written = Written()
    with ThreadPoolExecutor(4) as pool_threads:
        for a, b in itertools.pairwise(edges):
            n = round(total * (b - start_ms) / span) - round(total * (a - start_ms) / span)
            if n <= 0:
                continue
            ts = np.sort(rng.integers(a, b, size=n))
            parts = partitions(project_id, _table(pool, rng, ts, project_index))

            def encode(part: tuple[FileEntry, pa.Table]) -> tuple[FileEntry, bytes]:
                data = encode_parquet(part[1])
                return msgspec.structs.replace(part[0], bytes=len(data)), data

            encoded = list(pool_threads.map(encode, parts))
            catalog.add_pending(entry for entry, _ in encoded)
            list(pool_threads.map(lambda e: storage.put(e[0].key, e[1]), encoded))
            catalog.publish(entry.key for entry, _ in encoded)
            written.rows += n
            written.files += len(encoded)
            written.bytes += sum(entry.bytes for entry, _ in encoded)
            if progress is not None:
                progress(f"{project_id}: {written.rows:,}/{total:,} rows, "
                         f"{written.files:,} files")
    return written
