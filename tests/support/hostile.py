"""Hostile ingest bodies, generated, and the rows a reader must return for them.

The ingest key is public, so a body can hold anything the wire format allows: any
Unicode (lone surrogates, control characters, line separators), every JSON number form
(huge integers, exponents, ``-0``, values out of float range), duplicate attribute keys,
box ids that look like numbers or dates, stacks with zero, negative and huge positions.
:func:`bodies` draws such bodies as JSON text; each :class:`Sent` event knows whether
ingest must reject it and, if not, the row every reader must give back.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from hypothesis import strategies as st

NOW_MS = int(datetime.now(UTC).timestamp() * 1000)
MIN_TS = 946_684_800_000  # 2000-01-01, ingest's floor
MAX_FUTURE_MS = 10 * 60_000
LEVELS = {"debug": "debug", "info": "info", "warn": "warn", "error": "error",
          "warning": "warn", "log": "info", "trace": "debug", "fatal": "error",
          "critical": "error"}
APP_URL = "https://cdn.test/app.min.js"  # the tests upload a map for it

# Characters readers have choked on, and plenty of others.
_CHARS = st.one_of(
    st.characters(categories=["Cs", "Cc", "Cf", "Zl", "Zp", "Zs", "So", "Lo"]),
    st.sampled_from("\x00\x1b\x85\u2028\u2029\u202e\ufeff\ufffd\"\\/%,:{}[]*?_\n\r\t\x7f"),
    st.characters(),
)
TEXT = st.text(_CHARS, max_size=40)
NAME = st.text(_CHARS, max_size=8)


def norm(text: str) -> str:
    """``text`` as it comes back: a surrogate pair joined, a lone surrogate as U+FFFD."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def dump_str(text: str, ascii_only: bool) -> str:
    if not ascii_only and any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        ascii_only = True  # raw surrogates cannot be UTF-8: escaped, as JSON.stringify does
    return json.dumps(text, ensure_ascii=ascii_only)


NUMBER = st.one_of(
    st.integers().map(str),
    st.integers(min_value=-(2**200), max_value=2**200).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["1E2", "-0", "-0.0", "0.1e+5", "5e-324", "1e-400", "1.7976931348623157e308",
                     "1e999", "-1e999", "1" + "0" * 400, "1" + "0" * 400 + ".5",
                     "18446744073709551616", "-9223372036854775809"]),
)
SCALAR = st.one_of(
    NUMBER,
    st.tuples(TEXT, st.booleans()).map(lambda t: dump_str(*t)),
    st.sampled_from(["true", "false", "null"]),
)
# Positions an engine could never print, and ones it could.
POSITION = st.one_of(st.integers(-3, 3), st.integers(0, 2**70),
                     st.sampled_from([2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**64]))
FRAME = st.one_of(
    st.builds(lambda f, ln, c: f"    at {f} ({APP_URL}:{ln}:{c})", NAME, POSITION, POSITION),
    st.builds(lambda ln, c: f"    at {APP_URL}:{ln}:{c}", POSITION, POSITION),
    st.builds(lambda f, ln, c: f"{f}@{APP_URL}:{ln}:{c}", NAME, POSITION, POSITION),
    st.builds(lambda u, ln, c: f"    at x ({u}:{ln}:{c})", TEXT, POSITION, POSITION),
    TEXT,
)
STACK = st.builds(lambda head, frames: "\n".join([head, *frames]), TEXT,
                  st.lists(FRAME, max_size=6))
BOX = st.one_of(
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True),
    st.sampled_from(["123", "0123", "00", "2026-01-01", "2026-01-01T00", "1e5", "1.5", "true",
                     "false", "null", "nan", "inf", "0x1F", "_x", "a..b"]).filter(
        lambda b: b[0].isalnum()),
)


@dataclass
class Sent:
    """One event as sent: its JSON text, and the row it must read back as (None: rejected)."""

    text: str
    row: dict[str, object] | None
    future: bool = False  # a ts from the future: the row takes its received time
    too_deep: bool = False  # nested past the decoder's depth: the whole body is refused


