"""Bare batches and asks (``cluster.bus.RedisBus``), with real Redis and three buses in
one process: a node sends a project's batches without their rows until another node
reads the project; a read first asks for the rows and then has every one of them; a live
tail's mark never passes a row that has not arrived, even while the project's heat lapses
and comes back under it."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from unittest import mock

import msgspec

from cluster import bus as bus_module
from cluster import peers as peers_module
from cluster.bus import RedisBus
from cluster.peers import Peers
from core.schema import ID_STEP, RowBatch
from core.supervisor import Supervisor
from tests.cluster.test_bus_peers import batch


def clock() -> int:
    return int(time.time() * 1_000_000)


class Node:
    """A bus with what a node gives it: ids from a clock (each node its own slot of the
    step), and a floor at or above every id it gave (all queued at once) and below every
    id it will give."""

    def __init__(self, url: str, name: str, index: int,
                 supervisor: Supervisor | None = None) -> None:
        self.name = name
        self.index = index
        self.lsn = 0
        self.last_id = 0
        self.peers = Peers(name)
        self.on_advance: Callable[[], None] = lambda: None  # what a test does as marks move
        self.bus = RedisBus(url, name, self.peers,
                            lambda: max(self.last_id, clock() * ID_STEP), dict, 1_000_000,
                            advanced=lambda: self.on_advance(), supervisor=supervisor)
        self.bus.epoch = f"epoch-{name}"
        self.sent: list[RowBatch] = []

    def ingest(self, project: str, rows: int) -> RowBatch:
        self.lsn += 1
        start = max(self.last_id // ID_STEP + 1, clock()) * ID_STEP + self.index
        b = batch(project, self.lsn, start, rows)
        self.last_id = b.last_id
        self.bus.publish(b, msgspec.msgpack.encode(b))
        self.sent.append(b)
        return b


@asynccontextmanager
async def nodes(url: str, count: int, supervisor: Supervisor | None = None
                ) -> AsyncIterator[list[Node]]:
    """``count`` nodes; the first under ``supervisor``, if given."""
    started = [Node(url, f"n{i}", i + 1, supervisor if i == 0 else None)
               for i in range(count)]
    for node in started:
        await node.bus.start()
    try:
        yield started
    finally:
        for node in started:
            await node.bus.close()


def ids_of(batches: list[RowBatch], project: str) -> list[int]:
    return sorted(i for b in batches if b.project_id == project for i in b.ids())


def read(node: Node, project: str) -> list[int]:
    tables = node.peers.snapshot(project, {})
    return sorted(i for t in tables for i in t["id"].to_pylist())


async def until(condition: object, limit_s: float = 5.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_batches_of_an_unread_project_go_bare_and_a_read_gets_every_row(
        redis_url: str) -> None:
    async def main() -> None:
        async with nodes(redis_url, 3) as (a, b, c):
            sent = [b.ingest("p", 5) for _ in range(20)] + [c.ingest("p", 3) for _ in range(7)]
            await until(lambda: a.peers.missing("p")
                        and len(a.peers.peers[b.name].gaps.get("p", ())) == 20
                        and len(a.peers.peers[c.name].gaps.get("p", ())) == 7)
            assert a.peers.rows == 0  # nothing but their places came
            await a.peers.prepare("p")  # what a search does first: ask, and wait
            assert read(a, "p") == ids_of(sent, "p")
            assert not a.peers.missing("p")
            # The project is read now: what follows comes with its rows, to every node.
            more = [b.ingest("p", 2) for _ in range(5)]
            await until(lambda: read(a, "p") == ids_of(sent + more, "p"))
            assert not a.peers.missing("p")
            await until(lambda: read(c, "p") == ids_of([*sent[:20], *more], "p"))
            # Another project nobody reads still goes bare.
            b.ingest("q", 4)
            await until(lambda: a.peers.missing("q"))

    asyncio.run(main())


def test_a_live_mark_never_passes_a_row_not_yet_here_while_heat_lapses(
        redis_url: str) -> None:
    """A live tail's hub releases rows up to min(watermark, hold): every row at or below a
    mark it saw must have reached its listener already, even when the writers stop
    sending rows (the project cooled) and start again on the next ask."""
    async def main() -> None:
        with mock.patch.object(bus_module, "HOT_S", 0.15), \
                mock.patch.object(bus_module, "REFRESH_S", 0.6):
            async with nodes(redis_url, 3) as (a, b, c):
                got: set[int] = set()
                late: list[int] = []
                marks = [0]
                class Hub:  # a live tail's hub of project p, as query.tail's watches
                    def watching(self, project: str) -> bool:
                        return project == "p"

                    def watched(self) -> list[str]:
                        return ["p"]

                    def peer_appended(self, _node: str, rb: RowBatch) -> None:
                        late.extend(i for i in rb.ids() if i <= marks[-1])
                        got.update(rb.ids())

                    def lost(self, project: str) -> None:
                        pass

                a.peers.watch(Hub())

                def advanced() -> None:
                    mark = min(a.peers.watermark(a.bus.floor()), a.peers.hold("p"))
                    marks.append(max(marks[-1], mark))

                a.on_advance = advanced
                filled = []
                fill = a.peers._fill
                a.peers._fill = lambda *args: filled.append(fill(*args)) or filled[-1]
                await a.peers.need("p")
                rng = random.Random(7)
                deadline = time.monotonic() + 4.0
                while time.monotonic() < deadline:
                    rng.choice((b, c)).ingest(rng.choice("pq"), rng.randint(1, 4))
                    await asyncio.sleep(rng.uniform(0, 0.03))
                wanted = set(ids_of(b.sent + c.sent, "p"))
                await until(lambda: wanted <= got)
                await until(lambda: marks[-1] >= max(wanted))
                assert late == []
                assert got == wanted
                # The heat lapsed on the way: batches of p went bare and came again.
                assert filled.count(True) > 3, filled.count(True)

    asyncio.run(main())


def test_a_read_does_not_wait_for_a_node_that_is_gone(redis_url: str) -> None:
    """A node that sent bare batches and then died is not waited for: the read goes on
    without its rows (it replays them from its WAL when it restarts)."""
    async def main() -> None:
        with mock.patch.object(peers_module, "DEAD_S", 0.5):
            async with nodes(redis_url, 2) as (a, b):
                b.ingest("p", 3)
                await until(lambda: a.peers.missing("p"))
                await b.bus.close()
                # Another entry from a moves the stream's time on past b's last one.
                await asyncio.sleep(0.7)
                began = time.monotonic()
                await a.peers.prepare("p")
                assert time.monotonic() - began < bus_module.WANT_S
                assert read(a, "p") == []
                assert not a.peers.missing("p")  # b is not live: its gap holds nothing

    asyncio.run(main())


def test_a_cluster_that_only_ingests_talks_once_a_heartbeat(redis_url: str) -> None:
    """Bare batches wait for the next heartbeat, and a node that reads nothing reads the
    stream once a heartbeat: about one entry and one read a HEARTBEAT_S each, however
    fast batches come. A read still gets every row, and what is read is sent at once."""
    async def main() -> None:
        async with nodes(redis_url, 2) as (a, b):
            reads = [0]
            take = a.bus._apply

            def counted(answer: object) -> None:
                reads[0] += 1
                take(answer)

            a.bus._apply = counted  # type: ignore[method-assign]
            first = await a.bus.redis.xadd(bus_module.STREAM, {"n": "probe", "f": 0})
            began, reads[0] = time.monotonic(), 0
            while time.monotonic() - began < 1.0:
                b.ingest("q", 5)
                await asyncio.sleep(0.004)
            elapsed = time.monotonic() - began
            await until(lambda: len(a.peers.peers[b.name].gaps.get("q", ())) == len(b.sent))
            beats = elapsed / bus_module.HEARTBEAT_S
            entries = await a.bus.redis.xrange(bus_module.STREAM, min=first)
            by_b = [f for _, f in entries if f[b"n"] == b.name.encode()]
            assert len(b.sent) > 4 * beats
            assert len(by_b) <= beats + 3, (len(by_b), beats)
            assert reads[0] <= beats + 3, (reads[0], beats)
            # A read asks, gets every row, and the rows that follow come without waiting
            # for a heartbeat: a node reading a project reads at the GATHER_S pace.
            await a.peers.prepare("q")
            assert read(a, "q") == ids_of(b.sent, "q")
            began, reads[0] = time.monotonic(), 0
            while time.monotonic() - began < 0.5:
                b.ingest("q", 5)
                await asyncio.sleep(0.004)
            await until(lambda: read(a, "q") == ids_of(b.sent, "q"))
            assert reads[0] > 0.5 / bus_module.HEARTBEAT_S + 3, reads[0]

    asyncio.run(main())
