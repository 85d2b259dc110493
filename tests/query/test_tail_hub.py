"""The tail's two paths and the handover between them (query/tail.py): rows pushed live
by the project's hub, rows read from a cursor, and never a row lost or sent twice.

The tests on a real server share one (``tserver`` below), each on a project of its own
name, starting once no tail of an earlier test is open (the tenant's cap counts them all,
and an open tail could fall back in another test's time); a counter of /metrics is read
as what the test itself added to it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import cast

import duckdb
import httpx
import pytest

from cluster.peers import Peers
from core.config import Config
from core.metrics import Registry
from core.schema import RowBatch, to_table
from ingest.buffer import LiveBuffer
from query.engine import QueryEngine
from query.frames import Skipped, batch_rows, frame
from query.hubs import HUB_MAX_ROWS, ClusterHub, Subscriber
from query.rows import SELECT
from query.tail import Tails
from tests.query.test_mcp import call, error_text, payload, run
from tests.query.test_tail import opened, send, wait_for
from tests.support.server import Server, create_project
from tests.support.sse import Tail, messages

ENV = {"BOXTRAIL_TAIL_HEARTBEAT_S": "0.3", "BOXTRAIL_TAIL_MAX_BEHIND": "5000",
       "BOXTRAIL_TAIL_MAX_PER_TENANT": "10"}


@pytest.fixture(scope="module")
def shared_tserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(tmp_path_factory.mktemp("tail-hub") / "data", ENV).start()
    yield server
    server.stop()


@pytest.fixture
def tserver(shared_tserver: Server) -> Server:
    """The module's server once the tails of earlier tests are gone (a closed tail is
    let go at its next heartbeat)."""
    with shared_tserver.client() as api:
        wait_for(lambda: metric(api, "boxtrail_tail_subscribers") == 0)
    return shared_tserver


def metric(api: httpx.Client, name: str, missing: float | None = None) -> float:
    """The metric's value; ``missing`` if given and the series is not there yet (a labelled
    counter appears once counted: before, in a test run first, it is 0)."""
    for line in api.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    if missing is not None:
        return missing
    raise AssertionError(f"no metric {name}")


def test_live_rows_are_the_rows_a_read_returns() -> None:
    # The hub builds rows from the batch's lists; a read gets them from its Arrow form.
    full = RowBatch(
        project_id="p", box="b1", session_id="s1", release="1.2.3", user_agent="UA",
        sdk='{"name":"boxtrail"}', debug_ids='{"a.js":"d1"}', received=1_760_000_000_123,
        id_start=1 << 40, ts=[1_760_000_000_000, 1_760_000_000_999],
        level=["info", "error"], message=["hello", "boom é \u2028 \"q\""],
        url=["https://b1.box.example/a", None], attrs=['{"n":1,"ok":true}', None],
        error_type=[None, "TypeError"], error_message=[None, "x is undefined"],
        error_stack=[None, "TypeError: x\n    at f (a.js:1:2)"], truncated=[None, "message"])
    bare = RowBatch(
        project_id="p", box=None, session_id=None, release=None, user_agent=None, sdk=None,
        debug_ids=None, received=1_760_000_000_500, id_start=(1 << 40) + 2,
        ts=[1_760_000_000_400], level=["debug"], message=[""], url=[None], attrs=[None],
        error_type=[None], error_message=[None], error_stack=[None], truncated=[None])
    con = duckdb.connect()
    con.register("buffered", to_table([full, bare]))
    read = con.execute(f"SELECT {', '.join(SELECT)} FROM buffered ORDER BY id").fetchall()
    live = [*batch_rows(full), *batch_rows(bare)]
    assert live == read
    assert [frame(r) for r in live] == [frame(r) for r in read]


def test_resume_while_ingest_runs(tserver: Server) -> None:
    total = 3000
    with tserver.client() as api:
        key = str(create_project(api, "resumed")["ingestKey"])
        first = Tail(api, "/v1/projects/resumed/tail")

        def sender() -> None:
            for start in range(0, total, 20):
                send(tserver, key, "b", [f"r{n}" for n in range(start, start + 20)])
                time.sleep(0.005)

        sending = threading.Thread(target=sender)
        sending.start()
        try:
            wait_for(lambda: len(first.logs()) >= 400)
            first.close()
            seen = first.logs()
            cut = int(str(seen[399]["message"])[1:])  # as if the connection dropped here
            # Resume while rows keep coming: the read and the hub's pages overlap.
            again = Tail(api, "/v1/projects/resumed/tail",
                         headers={"Last-Event-ID": str(seen[399]["id"])})
        finally:
            sending.join(60)
        wait_for(lambda: len(again.logs()) >= total - cut - 1, 30)
        time.sleep(0.3)
        again.close()
        assert [r["message"] for r in seen] == [f"r{n}" for n in range(len(seen))]
        assert [r["message"] for r in again.logs()] == [f"r{n}" for n in range(cut + 1, total)]
        ids = [str(m.id) for m in again.received if m.event == "log"]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_a_tail_that_stops_reading_falls_back_then_catches_up(tserver: Server) -> None:
    # ~40 MB of rows: more than the sockets hold, so the server's stream for the reader
    # that does not read blocks and its queue overflows (by bytes, well under
    # BOXTRAIL_TAIL_MAX_BEHIND rows), while other tails of the project go on live.
    total = 2500
    padding = "x" * 15_000
    with tserver.client() as api:
        key = str(create_project(api, "stalled")["ingestKey"])
        fallbacks = metric(api, "boxtrail_tail_fallbacks_total")
        fast = Tail(api, "/v1/projects/stalled/tail")
        odd = Tail(api, "/v1/projects/stalled/tail", {"query": "odd"})
        with api.stream("GET", "/v1/projects/stalled/tail",
                        timeout=httpx.Timeout(60, read=None)) as response:
            assert response.status_code == 200
            for start in range(0, total, 20):
                send(tserver, key, "b", [f"{n} {'odd' if n % 2 else 'even'} {padding}"
                                         for n in range(start, start + 20)])
            wait_for(lambda: len(fast.logs()) == total, 60)
            assert metric(api, "boxtrail_tail_fallbacks_total") >= fallbacks + 1
            delivered: list[int] = []
            dropped = 0
            deadline = time.monotonic() + 60
            for message in messages(response):
                assert time.monotonic() < deadline, (len(delivered), dropped)
                if message.event == "log":
                    delivered.append(int(str(message.json()["message"]).split()[0]))
                elif message.event == "dropped":
                    dropped += int(message.json()["count"])  # type: ignore[call-overload]
                if len(delivered) + dropped >= total:
                    break
        wait_for(lambda: len(odd.logs()) == total // 2, 30)
        time.sleep(0.3)
        fast.close()
        odd.close()
        # Within BOXTRAIL_TAIL_MAX_BEHIND: it read its way back, nothing skipped.
        assert dropped == 0 and delivered == list(range(total))
        assert [int(str(r["message"]).split()[0]) for r in fast.logs()] == list(range(total))
        assert [int(str(r["message"]).split()[0]) for r in odd.logs()] == list(
            range(1, total, 2))


QUERIES = ["checkout", "level:error OR level:warn", '-"step 3" box:b1', "/fail(ed|ure)/",
           "attr.user:4*", "type:TypeError", "url:*cart*", "release:1.*"]


def test_every_filter_gives_live_what_a_search_gives(tserver: Server) -> None:
    # Each tail's query runs on the live path (DuckDB over the hub's batch); /logs runs
    # the same query over the stored rows. Both must name the same rows.
    with tserver.client() as api:
        key = str(create_project(api, "filtered")["ingestKey"])
        fallbacks = metric(api, "boxtrail_tail_fallbacks_total")
        live = metric(api, 'boxtrail_tail_pages_total{source="live"}', missing=0.0)
        tails = {q: Tail(api, "/v1/projects/filtered/tail", {"query": q}) for q in QUERIES}
        tails |= {"box b2": Tail(api, "/v1/projects/filtered/tail", {"boxId": "b2"})}
        levels = ["debug", "info", "warn", "error"]
        for k in range(40):
            events = [{"level": levels[(k + i) % 4],
                       "message": f"checkout step {i} {'failed' if i % 3 else 'ok'} {k}",
                       "url": f"https://shop.test/{'cart' if i % 2 else 'home'}",
                       "attrs": {"user": f"{k % 7}{i}"},
                       **({"error": {"type": "TypeError" if i % 2 else "RangeError",
                                     "message": "boom"}} if i in (3, 4) else {})}
                      for i in range(6)]
            box = f"b{k % 3}"
            r = httpx.post(f"{tserver.url}/v1/ingest", params={"key": key},
                           json={"context": {"boxId": box, "release": f"{k % 2}.0"},
                                 "events": events})
            assert r.status_code == 202, r.text

        def searched(params: dict[str, str]) -> list[str]:
            rows = api.get("/v1/projects/filtered/logs", params={**params, "limit": "1000"}).json()
            return [str(row["id"]) for row in reversed(rows["rows"])]

        expected = {q: searched({"query": q}) for q in QUERIES}
        expected["box b2"] = searched({"boxId": "b2"})
        for name, tail in tails.items():
            wait_for(lambda t=tail, n=name: len(t.logs()) >= len(expected[n]))  # type: ignore[misc]
        time.sleep(0.3)
        for name, tail in tails.items():
            tail.close()
            assert [str(r["id"]) for r in tail.logs()] == expected[name], name
        assert all(expected.values()), [n for n, ids in expected.items() if not ids]
        # All of it came the live way: no tail had to read from its cursor.
        assert metric(api, "boxtrail_tail_fallbacks_total") == fallbacks
        assert metric(api, 'boxtrail_tail_pages_total{source="live"}') > live


def test_mcp_tails_count_toward_the_tenants_cap(tserver: Server) -> None:
    with tserver.client() as api:
        create_project(api, "capped")
        sse = [Tail(api, "/v1/projects/capped/tail") for _ in range(9)]
        result: dict[str, object] = {}

        def mcp_tail() -> None:
            result.update(payload(run(call(tserver, "auto", "logs_tail",
                                           {"project": "capped", "seconds": 3}))))

        listening = threading.Thread(target=mcp_tail)
        listening.start()
        try:
            wait_for(lambda: metric(api, "boxtrail_tail_subscribers") == 10)
            assert opened(api, "/v1/projects/capped/tail")[0] == 429
            refused = error_text(run(call(tserver, "auto", "logs_tail",
                                          {"project": "capped", "seconds": 1})))
            assert "10 tails are open for this tenant" in refused
        finally:
            listening.join(30)
        assert result == {"rows": [], "omitted": 0, "seconds": 3}
        wait_for(lambda: metric(api, "boxtrail_tail_subscribers") == 9)
        for tail in sse:
            tail.close()


def test_a_stuck_hub_lets_its_rows_go_and_sends_its_tails_back_to_their_cursors() -> None:
    """While a query hub waits on DuckDB, rows pile up in it: past HUB_MAX_ROWS it drops
    them and every tail it serves falls back to reading from its cursor, so a stuck filter
    costs neither memory nor rows. The rows it let go are the node's doing, not the
    reader's: counted as a backlog read, not a fallback, and excused from its lag."""

    def batch(first_id: int, rows: int) -> RowBatch:
        return RowBatch(
            project_id="p", box="b", session_id=None, release=None, user_agent=None,
            sdk=None, debug_ids=None, received=1_760_000_000_000, id_start=first_id,
            ts=[1_760_000_000_000] * rows, level=["info"] * rows, message=["m"] * rows,
            url=[None] * rows, attrs=[None] * rows, error_type=[None] * rows,
            error_message=[None] * rows, error_stack=[None] * rows, truncated=[None] * rows)

    async def main() -> tuple[bool, int, float, float, float, int]:
        buffer = LiveBuffer()
        tails = Tails(Config(), cast(QueryEngine, None), buffer, Registry())
        sub = Subscriber((frame, None, "message = ?", ("m",)), 0, 10**9, tails.m_fallbacks,
                         tails.m_backlogs)
        hub = tails._join("p", sub)
        # Nothing awaits in between: the hub's task never gets to deliver.
        fed = 0
        while fed <= HUB_MAX_ROWS:
            b = batch(fed + 1, 1000)
            buffer.append(b)  # as the ingest service hands a durable batch on
            tails.appended(b)
            fed += 1000
        state = (sub.overflowed, hub.rows, tails.m_fallbacks.get(), float(len(sub.queue)),
                 tails.m_backlogs.get(), sub.excused)
        tails._leave(hub, sub)
        tails.pool.shutdown()
        return state

    overflowed, held, fallbacks, queued, backlogs, excused = asyncio.run(main())
    assert overflowed and queued == 0
    assert held < HUB_MAX_ROWS  # what came after the valve tripped, not everything
    assert backlogs == 1 and fallbacks == 0
    # Every row it had been given when it let them go: ids 1.. in 1,000-row batches.
    assert excused == HUB_MAX_ROWS + 1000


