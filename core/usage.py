"""What is metered: the one list of usage kinds (:data:`KINDS`, each with its unit), and the
tallies every stage adds to.

A tally counts a quantity per (project, box, minute, kind, source, reason); the tenant is
the project's, taken when the tally is written (``usage.store``). Two ways in:

- **Ingest's**, exact: :func:`tally_batch` counts a WAL record (an accepted request, or a
  refused one: :attr:`RowBatch.refused`) as the buffer seals it, and the flush writes its
  chunks' tallies in the catalog transaction that makes their rows live. A record is in
  exactly one flush, replayed or not, so each durable event is counted once, and an event
  that was never durable never (``ingest.service``).
- **The readers'**, in memory: :class:`Meter` gathers queries, bytes scanned, tail-seconds
  and frames; ``usage.store`` writes them every second (a crash loses that second).
"""

from __future__ import annotations

import re
import threading
import time
from typing import Literal, get_args

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from core.schema import ID_EPOCH_MS, NODE_BITS, SEQ_BITS, RowBatch

Kind = Literal[
    "ingest.requests", "ingest.events", "ingest.bytes", "ingest.inflated_bytes",
    "refused.requests", "refused.events", "client_discard.events",
    "deleted.events", "storage.parquet", "storage.sourcemaps",
    "query.requests", "query.scanned_bytes", "tail.seconds", "symbolicate.frames",
]
KINDS: tuple[str, ...] = get_args(Kind)
# Each kind's unit, and what it counts (docs/usage.md is this table).
UNITS: dict[str, str] = {
    "ingest.requests": "requests",  # answered 202/200, per source (intake)
    "ingest.events": "events",  # made durable
    "ingest.bytes": "bytes",  # accepted request bodies as received
    "ingest.inflated_bytes": "bytes",  # ... and as inflated
    "refused.requests": "requests",  # refused whole, per reason
    "refused.events": "events",  # not stored, per reason: refused requests' and rejected
    "client_discard.events": "events",  # dropped by the SDK before sending, per reason
    "deleted.events": "events",  # removed by a finished deletion job
    "storage.parquet": "byte_hours",  # hourly snapshot of a project's live Parquet bytes
    "storage.sourcemaps": "byte_hours",  # ... and of its source maps
    "query.requests": "requests",  # searches, errors, histograms, MCP tool calls
    "query.scanned_bytes": "bytes",  # Parquet bytes of the files those read
    "tail.seconds": "seconds",  # live tails held open
    "symbolicate.frames": "frames",  # stack frames rewritten by a source map
}
assert set(UNITS) == set(KINDS)

# The SDK's drop reasons (docs/sdk.md), and the Sentry SDKs' (their client reports'
# discarded_events); any other word counts as "other".
DISCARD_REASONS = frozenset(("queue_full", "rate_limit", "rejected", "before_send"))
SENTRY_DISCARD_REASONS = frozenset((
    "queue_overflow", "cache_overflow", "buffer_overflow", "ratelimit_backoff",
    "network_error", "sample_rate", "before_send", "event_processor", "send_error",
    "internal_sdk_error", "insufficient_data", "backpressure"))
# The client report categories that are rows here (errors, messages, logs).
SENTRY_ROW_CATEGORIES = frozenset(("error", "default", "log_item"))
_DISCARD_PREFIX = "boxtrail: dropped "
_DISCARD = re.compile(r"boxtrail: dropped (\d{1,9}) events (\{.{0,400}\})", re.S)
_MAX_DISCARD = 1_000_000  # one report's reason: the SDK's queue is at most 20,000

# (project, box, minute as Unix seconds, kind, source, reason) -> quantity
Key = tuple[str, str, int, str, str, str]
Tally = dict[Key, int]


def add(tally: Tally, key: Key, quantity: int) -> None:
    if quantity:
        tally[key] = tally.get(key, 0) + quantity


def merge(into: Tally, other: Tally) -> Tally:
    for key, quantity in other.items():
        into[key] = into.get(key, 0) + quantity
    return into


