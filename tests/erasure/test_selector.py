"""What a deletion request can say, generated: every body is either refused with the one
error shape (400) or becomes a selector that runs over hostile rows, selects exactly the
rows a search for the same conditions returns, and keeps the rest whole."""

from __future__ import annotations

from datetime import datetime

import duckdb
import msgspec
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ApiError
from core.schema import SCHEMA
from erasure.routes import DeletionRequest, selector_of
from erasure.selector import keep
from query.language import compile_query
from tests.query.test_language import noise

NOW_MS = 1_796_000_000_000


def _ms(ts: datetime) -> int:
    return int(ts.timestamp() * 1000)
HOSTILE = ["", "%", "_", "\\", '"', "'); DROP TABLE t; --", "é\u200b", "\x00", "a" * 300,
           "user=42", "😀", "\ufffd", "NaN"]


def rows() -> pa.Table:
    """A few rows an attacker could have sent: every string column hostile."""
    out = []
    for i, text in enumerate(HOSTILE):
        attrs = msgspec.json.encode({"userId": 42 if i % 2 else text, text: i}).decode()
        out.append({"id": i + 1, "ts": NOW_MS - i * 3_600_000, "received": NOW_MS,
                    "level": ("error", "info", "warn")[i % 3], "message": text,
                    "box": None if i % 4 == 0 else f"b{i % 3}", "url": text,
                    "session_id": text, "release": text, "user_agent": text, "sdk": text,
                    "debug_ids": None, "attrs": attrs, "error_type": text or None,
                    "error_message": text, "error_stack": text, "truncated": None,
                    "error_frames": None})
    return pa.Table.from_pylist(out, schema=SCHEMA)


VALID_TIMES = ["1h", "2d", "30d", "2026-12-01", "2026-12-31T10:00:00Z", "2000-01-01"]
QUERIES = ["attr.userId:42", "level:error", "-message:user*", "", "user=42", '"DROP TABLE"',
           "level:warn OR attr.userId:42", "/é.*/", "release:%"]
times = st.one_of(st.none(), st.none(), st.sampled_from(VALID_TIMES),
                  st.sampled_from(VALID_TIMES), noise)
bodies = st.builds(
    lambda box, since, until, query: {k: v for k, v in (("box", box), ("since", since),
                                                        ("until", until), ("query", query))
                                      if v is not None},
    st.one_of(st.none(), st.none(), st.sampled_from(["b1", "b2"]),
              st.sampled_from(["../x", ""]), st.text(max_size=6)),
    times, times, st.one_of(st.none(), st.sampled_from(QUERIES), st.sampled_from(QUERIES),
                            noise))


@settings(max_examples=600, deadline=None)
@given(bodies)
def test_a_request_is_refused_clearly_or_selects_exactly_what_a_search_would(
        body: dict[str, str]) -> None:
    table = rows()
    try:
        raw = msgspec.json.encode(body)
    except UnicodeEncodeError:
        return  # a lone surrogate: no JSON text can hold one (the server refuses its escape)
    try:
        request = msgspec.json.decode(raw, type=DeletionRequest)
        selector = selector_of(request, NOW_MS + 1)
    except msgspec.ValidationError:
        return  # refused by the body's schema (a 400 from the route)
    except ApiError as exc:
        assert exc.status_code == 400
        msgspec.json.encode(exc.envelope())  # the one error shape, renderable
        return
    mask = selector.mask(table)
    # What is expected, from the request itself: the box, the time range and "made before
    # now" in Python, the query as a search runs it (its SQL, in DuckDB directly).
    matching = set(table["id"].to_pylist())
    if selector.query is not None:
        sql, params = compile_query(selector.query)
        con = duckdb.connect()
        con.register("t", table)
        matching = {r[0] for r in con.execute(f"SELECT id FROM t WHERE {sql}",
                                              params).fetchall()}
        con.close()
    since = selector.since_ms if selector.since_ms is not None else -(1 << 62)
    until = selector.until_ms if selector.until_ms is not None else 1 << 62
    expected = {r["id"] for r in table.to_pylist()
                if r["id"] in matching and since <= _ms(r["ts"]) < until
                and (request.box in (None, msgspec.UNSET) or r["box"] == request.box)}
    assert {i for i, m in zip(table["id"].to_pylist(), mask, strict=True) if m} == expected
    kept, gone = keep(table, [selector])
    assert gone == len(expected)
    assert kept.to_pylist() == [r for r in table.to_pylist() if r["id"] not in expected]
