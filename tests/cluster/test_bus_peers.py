"""The other nodes' rows as a node holds them (``cluster.peers.Peers``), against a model.

Batches arrive as payloads and stay undecoded until a read wants their project, or are
decoded at once when a live tail watches it; either way a search must see exactly the rows
past each node's catalog position, in the same order, whatever mix of arrivals, flushes,
trims and reads came before."""

from __future__ import annotations

import asyncio
from unittest import mock

import msgspec
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cluster.peers import DEAD_S, FLUSHING_S, SILENT_MAX_S, Held, Peers, Positions, past
from cluster.wire import Sent, decode_sent, encode_sent
from core.schema import ID_STEP, RowBatch

NODES = ("a", "b")
PROJECTS = ("p", "q")

ops = st.lists(st.one_of(
    st.tuples(st.just("offer"), st.sampled_from(NODES), st.sampled_from(PROJECTS),
              st.integers(1, 4), st.booleans(), st.booleans(), st.booleans()),
    st.tuples(st.just("fill"), st.sampled_from(NODES)),
    st.tuples(st.just("flush"), st.sampled_from(NODES), st.sampled_from(PROJECTS),
              st.integers(0, 3)),
    st.tuples(st.just("trim")),
    st.tuples(st.just("prepare"), st.sampled_from(PROJECTS)),
    st.tuples(st.just("read"), st.sampled_from(PROJECTS), st.integers(0, 3)),
    # A read off the loop: its capture now, cut at positions read later (past).
    st.tuples(st.just("capture"), st.sampled_from(PROJECTS), st.integers(0, 3)),
    st.tuples(st.just("past")),
), max_size=60)


class Watcher:
    """What the live tails are to ``Peers`` (``cluster.peers.PeerWatcher``): the projects
    watched, and what came and what was lost of them."""

    def __init__(self, projects: set[str] | None = None) -> None:
        self.projects = projects or set()
        self.heard: list[tuple[str, int]] = []
        self.lost_projects: list[str] = []

    def watching(self, project_id: str) -> bool:
        return project_id in self.projects

    def watched(self) -> set[str]:
        return self.projects

    def peer_appended(self, node: str, b: RowBatch) -> None:
        self.heard.append((node, b.lsn))

    def lost(self, project_id: str) -> None:
        self.lost_projects.append(project_id)


def batch(project: str, lsn: int, id_start: int, rows: int) -> RowBatch:
    return RowBatch(lsn=lsn, project_id=project, box=None, session_id=None, release=None,
                    user_agent=None, sdk=None, debug_ids=None, received=1, id_start=id_start,
                    id_step=ID_STEP, ts=[1] * rows, level=["info"] * rows,
                    message=[f"m{lsn}"] * rows, url=[None] * rows, attrs=[None] * rows,
                    error_type=[None] * rows, error_message=[None] * rows,
                    error_stack=[None] * rows, truncated=[None] * rows)


def on_the_wire(b: RowBatch, bare: bool = False) -> Sent:
    """What a reader gets: the batch as ``RedisBus.publish`` queues it (with its rows, or
    bare), through the entry's encoding and back."""
    sent = Sent.bare(b) if bare else Sent.of(b, msgspec.msgpack.encode(b))
    return decode_sent(encode_sent([sent]))[0]


@settings(max_examples=300, deadline=None)
@given(ops)
# A batch decoded for a live tail while an older one waits undecoded: the buffer must take
# the older first, or a chunk's last LSN lies and a trim drops rows not yet in Parquet.
@example([("offer", "a", "p", 2, False, False, False), ("offer", "a", "p", 2, True, False, False),
          ("read", "p", 0), ("flush", "a", "p", 1), ("trim",), ("read", "p", 0)])
# A bare batch between two with rows, read before and after its rows come.
@example([("offer", "a", "p", 2, False, False, False), ("offer", "a", "p", 1, False, False, True),
          ("offer", "a", "p", 3, True, False, False), ("read", "p", 0), ("prepare", "p"),
          ("fill", "a"), ("read", "p", 1), ("flush", "a", "p", 2), ("trim",), ("read", "p", 0)])
# Captured, then flushed and trimmed before the positions are read: cut, not lost or twice.
@example([("offer", "a", "p", 2, False, False, False), ("offer", "a", "p", 2, False, False, False),
          ("capture", "p", 0), ("flush", "a", "p", 1), ("trim",), ("offer", "a", "p", 1, False,
          False, False), ("past",)])