@dataclass
class Body:
    session: str
    box: str
    context: dict[str, object]
    events: list[Sent] = field(default_factory=list)

    def text(self) -> bytes:
        events = ",".join(e.text for e in self.events)
        return ('{"context":' + json.dumps(self.context) + ',"events":[' + events + "]}").encode()

    def refused(self) -> bool:
        """Nesting past the JSON decoder's depth limit (~1,000) refuses the body whole, as
        invalid JSON does: a 400 that names it."""
        return any(e.too_deep for e in self.events)

    def accepted(self) -> list[Sent]:
        if self.refused():
            return []
        return [e for e in self.events if e.row is not None]

    def rejected(self) -> list[int]:
        return [i for i, e in enumerate(self.events) if e.row is None]


def _loads(text: str) -> object:
    """A JSON value as boxtrail reads it (the first of duplicate keys wins, as in DuckDB's
    json_extract), strings as they come back."""
    def first(pairs: list[tuple[str, object]]) -> dict[str, object]:
        out: dict[str, object] = {}
        for key, value in pairs:
            out.setdefault(norm(key), value)
        return out

    def fix(value: object) -> object:
        if isinstance(value, str):
            return norm(value)
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        return value
    return fix(json.loads(text, object_pairs_hook=first))


def _finite(text: str) -> bool:
    """No number in ``text`` out of float range, under a repeated key too: the first of
    duplicate keys is the one kept, but the event holds them all and is refused whole."""
    finite = True

    def check(pairs: list[tuple[str, object]]) -> dict[str, object]:
        nonlocal finite
        finite = finite and all(not isinstance(v, float) or math.isfinite(v) for _, v in pairs)
        return dict(pairs)
    json.loads(text, object_pairs_hook=check)
    return finite


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + \
        f"{ms % 1000:03d}Z"


@st.composite
def timestamps(draw: st.DrawFn) -> tuple[str | None, int | None, bool]:
    """(JSON text or None for no ts, expected ms or None if rejected, from the future)."""
    kind = draw(st.sampled_from(["none", "ms", "float", "iso", "future", "old", "far"]))
    ms = draw(st.integers(NOW_MS - 30 * 86_400_000, NOW_MS))
    if kind == "none":
        return None, -1, False  # -1: the received time
    if kind == "ms":
        return str(ms), ms, False
    if kind == "float":
        return f"{ms}.{draw(st.integers(0, 999)):03d}", ms, False
    if kind == "iso":
        offset = draw(st.integers(-14 * 60, 14 * 60))
        local = datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None) + timedelta(
            minutes=offset)
        text = local.isoformat(timespec="milliseconds")
        sign = "+" if offset > 0 else "-"
        suffix = "Z" if offset == 0 else f"{sign}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}"
        return json.dumps(text + suffix), ms, False
    if kind == "future":
        text = draw(st.sampled_from([str(NOW_MS + 86_400_000), "1e300", str(2**80),
                                     '"9999-12-31T23:59:59-14:00"', '"2999-01-01T00:00:00Z"']))
        return text, -1, True
    if kind == "old":
        return draw(st.sampled_from(["0", "-1", "1700000000", str(-(2**70)),
                                     '"1999-12-31T23:59:59Z"', '"0001-01-01T00:00:00+14:00"'])
                    ), None, False
    return draw(st.sampled_from(['"not a time"', '"2026-01-01T00:00:00"', "1e999", "[]"])
                ), None, False


