"""The compiled core's reading of Sentry log items against the Python path.

An envelope whose one stored item is a log (``Sentry.logger``'s batches) is read by the
core (``_core.logs``) where it takes the item; whatever the bytes, the answer must be the
one the Python path (``ingest.envelope``) gives alone: the same refusal, or the same rows
byte for byte, the same release, counts, rejections and cuts.
"""

from __future__ import annotations

import time

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.errors import ApiError
from core.schema import RowBatch, to_table
from ingest.envelope import MAX_TAGS, Item, to_events
from ingest.events import MIN_TS, BatchBuilder, Limits
from ingest.sentry import add
from ingest.wire import decode_logs
from query.frames import batch_rows
from tests.ingest.test_core import DEFAULT, LIMITS, RECEIVED, SCALAR, TEXT, bounded

MAX_LOGS = 50


def outcome(payload: bytes, limits: Limits, *, compiled: bool) -> object:
    try:
        converted = to_events({}, [Item("log", {}, payload)], MAX_LOGS,
                              limits if compiled else None)
    except ApiError as exc:
        return ("refused", exc.code, str(exc))
    count, stored, dropped = converted.rows, dict(converted.stored), list(converted.dropped)
    builder = BatchBuilder("p", None, converted.context(), RECEIVED, limits)
    add(builder, converted)
    batch = builder.batch
    replayed = msgspec.msgpack.decode(msgspec.msgpack.encode(batch), type=RowBatch)
    table = to_table([batch])
    assert table.equals(to_table([replayed]))
    rows = list(batch_rows(batch))
    assert rows == list(batch_rows(replayed))
    return (count, stored, dropped, converted.release, len(batch), table.to_pylist(), rows,
            [(r.index, r.code, r.error) for r in builder.rejected], builder.truncations)


def same(payload: bytes, limits: Limits) -> None:
    assert outcome(payload, limits, compiled=True) == outcome(payload, limits, compiled=False)


NOW_S = RECEIVED / 1000
# Values as Sentry's SDKs type them, and numbers in every shape JSON allows.
NUMBER_TEXT = st.one_of(
    st.sampled_from([b"0", b"-0", b"1.0", b"1.50", b"0.0001", b"0.00001", b"0.000001",
                     b"1e3", b"12345678901234567", b"-0.0", b"3.25", b"1E2", b"10.0",
                     b"1.0000000000000001", b"0.1000000000000001"]),
    st.from_regex(rb"\A-?(0|[1-9][0-9]{0,19})(\.[0-9]{1,19})?([eE][+-]?[0-9]{1,3})?\Z"))


@st.composite
def log_payloads(draw: st.DrawFn) -> bytes:
    """A log container as ``Sentry.logger`` sends it: mostly within every rule,
    sometimes just past one."""
    def rarely(usual: st.SearchStrategy[object], odd: st.SearchStrategy[object]) -> object:
        return draw(odd) if draw(st.integers(0, 11)) == 0 else draw(usual)

    items = []
    for _ in range(draw(st.integers(0, 5))):
        entry: dict[str, object] = {
            "timestamp": rarely(st.floats(NOW_S - 86_400, NOW_S),
                                st.sampled_from([None, 0, NOW_S + 3600, 1e13, 946684799.9,
                                                 "2026-01-01T00:00:00Z", int(NOW_S), True])),
            "level": rarely(st.sampled_from(["trace", "debug", "info", "warn", "warning",
                                             "error", "fatal", "log"]),
                            st.sampled_from(["", None, "Info", "critical", 3]))}
        if draw(st.integers(0, 7)):
            entry["body"] = rarely(TEXT, st.one_of(st.none(), st.integers()))
        if draw(st.booleans()):
            attributes: dict[str, object] = {}
            for key in draw(st.lists(TEXT, max_size=5)):
                typed: object = {"value": draw(SCALAR), "type": "string"}
                if draw(st.integers(0, 9)) == 0:
                    typed = draw(st.sampled_from([{}, {"type": "x"}, 5, {"value": [1]},
                                                  {"value": {"a": 1}}]))
                attributes[key] = typed
            if draw(st.integers(0, 3)) == 0:
                attributes["sentry.release"] = {"value": draw(st.one_of(TEXT, st.integers()))}
            entry["attributes"] = attributes
        if draw(st.integers(0, 2)) == 0:
            entry.setdefault("attributes", {})["number"] = {"value": "<n>"}  # type: ignore[index]
        if draw(st.integers(0, 3)) == 0:
            entry["trace_id"] = draw(st.one_of(TEXT, st.lists(st.integers(), max_size=2)))
        items.append(entry)
    container: dict[str, object] = {"items": items}
    if draw(st.booleans()):
        container = {"version": 2, **container}
    raw = msgspec.json.encode(container)
    # A number as some encoder other than ours may write it.
    return raw.replace(b'"<n>"', draw(NUMBER_TEXT))


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    raw = bytearray(draw(log_payloads()))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(raw)))
        byte = draw(st.one_of(st.sampled_from(b'{}[]",:\\0123456789.eE+-ntfu \x00\x80\xff'),
                              st.integers(0, 255)))
        kind = draw(st.sampled_from(["set", "insert", "cut"]))
        if kind == "set" and at < len(raw):
            raw[at] = byte
        elif kind == "insert":
            raw.insert(at, byte)
        elif at < len(raw):
            del raw[at]
    return bytes(raw)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=log_payloads(), limits=LIMITS)