def test_a_cluster_hub_whose_watermark_is_stuck_lets_rows_go_then_starts_again() -> None:
    """A cluster hub holds rows until the watermark passes them. While the watermark is
    stuck (this node cannot read the stream), it holds at most HUB_MAX_ROWS; past that it
    lets them go, and when the watermark moves its tails read up to it for themselves and
    the hub holds again from there."""

    def batch(first_id: int, rows: int) -> RowBatch:
        return RowBatch(
            project_id="p", box="b", session_id=None, release=None, user_agent=None,
            sdk=None, debug_ids=None, received=1, id_start=first_id, ts=[1] * rows,
            level=["info"] * rows, message=["m"] * rows, url=[None] * rows,
            attrs=[None] * rows, error_type=[None] * rows, error_message=[None] * rows,
            error_stack=[None] * rows, truncated=[None] * rows)

    class Engine:  # the rows visible above a cursor (none, unless set); reads are noted
        def __init__(self) -> None:
            self.reads: list[int] = []
            self.visible: list[tuple[int]] = []

        async def after(self, project_id: str, after_id: int, *_: object) -> list[object]:
            self.reads.append(after_id)
            return [r for r in self.visible if r[0] > after_id]

    async def main() -> None:
        floor = [10]  # this node's floor; no other node is heard: it is the watermark
        engine = Engine()
        tails = Tails(Config(), cast(QueryEngine, engine), LiveBuffer(), Registry(),
                      Peers("me"), lambda: floor[0])
        sub = Subscriber((frame, None, None, ()), 0, 10**9, tails.m_fallbacks)
        hub = cast(ClusterHub, tails._join("p", sub))
        await asyncio.sleep(0.05)
        assert engine.reads == [10] and hub.released == 10
        fed = 0
        while fed <= HUB_MAX_ROWS + 5000:  # the watermark never moves meanwhile
            hub.feed(batch(11 + fed, 1000))
            fed += 1000
            assert len(hub.held) <= HUB_MAX_ROWS
        assert hub.spilled and not hub.held and not sub.overflowed
        floor[0] = 11 + fed  # every row fed so far is visible: the tail reads it itself
        hub.wake.set()
        await asyncio.sleep(0.05)
        assert hub.released == floor[0] and not hub.spilled
        assert sub.overflowed and engine.reads == [10, floor[0]]
        hub.feed(batch(floor[0] + 1, 3))
        assert sorted(hub.held) == [floor[0] + 1, floor[0] + 2, floor[0] + 3]
        # A seed that finds more than the cap above the mark spills at once, rather than
        # hold a part of them (the watermark would pass the rest unsent).
        engine.visible = [(floor[0] + 10 + i,) for i in range(HUB_MAX_ROWS + 1)]
        hub.spilled, hub.held = True, {}
        floor[0] += 5
        hub.wake.set()
        await asyncio.sleep(0.05)
        assert hub.spilled and not hub.held and engine.reads[-1] == floor[0]
        tails._leave(hub, sub)
        tails.pool.shutdown()

    asyncio.run(main())


