"""Lookups on a real esbuild bundle (``symbolicate.lookup``), caches and the rewritten text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from symbolic.sourcemap import SourceMapView
from symbolic.sourcemapcache import SourceMapCache

from symbolicate import built as built_module
from symbolicate.built import Built, Found, build, lookup, recorded, source_path
from symbolicate.lru import ByteLRU
from symbolicate.rewrite import MAX_CONTEXT_CHARS, FrameOut, stack_text, trim
from symbolicate.stack import parse_stack
from tests.fixtures.sourcemaps import handmade
from tests.fixtures.sourcemaps.bundles import build_esbuild, position
from tests.support import names_matrix


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    assets = build_esbuild(tmp_path_factory.mktemp("lookup")) / "assets"
    return (assets / "main.js").read_bytes(), (assets / "main.js.map").read_bytes()


def built(bundle: tuple[bytes, bytes], with_js: bool = True) -> Built:
    js, source_map = bundle
    return Built(SourceMapCache.from_bytes(js if with_js else b"", source_map),
                 SourceMapView.from_json_bytes(source_map), with_js, True)


def test_cache_lookup_gives_scope_names_and_context(bundle: tuple[bytes, bytes]) -> None:
    js = bundle[0].decode()
    line2 = js.split("\n")[1]
    column = line2.index("t.owner.name") + len("t.owner.") + 1  # where V8 points
    found = lookup(built(bundle), 2, column)
    assert isinstance(found, Found)
    assert (found.file, (found.line, found.column), found.function) == (
        "src/render.js", position("render.js", "cart.owner.name", "name"), "renderCart")
    assert found.context_line == "${total.toFixed(2)} for ${cart.owner.name}`;"
    assert len(found.pre_context) == 5 and found.pre_context[-1] == "  const text = `Total:"


def test_the_view_answers_where_the_cache_has_no_token(bundle: tuple[bytes, bytes]) -> None:
    # Line 2 of the bundle starts inside a multi-line template literal: the cache has no
    # token there; the view's segment (the literal's start) is on the asked line.
    assert built(bundle).cache.lookup(2, 1, 0) is None  # type: ignore[union-attr]
    found = lookup(built(bundle), 2, 1)
    assert isinstance(found, Found) and found.function is None
    assert (found.file, (found.line, found.column)) == (
        "src/render.js", position("render.js", "`Total:"))
    assert found.context_line == "  const text = `Total:"


def test_never_a_previous_line_mapping(bundle: tuple[bytes, bytes]) -> None:
    # Line 3 is the sourceMappingURL comment: no mapping. The view alone would answer with
    # the last token of line 2.
    view = built(bundle).view
    assert view is not None
    match = view.lookup(2, 0)
    assert match is not None and match.dst_line == 1
    assert lookup(built(bundle), 3, 1) == "no_mapping"
    assert lookup(built(bundle), 99, 1) == "no_mapping"


def test_without_the_js_no_function_name(bundle: tuple[bytes, bytes]) -> None:
    found = lookup(built(bundle, with_js=False), 2, 34)
    assert isinstance(found, Found) and found.file == "src/render.js" and found.function is None


def test_byte_lru_stays_under_its_bound() -> None:
    lru: ByteLRU[str, int] = ByteLRU(100)
    for i in range(10):
        lru.put(f"k{i}", i, 30)
        assert lru.bytes <= 100
    assert len(lru) == 3 and lru.get("k9") == 9 and lru.get("k0") is None
    lru.get("k7")  # used: kept over k8
    lru.put("k10", 10, 30)
    assert lru.get("k7") == 7 and lru.get("k8") is None
    lru.put("huge", 0, 101)  # larger than the whole cache: not kept, nothing evicted
    assert lru.get("huge") is None and len(lru) == 3


@pytest.mark.parametrize(("src", "shown"), [
    ("../src/a.js", "src/a.js"), ("../../src/a.js", "src/a.js"), ("./src/a.js", "src/a.js"),
    ("webpack://app/./src/a.js", "src/a.js"), ("webpack:///src/a.js", "src/a.js"),
    ("/home/ci/src/a.js", "/home/ci/src/a.js"), ("https://x.test/a.js", "https://x.test/a.js"),
])
def test_source_paths(src: str, shown: str) -> None:
    assert source_path(src) == shown


def test_long_context_lines_are_cut_around_the_column() -> None:
    line = "x" * 500 + "HERE" + "y" * 500
    cut = trim(line + "\n", 501)
    assert "HERE" in cut and cut.startswith("\u2026") and cut.endswith("\u2026")
    assert len(cut) == MAX_CONTEXT_CHARS + 2
    assert trim("short\n", 3) == "short"


def test_rewritten_text_reads_like_v8() -> None:
    parsed = parse_stack("f@https://x.test/a.js:1:10\nasync*g@https://x.test/a.js:1:20\n"
                         "@https://x.test/b.js:3:4\n")
    out = [FrameOut(function="render", file="src/a.js", line=5, column=7, raw="",
                    symbolicated=True),
           FrameOut(function="load", file="src/a.js", line=9, column=3, raw="",
                    symbolicated=True),
           FrameOut(function=None, file="https://x.test/b.js", line=3, column=4, raw="",
                    problem="missing_sourcemap")]
    assert stack_text("TypeError: x", parsed.frames, out, 2) == (
        "TypeError: x\n"
        "    at render (src/a.js:5:7)\n"
        "    at async load (src/a.js:9:3)\n"
        "    at https://x.test/b.js:3:4\n"
        "    ... 2 more frames")



# --- Positions and mappings a map cannot answer with a file and line ----------------------------

# JS (one line: "a.b(1,2);c.d(3,4);e.f(5,6);"): column 0 maps to src/app.js 1:1, column 9
# to no original source (a one-field segment: code the bundler generated), column 18 to
# line 3, column 4 of a source the map leaves unnamed (null).
PARTS = handmade.source_map(
    handmade.mappings([[(0, 0, 0, 0), (9,), (9, 1, 2, 3)]]), sources=["src/app.js", None],
    contents=["one\ntwo\nthree\n", "x\ny\nz\n"])


@pytest.fixture(params=["cache", "view", "stripped"])
def parts(request: pytest.FixtureRequest) -> Built:
    """The map's lookups three ways: the cache built from the whole map, the view alone,
    and the cache built without sourcesContent (as ``build`` does for most maps)."""
    data = handmade.dumps(PARTS)
    if request.param == "cache":
        return Built(SourceMapCache.from_bytes(handmade.JS.encode(), data), data, True, True)
    if request.param == "view":
        return Built(None, data, True, True)
    built = build(data, handmade.JS.encode(), True, True)
    assert built is not None and built.sources is not None
    return built


@pytest.mark.parametrize(("line", "column"), [
    (0, 5), (1, 0), (0, 0), (-1, 1), (1, -1), (2**31 + 1, 1), (1, 2**31 + 1), (2**32, 1),
    (1, 2**32 + 5), (10**30, 1), (1, -(10**30)),
])
def test_positions_no_map_can_hold(parts: Built, line: int, column: int) -> None:
    """1-based, so 0 is not a position; a map holds 0-based positions below 2^31."""
    assert lookup(parts, line, column) == "invalid_location"


def test_the_greatest_position_is_still_looked_up(parts: Built) -> None:
    assert lookup(parts, 2**31, 2**31) == "no_mapping"
    assert lookup(parts, 1, 2**31) != "invalid_location"


def test_a_one_field_segment_has_no_original_source(parts: Built) -> None:
    assert lookup(parts, 1, 10) == "no_original_source"
    assert lookup(parts, 1, 18) == "no_original_source"
    found = lookup(parts, 1, 1)
    assert isinstance(found, Found) and (found.file, found.line, found.column) == (
        "src/app.js", 1, 1)


def test_a_null_source_is_a_position_without_a_file(parts: Built) -> None:
    found = lookup(parts, 1, 19)
    assert isinstance(found, Found)
    assert (found.file, found.line, found.column) == (None, 3, 4)


def test_a_map_stored_before_uploads_were_checked_never_gives_a_wrapped_line() -> None:
    """``symbolic`` reads a negative original line as 4294967295 (the view) or 0 (the
    cache, which adds 1): ECMA-426 says such a mapping has no original position."""
    data = handmade.dumps(handmade.source_map(handmade.mappings(
        [[(0, 0, 0, 0), (9, 0, -1, 0), (9, 0, 1, -1)]])))
    for built in (Built(SourceMapCache.from_bytes(handmade.JS.encode(), data), data, True,
                        False), Built(None, data, True, False)):
        assert lookup(built, 1, 10) == "no_original_source"
        assert lookup(built, 1, 19) == "no_original_source"


# --- where a map has segments (symbolicate.built.recorded) -------------------------------------


@pytest.mark.parametrize("bundler", ["esbuild", "rollup-swc", "vite", "webpack",
                                     "webpack-coarse"])
@pytest.mark.parametrize("chunk", [1 << 16, 7])  # decoded in chunks that end at separators
def test_recorded_gives_every_original_position_of_the_map(
        bundler: str, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(built_module, "_CHUNK", chunk)
    source_map = names_matrix.source_map(bundler)
    marks = recorded(json.dumps(source_map).encode())
    assert marks is not None
    expected: dict[str, set[int]] = {}
    sources: list[str] = source_map["sources"]  # type: ignore[assignment]
    for line in names_matrix._segments(source_map):
        for segment in line:
            if len(segment) >= 4:
                expected.setdefault(sources[segment[1]], set()).add(
                    segment[2] << 32 | segment[3])
    assert {name: set(found.tolist()) for name, found in marks.items() if len(found)} == expected


def test_recorded_declines_what_it_cannot_name_and_never_raises() -> None:
    one = handmade.mappings([[(0, 0, 1, 9), (4, 0, -1, -9)], [(2,)]])
    found = recorded(handmade.dumps(handmade.source_map(one)))
    assert found is not None and found["src/app.js"].tolist() == [0, 1 << 32 | 9]
    # Names as the lookups give them are another matter with a root or sections.
    assert recorded(handmade.dumps(handmade.source_map(one, sourceRoot="/x/"))) is None
    assert recorded(handmade.dumps(handmade.index_map(((0, 0), handmade.source_map(one))))) \
        is None
    # Two- and three-field segments, negative running values, junk: no marks, or none wrong.
    for mappings in ("AA", "AAA", "D", "AAAA,D;;", "gggggggggggB", "!!", "", ";;;"):
        result = recorded(handmade.dumps(handmade.source_map(mappings)))
        assert result is None or all(
            (found >= 0).all() and (found >> 32 < 1 << 31).all() for found in result.values())
    assert recorded(b"\x00 not json") is None


@settings(max_examples=300, deadline=None)
@given(mappings=st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                 "0123456789+/,;!é", max_size=200),
       sources=st.lists(st.one_of(st.none(), st.text(max_size=5)), max_size=4))
def test_recorded_decodes_any_mappings_without_raising(mappings: str,
                                                       sources: list[str | None]) -> None:
    result = recorded(handmade.dumps(handmade.source_map(mappings, sources=sources)))
    if result is not None:
        assert set(result) <= {s for s in sources if s}
        for found in result.values():
            assert list(found) == sorted(set(found.tolist()))
