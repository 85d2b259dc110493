"""The other nodes' rows as this node holds them until their node flushes them, and the
cluster watermark that keeps live tails in id order (see ``cluster.bus``)."""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from cluster.wire import Sent, decoded
from core.schema import ID_STEP, RowBatch
from ingest.buffer import SEAL_ROWS, LiveBuffer

log = logging.getLogger("boxtrail.bus")

DEAD_S = 3.0
# A node silent on the stream for DEAD_S whose WAL position moved in the catalog within
# FLUSHING_S is alive and cut from Redis: it acks, flushes, and publishes what it queued
# once it can, so the watermark still waits for it (its rows would otherwise come below
# every other node's live tails), up to SILENT_MAX_S of silence. Twice the default flush
# interval (5 s): a node under ingest flushes at least that often.
FLUSHING_S = 10.0
SILENT_MAX_S = 30.0
# The catalog's WAL positions: node -> (its position, {project: a position past it}).
Positions = dict[str, tuple[int, dict[str, int]]]


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

    def ask_with(self, need: Callable[[str], Awaitable[None]]) -> None:
        """From now on, before a read of a project, ``need(project)`` has the other nodes
        send the rows of their bare batches of it (``RedisBus.need``)."""
        self.need = need

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
            batch = decoded(node, sent)
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
            self.rows += len(batch)
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
        if self.watching(sent.project_id) and (batch := decoded(node, sent)) is not None:
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
            batch = decoded(node, sent)
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
                    if sent.size and (batch := decoded(node, sent)) is not None:
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
