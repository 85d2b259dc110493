"""The compiled core (ingest/_core.c) against the Python path it stands in for.

For any bytes at all, reading a body through ``ingest.routes.parse`` (the core where it
takes the body) and through the Python path alone must come to the same thing: the same
refusal, or the same rows byte for byte (the WAL record), the same rejections with their
codes and indexes, the same truncation counts. Bodies are drawn from the hostile
generators, from the SDK's own shape (which the core must take: otherwise this would
compare the Python path with itself), from byte-level damage to those, and from
arbitrary bytes, under the default limits and tight ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.errors import ApiError
from core.schema import RowBatch, to_table
from ingest.events import BatchBuilder, Limits
from ingest.routes import Columns, add, parse
from ingest.wire import decode_columns
from query.frames import batch_rows
from tests.support import hostile

DEFAULT = Limits(message=8192, stack=65536, attrs=64, attr=1024)
TIGHT = Limits(message=24, stack=40, attrs=2, attr=12)
RECEIVED = int(time.time() * 1000)
LIMITS = st.sampled_from([DEFAULT, TIGHT])


def outcome(raw: bytes, limits: Limits, *, compiled: bool) -> object:
    """What ingest makes of ``raw``: its refusal, or its batch, rejections and cuts."""
    try:
        body = parse(raw, limits, compiled=compiled)
    except ApiError as exc:
        return ("refused", exc.code, str(exc))
    context = body.context
    builder = BatchBuilder("p", None, context, RECEIVED, limits)
    add(builder, body, raw)
    events = body.events if isinstance(body, Columns) else len(body.events)
    batch = builder.batch
    # What every reader sees: the rows as Arrow (the seal, the flush), the rows of a live
    # tail, and both again after the WAL's round trip (a replay).
    replayed = msgspec.msgpack.decode(msgspec.msgpack.encode(batch), type=RowBatch)
    table = to_table([batch])
    assert table.equals(to_table([replayed]))
    rows = list(batch_rows(batch))
    assert rows == list(batch_rows(replayed))
    return (events, context.box_id, len(batch), table.to_pylist(), rows,
            [(r.index, r.code, r.error) for r in builder.rejected], builder.truncations)


def same(raw: bytes, limits: Limits) -> None:
    assert outcome(raw, limits, compiled=True) == outcome(raw, limits, compiled=False)


# Strings as the SDK sends them, and what page code puts in them.
TEXT = st.one_of(st.text(max_size=30),
                 st.text(st.characters(codec="ascii"), max_size=60),
                 st.sampled_from(["", "a\u2028b", "\U0001f600", "\\", '"', "\x00", "é" * 7]))
SCALAR = st.one_of(st.integers(-(2**70), 2**70), st.integers(-100, 10**6),
                   st.floats(allow_nan=False, min_value=-1e20, max_value=1e20),
                   st.booleans(), st.none(), TEXT, TEXT,
                   st.sampled_from([1e300, -0.0, 5e-324, float("inf")]))


@st.composite
def sdk_bodies(draw: st.DrawFn) -> bytes:
    """A body of the SDK's shape: mostly within every rule, sometimes just past one."""
    def rarely(usual: st.SearchStrategy[object], odd: st.SearchStrategy[object]) -> object:
        return draw(odd) if draw(st.integers(0, 15)) == 0 else draw(usual)

    events = []
    for _ in range(draw(st.integers(0, 6))):
        event: dict[str, object] = {
            "ts": rarely(st.integers(RECEIVED - 86_400_000, RECEIVED),
                         st.sampled_from([RECEIVED + 3_600_000, 1_000, 17e11])),
            "level": rarely(st.sampled_from(["debug", "info", "warn", "error"]),
                            st.sampled_from(["log", "Info", "warning"])),
            "message": draw(TEXT)}
        if draw(st.booleans()):
            event["url"] = draw(st.one_of(TEXT, st.none()))
        if draw(st.booleans()):
            event["attrs"] = draw(st.dictionaries(TEXT, SCALAR, max_size=4))
        if draw(st.integers(0, 3)) == 0:
            event["error"] = draw(st.one_of(st.none(), st.fixed_dictionaries(
                {}, optional={"type": st.one_of(TEXT, st.none()),
                              "message": st.one_of(TEXT, st.none()),
                              "stack": st.one_of(TEXT, st.none())})))
        events.append(event)
    context: dict[str, object] = draw(st.fixed_dictionaries({}, optional={
        "url": st.one_of(TEXT, st.none()), "sessionId": TEXT, "release": TEXT,
        "boxId": st.sampled_from(["b1", "not a box!"]),
        "sdk": st.fixed_dictionaries({"name": TEXT, "version": TEXT}),
        "debugIds": st.dictionaries(TEXT, TEXT, max_size=2)}))
    body: dict[str, object] = {"events": events}
    if draw(st.booleans()):
        body = {"context": context, "events": events}
    return msgspec.json.encode(body)


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    """An SDK body with a few bytes changed, inserted or cut."""
    raw = bytearray(draw(sdk_bodies()))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(raw)))
        kind = draw(st.sampled_from(["set", "insert", "cut", "truncate"]))
        byte = draw(st.one_of(st.sampled_from(b'{}[]",:\\0123456789.eE+-ntfu \x00\x80\xff'),
                              st.integers(0, 255)))
        if kind == "set" and at < len(raw):
            raw[at] = byte
        elif kind == "insert":
            raw.insert(at, byte)
        elif kind == "cut" and at < len(raw):
            del raw[at]
        elif kind == "truncate":
            del raw[at:]
    return bytes(raw)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=sdk_bodies(), limits=LIMITS)
