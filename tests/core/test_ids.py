"""Event ids across nodes: unique, sortable by time, and a floor no later id goes under."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from core.schema import ID_STEP, NODE_BITS, IdGenerator, RowBatch, to_table


def batch(id_start: int, n: int, step: int) -> RowBatch:
    return RowBatch(project_id="p", box=None, session_id=None, release=None, user_agent=None,
                    sdk=None, debug_ids=None, received=1, id_start=id_start, ts=[1] * n,
                    level=["info"] * n, message=["m"] * n, url=[None] * n, attrs=[None] * n,
                    error_type=[None] * n, error_message=[None] * n, error_stack=[None] * n,
                    truncated=[None] * n, id_step=step)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 5000)), min_size=1, max_size=60))
def test_ids_of_many_nodes_never_collide_and_each_nodes_grow(takes: list[tuple[int, int]]
                                                             ) -> None:
    gens = {n: IdGenerator(n) for n in (1, 2, 3)}
    seen: set[int] = set()
    last = {n: 0 for n in gens}
    for node, count in takes:
        first = gens[node].take(count)
        ids = batch(first, count, ID_STEP).ids()
        assert first > last[node]
        assert all(i & (ID_STEP - 1) == node for i in ids)  # the node's number, low bits
        assert seen.isdisjoint(ids)
        seen.update(ids)
        last[node] = ids[-1]


def test_a_floor_is_above_every_id_given_and_below_every_later_one() -> None:
    gen = IdGenerator(7)
    given_ids = [gen.take(3) for _ in range(100)]
    floor = gen.floor()
    assert max(given_ids) + 2 * ID_STEP <= floor
    assert gen.take(1) > floor
    other = IdGenerator(8)
    other.advance_past(floor)  # another node's id: this one's next ids are above it
    assert other.take(1) > floor


def test_the_arrow_ids_are_the_batch_ids() -> None:
    table = to_table([batch(5 << NODE_BITS | 3, 4, ID_STEP), batch(1000, 3, 1)])
    assert table["id"].to_pylist() == [*batch(5 << NODE_BITS | 3, 4, ID_STEP).ids(),
                                       1000, 1001, 1002]


def test_a_wal_record_from_before_the_step_reads_as_consecutive_ids() -> None:
    """Records written before ``id_step`` existed decode with step 1, as their ids were."""
    old = msgspec.msgpack.encode(batch(42, 3, 1))
    fields = msgspec.msgpack.decode(old)
    step = RowBatch.__struct_fields__.index("id_step")
    assert fields[step] == 1
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(fields[:step]), type=RowBatch)
    assert list(decoded.ids()) == [42, 43, 44] and decoded.last_id == 44
    # ... and without what usage counts (core.usage): an accepted request of unknown size.
    assert (decoded.source, decoded.wire_bytes, decoded.rejected, decoded.refused) == (
        "", 0, {}, "")


def test_new_ids_are_above_ids_of_the_old_layout() -> None:
    """Before node numbers: ms << 20 | sequence. A node upgraded in place keeps its order."""
    gen = IdGenerator(1)
    now_ms_counter = gen.floor() >> NODE_BITS
    ms = now_ms_counter >> 12
    old_max_now = (ms << 20) | ((1 << 20) - 1)
    assert gen.take(1) > old_max_now