@st.composite
def events(draw: st.DrawFn, context_url: str | None) -> Sent:
    fields: list[tuple[str, str]] = []
    ok = True
    level = draw(st.one_of(st.sampled_from(sorted(LEVELS)), st.sampled_from(["ERROR", "Warn"]),
                           NAME))
    fields.append(("level", json.dumps(level)))
    if level.lower() not in LEVELS:
        ok = False
    ts_text, ts_ms, future = draw(timestamps())
    if ts_text is not None:
        fields.append(("ts", ts_text))
    if ts_ms is None:
        ok = False
    message = draw(st.one_of(st.none(), TEXT))
    if message is not None:
        fields.append(("message", dump_str(message, draw(st.booleans()))))
    url = draw(st.one_of(st.none(), TEXT))
    if url is not None:
        fields.append(("url", dump_str(url, draw(st.booleans()))))
    attrs: object = {}
    attrs_kind = draw(st.sampled_from(["none", "pairs", "pairs", "null", "nested"]))
    if attrs_kind == "pairs":
        keys = draw(st.lists(st.one_of(NAME, st.sampled_from(["a", "a", "b"])), max_size=6))
        pairs = [(k, draw(SCALAR)) for k in keys]
        text = "{" + ",".join(f"{dump_str(k, draw(st.booleans()))}:{v}" for k, v in pairs) + "}"
        fields.append(("attrs", text))
        attrs = _loads(text)
        if not _finite(text):
            ok = False
    elif attrs_kind == "null":
        fields.append(("attrs", "null"))
    elif attrs_kind == "nested":
        nested = draw(st.sampled_from(['{"a":{"b":1}}', '{"a":[1]}', "[1]", '"text"', "1",
                                       '{"a":' * 100 + "1" + "}" * 100,
                                       "[" * 2000 + "]" * 2000]))
        fields.append(("attrs", nested))
        if len(nested) > 2000:
            order = draw(st.permutations(fields))
            return Sent("{" + ",".join(f'"{k}":{v}' for k, v in order) + "}", None,
                        too_deep=True)
        ok = False
    error = None
    if draw(st.integers(0, 2)):
        error = {k: draw(st.one_of(st.none(), TEXT)) for k in ("type", "message")}
        error["stack"] = draw(st.one_of(st.none(), STACK))
        fields.append(("error", "{" + ",".join(
            f'"{k}":{"null" if v is None else dump_str(v, draw(st.booleans()))}'
            for k, v in error.items()) + "}"))
    if message is None and error is None:
        ok = False  # an event needs a message or an error
    order = draw(st.permutations(fields))
    text = "{" + ",".join(f'"{k}":{v}' for k, v in order) + "}"
    if not ok:
        return Sent(text, None)
    shown = message if message is not None else (
        (error or {}).get("message") or (error or {}).get("type") or "")
    err = None
    if error is not None and any(v is not None for v in error.values()):
        err = {k: None if v is None else norm(v) for k, v in error.items()}
    row: dict[str, object] = {
        "ts": ts_ms, "level": LEVELS[level.lower()], "message": norm(str(shown)),
        "url": norm(url) if url else context_url, "attrs": attrs or {}, "error": err,
        "truncated": ["ts"] if future else None,
    }
    return Sent(text, row, future)


@st.composite
def bodies(draw: st.DrawFn, session: str) -> Body:
    box = draw(BOX)
    url = draw(st.one_of(st.none(), TEXT.map(norm)))
    context: dict[str, object] = {"sessionId": session, "boxId": box}
    if url is not None:
        context["url"] = url
    release = draw(st.one_of(st.none(), TEXT.map(norm)))
    if release is not None:
        context["release"] = release
    if draw(st.booleans()):
        context["debugIds"] = draw(st.dictionaries(TEXT.map(norm), TEXT.map(norm), max_size=3))
    body = Body(session, box, context)
    body.events = draw(st.lists(events(url), min_size=1, max_size=8))
    for sent in body.events:
        if sent.row is not None:
            sent.row |= {"boxId": box, "sessionId": session, "release": release}
    return body


def check_row(got: dict[str, object], sent: Sent, window: tuple[int, int]) -> None:
    """``got`` (a row from any reader) is ``sent`` as sent; ``window`` is when the body was
    posted (epoch ms), for rows that take their received time."""
    want = sent.row
    assert want is not None
    for name in ("level", "message", "url", "attrs", "boxId", "sessionId", "release",
                 "truncated"):
        assert got.get(name) == want[name], (name, got, want)
    assert not got.get("problem"), got
    ts = want["ts"]
    if ts == -1:
        assert _iso(window[0] - 1000) <= str(got["ts"]) <= _iso(window[1] + 1000), (got, window)
    else:
        assert got["ts"] == _iso(int(ts)), (got["ts"], ts)  # type: ignore[call-overload]
    error = want["error"]
    if error is None:  # an errors-view row has an error detail all the same, empty
        shown = got.get("error")
        assert shown is None or (shown["type"] is None and shown.get("rawStack") is None), got
    else:
        assert isinstance(got["error"], dict)
        assert got["error"]["type"] == error["type"]  # type: ignore[index]
        shown_stack = got["error"].get("rawStack", got["error"].get("stack"))  # type: ignore[union-attr]
        assert shown_stack == error["stack"], got