def test_a_backlog_the_watermark_held_is_read_whole_and_a_slow_reader_still_skips() -> None:
    """Rows a cluster hub held while the watermark was stuck (this node cut from Redis)
    are no fault of its tails' readers: however many more than ``tail_max_behind`` they
    are, the tail reads them from its cursor, every one in order, without ``dropped`` or
    a fallback counted (issue 35). A reader that then leaves its queue unread is slow by
    itself, and skips as before."""
    max_behind = 100
    step = 1 << 10

    def batch(first_id: int, rows: int) -> RowBatch:
        return RowBatch(
            project_id="p", box="b", session_id=None, release=None, user_agent=None,
            sdk=None, debug_ids=None, received=1, id_start=first_id, id_step=step,
            ts=[1] * rows, level=["info"] * rows, message=["m"] * rows, url=[None] * rows,
            attrs=[None] * rows, error_type=[None] * rows, error_message=[None] * rows,
            error_stack=[None] * rows, truncated=[None] * rows)

    class Engine:  # what a read finds: the rows made visible so far
        def __init__(self) -> None:
            self.visible: list[tuple[int]] = []

        def _between(self, after_id: int, upto: int | None) -> list[tuple[int]]:
            return [r for r in self.visible if after_id < r[0] <= (upto or 1 << 62)]

        async def after(self, project_id: str, after_id: int, box: object, limit: int,
                        where: object = None, bound: int | None = None) -> list[tuple[int]]:
            return self._between(after_id, bound)[:limit]

        async def count_between(self, project_id: str, after_id: int, upto_id: int,
                                *_: object) -> int:
            return len(self._between(after_id, upto_id))

    def encode(row: tuple[object, ...]) -> bytes:
        return b"%d\n" % cast(int, row[0])

    async def main() -> None:
        floor = [10]  # no other node heard: this node's floor is the watermark
        engine = Engine()
        tails = Tails(Config(tail_max_behind=max_behind), cast(QueryEngine, engine),
                      LiveBuffer(), Registry(), Peers("me"), lambda: floor[0])
        tail = tails.follow("p", None, None, 10, encode, 5.0)
        got: list[int] = []
        skipped: list[Skipped] = []

        async def read_until(count: int) -> None:
            while len(got) < count and not skipped:
                part = await asyncio.wait_for(anext(tail), 5)
                if isinstance(part, Skipped):
                    skipped.append(part)
                elif part is not None:
                    got.extend(int(line) for line in part.split())

        next_id = 11

        def come(rows: int) -> None:
            nonlocal next_id
            b = batch(next_id, rows)
            engine.visible += [(i,) for i in b.ids()]
            tails.appended(b)
            next_id = b.last_id + 1

        async def released_in_small_steps() -> None:  # 600 rows, each release pushed live
            for _ in range(30):
                come(20)
                floor[0] = next_id - 1
                tails.advance()
                await asyncio.sleep(0.005)

        first = asyncio.ensure_future(read_until(1))  # the tail reads, then waits live
        await asyncio.sleep(0.05)
        # The watermark is stuck while 2,000 rows come: 20x what a reader may be behind.
        for _ in range(20):
            come(100)
        hub = cast(ClusterHub, tails.hubs["p", False])
        assert len(hub.held) == 2000 and not got
        floor[0] = next_id - 1  # the cut heals
        tails.advance()
        await first
        assert len(got) == 500  # the first page of the backlog, read from the cursor
        # While the reader works through the backlog, 600 more rows come live: its queue
        # overflows, but it is behind by no more than the backlog it was handed.
        await released_in_small_steps()
        assert tails.m_fallbacks.get() == 1
        await read_until(2600)
        assert got == [i for (i,) in engine.visible] and not skipped
        assert tails.m_dropped.get() == 0 and tails.m_backlogs.get() == 1
        assert not hub.held and hub.released == floor[0]
        # Back at the live edge, the reader stops reading while 600 more rows come: past
        # max_behind queued it is sent back by its own doing, and skips them.
        await released_in_small_steps()
        assert tails.m_fallbacks.get() == 2
        await read_until(3200)
        assert skipped == [Skipped(600, floor[0])] and len(got) == 2600
        assert tails.m_dropped.get() == 600
        await tail.aclose()
        tails.pool.shutdown()

    asyncio.run(main())