@example(payload=b'{"items":[{"timestamp":1767225566.5,"body":"a","attributes":'
         b'{"n":{"value":0.000001}}}]}', limits=DEFAULT)
@example(payload=b'{"items":[{"timestamp":1767225566.5,"body":"a","attributes":'
         b'{"n":{"value":1},"n":{"value":2}}}]}', limits=DEFAULT)
@example(payload=b'{"items":[{"timestamp":1767225566.5,"body":"a","attributes":'
         b'{"n":{"value":1.50}}}]}', limits=DEFAULT)
@example(payload=b'{"items":[{"timestamp":1767225566.5,"body":"a","attributes":'
         b'{"n":{"value":1.0000000000000001}}}]}', limits=DEFAULT)
def test_log_items_read_the_same(payload: bytes, limits: Limits) -> None:
    same(payload, limits)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=damaged(), limits=LIMITS)
def test_damaged_log_items_read_the_same(payload: bytes, limits: Limits) -> None:
    same(payload, limits)


@settings(max_examples=200, deadline=None)
@given(payload=st.binary(max_size=120), limits=LIMITS)
@example(payload=b'{"items":[]}', limits=DEFAULT)
def test_any_bytes_read_the_same(payload: bytes, limits: Limits) -> None:
    same(payload, limits)


def test_the_core_takes_what_sentry_logger_sends() -> None:
    """The benchmark's envelopes (the SDK's shape, typed attributes) are the core's: else
    the comparisons above could hold by the core declining everything."""
    from benchmarks.datagen import make_bodies, to_envelope
    from ingest.envelope import split

    for body in make_bodies(3, 20, 100, ts_ms=RECEIVED):
        _, items = split(to_envelope(body))
        [log] = [i for i in items if i.type == "log"]
        assert decode_logs(log.payload, DEFAULT.message, DEFAULT.attrs, DEFAULT.attr,
                           MAX_TAGS, MIN_TS) is not None
        same(log.payload, DEFAULT)
    payload = (b'{"version":2,"items":[{"timestamp":%f,"level":"warning","body":"\\u00e9\\n",'
               b'"trace_id":"x","attributes":{"sentry.release":{"value":"r@1","type":"string"},'
               b'"n":{"value":-1.25,"type":"double"},"ok":{"value":true},"z":{}}}]}'
               % time.time())
    found = decode_logs(payload, DEFAULT.message, DEFAULT.attrs, DEFAULT.attr, MAX_TAGS, MIN_TS)
    assert found is not None
    columns, release = found
    assert release == "r@1"
    assert columns.level.array(1).to_pylist() == ["warn"]
    assert columns.message.array(1).to_pylist() == ["\u00e9\n"]
    assert columns.attrs.array(1).to_pylist() == [
        '{"sentry.release":"r@1","n":-1.25,"ok":true,"z":null}']
    same(payload, DEFAULT)


_ITEM = b'{"items":[{"timestamp":1767225566.5,'
_PATHOLOGICAL = {
    "malformed UTF-8": _ITEM + b'"body":"a\xff"}]}',
    "NUL byte": _ITEM + b'"body":"a\x00"}]}',
    "truncated": _ITEM + b'"body":"abc',
    "deep skipped field": _ITEM + b'"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}]}",
    "10^6 digits": _ITEM + b'"attributes":{"n":{"value":1' + b"0" * 1_000_000 + b"}}}]}",
    "1 MiB string": _ITEM + b'"body":"' + b"x" * (1 << 20) + b'"}]}',
    "100k names": _ITEM + b'"attributes":{' + b",".join(
        b'"k%d":{"value":%d}' % (i, i) for i in range(100_000)) + b"}}]}",
}


@pytest.mark.parametrize("case", sorted(_PATHOLOGICAL))
def test_pathological_log_items_get_the_python_paths_answer_in_bounded_time(case: str
                                                                            ) -> None:
    payload = _PATHOLOGICAL[case]
    got = bounded(lambda: outcome(payload, DEFAULT, compiled=True), len(payload))
    assert got == outcome(payload, DEFAULT, compiled=False)
