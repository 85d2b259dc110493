"""Stack parsing: fixture folders from real engines and docs, each format, caps, and
Hypothesis checks that no input raises or takes more than linear time.

Fixtures are ``tests/fixtures/stacks/<engine>/<name>.txt`` (the stack as printed) with
``<name>.json`` (the expected parse; each file says where its stack came from). The V8 ones
were captured from real headless Chromium by ``capture_chromium.py`` in that folder, with
the expected frames taken from V8's own structured call sites.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from symbolicate.stack import (
    CUT,
    MAX_DATA_URL_CHARS,
    MAX_FRAMES,
    MAX_LINE_CHARS,
    MAX_MESSAGE_CHARS,
    Frame,
    ParsedStack,
    parse_stack,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"
FIXTURE_FILES = sorted(FIXTURES.glob("*/*.txt"))
APP = "https://app.example.com/assets/app.js"


def fields(frame: Frame) -> dict[str, Any]:
    """A frame as the fixtures write it: without ``raw``, only non-default values."""
    return {key: value for key, value in msgspec.structs.asdict(frame).items()
            if key != "raw" and value is not None and value is not False}


def one(line: str) -> dict[str, Any]:
    """The fields of the only frame ``line`` parses to."""
    parsed = parse_stack(line)
    assert len(parsed.frames) == 1, parsed
    return fields(parsed.frames[0])


# --- Fixture folders ---------------------------------------------------------------------------


def test_fixture_folders_cover_every_engine() -> None:
    by_engine = {path.parent.name for path in FIXTURE_FILES}
    assert by_engine == {"v8", "spidermonkey", "jsc"}
    for path in FIXTURE_FILES:
        assert path.with_suffix(".json").is_file(), f"{path.name} has no expected .json"


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fixture(path: Path) -> None:
    expected = json.loads(path.with_suffix(".json").read_text())
    text = path.read_text()
    parsed = parse_stack(text)
    assert expected["source"]  # every fixture says where its stack came from
    assert path.parent.name == expected["engine"] == parsed.engine
    assert parsed.message == expected["message"]
    assert [fields(frame) for frame in parsed.frames] == expected["frames"]
    assert parsed.omitted_frames == expected["omitted_frames"]
    lines = [line.strip() for line in text.split("\n")]
    for frame in parsed.frames:
        assert frame.raw in lines or (CUT in frame.raw and len(frame.raw) == MAX_LINE_CHARS)


def test_documentation_fixtures_say_so() -> None:
    for path in FIXTURE_FILES:
        source = json.loads(path.with_suffix(".json").read_text())["source"]
        if path.parent.name != "v8":  # no Firefox or Safari here: all from documentation
            assert source.startswith("documentation:"), path
        else:
            assert source.startswith(("documentation:", "real headless Chromium")), path


# --- V8 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "expected"), [
    (f"    at fn ({APP}:10:5)", {"function": "fn", "url": APP, "line": 10, "column": 5}),
    (f"    at {APP}:10:5", {"url": APP, "line": 10, "column": 5}),
    (f"    at async load ({APP}:3:9)",
     {"function": "load", "url": APP, "line": 3, "column": 9, "is_async": True}),
    (f"    at new Store ({APP}:1:2)",
     {"function": "Store", "url": APP, "line": 1, "column": 2, "is_constructor": True}),
    (f"    at Object.i [as save] ({APP}:1:2)",
     {"function": "Object.i", "alias": "save", "url": APP, "line": 1, "column": 2}),
    (f"    at I.e.fn.(anonymous function) [as index] ({APP}:10:3651)",
     {"function": "I.e.fn.(anonymous function)", "alias": "index", "url": APP, "line": 10,
      "column": 3651}),
    ("    at Array.map (<anonymous>)", {"function": "Array.map", "native": True}),
    ("    at Error (native)", {"function": "Error", "native": True}),
    ("    at async Promise.all (index 3)",
     {"function": "Promise.all", "is_async": True, "native": True}),
    ("    at <anonymous>:1:7", {"line": 1, "column": 7}),
    (f"    at eval (eval at run ({APP}:72:3), <anonymous>:4:1)",
     {"function": "eval", "url": APP, "line": 72, "column": 3, "eval": True}),
    (f"    at deep (eval at <anonymous> (eval at run ({APP}:75:3)), <anonymous>:1:26)",
     {"function": "deep", "url": APP, "line": 75, "column": 3, "eval": True}),
    ("    at f (eval at g (eval at h (eval at i (x.js))), <anonymous>:1:2)",
     {"function": "f", "eval": True}),  # no position in the origin: eval without location
    ("    at f (webpack://shop/./src/App.jsx?3f2a:2:9)",
     {"function": "f", "url": "webpack://shop/./src/App.jsx?3f2a", "line": 2, "column": 9}),
    ("    at f (blob:https://app.example.com/0b9c-11:2:9)",
     {"function": "f", "url": "blob:https://app.example.com/0b9c-11", "line": 2, "column": 9}),
    ("    at f (file:///C:/app/main.js:2:9)",
     {"function": "f", "url": "file:///C:/app/main.js", "line": 2, "column": 9}),
    ("    at chrome-extension://abc/content.js:2:9",
     {"url": "chrome-extension://abc/content.js", "line": 2, "column": 9}),
    ("    at f (https://h.test/a/(group)/[id]/p@1.2:x.js:2:9)",
     {"function": "f", "url": "https://h.test/a/(group)/[id]/p@1.2:x.js", "line": 2,
      "column": 9}),
    ("    at f (https://h.test/a)b.js:2:9)",  # unbalanced ")" in the URL
     {"function": "f", "url": "https://h.test/a)b.js", "line": 2, "column": 9}),
    ("    at f (wasm://wasm/8c2e:wasm-function[12]:0x1a2)",
     {"function": "f", "url": "wasm://wasm/8c2e:wasm-function[12]:0x1a2"}),
    ("    at f (https://h.test/x.js:123456789012:1)",  # not a plausible line number
     {"function": "f", "url": "https://h.test/x.js:123456789012", "line": 1}),
])
def test_v8_frames(line: str, expected: dict[str, Any]) -> None:
    assert one("Error: boom\n" + line) == expected
    assert parse_stack(line).engine == "v8"


def test_v8_message_lines_and_prose() -> None:
    parsed = parse_stack("Error: first\nsecond at user@host:8080\n  at nothing here\n"
                         f"    at f ({APP}:1:2)\nnot a frame\n    at {APP}:3:4\n")
    assert parsed.engine == "v8"
    assert parsed.message == "Error: first\nsecond at user@host:8080\n  at nothing here"
    assert [fields(f) for f in parsed.frames] == [
        {"function": "f", "url": APP, "line": 1, "column": 2},
        {"url": APP, "line": 3, "column": 4}]


# --- SpiderMonkey ------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "expected"), [
    (f"fn@{APP}:10:5", {"function": "fn", "url": APP, "line": 10, "column": 5}),
    (f"@{APP}:10:5", {"url": APP, "line": 10, "column": 5}),
    (f"async*fn@{APP}:1:2", {"function": "fn", "url": APP, "line": 1, "column": 2,
                             "is_async": True}),
    (f"setTimeout handler*@{APP}:1:2", {"url": APP, "line": 1, "column": 2, "is_async": True}),
    (f"fn@{APP} line 9 > eval:1:25", {"function": "fn", "url": APP, "line": 9, "eval": True}),
    (f"anonymous@{APP} line 10 > Function:1:8",
     {"function": "anonymous", "url": APP, "line": 10, "eval": True}),
    (f"@{APP} line 7 > eval line 1 > eval:1:1", {"url": APP, "line": 7, "eval": True}),
    ("fn@https://cdn.test/npm/lodash@4.17.21/x.js:1:2",
     {"function": "fn", "url": "https://cdn.test/npm/lodash@4.17.21/x.js", "line": 1,
      "column": 2}),
    ("./node_modules/@scope/pkg/index.js/run<@https://h.test/b.js:1:2",
     {"function": "./node_modules/@scope/pkg/index.js/run<", "url": "https://h.test/b.js",
      "line": 1, "column": 2}),
    ("f@webpack://@scope/pkg/./src/a.js:3:4",
     {"function": "f", "url": "webpack://@scope/pkg/./src/a.js", "line": 3, "column": 4}),
    ("get total@https://h.test/b.js:1:2",
     {"function": "get total", "url": "https://h.test/b.js", "line": 1, "column": 2}),
    ("@debugger eval code:1:5", {"url": "debugger eval code", "line": 1, "column": 5}),
    ("trace@https://h.test/old.js:44", {"function": "trace", "url": "https://h.test/old.js",
                                        "line": 44}),
])
def test_spidermonkey_frames(line: str, expected: dict[str, Any]) -> None:
    assert one(line) == expected


def test_spidermonkey_has_no_message_and_is_recognised() -> None:
    parsed = parse_stack(f"fn@{APP}:1:2\nasync*@{APP}:3:4\n")
    assert (parsed.engine, parsed.message, len(parsed.frames)) == ("spidermonkey", None, 2)


# --- JavaScriptCore ------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "expected"), [
    (f"fn@{APP}:10:5", {"function": "fn", "url": APP, "line": 10, "column": 5}),
    (f"global code@{APP}:13:4", {"function": "global code", "url": APP, "line": 13, "column": 4}),
    (f"module code@{APP}:1:1", {"function": "module code", "url": APP, "line": 1, "column": 1}),
    ("[native code]", {"native": True}),
    ("map@[native code]", {"function": "map", "native": True}),
    ("eval code", {"function": "eval code", "eval": True}),
    ("eval code@", {"function": "eval code", "eval": True}),
    ("anonymous@", {"function": "anonymous", "eval": True}),
    (f"{APP}:34:25", {"url": APP, "line": 34, "column": 25}),
    ("https://cdn.test/npm/lodash@4.17.21/x.js:1:2",
     {"url": "https://cdn.test/npm/lodash@4.17.21/x.js", "line": 1, "column": 2}),
])
def test_jsc_frames(line: str, expected: dict[str, Any]) -> None:
    assert one(line) == expected


def test_jsc_is_recognised_by_its_markers() -> None:
    assert parse_stack(f"fn@{APP}:1:2\nglobal code@{APP}:3:4").engine == "jsc"
    assert parse_stack(f"fn@{APP}:1:2\n{APP}:3:4").engine == "jsc"
    # Without a marker the two formats are the same; SpiderMonkey is the guess.
    assert parse_stack(f"fn@{APP}:1:2").engine == "spidermonkey"


@pytest.mark.parametrize("text", [
    "", "\n\n", "Error: boom", "TypeError: cannot reach user@host:8080",
    "just some text (with parens)", "at", "at ", "@", "[native code] and more",
])
def test_text_without_frames(text: str) -> None:
    parsed = parse_stack(text)
    assert (parsed.engine, parsed.frames, parsed.omitted_frames) == ("unknown", [], 0)
    assert parsed.message == (text.strip() or None)


# --- Caps --------------------------------------------------------------------------------------


def test_frame_cap_keeps_the_innermost() -> None:
    text = "Error: deep\n" + "".join(f"    at f{i} ({APP}:{i + 1}:1)\n" for i in range(1000))
    parsed = parse_stack(text)
    assert len(parsed.frames) == MAX_FRAMES
    assert parsed.omitted_frames == 1000 - MAX_FRAMES
    assert [f.function for f in parsed.frames[:3]] == ["f0", "f1", "f2"]
    assert parsed.frames[-1].line == MAX_FRAMES


def test_long_line_keeps_name_and_position() -> None:
    url = "https://h.test/" + "a" * 100_000 + ".js"
    frame = parse_stack(f"Error: x\n    at handler ({url}:12:34)").frames[0]
    assert (frame.function, frame.line, frame.column) == ("handler", 12, 34)
    assert len(frame.raw) == MAX_LINE_CHARS and CUT in frame.raw
    assert frame.url is not None and frame.url.startswith("https://h.test/aaa")
    assert CUT in frame.url and len(frame.url) < MAX_LINE_CHARS


def test_data_urls_are_abbreviated() -> None:
    url = "data:text/javascript;base64," + "QUFB" * 5000
    for text in (f"    at f ({url}:1:9)", f"f@{url}:1:9", f"{url}:1:9"):
        frame = parse_stack(text).frames[0]
        assert frame.url == url[: MAX_DATA_URL_CHARS - 1] + CUT
        assert (frame.line, frame.column) == (1, 9)
    short = "data:text/javascript,throw%201"
    assert parse_stack(f"f@{short}:1:9").frames[0].url == short


def test_crlf_and_indentation() -> None:
    parsed = parse_stack(f"Error: a\r\nb\r\n    at f ({APP}:1:2)\r\n\tat g ({APP}:3:4)\r\n")
    assert parsed.message == "Error: a\nb"
    assert [(f.function, f.raw) for f in parsed.frames] == [
        ("f", f"at f ({APP}:1:2)"), ("g", f"at g ({APP}:3:4)")]


def test_parsed_stack_is_a_wire_struct() -> None:
    parsed = parse_stack((FIXTURES / "v8" / "method_alias.txt").read_text())
    encoded = msgspec.json.encode(parsed)
    assert msgspec.json.decode(encoded, type=ParsedStack) == parsed


def test_message_cap() -> None:
    parsed = parse_stack("Error: " + "m" * 100_000 + "\n" * 3 + f"    at {APP}:1:2")
    assert parsed.message is not None and len(parsed.message) == MAX_MESSAGE_CHARS
    assert parsed.message.endswith(CUT) and len(parsed.frames) == 1


@pytest.mark.parametrize("number", ["9" * 5000, "\u0663", "\u00b2", "-1", "1.5", ""])
def test_odd_numbers_are_not_positions(number: str) -> None:
    """int() raises on 5000 digits and accepts Arabic-Indic digits: neither is a line."""
    for text in (f"    at f (x.js:{number}:{number})", f"f@x.js:{number}", f"x.js:1:{number}"):
        parse_stack(text)  # never raises
    assert parse_stack(f"    at f (x.js:{number})").frames[0].line is None


# --- Hypothesis --------------------------------------------------------------------------------

PIECES = ["at ", "    at ", "async ", "new ", "(", ")", ":", "@", "*", " ", "\n", "\r\n", "\t",
          "1", "42", "9" * 12, " > eval", " line ", " > Function", "eval at ", ", <anonymous>",
          "<anonymous>", "[native code]", " [as ", "]", "https://", "data:", "blob:", "webpack://",
          "global code", "eval code", "anonymous", "/<", "\u2026", "\u0663", "x" * 5000,
          "(" * 300, ")" * 300, "@" * 200, ":" * 200]
stack_like = st.lists(st.sampled_from(PIECES) | st.text(max_size=8), max_size=60).map("".join)


def check_invariants(parsed: ParsedStack) -> None:
    assert isinstance(parsed, ParsedStack)
    assert parsed.engine in ("v8", "spidermonkey", "jsc", "unknown")
    assert len(parsed.frames) <= MAX_FRAMES and parsed.omitted_frames >= 0
    assert parsed.message is None or 0 < len(parsed.message) <= MAX_MESSAGE_CHARS
    for frame in parsed.frames:
        assert isinstance(frame, Frame) and 0 < len(frame.raw) <= MAX_LINE_CHARS
        for number in (frame.line, frame.column):
            assert number is None or 0 <= number < 10**9


@settings(max_examples=500, deadline=None)
@given(st.text())
def test_random_text_never_raises(text: str) -> None:
    check_invariants(parse_stack(text))


@settings(max_examples=1000, deadline=None)
@given(stack_like)
def test_stack_like_text_never_raises(text: str) -> None:
    check_invariants(parse_stack(text))


def best_time(work: Callable[[], object], repeat: int = 5) -> float:
    """CPU seconds of the fastest run: CPU time, not wall time, so that other processes
    on a busy machine do not count; the fastest run, so that a GC pause does not."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return best