def test_a_catch_up_read_the_catalog_cannot_answer_yet_is_tried_again_not_the_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A tail reading a backlog from its cursor (after a cut, or a fallback) needs the
    catalog for each page; a read it cannot answer yet (a flush's commit holding the
    buffer, a slow catalog link: ``MetadataUnavailable``) is tried again, heartbeats sent
    meanwhile. The stream used to end there, silently, short of the rows it was owed (seen
    once in a three-node run: a tail 840 rows short after a Redis cut)."""
    import query.tail
    from metadata.db import MetadataUnavailable

    monkeypatch.setattr(query.tail, "RETRY_S", 0.01)
    failing = {2, 3, 6, 9}  # the calls that fail: reads and counts, once and twice running

    class Engine:
        def __init__(self) -> None:
            self.visible = [(i,) for i in range(1, 1601)]  # four pages
            self.calls = 0

        def _fail(self) -> None:
            self.calls += 1
            if self.calls in failing:
                raise MetadataUnavailable("the catalog is slow to answer")

        async def after(self, project_id: str, after_id: int, box: object, limit: int,
                        where: object = None, bound: int | None = None) -> list[tuple[int]]:
            self._fail()
            return [r for r in self.visible if after_id < r[0] <= (bound or 1 << 62)][:limit]

        async def count_between(self, project_id: str, after_id: int, upto_id: int,
                                *_: object) -> int:
            self._fail()
            return len([r for r in self.visible if after_id < r[0] <= upto_id])

    def encode(row: tuple[object, ...]) -> bytes:
        return b"%d\n" % cast(int, row[0])

    async def main() -> tuple[list[int], int, list[object], int]:
        engine = Engine()
        tails = Tails(Config(tail_max_behind=10**6), cast(QueryEngine, engine),
                      LiveBuffer(), Registry())
        got: list[int] = []
        beats = 0
        others: list[object] = []
        async with contextlib.aclosing(tails.follow("p", None, None, 0, encode, 5.0)) as tail:
            while len(got) < 1600:
                part = await asyncio.wait_for(anext(tail), 5)
                if part is None:
                    beats += 1
                elif isinstance(part, bytes):
                    got.extend(int(line) for line in part.split())
                else:
                    others.append(part)
        tails.pool.shutdown()
        return got, beats, others, engine.calls

    got, beats, others, calls = asyncio.run(main())
    assert got == list(range(1, 1601)) and not others
    assert beats >= 3 and calls > max(failing)  # each failure tried again, not skipped