@example(raw=b'{"events":[{"ts":1767225566871,"message":"a","attrs":{"n":1e+500}}]}',
         limits=DEFAULT)
@example(raw=b'{"events":[{"ts":1767225566871,"message":"a","attrs":{"n":"1' + b"0" * 250
         + b'"}}]}', limits=DEFAULT)
def test_sdk_bodies_read_the_same(raw: bytes, limits: Limits) -> None:
    same(raw, limits)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=damaged(), limits=LIMITS)
def test_damaged_bodies_read_the_same(raw: bytes, limits: Limits) -> None:
    same(raw, limits)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=hostile.bodies("s-core"), limits=LIMITS)
def test_hostile_bodies_read_the_same(body: hostile.Body, limits: Limits) -> None:
    same(body.text(), limits)


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=200), limits=LIMITS)
@example(raw=b"", limits=DEFAULT)
@example(raw=b'{"events":[]}', limits=DEFAULT)
@example(raw=b'{"events":[]} x', limits=DEFAULT)
@example(raw=b'\xef\xbb\xbf{"events":[]}', limits=DEFAULT)
def test_any_bytes_read_the_same(raw: bytes, limits: Limits) -> None:
    same(raw, limits)


def test_the_core_takes_what_the_sdk_sends() -> None:
    """Bodies as the SDK and the benchmark send them are the core's, not the Python
    path's: without this the comparisons above could hold by the core declining all."""
    from benchmarks.datagen import make_bodies

    bodies = make_bodies(7, 50, 100, ts_ms=RECEIVED)
    assert all(decode_columns(b, DEFAULT.message, DEFAULT.stack, DEFAULT.attrs,
                              DEFAULT.attr) is not None for b in bodies)
    for raw in bodies[:5]:
        same(raw, DEFAULT)
    escaped = (b'{"events":[{"ts":%d,"level":"warn","message":"\\u00e9\\ud83d\\ude00\\n\\"",'
               b'"attrs":{"k\\u00e9":"v\\\\","n":-1.5e-3,"b":true,"z":null},"error":{"type":'
               b'"TypeError","stack":"at f (a.js:1:2)\\n"}}]}' % RECEIVED)
    columns = decode_columns(escaped, DEFAULT.message, DEFAULT.stack, DEFAULT.attrs,
                             DEFAULT.attr)
    assert columns is not None
    assert columns.message.array(1).to_pylist() == ['\u00e9\U0001f600\n"']
    assert columns.attrs.array(1).to_pylist() == [
        '{"k\\u00e9":"v\\\\","n":-1.5e-3,"b":true,"z":null}']
    assert columns.error_stack is not None
    assert columns.error_stack.array(1).to_pylist() == ["at f (a.js:1:2)\n"]
    same(escaped, DEFAULT)


