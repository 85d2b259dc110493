"""Maps looked up without their sourcesContent (``symbolicate.sources``) answer exactly as
``symbolic`` does with the whole map: same file, line, column, function and context lines,
at every position of a real bundle, of an index map, and of a map whose sources have every
kind of line ending."""

from __future__ import annotations

import json

import pytest
from symbolic.sourcemap import SourceMapView
from symbolic.sourcemapcache import SourceMapCache

from symbolicate.built import Built, Found, Miss, build, lookup
from symbolicate.sources import strip
from tests.fixtures.sourcemaps.bundles import build_esbuild

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _vlq(value: int) -> str:
    value = (-value << 1) | 1 if value < 0 else value << 1
    out = ""
    while True:
        digit, value = value & 31, value >> 5
        out += _B64[digit | (32 if value else 0)]
        if not value:
            return out


def _whole(js: bytes, source_map: bytes) -> Built:
    return Built(SourceMapCache.from_bytes(js, source_map),
                 SourceMapView.from_json_bytes(source_map), bool(js), True)


def _answers(built: Built, js: bytes) -> list[Found | Miss]:
    lines = js.decode().split("\n")
    return [lookup(built, line, column) for line, text in enumerate(lines, 1)
            for column in range(1, len(text) + 3)]


def _assert_same(js: bytes, source_map: bytes, with_js: bool = True) -> None:
    given = js if with_js else b""
    stripped = build(source_map, given, with_js, True)
    assert stripped is not None and stripped.sources is not None  # the stripped path
    whole = _answers(_whole(given, source_map), js)
    assert _answers(stripped, js) == whole
    assert sum(isinstance(found, Found) and found.context_line is not None
               for found in whole) > 10
    # Where the cache has no token the view answers: compare the views everywhere.
    parts = strip(source_map)
    assert parts is not None
    whole_view = _answers(Built(None, SourceMapView.from_json_bytes(source_map), with_js, True),
                          js)
    assert _answers(Built(None, parts.map, with_js, True, parts.sources), js) == whole_view
    assert sum(isinstance(found, Found) and found.context_line is not None
               for found in whole_view) > 10


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    assets = build_esbuild(tmp_path_factory.mktemp("sources")) / "assets"
    return (assets / "main.js").read_bytes(), (assets / "main.js.map").read_bytes()


def test_every_position_of_a_bundle(bundle: tuple[bytes, bytes]) -> None:
    js, source_map = bundle
    _assert_same(js, source_map)
    _assert_same(js, source_map, with_js=False)  # without the JS: no function names, same positions


def test_index_maps(bundle: tuple[bytes, bytes]) -> None:
    js, source_map = bundle
    plain = json.loads(source_map)
    _assert_same(js, json.dumps({"version": 3, "sections": [
        {"offset": {"line": 0, "column": 0}, "map": plain}]}).encode())


def test_line_endings_long_lines_and_missing_contents() -> None:
    contents: list[str | None] = [
        "a\nb\r\nc\rd\u2028e\n\nf\r\r\n" + "x" * 300 + "\n",  # every line ending, a long line
        "one\ntwo\nthree\n",  # a trailing newline: an empty last line
        "no newline at the end",
        "",
        None,
    ]
    calls = 60
    js = ("function f(){}" + "f();" * calls).encode()
    start = js.index(b"f();")
    segments, previous = [], (0, 0, 0, 0)
    for i in range(calls):  # call i maps to source i % 5, line i // 5 (past some ends)
        now = (start + 4 * i, i % 5, i // 5, 150 * (i % 3))
        segments.append("".join(_vlq(a - b) for a, b in zip(now, previous, strict=True)))
        previous = now
    source_map = {"version": 3, "sources": [f"s{i}.js" for i in range(5)],
                  "sourcesContent": contents, "names": [], "mappings": ",".join(segments)}
    _assert_same(js, json.dumps(source_map).encode())


@pytest.mark.parametrize("extra", [{"sourceRoot": "src/"},
                                   {"sources": ["a.js", "a.js"]}])
def test_ambiguous_names_keep_the_map_whole(extra: dict[str, object]) -> None:
    source_map = {"version": 3, "sources": ["a.js", "b.js"], "sourcesContent": ["x", "y"],
                  "names": [], "mappings": "AAAA", **extra}
    assert strip(json.dumps(source_map).encode()) is None


def test_no_sources_content_strips_to_the_same_map() -> None:
    source_map = {"version": 3, "sources": ["a.js"], "names": [], "mappings": "AAAA"}
    stripped = strip(json.dumps(source_map).encode())
    assert stripped is not None and json.loads(stripped.map) == source_map
    assert stripped.sources.lines("a.js") is None
