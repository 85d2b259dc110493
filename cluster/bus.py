"""What crosses nodes live: every node's acked rows, on a Redis stream, to the other nodes.

A node's fsynced WAL stays the durability point; the bus only makes rows visible sooner.
After a batch is durable (and applied to the node's own buffer) it is added to one Redis
stream, ``boxtrail:rows``, with the node's id and the batch's LSN. Every node reads the
whole stream and keeps the other nodes' batches in :class:`Peers`, one live buffer per
node, until the shared catalog says the node that wrote them has them in Parquet (its
WAL position for the batch's project, ``metadata.catalog``). A search reads the catalog's
files and those positions in one snapshot, and takes from a peer's buffer only the rows
past the position: each row once, whichever node answers.

A batch carries its rows (its WAL payload, compressed) only if its project is *hot*:
another node asked for the project within ``HOT_S``. Otherwise it goes *bare*, its place
alone. Before a read of a project a node that holds a live node's bare batch of it
*asks* (:meth:`RedisBus.need`): every live node then sends the rows of its bare batches
of the project, read back from its WAL, then an *answer*, and keeps the project hot. So
the rows of a project nobody reads never leave their node before its flush (Loki's
queriers likewise get recent rows from the ingesters that hold them, when they read).

Each entry also carries the node's *floor*: an id such that every id the node has given
at or below it is on the stream already (``core.schema``: a node's ids grow in the
order its rows become visible). An idle node adds a heartbeat every ``HEARTBEAT_S`` with
its floor. The lowest floor of the live nodes, the cluster *watermark*, is the id below
which no row can still appear: live tails deliver rows in id order up to it (and below
any bare batch of their project whose rows have not come, :meth:`Peers.hold`), so a tail
resumed on any node with ``Last-Event-ID`` misses and repeats nothing. A node not heard
from for ``DEAD_S`` no longer holds the watermark back, unless the catalog shows it still
flushing (:meth:`Peers.waited`): it is alive but cut from Redis, and its rows will come.

The stream keeps ``RETAIN_S`` of entries: a node (re)starting reads them all, taking the
batches not yet in Parquet. While Redis is unreachable the node keeps acking (its WAL),
queues what it has to publish (up to ``buffer_max_rows`` rows) and sends it when Redis is
back; other nodes see those rows once it flushes, or when it publishes again.

The loops (publish, read, trim, answer) retry what they expect of Redis themselves
(``RedisError``, ``OSError``) and run under the node's supervisor
(``core.supervisor``) for the rest: a connection reset under uvloop raises
``RuntimeError`` from a write (redis-py then drops the connection, and the next command
connects again), and a loop that died of it is restarted within ``FIRST_BACKOFF_S``. What a
restarted publisher had not sent is still queued, and its asks go with its next entries;
a reader starts again after the last entry it took, so an entry it died of is not read
twice.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from core.metrics import Registry
from core.schema import ID_STEP, RowBatch
from core.supervisor import Supervisor
from ingest.buffer import SEAL_ROWS, LiveBuffer

log = logging.getLogger("boxtrail.bus")

STREAM = "boxtrail:rows"
ACKS = "boxtrail:read"  # node -> the last stream entry it has read
JOIN_S = 5.0
HEARTBEAT_S = 0.1
# Under load a read or a publish finds more entries waiting the longer it waits: at most one
# of each every GATHER_S, which costs a row up to twice that in freshness. Each costs ~0.1
# ms of Python (redis-py), so at 0.01 s they were ~6% of a loaded node's CPU. That pace is
# kept for what somebody waits for (rows of a project being read, asks, answers); bare
# batches go with the next heartbeat, and a node reading nothing reads the stream once a
# HEARTBEAT_S (an ask it answers waits that much more): a cluster that only ingests writes
# ~3x fewer entries and reads 4x less often; those round trips were most of what the bus
# cost (session 14, docs/cluster.md).
GATHER_S = 0.025
ACK_S = 0.25  # how often a node records how far it has read (what a joiner waits for)
DEAD_S = 3.0
# A node silent on the stream for DEAD_S whose WAL position moved in the catalog within
# FLUSHING_S is alive and cut from Redis: it acks, flushes, and publishes what it queued
# once it can, so the watermark still waits for it (its rows would otherwise come below
# every other node's live tails), up to SILENT_MAX_S of silence. Twice the default flush
# interval (5 s): a node under ingest flushes at least that often.
FLUSHING_S = 10.0
SILENT_MAX_S = 30.0
# A project's batches go out bare (without their rows) unless a node asked for them within
# HOT_S; a node reading it asks again every REFRESH_S, and waits up to WANT_S for answers.
HOT_S = 60.0
REFRESH_S = 20.0
WANT_S = 1.0
RETAIN_S = 30.0
READ_COUNT = 2000
TRIM_S = 0.25
ENTRY_BYTES = 256 * 1024  # batches' payload bytes per stream entry, about
# The publisher and the reader retry a failing Redis after 0.2 s, doubling up to this. It
# was 2 s, most of what a reset's heal cost before rows moved again (and every tail in the
# cluster waits for a cut node's rows); an attempt against a link that refuses costs
# nothing to speak of, and one against a blackhole waits out its own timeout anyway.
RETRY_MAX_S = 0.5
_decode_batch = msgspec.msgpack.Decoder(RowBatch).decode

# The catalog's WAL positions: node -> (its position, {project: a position past it}).
Positions = dict[str, tuple[int, dict[str, int]]]


def _stream_id(value: bytes | str) -> tuple[int, int]:
    """A stream entry id (b"1733100000000-3") as a comparable pair."""
    text = value.decode() if isinstance(value, bytes) else value
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _decoded(node: str, sent: Sent) -> RowBatch | None:
    try:
        return sent.batch()
    except Exception as exc:  # LZ4 or msgpack: a bad batch fails alone
        log.error("bus: a batch of node %s does not decode (%r)", node, exc)
        return None


def _pass_on(to: asyncio.Future[Any], done: asyncio.Future[Any]) -> None:
    if not to.done():
        to.set_result(done.result())


def position(positions: Positions, node: str, project_id: str) -> int:
    flushed, ahead = positions.get(node, (0, {}))
    return max(flushed, ahead.get(project_id, 0))


@dataclass
class _Peer:
    buffer: LiveBuffer = field(default_factory=LiveBuffer)
    applied: int = 0  # the last LSN applied (a restarted node publishes its replay again)
    epoch: str = ""  # the node's WAL (a new one after its disk was lost)
    floor: int = 0
    heard: int = 0  # the stream time (ms, Redis's clock) of its last entry read here
    # Its WAL position in the catalog as last read here, and when (monotonic) it was seen
    # to move: a node that flushes is alive, whether or not it reaches the stream.
    position: tuple[int, int] | None = None
    flushing_at: float = float("-inf")
    # Per project: (lsn, last id) of the batches held, in LSN (so id) order, and the last id
    # let go: what a WAL position means in ids.
    batches: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    dropped_id: dict[str, int] = field(default_factory=dict)
    # Per project, the batches held as they came (their WAL payloads, with LSN and rows),
    # oldest first, all after those in ``buffer``: decoded when a reader first wants them.
    # Bare batches among them (sent without their rows: nobody read the project when they
    # were published), per project, by LSN in LSN order: an id below every id of the batch.
    # A reader asks for their rows (RedisBus.need).
    raw: dict[str, deque[Sent]] = field(default_factory=dict)
    raw_rows: int = 0
    gaps: dict[str, dict[int, int]] = field(default_factory=dict)




@dataclass(frozen=True)
class Held:
    """A peer's rows of one project as a reader took them (:meth:`Peers.capture`), with
    what it needs to cut them at positions read afterwards: the (lsn, last id) of the
    batches held then, and the last id let go before."""

    node: str
    tables: list[pa.Table]
    batches: list[tuple[int, int]]
    dropped_id: int

    def past(self, upto_lsn: int) -> list[pa.Table]:
        """The rows past WAL position ``upto_lsn``: those not in Parquet at it."""
        i = bisect.bisect_right(self.batches, (upto_lsn, 1 << 63))
        cut = max(self.batches[i - 1][1] if i else 0, self.dropped_id)
        out: list[pa.Table] = []
        for table in self.tables:
            ids = table["id"]
            if pc.min(ids).as_py() <= cut:
                table = table.filter(pc.greater(ids, cut))
            if table.num_rows:
                out.append(table)
        return out


def past(held: list[Held], project_id: str, positions: Positions) -> list[pa.Table]:
    """The rows of a capture not in Parquet at ``positions``: read the positions after the
    capture (in one snapshot with the files), and each row is in one or the other. A row
    let go before the capture was at or below a position the bus had read, which the later
    read sees too; one let go after it is still in the capture, and cut here."""
    return [t for h in held for t in h.past(position(positions, h.node, project_id))]


class PeerWatcher(Protocol):
    """Who reads the other nodes' rows live here (``query.tail``). Batches of the projects
    it is ``watching`` are decoded on arrival and handed to it; it is told of a watched
    project when a bare batch of it is let go without its rows having come (its node
    flushed it first), and reads those rows from Parquet."""

    def watching(self, project_id: str) -> bool: ...

    def watched(self) -> Iterable[str]: ...

    def peer_appended(self, node: str, batch: RowBatch) -> None: ...

    def lost(self, project_id: str) -> None: ...


class _Unwatched:
    def watching(self, project_id: str) -> bool:
        return False

    def watched(self) -> Iterable[str]:
        return ()

    def peer_appended(self, node: str, batch: RowBatch) -> None:
        pass

    def lost(self, project_id: str) -> None:
        pass


class Peers:
    """The other nodes' rows not yet in Parquet, and their floors.

    Every node receives every other node's batches (bare, or with their rows while their
    project is read), so what a node does with each one is paid N-1 times over: a batch is
    kept as the bytes that came (its WAL payload) and decoded into the node's live buffer
    only when a search, a tail or a live tail's hub first reads its project. Rows nobody
    reads here before their node flushes them are never decoded here at all."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.peers: dict[str, _Peer] = {}
        self.watcher: PeerWatcher = _Unwatched()  # the live tails, once they watch
        # Before a read of a project: have the other nodes send the rows of their bare
        # batches of it (RedisBus.need).
        self.need: Callable[[str], Awaitable[None]] | None = None
        self.rows = 0
        self.latest = 0  # the stream time of the newest entry read

    def watch(self, watcher: PeerWatcher) -> None:
        """From now on, ``watcher`` takes the batches of the projects it watches."""
        self.watcher = watcher

    def watching(self, project_id: str) -> bool:
        return self.watcher.watching(project_id)

    def watched(self) -> Iterable[str]:
        return self.watcher.watched()

    def _tell(self, node: str, batch: RowBatch) -> None:
        try:
            self.watcher.peer_appended(node, batch)
        except Exception:
            log.exception("bus: the live tails could not take a batch of node %s", node)

    def _peer(self, node: str) -> _Peer:
        peer = self.peers.get(node)
        if peer is None:
            peer = self.peers[node] = _Peer()
        return peer

    def epoch(self, node: str, epoch: str) -> None:
        """The WAL an entry of ``node`` came from. A new one means the node lost its disk
        and starts again on an empty WAL: what was held of the old one is either in Parquet
        or gone with it, and the new WAL's LSNs start over."""
        peer = self._peer(node)
        if peer.epoch and epoch != peer.epoch:
            log.warning("bus: node %s has a new WAL; letting go of %d rows of its old one",
                        node, peer.buffer.rows)
            self.rows -= peer.buffer.rows + peer.raw_rows
            self.peers[node] = _Peer(epoch=epoch, floor=peer.floor, heard=peer.heard)
        else:
            peer.epoch = epoch

    def heard(self, node: str, floor: int, at_ms: int) -> None:
        """An entry of ``node`` with its floor, added to the stream at ``at_ms``."""
        peer = self._peer(node)
        peer.floor = max(peer.floor, floor)
        peer.heard = max(peer.heard, at_ms)
        self.latest = max(self.latest, at_ms)

    def live(self) -> list[str]:
        """The nodes heard within DEAD_S of the newest entry read. Time is the stream's:
        while this node cannot read it, nobody is taken for dead (and the watermark holds)."""
        return [n for n, p in self.peers.items() if self.latest - p.heard < DEAD_S * 1000]

    def flushed(self, positions: Positions) -> None:
        """The catalog's WAL positions, as read now: note the nodes whose position moved."""
        now = time.monotonic()
        for node, (lsn, ahead) in positions.items():
            if node == self.node_id or (peer := self.peers.get(node)) is None:
                continue
            seen = (lsn, max(ahead.values(), default=0))
            if peer.position is not None and seen != peer.position:
                peer.flushing_at = now
            peer.position = seen

    def waited(self) -> list[str]:
        """The nodes whose rows the live tails wait for: the live ones, and those silent on
        the stream (up to SILENT_MAX_S) that flushed within FLUSHING_S, so are alive but cut
        from Redis; their rows come when they can publish, and a tail that passed them would
        never send them (issue 35). A node killed stops flushing, and is let go."""
        now = time.monotonic()
        return [n for n, p in self.peers.items()
                if self.latest - p.heard < DEAD_S * 1000
                or (self.latest - p.heard < SILENT_MAX_S * 1000
                    and now - p.flushing_at < FLUSHING_S)]

    def offer(self, node: str, sent: Sent, positions: Positions | None) -> bool:
        """Hold a batch of ``node`` as it came, undecoded (decoded now if its project is
        tailed here), unless held already or in Parquet; whether it was new."""
        peer = self._peer(node)
        if sent.lsn <= peer.applied:
            return self._fill(node, peer, sent)
        if not sent.size:  # bare: its place is kept, its rows are asked for when read
            peer.applied = sent.lsn
            if positions is not None and sent.lsn <= position(positions, node,
                                                               sent.project_id):
                self._lost(sent.project_id)
                return False
            peer.raw.setdefault(sent.project_id, deque()).append(sent)
            # Ids are ID_STEP apart within a batch (1 in old WAL records: lower still).
            below = sent.last_id - sent.rows * ID_STEP
            peer.gaps.setdefault(sent.project_id, {})[sent.lsn] = below
            peer.batches.setdefault(sent.project_id, []).append((sent.lsn, sent.last_id))
            return True
        if self.watching(sent.project_id):
            batch = _decoded(node, sent)
            return batch is not None and self.apply(node, batch, sent, positions)
        peer.applied = sent.lsn
        if positions is not None and sent.lsn <= position(positions, node, sent.project_id):
            return False
        peer.raw.setdefault(sent.project_id, deque()).append(sent)
        peer.raw_rows += sent.rows
        peer.batches.setdefault(sent.project_id, []).append((sent.lsn, sent.last_id))
        self.rows += sent.rows
        return True

    def apply(self, node: str, batch: RowBatch, sent: Sent, positions: Positions | None
              ) -> bool:
        """Hold a batch of ``node`` decoded for the live tails unless held already or in
        Parquet; whether it was new."""
        peer = self._peer(node)
        if batch.lsn <= peer.applied:
            return False
        peer.applied = batch.lsn
        flushed = positions is not None and batch.lsn <= position(positions, node,
                                                                     batch.project_id)
        if not flushed:
            if batch.project_id in peer.raw:
                # Older batches of the project wait undecoded, and the buffer keeps WAL
                # order: this one waits behind them (decoded again when read), rather than
                # have the stream's reader decode the backlog here, all at once.
                peer.raw[batch.project_id].append(sent)
                peer.raw_rows += sent.rows
            else:
                peer.buffer.append(batch)
            peer.batches.setdefault(batch.project_id, []).append((batch.lsn, batch.last_id))
            self.rows += len(batch.ts)
        # Live tails take it either way: a batch its node flushed before it reached the
        # stream (the bus was out) is in Parquet for searches, and still new to the tails.
        self._tell(node, batch)
        return not flushed

    def _fill(self, node: str, peer: _Peer, sent: Sent) -> bool:
        """The rows of a bare batch held (sent again on request); whether it was one."""
        gaps = peer.gaps.get(sent.project_id)
        if not sent.size or gaps is None or sent.lsn not in gaps:
            return False
        queue = peer.raw[sent.project_id]
        at = next(i for i, held in enumerate(queue) if held.lsn == sent.lsn)
        queue[at] = sent
        del gaps[sent.lsn]
        if not gaps:
            del peer.gaps[sent.project_id]
        peer.raw_rows += sent.rows
        self.rows += sent.rows
        if self.watching(sent.project_id) and (batch := _decoded(node, sent)) is not None:
            self._tell(node, batch)
        return True

    def _lost(self, project_id: str) -> None:
        if self.watching(project_id):
            try:
                self.watcher.lost(project_id)
            except Exception:
                log.exception("bus: lost-rows callback failed")

    def missing(self, project_id: str) -> bool:
        """Whether a live node's bare batch of the project is held here without its rows."""
        live = self.live()
        return any(self.peers[node].gaps.get(project_id) for node in live
                   if node != self.node_id)

    def hold(self, project_id: str) -> int:
        """An id below every row of the project that a live node sent bare and has not sent
        again yet (a live tail waits at it)."""
        # A node's ids grow with its LSNs, so its oldest gap's bound is its lowest.
        return min([1 << 63, *(next(iter(gaps.values())) for node in self.waited()
                                if node != self.node_id
                                and (gaps := self.peers[node].gaps.get(project_id)))])

    def holding(self) -> bool:
        return any(peer.batches for peer in self.peers.values())

    def has_rows(self, project_id: str) -> bool:
        return any(peer.batches.get(project_id) for peer in self.peers.values())

    def _decode(self, node: str, project_id: str, upto_rows: int | None = None) -> None:
        """Move the node's undecoded batches of the project into its buffer, oldest first
        (about ``upto_rows`` rows of them, or all)."""
        peer = self.peers[node]
        queue = peer.raw.get(project_id)
        done = 0
        while queue and queue[0].size and (upto_rows is None or done < upto_rows):
            sent = queue.popleft()
            peer.raw_rows -= sent.rows
            done += sent.rows
            batch = _decoded(node, sent)
            if batch is None:  # logged; its node still has it, and flushes it
                self.rows -= sent.rows
                continue
            peer.buffer.append(batch)
        if queue is not None and not queue:
            del peer.raw[project_id]

    async def prepare(self, project_id: str) -> None:
        """Decode what is held of the project, yielding to the event loop every
        ``SEAL_ROWS`` rows: a read after a quiet while may find many seconds of other
        nodes' rows to decode, and ingest must not wait them out. (:meth:`snapshot` decodes
        whatever is still left.) First the rows of bare batches are asked for."""
        if self.need is not None:
            await self.need(project_id)
        for node in list(self.peers):
            while ((peer := self.peers.get(node)) is not None
                   and (queue := peer.raw.get(project_id)) and queue[0].size):
                self._decode(node, project_id, SEAL_ROWS)
                await asyncio.sleep(0)

    def capture(self, project_id: str, after_id: int = 0) -> list[Held]:
        """The peers' rows of the project above ``after_id``, as held now, to be cut by
        :func:`past` at positions read after this call."""
        out: list[Held] = []
        for node, peer in self.peers.items():
            held = peer.batches.get(project_id)
            if not held:
                continue
            self._decode(node, project_id)
            found = peer.buffer.snapshot(project_id, after_id)
            if queue := peer.raw.get(project_id):
                # Behind a bare batch whose rows never came (its node did not answer): the
                # rows after it are read without it, and stay held in order for later.
                behind = LiveBuffer()
                for sent in queue:
                    if sent.size and (batch := _decoded(node, sent)) is not None:
                        behind.append(batch)
                found += behind.snapshot(project_id, after_id)
            out.append(Held(node, found, list(held), peer.dropped_id.get(project_id, 0)))
        return out

    def snapshot(self, project_id: str, positions: Positions, after_id: int = 0
                 ) -> list[pa.Table]:
        """The peers' rows of the project past their nodes' positions (and above
        ``after_id``)."""
        return past(self.capture(project_id, after_id), project_id, positions)

    def trim(self, positions: Positions) -> int:
        """Let go of what the catalog says is in Parquet; return how many rows went."""
        gone = 0
        for node, peer in self.peers.items():
            for project_id, held in list(peer.batches.items()):
                upto = position(positions, node, project_id)
                i = bisect.bisect_right(held, (upto, 1 << 63))
                if not i:
                    continue
                peer.dropped_id[project_id] = max(peer.dropped_id.get(project_id, 0),
                                                  held[i - 1][1])
                before = peer.buffer.rows
                peer.buffer.drop_through(project_id, upto)
                gone += before - peer.buffer.rows
                queue = peer.raw.get(project_id)
                while queue and queue[0].lsn <= upto:
                    sent = queue.popleft()
                    peer.raw_rows -= sent.held_rows
                    gone += sent.held_rows
                    if (gaps := peer.gaps.get(project_id)) is not None:
                        if gaps.pop(sent.lsn, None) is not None:
                            self._lost(project_id)
                        if not gaps:
                            del peer.gaps[project_id]
                if queue is not None and not queue:
                    del peer.raw[project_id]
                if i == len(held):
                    del peer.batches[project_id]
                else:
                    del held[:i]
        self.rows -= gone
        return gone

    def watermark(self, own_floor: int) -> int:
        """The id at or below which every row of every node waited for is visible here."""
        return min([own_floor, *(self.peers[n].floor for n in self.waited()
                                 if n != self.node_id)])


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
        return cls(batch.lsn, batch.project_id, batch.last_id, len(batch.ts), len(payload),
                   memoryview(_LZ4.compress(payload, asbytes=True)))

    @classmethod
    def bare(cls, batch: RowBatch) -> Sent:
        """The batch without its rows (a project nobody reads): size 0."""
        return cls(batch.lsn, batch.project_id, batch.last_id, len(batch.ts), 0, _EMPTY)

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
_encode_sent = msgspec.msgpack.Encoder().encode
_decode_sent = msgspec.msgpack.Decoder(list[Sent]).decode