@pytest.mark.parametrize("raw", [
    b'{"events":[{"ts":1767225566871,"message":"\\ud800"}]}',  # lone surrogate: repaired
    b'{"events":[{"ts":1767225566871,"message":"a","message":"b"}]}',  # last one wins
    b'{"events":[{"ts":1767225566871,"message":"a","extra":[1]}]}',  # unknown field
    b'{"events":[{"ts":1767225566871,"level":"warning","message":"a"}]}',  # mapped level
    b'{"events":[{"ts":"2026-01-01T00:00:00Z","message":"a"}]}',  # ISO time
    b'{"events":[{"ts":1767225566871,"message":"a","attrs":{"a":{"b":1}}}]}',  # nested
    b'{"events":[{"ts":1767225566871,"message":"a","attrs":{"a":"[x]"}}]}',  # looks nested
    b'{"events":[{"ts":1767225566871,"message":"a","attrs":{"a":"\xed\xa0\x80"}}]}',
])
def test_what_the_core_declines_the_python_path_reads(raw: bytes) -> None:
    assert decode_columns(raw, DEFAULT.message, DEFAULT.stack, DEFAULT.attrs,
                          DEFAULT.attr) is None
    same(raw, DEFAULT)


def bounded(read: Callable[[], object], size: int) -> object:
    """What ``read()`` returns, having taken under 5 s of CPU and under 32 bytes of memory per
    byte read (plus 1 MiB): linear in the input, far above what a pathological input takes,
    far below what a quadratic step or a copy per nesting level would."""
    import tracemalloc

    tracemalloc.start()
    started = time.process_time()
    try:
        got = read()
        spent = time.process_time() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert spent < 5
    assert peak < 32 * size + (1 << 20)
    return got


_TS = b"1767225566871"
_PATHOLOGICAL = {
    "malformed UTF-8": (b'{"events":[{"ts":' + _TS + b',"message":"a\xff\xfe"}]}', "refused"),
    "NUL byte": (b'{"events":[{"ts":' + _TS + b',"message":"a\x00b"}]}', "refused"),
    "truncated": (b'{"events":[{"ts":' + _TS + b',"message":"abc', "refused"),
    "deep attrs": (b'{"events":[{"ts":' + _TS + b',"message":"a","attrs":' + b"[" * 100_000
                   + b"]" * 100_000 + b"}]}", "refused"),
    "deep context": (b'{"context":' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000
                     + b',"events":[]}', "refused"),
    "10^6 digits": (b'{"events":[{"ts":' + _TS + b',"message":"a","attrs":{"n":1'
                    + b"0" * 1_000_000 + b"}}]}", "rejected"),
    "1 MiB string": (b'{"events":[{"ts":' + _TS + b',"message":"' + b"x" * (1 << 20) + b'"}]}',
                     "message"),
    "100k keys": (b'{"events":[{"ts":' + _TS + b',"message":"a","attrs":{' + b",".join(
        b'"k%d":%d' % (i, i) for i in range(100_000)) + b"}}]}", "attrs"),
}


@pytest.mark.parametrize("case", sorted(_PATHOLOGICAL))
def test_pathological_bodies_get_a_clear_answer_in_bounded_time_and_memory(case: str) -> None:
    """Each a refusal, a rejected event or a cut field, as the Python path decides, with the
    time and memory of reading it bounded: linear in the body (seconds and 32 bytes per
    byte are far above what any of them takes, and far below what a quadratic step or a
    copy per nesting level would)."""
    raw, expected = _PATHOLOGICAL[case]
    got = bounded(lambda: outcome(raw, DEFAULT, compiled=True), len(raw))
    assert isinstance(got, tuple)
    if expected == "refused":
        assert got[:2] == ("refused", "invalid_body")
    elif expected == "rejected":
        assert [r[:2] for r in got[5]] == [(0, "invalid_event")]
    else:
        assert got[5] == [] and got[6] == {expected: 1}
    assert got == outcome(raw, DEFAULT, compiled=False)