def test_a_read_sees_exactly_the_rows_past_each_nodes_position(script: list[tuple]) -> None:
    # Seal every few rows, and decode a few rows at a time: chunks and slices get edges.
    with mock.patch("ingest.buffer.SEAL_ROWS", 3), mock.patch("cluster.peers.SEAL_ROWS", 2):
        peers = Peers("me")
        watcher = Watcher()
        peers.watch(watcher)
        watched, heard = watcher.projects, watcher.heard
        lsn = dict.fromkeys(NODES, 0)
        counter = 0
        flushed = {(n, p): 0 for n in NODES for p in PROJECTS}
        held: list[tuple[str, str, int, list[int]]] = []  # node, project, lsn, ids
        bare: dict[str, list[RowBatch]] = {n: [] for n in NODES}  # rows not yet come
        expect_heard: list[tuple[str, int]] = []
        # A capture not yet cut: project, after, what it took, and what was held then.
        captured: tuple[str, int, list[Held], list[tuple[str, str, int, list[int]]]] | None
        captured = None

        def read_after(project: str, skip: int) -> tuple[list[int], int]:
            expected = sorted(i for node, p, at, ids in held for i in ids
                              if p == project and at > flushed[node, p])
            return expected, expected[skip - 1] if 0 < skip <= len(expected) else 0

        def check(got_tables: list, expected: list[int], after: int) -> None:
            got = sorted(i for t in got_tables for i in t["id"].to_pylist())
            # Whole tables with rows above ``after`` (the query's WHERE cuts the rest),
            # never a row at or below a node's position, nor one twice.
            assert [i for i in got if i > after] == [i for i in expected if i > after]
            assert set(got) <= set(expected) and len(got) == len(set(got))

        def positions() -> Positions:
            return {n: (0, {p: flushed[n, p] for p in PROJECTS}) for n in NODES}

        for op in script:
            if op[0] == "offer":
                _, node, project, rows, watch, known, is_bare = op
                lsn[node] += 1
                b = batch(project, lsn[node], (counter + 1) * ID_STEP + NODES.index(node) + 1,
                          rows)
                counter += rows
                (watched.add if watch else watched.discard)(project)
                new = peers.offer(node, on_the_wire(b, is_bare),
                                  positions() if known else None)
                assert new  # nothing here is flushed before it arrives
                assert not peers.offer(node, on_the_wire(b, True), positions())  # a repeat
                if is_bare:
                    bare[node].append(b)
                    assert peers.missing(project) and peers.hold(project) < b.id_start
                    continue
                assert not peers.offer(node, on_the_wire(b), positions())
                held.append((node, project, b.lsn, list(b.ids())))
                if watch:
                    expect_heard.append((node, b.lsn))
            elif op[0] == "fill":  # the node sends the rows of its oldest bare batch
                if not bare[op[1]]:
                    continue
                b = bare[op[1]].pop(0)
                node, gone = op[1], b.lsn <= flushed[op[1], b.project_id]
                filled = peers.offer(node, on_the_wire(b), positions())
                # Taken unless a trim let its place go (its node flushed it).
                assert filled or gone
                if filled:
                    held.append((node, b.project_id, b.lsn, list(b.ids())))
                    if b.project_id in watched:
                        expect_heard.append((node, b.lsn))
                assert not peers.offer(node, on_the_wire(b), positions())  # a repeat
            elif op[0] == "flush":  # the node flushed the project up to some batch of it
                _, node, project, back = op
                flushed[node, project] = max(flushed[node, project], lsn[node] - back)
            elif op[0] == "trim":
                peers.trim(positions())
            elif op[0] == "prepare":
                asyncio.run(peers.prepare(op[1]))
            elif op[0] == "read":
                _, project, skip = op
                expected, after = read_after(project, skip)
                check(peers.snapshot(project, positions(), after), expected, after)
            elif op[0] == "capture":
                _, project, skip = op
                after = read_after(project, skip)[1]
                captured = (project, after, peers.capture(project, after), list(held))
            elif captured is not None:  # past: positions read now, after whatever came
                project, after, taken, then = captured
                captured = None
                # What was held at the capture and is not in Parquet now: a row trimmed
                # meanwhile was flushed, so it is cut here too.
                expected = sorted(i for node, p, at, ids in then for i in ids
                                  if p == project and at > flushed[node, p])
                check(past(taken, project, positions()), expected, after)
        assert heard == expect_heard
        # Once every node has flushed everything, nothing is held.
        flushed = {(n, p): lsn[n] for n in NODES for p in PROJECTS}
        peers.trim(positions())
        assert peers.rows == 0
        for project in PROJECTS:
            assert peers.snapshot(project, positions()) == []
            assert not peers.has_rows(project)