class Outbox:
    """The batches this node has to add to the stream, oldest first, bounded in rows."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.batches: deque[Sent] = deque()
        self.rows = 0
        self.lost_rows = 0  # let go while the bus was out, past max_rows
        self.wake = asyncio.Event()

    def put(self, sent: Sent) -> None:
        self.batches.append(sent)
        self.rows += sent.held_rows  # bare batches take no room to speak of
        while self.rows > self.max_rows and len(self.batches) > 1:
            self.rows -= (gone := self.batches.popleft()).held_rows
            self.lost_rows += gone.rows
        if sent.payload:  # rows somebody reads go now; bare ones with the next heartbeat
            self.wake.set()


class RedisBus:
    """The Redis stream (see the module docstring): a publisher and a reader task."""

    def __init__(self, url: str, node_id: str, peers: Peers, floor: Callable[[], int],
                 positions: Callable[[], Positions], max_rows: int, *,
                 read_back: Callable[..., bytes | None] = lambda *_: None,
                 advanced: Callable[[], None] = lambda: None,
                 shares: dict[str, Callable[[], object]] | None = None,
                 receives: dict[str, Callable[[str, Any], None]] | None = None,
                 supervisor: Supervisor | None = None) -> None:
        """``floor``: this node's (``ingest.ids``); ``positions``: the catalog's, as a thread
        last read them; ``read_back(segment, offset, lsn)``: a batch's WAL payload, for an
        ask (``ingest.wal.read_record``); ``advanced``: called when the cluster watermark
        moves (the live tails); ``shares`` and ``receives``: what this node sends with each
        heartbeat by name (a JSON value, or None for nothing) and what it does with another
        node's (the cluster-wide rate limits and tail counts)."""
        import redis.asyncio as redis

        # The node's (boxtrail.app); a bus made alone (tests) has one of its own.
        self.supervisor = supervisor or Supervisor(Registry())
        self.redis = redis.from_url(url, socket_connect_timeout=2, socket_timeout=5,
                                    health_check_interval=5)
        self.errors = (redis.RedisError, OSError)
        self.node_id = node_id
        self.peers = peers
        self.floor = floor
        self.positions = positions
        self._positions_read: tuple[float, Positions] | None = None
        self._acked_at = 0.0
        self.outbox = Outbox(max_rows)
        self.connected = False
        self.last_read = "0-0"
        self.advanced = advanced
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self.shares = shares or {}
        self.receives = receives or {}
        self._shared_at = 0.0
        # Until when this node reads the stream at the GATHER_S pace: it asked for a
        # project within HOT_S (a search, an open tail), so it wants the rows as they come.
        self._reading_until = 0.0
        self.epoch = ""  # this node's WAL's (set before start)
        # Projects whose batches go out with their rows, until when (monotonic).
        self.hot: dict[str, float] = {}
        # This node's batches sent bare and not yet in Parquet, each with where its WAL
        # record is (read back with ``read_back(*place, lsn)`` when asked for), or its
        # payload (a batch replayed at start).
        self.held: dict[str, deque[tuple[Sent, Any]]] = {}
        self.read_back = read_back
        self.rows_answered = 0
        self._asks: asyncio.Queue[tuple[str, str, deque[tuple[Sent, Any]]]] = asyncio.Queue()
        # Asking: projects to ask for on the next entry, with what waits for the entry's
        # id; when each project was last asked for; what each node answered, by project.
        self.wants: dict[str, asyncio.Future[tuple[int, int]]] = {}
        self.wanted_at: dict[str, float] = {}
        self.answered: dict[tuple[str, str], tuple[int, int]] = {}
        # Answering: project -> the latest ask read (its entry id), sent after the rows.
        self.answers: dict[str, str] = {}
        peers.need = self.need

    async def start(self) -> None:
        """Join: announce this node on the stream, then wait (before the server takes a
        request) until this node has read the stream up to its announcement and every
        live node has too. From then on no node can have a row of this one that it does
        not know to wait for, and this node knows every live node's floor."""
        hello = None
        try:
            # Floor 0: batches replayed from the WAL are queued to go after it, and may
            # be below this node's floor now; the entries that follow move it.
            hello = await self.redis.xadd(STREAM, {"n": self.node_id, "e": self.epoch,
                                                   "f": 0})
        except self.errors as exc:
            log.warning("bus: cannot announce this node (%s); live tails on other nodes may "
                        "miss rows it takes until they hear from it", exc)
        start = self.supervisor.start
        self._tasks = [start("bus-publish", self._publish_loop),
                       start("bus-read", self._read_loop, on_death=self._unread),
                       start("bus-trim", self._trim_loop),
                       start("bus-answer", self._answer_loop)]
        if hello is not None:
            await self._joined(_stream_id(hello))

    async def _joined(self, hello: tuple[int, int]) -> None:
        deadline = time.monotonic() + JOIN_S
        waiting: list[str] = []
        while time.monotonic() < deadline:
            if _stream_id(self.last_read) >= hello:
                acks: dict[Any, Any] = {}
                with contextlib.suppress(*self.errors):
                    acks = await self.redis.hgetall(ACKS)
                read = {k.decode(): _stream_id(v) for k, v in acks.items()}
                waiting = [n for n in self.peers.live() if n != self.node_id
                           and read.get(n, (0, 0)) < hello]
                if not waiting:
                    return
            await asyncio.sleep(0.02)
        log.warning("bus: nodes %s did not read this node's announcement within %.0f s; "
                    "their live tails may miss its first rows", waiting or "?", JOIN_S)

    async def close(self) -> None:
        # redis-py may turn a cancelled command into a ConnectionError, which the loops
        # would retry: they look at this flag first.
        self._closing = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        await self.redis.aclose()

    def publish(self, batch: RowBatch, payload: bytes, place: Any = None) -> None:
        """Queue a durable batch (its WAL payload, and where its WAL record is) for the
        stream: with its rows if a node reads its project, else bare (its rows read back
        from the WAL when asked for; not kept in memory, which cost ~15%)."""
        if self.hot.get(batch.project_id, 0.0) > time.monotonic():
            self.outbox.put(Sent.of(batch, payload))
            return
        bare = Sent.bare(batch)
        self.held.setdefault(batch.project_id, deque()).append(
            (bare, payload if place is None else place))
        self.outbox.put(bare)

    async def need(self, project_id: str) -> None:
        """Before a read of the project: if another live node's bare batch of it is held
        here, ask every live node for the rows, and wait (up to WANT_S) until each has
        answered; else keep the project asked for (every REFRESH_S), without waiting."""
        since = time.monotonic() - self.wanted_at.get(project_id, -REFRESH_S)
        if not self.peers.missing(project_id):
            if since >= REFRESH_S and any(n != self.node_id for n in self.peers.live()):
                self._ask(project_id)
            return
        if not self.connected:
            return
        try:
            asked = await asyncio.wait_for(asyncio.shield(self._ask(project_id)), WANT_S)
        except TimeoutError:
            log.warning("bus: could not ask for the rows of %s; reading without them",
                        project_id)
            return
        deadline = time.monotonic() + WANT_S
        while waiting := [n for n in self.peers.live() if n != self.node_id
                          and self.answered.get((n, project_id), (0, 0)) < asked]:
            if time.monotonic() > deadline:
                log.warning("bus: nodes %s did not send the rows of %s within %.0f s; "
                            "reading without them", waiting, project_id, WANT_S)
                return
            await asyncio.sleep(0.005)

    def _ask(self, project_id: str) -> asyncio.Future[tuple[int, int]]:
        future = self.wants.get(project_id)
        if future is None:
            future = self.wants[project_id] = asyncio.get_running_loop().create_future()
            self.outbox.wake.set()
        return future

    def _asked(self, entry_id: str, projects: Any) -> None:
        """Another node asks for the rows of these projects: send them from now on, and
        the rows of the batches sent bare, then the answer."""
        until = time.monotonic() + HOT_S
        for project_id in projects if isinstance(projects, list) else ():
            if not isinstance(project_id, str):
                continue
            self.hot[project_id] = until
            self._asks.put_nowait((entry_id, project_id, self.held.pop(project_id, deque())))

    async def _answer_loop(self) -> None:
        """Answer the asks in the order read: the rows of the bare batches (read back from
        the WAL, off the event loop), then the answer."""
        loop = asyncio.get_running_loop()
        while True:
            entry_id, project_id, held = await self._asks.get()
            try:
                filled = await loop.run_in_executor(None, self._filled, held) if held else []
            except Exception:  # the rows not sent reach the others when this node flushes
                log.exception("bus: could not read back the rows asked for of %s", project_id)
                filled = []
            for sent in filled:
                self.outbox.put(sent)
                self.rows_answered += sent.rows
            self.answers[project_id] = entry_id
            self.outbox.wake.set()

    def _filled(self, held: deque[tuple[Sent, Any]]) -> list[Sent]:
        filled = []
        for bare, where in held:
            payload = where if isinstance(where, bytes) else self.read_back(*where, bare.lsn)
            if payload is None:  # its segment is gone: flushed, so nobody needs it
                continue
            filled.append(bare.filled(payload))
        return filled

    def _refresh_watched(self) -> None:
        """Projects tailed here are kept asked for, and asked for at once when a bare
        batch of one comes (its node stopped sending the rows)."""
        now = time.monotonic()
        for project_id in self.peers.watched():
            since = now - self.wanted_at.get(project_id, -REFRESH_S)
            if since >= REFRESH_S or (since >= 0.2 and self.peers.missing(project_id)):
                self._ask(project_id)

    def _entries(self, batches: list[Sent]) -> list[dict[Any, Any]]:
        """The batches as stream entries of about ``ENTRY_BYTES`` each: what every other
        node pays per entry (Redis's framing, redis-py's parsing) is paid per entry, not
        per batch. An entry's floor is its last batch's last id."""
        entries: list[dict[Any, Any]] = []
        group: list[Sent] = []
        size = 0
        for sent in batches:
            group.append(sent)
            size += len(sent.payload)
            if size >= ENTRY_BYTES or sent is batches[-1]:
                entries.append({"n": self.node_id, "e": self.epoch, "f": sent.last_id,
                                "m": _encode_sent(group)})
                group, size = [], 0
        return entries

    async def _publish_loop(self) -> None:
        backoff = 0.2
        failed = 0  # attempts in a row
        while not self._closing:
            try:
                await asyncio.wait_for(self.outbox.wake.wait(), HEARTBEAT_S)
                await asyncio.sleep(GATHER_S)
            except TimeoutError:  # a heartbeat, with the bare batches queued meanwhile
                pass
            self.outbox.wake.clear()
            # What the other nodes count with this one (rate limits, open tails), at most
            # once per HEARTBEAT_S.
            now = time.monotonic()
            extras: dict[str, bytes] = {}
            if now - self._shared_at >= HEARTBEAT_S:
                self._shared_at = now
                extras = {name: msgspec.json.encode(value)
                          for name, get in self.shares.items() if (value := get()) is not None}
            batches = list(self.outbox.batches)
            entries = self._entries(batches)
            # Asks, and answers (after the rows they answer with), go on the last entry.
            answers, asks = dict(self.answers), self.wants
            self.wants = {}
            if answers:
                extras["h"] = msgspec.json.encode(answers)
            if asks:
                extras["w"] = msgspec.json.encode(list(asks))
            if extras or not batches:  # a heartbeat: its floor is taken now, after them
                entries.append({"n": self.node_id, "e": self.epoch, "f": self.floor(),
                                **extras})
            sent = set(map(id, batches))
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    minid = f"{int((time.time() - RETAIN_S) * 1000)}-0"
                    for fields in entries:
                        pipe.xadd(STREAM, fields, minid=minid, approximate=True)
                    added = await pipe.execute()
            except self.errors as exc:
                if failed == 0:  # once per outage, not every RETRY_MAX_S
                    log.warning("bus: cannot publish %d entries (%s); retrying", len(entries),
                                exc)
                failed += 1
                self._ask_again(asks)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_MAX_S)
                continue
            except BaseException:  # the loop dies (it is restarted) or stops
                self._ask_again(asks)
                raise
            backoff = 0.2
            if failed:
                log.info("bus: publishing again after %d failed attempts", failed)
                failed = 0
            for project_id, entry_id in answers.items():
                if self.answers.get(project_id) == entry_id:
                    del self.answers[project_id]
            if asks:
                asked = _stream_id(added[-1])
                self._reading_until = now + HOT_S
                for project_id, future in asks.items():
                    self.wanted_at[project_id] = now
                    if not future.done():
                        future.set_result(asked)
            # put() may have let some of them go meanwhile (past max_rows), never others.
            queue = self.outbox.batches
            while queue and id(queue[0]) in sent:
                self.outbox.rows -= queue.popleft().held_rows

    def _ask_again(self, asks: dict[str, asyncio.Future[tuple[int, int]]]) -> None:
        """Asks whose entries were not added: asked again with the next entries."""
        for project_id, future in asks.items():
            if (newer := self.wants.get(project_id)) is not None:
                future.add_done_callback(functools.partial(_pass_on, newer))
            self.wants[project_id] = future

    def _unread(self) -> None:
        """The reader died: until it reads again, this node is not reading the stream."""
        self.connected = False

    async def _read_loop(self) -> None:
        backoff = 0.2
        while not self._closing:
            try:
                answer: Any = await self.redis.xread({STREAM: self.last_read}, count=READ_COUNT,
                                                block=1000)
            except self.errors as exc:
                if self.connected:
                    log.warning("bus: cannot read the stream (%s); retrying", exc)
                self.connected = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_MAX_S)
                continue
            self.connected = True
            backoff = 0.2
            if not answer:
                continue
            self._apply(answer)
            self._refresh_watched()
            if (now := time.monotonic()) - self._acked_at >= ACK_S:
                self._acked_at = now
                with contextlib.suppress(*self.errors):  # how far this node has read: a
                    await self.redis.hset(ACKS, self.node_id, self.last_read)  # joiner waits
            self.advanced()
            reading = self.wants or time.monotonic() < self._reading_until
            await asyncio.sleep(GATHER_S if reading else HEARTBEAT_S)

    def _apply(self, answer: Any) -> None:
        """Take what an XREAD returned: the other nodes' batches, floors and shares."""
        positions: Positions | None = None
        for _, entries in answer:
            for entry_id, fields in entries:
                self.last_read = entry_id.decode()
                node = fields[b"n"].decode()
                if node != self.node_id:
                    if (epoch := fields.get(b"e")) is not None:
                        self.peers.epoch(node, epoch.decode())
                    if (many := fields.get(b"m")) is not None:
                        try:
                            batches = _decode_sent(many)
                        except msgspec.DecodeError:
                            log.error("bus: an entry of node %s does not decode", node)
                            batches = []
                        if batches and positions is None:
                            positions = self._positions()
                        for sent in batches:
                            self.peers.offer(node, sent, positions)
                    try:
                        if (asks := fields.get(b"w")) is not None:
                            self._asked(entry_id.decode(), msgspec.json.decode(asks))
                        if (answers := fields.get(b"h")) is not None:
                            for project_id, asked in msgspec.json.decode(answers).items():
                                key = (node, project_id)
                                self.answered[key] = max(self.answered.get(key, (0, 0)),
                                                         _stream_id(asked))
                    except (ValueError, AttributeError, msgspec.DecodeError):
                        log.exception("bus: an ask or answer of node %s not taken", node)
                    for name, receive in self.receives.items():
                        if (value := fields.get(name.encode())) is not None:
                            try:
                                receive(node, msgspec.json.decode(value))
                            except Exception:
                                log.exception("bus: %s of node %s not taken", name, node)
                self.peers.heard(node, int(fields[b"f"]), _stream_id(entry_id)[0])

    async def _trim_loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(TRIM_S)
            # Read with a tail open as well: whether a silent node still flushes decides
            # whether its tails wait for it (Peers.waited).
            if not self.peers.holding() and not self.held and not any(self.peers.watched()):
                continue
            positions = self._positions()
            if positions is None:
                continue
            self.peers.flushed(positions)
            self.peers.trim(positions)
            now = time.monotonic()
            self.hot = {p: until for p, until in self.hot.items() if until > now}
            for project_id, held in list(self.held.items()):
                upto = position(positions, self.node_id, project_id)
                while held and held[0][0].lsn <= upto:
                    held.popleft()
                if not held:
                    del self.held[project_id]

    def _positions(self) -> Positions | None:
        """The catalog's WAL positions, read at most once per ``TRIM_S``: they move when a
        node flushes (seconds apart), and one a little old only makes this node hold a
        batch a little longer (searches cut by a fresh snapshot of their own)."""
        now = time.monotonic()
        if self._positions_read is not None and now - self._positions_read[0] < TRIM_S:
            return self._positions_read[1]
        try:
            positions = self.positions()
        except Exception as exc:  # the catalog is out: hold everything, trim later
            log.debug("bus: no catalog positions (%s)", exc)
            return None
        self._positions_read = (now, positions)
        return positions