def assert_linear(unit: str, size: int = 40_000) -> None:
    """Time for ~8x the input must grow ~8x: quadratic work would be ~64x. The bound (30x)
    is loose so that cache effects and a busy machine do not fail it."""
    small = unit * max(1, size // len(unit))
    large = small * 8
    parse_stack(small)  # warm up: first-call allocations are not the parser's growth
    parse_stack(large)
    ratio = best_time(lambda: parse_stack(large)) / max(best_time(lambda: parse_stack(small)),
                                                        1e-6)
    assert ratio < 30, f"{ratio:.1f}x for 8x the input of {unit[:40]!r}"


PATHOLOGICAL = [
    "at (", "at f (" + "(" * 50, "at f " + "()" * 40 + ")\n", "    at f (" + ")" * 60 + "\n",
    "eval at a (", "    at f (eval at g (" * 3 + "\n", "@", "@a", "a@" + ":" * 10 + "\n", ":1",
    " line 1 > eval", "x", "\n", " ", "at x.js:1:2\n", "f@x.js:1:2\n", "x.js:1:2\n",
    "async*", "*@", "[native code]\n", "9" * 20 + ":",
]


@pytest.mark.parametrize("unit", PATHOLOGICAL)
def test_pathological_inputs_take_linear_time(unit: str) -> None:
    assert_linear(unit)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(PIECES[:-4]) | st.text(max_size=4), min_size=1, max_size=12)
       .map("".join).filter(bool))
def test_random_repeated_units_take_linear_time(unit: str) -> None:
    assert_linear(unit, size=20_000)
