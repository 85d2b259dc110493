"""``ingest.flusher.partitions``: one part per (box, date), rows in (box, ts, id) order."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from core.schema import SCHEMA
from ingest.flusher import DAY_MS, partitions

NOW = 1_795_990_651_672
rows = st.lists(
    st.tuples(st.sampled_from(["b", "a", "zz", "c", None]),
              # Few distinct ts over 3 days: ties that only the id orders, and day edges.
              st.integers(0, 9).map(lambda k: NOW - k * (DAY_MS // 3)), st.integers(0, 10**6)),
    min_size=1, max_size=300, unique_by=lambda r: r[2])


def table(data: list[tuple[str | None, int, int]], split: int) -> pa.Table:
    n = len(data)
    columns: dict[str, list[object]] = {f.name: [None] * n for f in SCHEMA}
    columns["box"] = [box for box, _, _ in data]
    columns["ts"] = columns["received"] = [ts for _, ts, _ in data]
    columns["id"] = [i for _, _, i in data]
    columns["level"] = ["info"] * n
    columns["message"] = [f"m{i}" for _, _, i in data]
    whole = pa.Table.from_pydict(columns, schema=SCHEMA)
    # Chunked like a flush of several sealed buffer chunks.
    return pa.concat_tables([whole.slice(0, split), whole.slice(split)])


@settings(max_examples=60, deadline=None)
@given(rows, st.integers(0, 300))
def test_parts_are_the_rows_sorted_by_box_ts_id_and_split_by_box_and_day(
        data: list[tuple[str | None, int, int]], split: int) -> None:
    t = table(data, split)
    parts = partitions("p", t)
    expected = t.sort_by([("box", "ascending"), ("ts", "ascending"), ("id", "ascending")])
    assert pa.concat_tables([part for _, part in parts]).to_pylist() == expected.to_pylist()
    seen = set()
    for entry, part in parts:
        boxes = set(part["box"].to_pylist())
        days = {ts.timestamp() * 1000 // DAY_MS for ts in part["ts"].to_pylist()}
        assert len(boxes) == 1 and len(days) == 1
        assert entry.box == (boxes.pop() or "_") and entry.rows == part.num_rows
        assert (entry.box, entry.date) not in seen
        seen.add((entry.box, entry.date))
        assert entry.min_id == min(part["id"].to_pylist())