def minute_of(ms: int) -> int:
    return ms // 60_000 * 60


def tally_batch(batch: RowBatch, into: Tally) -> None:
    """What one WAL record counts: an accepted request (its events, its bytes, its events
    rejected alone) or a refused one."""
    key = (batch.project_id, batch.box or "", minute_of(batch.received))
    project, box, minute = key
    source = batch.source or "ingest"  # records written before sources were kept
    if batch.refused:
        add(into, (project, box, minute, "refused.requests", source, batch.refused), 1)
        add(into, (project, box, minute, "refused.events", source, batch.refused),
            batch.refused_events)
        return
    add(into, (project, box, minute, "ingest.requests", source, ""), 1)
    add(into, (project, box, minute, "ingest.events", source, ""), len(batch))
    add(into, (project, box, minute, "ingest.bytes", source, ""), batch.wire_bytes)
    add(into, (project, box, minute, "ingest.inflated_bytes", source, ""), batch.body_bytes)
    for reason, n in batch.rejected.items():
        add(into, (project, box, minute, "refused.events", source, reason), n)
    for reason, n in batch.discarded.items():
        add(into, (project, box, minute, "client_discard.events", source, reason), n)


def sentry_discards(report: object, into: dict[str, int]) -> None:
    """A Sentry client report's ``discarded_events`` of rows, by reason, bounded."""
    events = report.get("discarded_events") if isinstance(report, dict) else None
    for item in events[:64] if isinstance(events, list) else ():
        if not isinstance(item, dict):
            continue
        category, n, reason = item.get("category"), item.get("quantity"), item.get("reason")
        if not isinstance(category, str) or category not in SENTRY_ROW_CATEGORIES:
            continue  # any JSON may stand here: only a string is looked up
        if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= _MAX_DISCARD:
            word = reason if isinstance(reason, str) and reason in SENTRY_DISCARD_REASONS \
                else "other"
            into[word] = into.get(word, 0) + n


def client_discards(project_id: str, table: pa.Table, into: Tally) -> None:
    """The SDK's drop reports among ``table``'s rows (``warn`` rows whose message is
    ``boxtrail: dropped N events {"reason": n, ...}``), counted by reason at the row's box
    and the minute it was received. What a client reports is its word: each reason's count
    is bounded, and a reason the SDK does not have counts as ``other``."""
    if not table.num_rows:
        return
    mask = pc.and_(pc.equal(table["level"], "warn"),
                   pc.starts_with(table["message"], _DISCARD_PREFIX))
    if not pc.any(mask).as_py():
        return
    reports = table.filter(mask).select(["id", "box", "message"]).to_pylist()
    for row in reports:
        match = _DISCARD.fullmatch(row["message"] or "")
        if match is None:
            continue
        try:
            counts = msgspec.json.decode(match.group(2), type=dict[str, int])
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        minute = minute_of((row["id"] >> (NODE_BITS + SEQ_BITS)) + ID_EPOCH_MS)
        for reason, n in list(counts.items())[:8]:
            if 0 < n <= _MAX_DISCARD:
                add(into, (project_id, row["box"] or "", minute, "client_discard.events", "sdk",
                           reason if reason in DISCARD_REASONS else "other"), n)


class Meter:
    """The readers' usage, gathered in memory until ``usage.store`` writes it (:meth:`take`).
    Called from the loop and from threads."""

    def __init__(self) -> None:
        self._tally: Tally = {}
        self._lock = threading.Lock()

    def note(self, project_id: str, kind: str, quantity: int, source: str = "",
             box: str = "") -> None:
        assert kind in UNITS, kind
        if quantity <= 0:
            return
        key = (project_id, box, minute_of(int(time.time() * 1000)), kind, source, "")
        with self._lock:
            self._tally[key] = self._tally.get(key, 0) + quantity

    def take(self) -> Tally:
        with self._lock:
            tally, self._tally = self._tally, {}
        return tally

    def put_back(self, tally: Tally) -> None:
        """A write that failed: counted again with the next one."""
        with self._lock:
            merge(self._tally, tally)
