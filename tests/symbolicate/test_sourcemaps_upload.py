"""Upload validation: pairing JS with maps, debug ids, warnings, and the errors that fail an
upload as a whole (``symbolicate.sourcemaps``, no server)."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ApiError
from symbolicate.sourcemaps import (
    InvalidUpload,
    SourceMapError,
    UploadedFile,
    UploadPlan,
    UploadTooLarge,
    normalize_prefix,
    plan_upload,
)
from tests.fixtures.sourcemaps.handmade import (
    dumps,
    index_map,
    mappings,
    nested,
    nested_sections,
    segment,
    source_map,
    vlq,
)

DEBUG_ID = "2460ccbf-8527-4c41-a5e3-52209e0c36d6"
# One line of minified JS and a map for it: "a" at column 0 of source line 0.
JS = b"function a(){throw new Error('x')}\n"
MAP = {"version": 3, "sources": ["src/a.js"], "sourcesContent": ["function a() {}\n"],
       "names": [], "mappings": "AAAA"}


def js(*comments: str) -> bytes:
    return JS + "".join(f"//# {c}\n" for c in comments).encode()


def smap(**changes: object) -> bytes:
    value = {**MAP, **changes}
    return json.dumps({k: v for k, v in value.items() if v is not None}).encode()


def plan(*files: tuple[str, bytes], prefix: str | None = None) -> UploadPlan:
    return plan_upload([UploadedFile(name, data) for name, data in files], prefix)


def codes(result: UploadPlan) -> list[tuple[str, str]]:
    return [(w.file, w.code) for w in result.warnings]


def test_js_and_map_are_paired_by_name() -> None:
    result = plan(("assets/app.js", JS), ("assets/app.js.map", smap()))
    [artifact] = result.artifacts
    assert (artifact.url, artifact.name, artifact.map_name) == (
        "~/assets/app.js", "assets/app.js", "assets/app.js.map")
    assert artifact.js == JS and artifact.sources_content and artifact.debug_id is None
    assert result.warnings == []


def test_source_mapping_url_wins_over_the_name() -> None:
    result = plan(("app.js", js("sourceMappingURL=maps/app.123.map")),
                  ("maps/app.123.map", smap()), prefix="https://cdn.example.com/static")
    [artifact] = result.artifacts
    assert artifact.map_name == "maps/app.123.map"
    assert artifact.url == "https://cdn.example.com/static/app.js"


def test_inline_map() -> None:
    inline = base64.b64encode(smap()).decode()
    result = plan(("app.js", js(f"sourceMappingURL=data:application/json;base64,{inline}")),
                  ("other.js.map", smap()))
    assert [(a.name, a.map_name) for a in result.artifacts] == [
        ("app.js", "app.js (inline map)"), ("other.js", "other.js.map")]
    assert codes(result) == [("other.js.map", "map_without_js")]


def test_debug_id_from_the_js_when_the_map_has_none() -> None:
    [artifact] = plan(("app.js", js(f"debugId={DEBUG_ID.upper()}")),
                      ("app.js.map", smap())).artifacts
    assert artifact.debug_id == DEBUG_ID


@pytest.mark.parametrize("key", ["debugId", "debug_id"])
def test_debug_id_from_the_map(key: str) -> None:
    compact = DEBUG_ID.replace("-", "")
    [artifact] = plan(("app.js", JS), ("app.js.map", smap(**{key: compact}))).artifacts
    assert artifact.debug_id == DEBUG_ID


def test_index_map_with_sections() -> None:
    index = {"version": 3, "sections": [
        {"offset": {"line": 0, "column": 0}, "map": MAP},
        {"offset": {"line": 1, "column": 0}, "map": {**MAP, "sourcesContent": None}}]}
    result = plan(("app.js", JS), ("app.js.map", json.dumps(index).encode()))
    [artifact] = result.artifacts
    assert not artifact.sources_content  # one section lacks it
    assert codes(result) == [("app.js.map", "missing_sources_content")]


def test_warnings_for_a_map_without_js_without_sources_and_js_without_map() -> None:
    result = plan(("a.js", JS), ("a.js.map", smap(sourcesContent=None)), ("b.js.map", smap()),
                  ("c.js", JS))
    assert [(a.url, a.js is not None) for a in result.artifacts] == [
        ("~/a.js", True), ("~/b.js", False)]
    assert codes(result) == [("a.js.map", "missing_sources_content"),
                             ("c.js", "js_without_map"), ("b.js.map", "map_without_js")]
    # Names come from the original sources now: the JS is not needed for them.
    assert "function names come from its sourcesContent" in result.warnings[2].message


# Each of these fails the upload as a whole: (files, error class, text the message holds).
BAD = {
    "not json": ([("app.js", JS), ("app.js.map", b"{not json")], SourceMapError,
                 "app.js.map: not a source map"),
    "version 2": ([("app.js", JS), ("app.js.map", smap(version=2))], SourceMapError,
                  "app.js.map: source map version 2"),
    "no mappings": ([("app.js", JS), ("app.js.map", smap(mappings=None))], SourceMapError,
                    "app.js.map: a source map needs 'sources' and 'mappings'"),
    "bad vlq": ([("app.js", JS), ("app.js.map", smap(mappings="AAAA,ZZZZZZZZZZZZ"))],
                SourceMapError, "app.js.map: invalid source map"),
    "url section": ([("app.js", JS), ("app.js.map", json.dumps({"version": 3, "sections": [
        {"offset": {"line": 0, "column": 0}, "url": "x.map"}]}).encode())], SourceMapError,
        "section 0 refers to a map by url"),
    "bad debug id": ([("app.js", JS), ("app.js.map", smap(debugId="nope"))], SourceMapError,
                     "app.js.map: debug id 'nope' is not a UUID"),
    "debug ids differ": ([("app.js", js(f"debugId={DEBUG_ID}")),
                          ("app.js.map", smap(debugId="00000000-0000-4000-8000-000000000000"))],
                         SourceMapError, "not from the same build"),
    "bad inline": ([("app.js", js("sourceMappingURL=data:application/json;base64,@@")),
                    ("b.js.map", smap())],
                   SourceMapError, "app.js: its inline source map is not valid base64"),
    "no map at all": ([("app.js", JS)], InvalidUpload, "the upload has no .map file"),
    "dotdot": ([("../app.js.map", smap())], InvalidUpload, "must be a path relative"),
    "absolute": ([("/etc/app.js.map", smap())], InvalidUpload, "must be a path relative"),
    "twice": ([("a.js.map", smap()), ("a.js.map", smap())], InvalidUpload, "twice"),
    "same url": ([("a.js", js("sourceMappingURL=a.map")), ("a.map", smap()),
                  ("a.js.map", smap())], InvalidUpload, "two files would be served at ~/a.js"),
}


TOP = 2**31 - 1  # the greatest position or index a 32-bit VLQ states
INNER = source_map("AAAA")


def _one(text: str, **changes: object) -> list[tuple[str, bytes]]:
    return [("app.js", JS), ("app.js.map", dumps(source_map(text, **changes)))]


def _index(*sections: tuple[tuple[int | float, int | float], dict[str, object]]
           ) -> list[tuple[str, bytes]]:
    return [("app.js", JS), ("app.js.map", dumps(index_map(*sections)))]


# ECMA-426 cases, written here from the specification's rules (1-based line and segment in
# the messages). Each is a map the specification calls invalid: refused at upload, 400.
ECMA426_BAD = {
    # VLQSignedValue / VLQUnsignedValue: "throw an error" past 32 bits.
    "VLQ beyond 32 bits": (_one(segment(0, 0) + vlq(2**31) + "A"),
                           "generated line 1, segment 1: a VLQ beyond 32 bits"),
    "padded VLQ beyond 32 bits": (_one("AA" + "g" * 9 + "gE" + "A"),
                                  "generated line 1, segment 1: a VLQ beyond 32 bits"),
    "VLQ without its last digit": (_one("AAAg;AAAA"),
                                   "generated line 1, segment 1: a VLQ ends without"),
    "not base64": (_one("AAAA,C!AC"), "segment 2: '!' is not a base64 digit"),
    "empty segment": (_one("AAAA,,CAAC"), "generated line 1, segment 2: an empty segment"),
    "comma before a line end": (_one("AAAA,;AAAA"), "an empty segment"),
    "two fields": (_one("AAAA;AA"), "generated line 2, segment 1: a segment of 2 fields"),
    "six fields": (_one("AAAAAA", names=["n"]), "a segment of 6 fields"),
    # DecodeMappingsField: running values out of range ("optionally report an error").
    "negative generated column": (_one(mappings([[(4, 0, 0, 0), (-5,)]])),
                                  "segment 2: generated column -1 is out of range"),
    "negative original line": (_one(mappings([[(0, 0, 3, 0)], [(0, 0, -4, 0)]])),
                               "generated line 2, segment 1: original line -1 is not in range"),
    "negative original column": (_one(mappings([[(0, 0, 0, -1)]])),
                                 "original column -1 is not in range"),
    "original line past 2^31 by steps": (_one(mappings([[(0, 0, TOP, 0), (1, 0, 1, 0)]])),
                                         "segment 2: original line 2147483648 is not in range"),
    "generated column past 2^31 by steps": (_one(mappings([[(TOP,), (1,)]])),
                                            "generated column 2147483648 is out of range"),
    "ECMA-426's -0 is -2^31": (_one("BAAA"), "generated column -2147483648 is out of range"),
    "source index out of range": (_one(mappings([[(0, 1, 0, 0)]])),
                                  "source index 1 is not below 1"),
    "name index out of range": (_one(mappings([[(0, 0, 0, 0, 1)]]), names=["n"]),
                                "name index 1 is not below 1"),
    # Index maps: offsets, order, overlap, and what a section may embed.
    "negative offset line": (_index(((-1, 0), INNER)),
                             "sections[0].offset.line -1 is not a position"),
    "offset column past 2^31": (_index(((0, 2**31), INNER)),
                                "sections[0].offset.column 2147483648 is not a position"),
    "fractional offset": (_index(((0.5, 0), INNER)),
                          "sections[0].offset.line 0.5 is not a position"),
    "offset and mapping past 2^31": (_index(((TOP, 0), source_map("AAAA;AAAA"))),
                                     "sections[0] maps generated line 2147483648"),
    "offset column and mapping past 2^31": (
        _index(((0, TOP), source_map(mappings([[(1, 0, 0, 0)]])))),
        "sections[0] maps generated column 2147483648"),
    "sections out of order": (_index(((5, 0), INNER), ((4, 0), INNER)),
                              "sections[1] starts before sections[0]"),
    "sections overlap": (_index(((0, 0), source_map("AAAA;;AAAA")), ((1, 0), INNER)),
                         "sections[1] starts at or before the last mapping of sections[0]"),
    "nested index map": ([("app.js", JS), ("app.js.map", nested_sections(2))],
                         "sections[0].map is an index map"),
    "section mappings": (_index(((0, 0), source_map("AAAA,,AAAA"))),
                         "sections[0].map: mappings: generated line 1, segment 2"),
    # ignoreList: indexes into sources (and Chrome's earlier name for it, the same rules).
    "ignoreList past sources": (_one("AAAA", ignoreList=[1]),
                                "ignoreList holds 1, not the index of one of the 1 sources"),
    "negative ignoreList": (_one("AAAA", ignoreList=[0, -1]), "ignoreList holds -1"),
    "x_google_ignoreList past sources": (_one("AAAA", x_google_ignoreList=[2]),
                                         "x_google_ignoreList holds 2"),
    "ignoreList of strings": (_one("AAAA", ignoreList=["0"]),
                              "Expected `int`, got `str` - at `$.ignoreList[0]`"),
    "fractional ignoreList": (_one("AAAA", ignoreList=[0.5]), "at `$.ignoreList[0]`"),
    "ignoreList not a list": (_one("AAAA", ignoreList=0), "at `$.ignoreList`"),
    "section ignoreList past sources": (
        _index(((0, 0), source_map("AAAA", ignoreList=[3]))),
        "sections[0].map: ignoreList holds 3"),
    "index map with mappings": ([("app.js", JS), ("app.js.map", dumps(
        {**index_map(((0, 0), INNER)), "mappings": "AAAA"}))],
        "an index map (with 'sections') must not have 'mappings'"),
    # Not ECMA-426's business but the same class: JSON nested too deep to read.
    "arrays nested 100,000 deep": ([("app.js", JS), ("app.js.map", nested(100_000))],
                                   "not a source map: JSON nested too deep"),
    "names nested 100,000 deep": ([("app.js", JS), ("app.js.map", nested(100_000, "names"))],
                                  "not a source map: Expected `str`, got `array`"),
    "sections nested 5,000 deep": ([("app.js", JS), ("app.js.map", nested_sections(5000))],
                                   "not a source map: JSON nested too deep"),
}


@pytest.mark.parametrize("case", ECMA426_BAD)
def test_invalid_by_ecma426_fails_whole(case: str) -> None:
    files, text = ECMA426_BAD[case]
    with pytest.raises(SourceMapError) as raised:
        plan(*files, ("ok.js", JS), ("ok.js.map", smap()))
    assert text in raised.value.message, raised.value.message
    assert raised.value.message.startswith("app.js.map: ")
    assert raised.value.status_code == 400 and raised.value.detail == {"file": "app.js.map"}


# Maps the specification calls valid, some of which symbolic 13.9 refuses or misreads.
ECMA426_GOOD = {
    "a long VLQ within 32 bits": _one("A" + "g" * 40 + "A" + "AA"),
    "every field at 2^31 - 1": _one(segment(TOP, 0, TOP, TOP, 0), names=["n"]),
    "one-field segments": _one(mappings([[(0,), (4, 0, 0, 0), (4,)], [], [(2,)]])),
    "a null source": _one(mappings([[(0, 0, 0, 0), (4, 1, 2, 3)]]),
                          sources=["src/app.js", None]),
    "empty mappings": _one(""),
    "only line breaks": _one(";;;"),
    "integral offsets written as 1.0": _index(((1.0, 2.0), INNER)),
    "sections in order": _index(((0, 0), source_map("AAAA,CAAC")), ((0, 2), INNER),
                                ((3, 0), source_map(mappings([[(1, 0, 0, 0)]])))),
    "an empty sections list": [("app.js", JS), ("app.js.map", dumps(index_map()))],
    "an empty ignoreList": _one("AAAA", ignoreList=[]),
    "every source ignored": _one("AAAA", sources=["a.js", "b.js"], ignoreList=[1, 0],
                                x_google_ignoreList=[1]),
}


@settings(max_examples=200, deadline=None)
@given(sources=st.integers(0, 4),
       ignored=st.lists(st.integers(-(2**40), 2**40) | st.integers(-2, 6), max_size=6))
def test_an_ignore_list_is_accepted_exactly_when_it_names_sources(
        sources: int, ignored: list[int]) -> None:
    files = _one("", sources=[f"s{i}.js" for i in range(sources)], ignoreList=ignored)
    if all(0 <= i < sources for i in ignored):
        assert plan(*files).artifacts
    else:
        with pytest.raises(SourceMapError, match="ignoreList holds"):
            plan(*files)


@pytest.mark.parametrize("case", ECMA426_GOOD)
def test_valid_by_ecma426_is_accepted(case: str) -> None:
    [artifact] = plan(*ECMA426_GOOD[case]).artifacts
    assert artifact.url == "~/app.js"


@pytest.mark.parametrize("case", BAD)
def test_invalid_uploads_fail_whole(case: str) -> None:
    files, error, text = BAD[case]
    with pytest.raises(error) as raised:
        plan(*files)
    assert text in raised.value.message
    assert raised.value.status_code == 400
    if error is SourceMapError:
        assert raised.value.code == "invalid_sourcemap"
        assert raised.value.detail["file"] in raised.value.message


def test_too_large() -> None:
    with pytest.raises(UploadTooLarge) as raised:
        plan_upload([UploadedFile(f"{i}.js.map", b"") for i in range(5000)], None)
    assert isinstance(raised.value, ApiError) and raised.value.status_code == 413


@pytest.mark.parametrize(("given", "expected"), [
    (None, "~/"), ("", "~/"), ("~/", "~/"), ("~", "~/"), ("~/assets", "~/assets/"),
    ("~/assets/", "~/assets/"), ("/assets", "~/assets/"), ("assets", "~/assets/"),
    ("https://cdn.example.com/static", "https://cdn.example.com/static/"),
])
def test_url_prefixes(given: str | None, expected: str) -> None:
    assert normalize_prefix(given) == expected


@pytest.mark.parametrize("given", ["~/../x", "ftp://host/x", "https://h/x?v=1", "~/a?b",
                                   # control characters urlsplit drops before it looks, a port
                                   # out of range (found by an attack: stored, never matched)
                                   "https://h\nx.test/static", "https://h/a\tb", "~/a\x7fb",
                                   "~/a\nb", "https://h:99999/"])
def test_bad_url_prefixes(given: str) -> None:
    with pytest.raises(InvalidUpload):
        normalize_prefix(given)
