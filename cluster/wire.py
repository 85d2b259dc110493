"""A batch as it crosses the Redis stream (``cluster.bus``): its place in its node's WAL and
its WAL payload, LZ4-compressed, or bare (its place alone)."""

from __future__ import annotations

import logging

import msgspec
import pyarrow as pa

from core.schema import RowBatch

log = logging.getLogger("boxtrail.bus")

_decode_batch = msgspec.msgpack.Decoder(RowBatch).decode


class Sent(msgspec.Struct, array_like=True, gc=False):
    """One batch on the stream: where it is in its node's WAL, and its WAL payload (a
    msgpack ``RowBatch``), LZ4-compressed (about 3x smaller: every other node reads it)
    and decoded only by a node that reads its rows; or bare (size 0, no payload). Read
    back as a view into the entry: taking a batch costs no copy and no walk of its rows."""

    lsn: int
    project_id: str
    last_id: int
    rows: int
    size: int  # the payload's, uncompressed
    payload: memoryview

    @classmethod
    def of(cls, batch: RowBatch, payload: bytes) -> Sent:
        return cls(batch.lsn, batch.project_id, batch.last_id, len(batch), len(payload),
                   memoryview(_LZ4.compress(payload, asbytes=True)))

    @classmethod
    def bare(cls, batch: RowBatch) -> Sent:
        """The batch without its rows (a project nobody reads): size 0."""
        return cls(batch.lsn, batch.project_id, batch.last_id, len(batch), 0, _EMPTY)

    def filled(self, payload: bytes) -> Sent:
        return Sent(self.lsn, self.project_id, self.last_id, self.rows, len(payload),
                    memoryview(_LZ4.compress(payload, asbytes=True)))

    @property
    def held_rows(self) -> int:
        """The rows it brings (a bare batch: none yet)."""
        return self.rows if self.size else 0

    def batch(self) -> RowBatch:
        data = _LZ4.decompress(self.payload, decompressed_size=self.size, asbytes=True)
        return _decode_batch(data)


_LZ4 = pa.Codec("lz4")
_EMPTY = memoryview(b"")
encode_sent = msgspec.msgpack.Encoder().encode
decode_sent = msgspec.msgpack.Decoder(list[Sent]).decode


def decoded(node: str, sent: Sent) -> RowBatch | None:
    try:
        return sent.batch()
    except Exception as exc:  # LZ4 or msgpack: a bad batch fails alone
        log.error("bus: a batch of node %s does not decode (%r)", node, exc)
        return None
