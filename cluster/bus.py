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

The stream keeps ``BOXTRAIL_BUS_RETAIN_S`` (30 s) of entries: a node (re)starting reads
them all, taking the batches not yet in Parquet. A deletion job trims the entries from
before it exactly once they are past that (:meth:`RedisBus.trim_before`). While Redis is
unreachable the node keeps acking (its WAL), queues what it has to publish (up to
``buffer_max_rows`` rows) and sends it when Redis is back; other nodes see those rows once
it flushes, or when it publishes again.

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
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from cluster.peers import Peers, Positions, position
from cluster.wire import Sent, decode_sent, encode_sent
from core.metrics import Registry
from core.schema import RowBatch
from core.supervisor import Supervisor

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
# A project's batches go out bare (without their rows) unless a node asked for them within
# HOT_S; a node reading it asks again every REFRESH_S, and waits up to WANT_S for answers.
HOT_S = 60.0
REFRESH_S = 20.0
WANT_S = 1.0
RETAIN_S = 30.0  # the default of BOXTRAIL_BUS_RETAIN_S
READ_COUNT = 2000
TRIM_S = 0.25
ENTRY_BYTES = 256 * 1024  # batches' payload bytes per stream entry, about
# The publisher and the reader retry a failing Redis after 0.2 s, doubling up to this. It
# was 2 s, most of what a reset's heal cost before rows moved again (and every tail in the
# cluster waits for a cut node's rows); an attempt against a link that refuses costs
# nothing to speak of, and one against a blackhole waits out its own timeout anyway.
RETRY_MAX_S = 0.5
def _stream_id(value: bytes | str) -> tuple[int, int]:
    """A stream entry id (b"1733100000000-3") as a comparable pair."""
    text = value.decode() if isinstance(value, bytes) else value
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _pass_on(to: asyncio.Future[Any], done: asyncio.Future[Any]) -> None:
    if not to.done():
        to.set_result(done.result())


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
                 supervisor: Supervisor | None = None, retain_s: float = RETAIN_S) -> None:
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
        self.retain_s = retain_s  # how long the stream keeps entries (BOXTRAIL_BUS_RETAIN_S)
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
        peers.ask_with(self.need)  # the peers' asks go out through this bus

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
                                "m": encode_sent(group)})
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
                    minid = f"{int((time.time() - self.retain_s) * 1000)}-0"
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
                            batches = decode_sent(many)
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

    async def trim_before(self, at_ms: int) -> None:
        """Delete every entry added before ``at_ms``, exactly (a deletion job's rows: its
        caller waits until they are past the stream's retention, so no node still needs
        them). XADD's own trim is approximate and only as new entries come."""
        await self.redis.xtrim(STREAM, minid=f"{at_ms}-0", approximate=False)

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
