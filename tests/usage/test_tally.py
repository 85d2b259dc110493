"""What a client says about its own drops is its word, read defensively: any message, any
JSON after the prefix, never an error, never a reason outside the SDK's (else ``other``),
never more than a bounded count; a well-formed report counts exactly what it says. A Sentry
client report, any JSON at all, the same."""

from __future__ import annotations

import json

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from core.schema import ID_EPOCH_MS, NODE_BITS, SEQ_BITS
from core.usage import (
    DISCARD_REASONS,
    SENTRY_DISCARD_REASONS,
    Tally,
    client_discards,
    sentry_discards,
)

MS = 1_796_560_000_000
ID = ((MS - ID_EPOCH_MS) << (SEQ_BITS + NODE_BITS)) | 1


def table(messages: list[str], levels: list[str]) -> pa.Table:
    n = len(messages)
    return pa.table({"id": pa.array([ID + i for i in range(n)], pa.int64()),
                     "box": pa.array(["b1"] * n), "level": pa.array(levels),
                     "message": pa.array(messages)})


reports = st.dictionaries(st.text(max_size=20), st.integers(-10, 10**12), max_size=12)
noise = st.one_of(
    st.text(max_size=300),
    st.builds(lambda n, r: f"boxtrail: dropped {n} events {json.dumps(r)}",
              st.integers(-5, 10**10), reports),
    st.builds(lambda r, tail: f"boxtrail: dropped 3 events {json.dumps(r)}{tail}",
              reports, st.text(max_size=20)),
    st.builds(lambda body: f"boxtrail: dropped 1 events {body}", st.text(max_size=60)))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(noise, st.sampled_from(["warn", "info", "error"])), max_size=20))
def test_any_message_is_read_without_error_and_within_bounds(rows: list[tuple[str, str]]
                                                            ) -> None:
    tally: Tally = {}
    client_discards("prj_1", table([m for m, _ in rows], [lv for _, lv in rows]), tally)
    for (project, box, minute, kind, source, reason), n in tally.items():
        assert (project, box, minute, kind, source) == (
            "prj_1", "b1", MS // 60_000 * 60, "client_discard.events", "sdk")
        assert reason in DISCARD_REASONS | {"other"}
        assert 0 < n <= 1_000_000 * 8 * len(rows)


@given(st.dictionaries(st.sampled_from(sorted(DISCARD_REASONS)), st.integers(1, 20_000),
                       min_size=1))
def test_the_sdks_report_counts_exactly(report: dict[str, int]) -> None:
    message = f"boxtrail: dropped {sum(report.values())} events {json.dumps(report)}"
    tally: Tally = {}
    client_discards("prj_1", table([message, "other"], ["warn", "warn"]), tally)
    assert {key[5]: n for key, n in tally.items()} == report


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**12) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner,
                                                                 max_size=6),
    max_leaves=30)
discard_items = st.fixed_dictionaries(
    {}, optional={"reason": st.one_of(st.sampled_from(sorted(SENTRY_DISCARD_REASONS)),
                                      st.text(max_size=20), json_values),
                  "category": st.one_of(st.sampled_from(["error", "default", "log_item",
                                                         "transaction"]), json_values),
                  "quantity": st.one_of(st.integers(-5, 10**12), json_values)})


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, st.fixed_dictionaries(
    {"discarded_events": st.one_of(json_values, st.lists(
        st.one_of(discard_items, json_values), max_size=80))})))
def test_any_sentry_client_report_is_read_without_error_and_within_bounds(report: object
                                                                         ) -> None:
    counts: dict[str, int] = {}
    sentry_discards(report, counts)
    assert set(counts) <= SENTRY_DISCARD_REASONS | {"other"}
    assert all(0 < n <= 1_000_000 * 64 for n in counts.values())
