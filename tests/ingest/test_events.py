"""Per-event validation and limits, on the fast (column-wise) and slow (per-event) paths."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from core.attrs import AttrsError
from core.attrs import decode as decode_attrs
from ingest.events import BatchBuilder, Limits
from ingest.wire import Body, body_decoder

NOW = 1_800_000_000_000
LIMITS = Limits(message=100, stack=200, attrs=3, attr=20)


def build(events: list[object]) -> BatchBuilder:
    body = body_decoder.decode(json.dumps({"events": events}).encode())
    assert isinstance(body, Body)
    builder = BatchBuilder("p", None, body.context, NOW, LIMITS)
    builder.add_all(body.events)
    return builder


def attrs_of(builder: BatchBuilder) -> list[object]:
    return [json.loads(a) if a is not None else None for a in builder.batch.attrs]


def test_valid_batch_keeps_attrs_as_sent() -> None:
    b = build([{"message": "a", "attrs": {"k": 1, "s": "x"}}, {"message": "b"},
               {"message": "c", "attrs": {"t": True, "n": None}}])
    assert b.rejected == []
    assert attrs_of(b) == [{"k": 1, "s": "x"}, None, {"t": True, "n": None}]
    assert b.batch.truncated == [None, None, None]


@pytest.mark.parametrize("attrs", [
    {"brace": "{not nested}"},        # a brace inside a string: slow path, still accepted
    {"bracket": "[1]"},
    {"a": 1, "b": 2, "c": 3},         # exactly at the count limit
])
def test_attrs_that_look_odd_but_are_fine(attrs: dict[str, object]) -> None:
    b = build([{"message": "m", "attrs": attrs}, {"message": "n", "attrs": {"z": 0}}])
    assert b.rejected == []
    assert attrs_of(b) == [attrs, {"z": 0}]


def test_attrs_limits_and_types() -> None:
    b = build([
        {"message": "many", "attrs": {"a": 1, "b": 2, "c": 3, "d": 4}},
        {"message": "long", "attrs": {"v": "y" * 50}},
        {"message": "nested", "attrs": {"o": {"x": 1}}},
        {"message": "list", "attrs": {"o": [1]}},
        {"message": "string", "attrs": "nope"},
        {"message": "null", "attrs": None},
    ])
    assert [(r.index, r.code) for r in b.rejected] == [(2, "invalid_event"), (3, "invalid_event"),
                                                       (4, "invalid_event")]
    assert attrs_of(b) == [{"a": 1, "b": 2, "c": 3}, {"v": "y" * 20}, None]
    assert b.batch.truncated == ["attrs", "attrs.v", None]
    assert b.batch.message == ["many", "long", "null"]


def test_fast_and_slow_paths_agree() -> None:
    events = [{"ts": NOW - i, "level": "warn", "message": f"m{i}", "url": "u",
               "attrs": {"i": i}, "error": {"type": "E", "message": "x", "stack": "s"}}
              for i in range(5)]
    fast = build(events)
    slow = build([*events, {"level": "nope", "message": "bad"}])  # one bad event: slow path
    assert [r.index for r in slow.rejected] == [5]
    for name in ("ts", "level", "message", "url", "error_type", "error_message", "error_stack",
                 "truncated"):
        assert getattr(fast.batch, name) == getattr(slow.batch, name), name
    assert attrs_of(fast) == attrs_of(slow)


def test_timestamps() -> None:
    b = build([{"message": "iso", "ts": "2026-01-01T00:00:00.5Z"},
               {"message": "future", "ts": NOW + 3_600_000},
               {"message": "missing"},
               {"message": "float", "ts": 1.7e12}])
    assert b.batch.ts == [1_767_225_600_500, NOW, NOW, 1_700_000_000_000]


def test_messages_cut_at_a_utf8_boundary() -> None:
    b = build([{"message": "é" * 80, "error": {"message": "ü" * 80, "stack": "s" * 500}}])
    [message] = b.batch.message
    assert len(message.encode()) <= 100 and message == "é" * 50
    assert b.batch.error_stack == ["s" * 200]
    assert b.batch.truncated == ["message,error.message,error.stack"]
    assert b.truncations == {"message": 1, "error.message": 1, "error.stack": 1}


def test_every_client_string_has_a_size_cap() -> None:
    """URLs, error types, attribute keys and the context's strings are cut and marked
    like messages, so no field of a row grows with what a client sends."""
    body = body_decoder.decode(json.dumps({
        "context": {"url": "c" * 500, "release": "r" * 50, "sessionId": "s" * 50,
                    "userAgent": "a" * 50, "sdk": {"name": "n" * 50}},
        "events": [{"message": "m", "url": "u" * 500,
                    "error": {"type": "T" * 50, "message": "x"}},
                   {"message": "k", "attrs": {"k" * 30: 1}},
                   {"message": "default url"}]}).encode())
    assert isinstance(body, Body)
    b = BatchBuilder("p", None, body.context, NOW, LIMITS)
    b.add_all(body.events)
    context = "context.url,context.sessionId,context.release,context.userAgent,context.sdk"
    assert b.batch.truncated == [f"{context},url,error.type", f"{context},attrs.{'k' * 20}",
                                 context]
    assert b.batch.url == ["u" * 100, "c" * 100, "c" * 100]
    assert b.batch.error_type == ["T" * 20, None, None]
    assert (b.batch.release, b.batch.session_id, b.batch.user_agent) == (
        "r" * 20, "s" * 20, "a" * 20)
    assert b.batch.sdk == "n" * 20
    assert attrs_of(b) == [None, {"k" * 20: 1}, None]
    # A context cut alone (every event valid) keeps the fast path and marks every row.
    fast = BatchBuilder("p", None, body.context, NOW, LIMITS)
    fast.add_all(body_decoder.decode(b'{"events": [{"message": "a"}, {"message": "b"}]}').events)
    assert fast.batch.truncated == [context, context]
    assert fast.truncations["context.url"] == 2


def test_attribute_keys_stay_out_of_metric_labels_and_commas_are_escaped() -> None:
    b = build([{"message": "x", "attrs": {"a,b": "v" * 50, "100%": "w" * 50,
                                          "plain": "y" * 50}}])
    assert b.batch.truncated == ["attrs.a%2Cb,attrs.100%25,attrs.plain"]
    # One label for every attribute, however many keys clients invent.
    assert b.truncations == {"attrs.value": 3}
    from query.rows import split_truncated
    assert split_truncated(b.batch.truncated[0] or "") == ["attrs.a,b", "attrs.100%",
                                                           "attrs.plain"]


def test_iso_timestamps_take_a_lowercase_z() -> None:
    b = build([{"message": "z", "ts": "2026-01-01T00:00:00.5z"}])
    assert b.batch.ts == [1_767_225_600_500] and b.rejected == []


def test_error_only_event_takes_its_message() -> None:
    b = build([{"level": "error", "error": {"type": "TypeError", "message": "x is undefined"}}])
    assert b.batch.message == ["x is undefined"] and b.batch.error_type == ["TypeError"]


def test_raw_events_are_judged_alone() -> None:
    builder = BatchBuilder("p", None, body_decoder.decode(b'{"events": []}').context, NOW,
                           LIMITS)
    builder.add(0, msgspec.Raw(b'{"message": "ok"}'))
    builder.add(1, msgspec.Raw(b'"text"'))
    assert builder.batch.message == ["ok"]
    assert [(r.index, r.code) for r in builder.rejected] == [(1, "invalid_event")]


def test_lone_surrogate_escapes_are_repaired() -> None:
    from ingest.surrogates import repair

    raw = (b'["cut \\ud83d end", "pair \\ud83d\\ude00 ok", "low \\ude00", "lit \\\\ud83d", '
           b'"hi-lo-hi \\ud83d\\ude00\\ud83d", "\\u00e9 \\uD7FF"]')
    fixed = repair(raw)
    assert msgspec.json.decode(fixed) == [
        "cut \ufffd end", "pair \U0001f600 ok", "low \ufffd", "lit \\ud83d",
        "hi-lo-hi \U0001f600\ufffd", "\u00e9 \ud7ff"]
    assert repair(b'{"a": "\\ud83d\\ude00"}') == b'{"a": "\\ud83d\\ude00"}'


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(alphabet="ab{}[]\"\\:, \u00e9\u001e", max_size=8))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.just(None), values), min_size=1, max_size=8))
# Brace counts that add up with a value that is not an object.
@example([5, {"": "{"}])
@example([{"": "{"}, "x"])
@example(["{", None, {"a": 1}])
@example([{"": float("inf")}])  # found by a run: the oracle was the value, not its JSON
def test_raw_attrs_pass_only_flat_objects_within_limits(attrs: list[object]) -> None:
    """The fast path keeps attrs as sent only when each one is an object of scalars within
    the limits; anything else goes to the per-event path (None)."""
    raws = [msgspec.Raw(msgspec.json.encode(a)) if a is not None else msgspec.Raw()
            for a in attrs]
    kept = BatchBuilder._raw_attrs(raws, LIMITS)
    if kept is None:
        return
    assert len(kept) == len(attrs)
    for text, sent, raw in zip(kept, attrs, raws, strict=True):
        if sent is None:
            assert text is None
            continue
        assert text is not None
        decoded = msgspec.json.decode(text)
        # As sent: the JSON of the value (an infinity is sent as null, as JSON has none).
        assert decoded == msgspec.json.decode(bytes(raw)) and isinstance(decoded, dict)
        assert all(not isinstance(v, dict | list) for v in decoded.values())
        assert len(decoded) <= LIMITS.attrs
        assert all(len(msgspec.json.encode(v)) <= LIMITS.attr for v in decoded.values())


def _number(sign: str, digits: int, point: int, exponent: str) -> bytes:
    """A JSON number: ``digits`` digits (a 1 then zeros), a point after ``point`` of them
    (none if 0 or past the end), then ``exponent`` (``""``, ``"e60"``, ``"E-400"``...)."""
    text = "1" + "0" * (digits - 1)
    if 0 < point < digits:
        text = text[:point] + "." + text[point:]
    return f"{sign}{text}{exponent}".encode()


@settings(max_examples=300, deadline=None)
@given(sign=st.sampled_from(["", "-"]), digits=st.integers(1, 400),
       point=st.integers(0, 400),
       exponent=st.one_of(st.just(""), st.builds(
           "{}{}{}".format, st.sampled_from("eE"), st.sampled_from(["", "+", "-"]),
           st.integers(0, 450).map(str))),
       neighbour=st.booleans())
@example(sign="", digits=250, point=0, exponent="e60", neighbour=True)  # found by an attack
def test_a_number_in_attrs_is_stored_readable_or_its_event_refused(
        sign: str, digits: int, point: int, exponent: str, neighbour: bool) -> None:
    """Whatever its digits and exponent, a number in attrs that a batch stores reads back
    (``core.attrs``, as every reader decodes it), on the path that keeps attrs as sent and
    on the per-event one; a number a reader cannot read (out of float range) refuses its
    event alone, and nothing else does."""
    number = _number(sign, digits, point, exponent)
    events = b'{"message": "n", "ts": %d, "attrs": {"k": %s}}' % (NOW, number)
    if neighbour:  # a valid neighbour: the whole batch may take the fast path
        events += b', {"message": "x", "ts": %d, "attrs": {"j": 1}}' % NOW
    body = body_decoder.decode(b'{"events": [' + events + b"]}")
    assert isinstance(body, Body)
    builder = BatchBuilder("p", None, body.context, NOW, Limits(16384, 65536, 64, 1024))
    builder.add_all(body.events)
    refused = {r.index for r in builder.rejected}
    assert refused <= {0}
    for text in builder.batch.attrs:
        assert text is not None
        decode_attrs(text)  # raises if a reader could not read it
    try:
        decode_attrs(b'{"k": %s}' % number)
    except (msgspec.DecodeError, AttrsError):
        assert refused == {0}  # unreadable: refused
    else:
        assert refused == set()  # readable: stored


@settings(max_examples=200, deadline=None)
@given(ids=st.dictionaries(st.text(max_size=40), st.text(max_size=40), max_size=12))
@example(ids={f"https://x/{i:07d}.js": "0" * 36 for i in range(16_666)})  # an attack: 1 MB
def test_debug_ids_stay_within_what_one_event_may_carry(ids: dict[str, str]) -> None:
    """The context's debug ids are copied into every row of the batch: what is kept is at
    most LIMITS.attrs entries, each URL and id within LIMITS.attr, LIMITS.message bytes in
    all, each entry as sent; anything dropped marks the rows."""
    body = body_decoder.decode(json.dumps({"context": {"debugIds": ids},
                                           "events": [{"message": "m"}]}).encode())
    assert isinstance(body, Body)
    b = BatchBuilder("p", None, body.context, NOW, LIMITS)
    b.add_all(body.events)
    stored = b.batch.debug_ids
    kept: dict[str, str] = json.loads(stored) if stored is not None else {}
    assert stored is None or len(stored.encode()) <= LIMITS.message
    assert len(kept) <= LIMITS.attrs and kept.items() <= ids.items()
    assert all(len(k.encode()) <= LIMITS.attr and len(v.encode()) <= LIMITS.attr
               for k, v in kept.items())
    assert ("context.debugIds" in (b.batch.truncated[0] or "")) == (len(kept) < len(ids))