def test_undecoded_rows_are_counted_and_a_bad_payload_fails_alone() -> None:
    peers = Peers("me")
    good = batch("p", 1, ID_STEP + 1, 2)
    peers.offer("a", on_the_wire(good), None)
    wrong = Sent.of(batch("p", 2, 3 * ID_STEP + 1, 5), msgspec.msgpack.encode([1, 2]))
    torn = Sent.of(batch("p", 3, 9 * ID_STEP + 1, 4), msgspec.msgpack.encode(good))
    torn.payload = torn.payload[:-3]
    for bad in (wrong, torn):
        peers.offer("a", decode_sent(encode_sent([bad]))[0], None)
    assert peers.rows == 11
    (table,) = peers.snapshot("p", {})
    assert table["id"].to_pylist() == list(good.ids())
    assert peers.rows == 2


def test_a_tailed_projects_bare_batch_let_go_without_its_rows_is_reported() -> None:
    """A live tail's hub waits below a bare batch until its rows come; if its node flushes
    it first, the place goes and the hub must be told (it then reads from the files), or
    it would pass those rows by."""
    peers = Peers("me")
    watcher = Watcher({"p"})
    peers.watch(watcher)
    lost = watcher.lost_projects
    first = batch("p", 1, ID_STEP + 1, 3)
    peers.offer("a", on_the_wire(first, bare=True), None)
    assert peers.hold("p") < first.id_start and peers.missing("p")
    peers.offer("a", on_the_wire(batch("q", 2, 9 * ID_STEP + 1, 2), bare=True), None)
    peers.trim({"a": (0, {"p": 1, "q": 2})})  # both flushed before their rows came
    assert lost == ["p"] and not peers.missing("p") and peers.hold("p") == 1 << 63
    # Flushed before it even arrived (its node could not reach the stream for a while).
    peers.offer("a", on_the_wire(batch("p", 3, 20 * ID_STEP + 1, 1), bare=True),
                {"a": (0, {"p": 3})})
    assert lost == ["p", "p"]
    # Filled in time: nothing to report.
    fourth = batch("p", 4, 30 * ID_STEP + 1, 2)
    peers.offer("a", on_the_wire(fourth, bare=True), None)
    assert peers.offer("a", on_the_wire(fourth), None)
    peers.trim({"a": (0, {"p": 4})})
    assert lost == ["p", "p"] and peers.rows == 0


def test_a_node_silent_on_the_stream_that_still_flushes_holds_the_watermark() -> None:
    """A node cut from Redis keeps acking and flushing, and publishes what it queued once
    it can: its rows would come below every live tail that passed its floor, so the
    watermark waits for it while its catalog position moves (issue 35). One that stops
    flushing too (killed) is let go, as is one silent for SILENT_MAX_S."""
    clock = [100.0]
    with mock.patch("cluster.peers.time.monotonic", lambda: clock[0]):
        peers = Peers("me")
        peers.heard("a", 50, 1_000)
        peers.heard("b", 80, 1_000)
        peers.flushed({"a": (3, {}), "b": (7, {})})  # seen once: nothing moved yet
        assert peers.watermark(1 << 40) == 50
        peers.heard("b", 90, 1_000 + int(DEAD_S * 1000))  # "a" silent for DEAD_S
        assert peers.live() == ["b"] and peers.watermark(1 << 40) == 90
        clock[0] += 1.0
        peers.flushed({"a": (4, {}), "b": (7, {})})  # "a" flushed: alive, cut from Redis
        assert peers.waited() == ["a", "b"] and peers.watermark(1 << 40) == 50
        assert peers.live() == ["b"]  # asks and tail caps still count on the stream only
        clock[0] += 1.0
        peers.flushed({"a": (4, {"p": 9}), "b": (7, {})})  # a project's position moves too
        clock[0] += FLUSHING_S - 0.5
        assert peers.watermark(1 << 40) == 50
        clock[0] += 1.0  # no flush for FLUSHING_S: killed, or idle with nothing to send
        assert peers.waited() == ["b"] and peers.watermark(1 << 40) == 90
        peers.flushed({"a": (5, {"p": 9}), "b": (7, {})})
        assert peers.watermark(1 << 40) == 50
        peers.heard("b", 95, 1_000 + int(SILENT_MAX_S * 1000))  # silent too long
        peers.flushed({"a": (6, {"p": 9}), "b": (7, {})})
        assert peers.waited() == ["b"] and peers.watermark(1 << 40) == 95
