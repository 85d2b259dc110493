"""Function names from the original source (``symbolicate.scopes``).

- The matrix: real stacks of five engines over seven minified bundles of one app, replayed
  from ``tests/fixtures/names`` (``refresh.py`` there records them again), named as each
  engine names the unbundled modules (``tests/support/names_matrix.py`` says how names are paired
  and compared).
- V8 itself: a module of every naming construct runs in node now, and each frame's name
  from the source must be the one V8 printed.
- Hostile sources: any text parses to a table that answers any position; stored tables that
  are damaged or stale are built again; a map without sources names frames from the
  minified code and says so.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.metrics import Registry
from core.storage.local import LocalStorage
from metadata.sqlite import open_db
from symbolicate import scopes
from symbolicate.artifacts import ArtifactStore, blob_key
from symbolicate.built import FROM_SOURCE
from symbolicate.lookup import StackInput, Symbolicator
from symbolicate.printed import Printed, printed
from symbolicate.rewrite import FrameOut
from symbolicate.scopes import (
    MAX_SOURCE_CHARS,
    PackedScopes,
    StaleScopes,
    build_scopes,
    pack,
)
from symbolicate.sourcemaps import UploadedFile, plan_upload
from symbolicate.stack import parse_stack
from tests.fixtures.sourcemaps import handmade
from tests.support import names_matrix
from tests.symbolicate.test_symbolicate_store import wired

# --- the matrix ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cells() -> dict[tuple[str, str], names_matrix.Cell]:
    return names_matrix.score()


def test_the_matrix_covers_five_engines_and_nine_bundlers(
        cells: dict[tuple[str, str], names_matrix.Cell]) -> None:
    engines = {engine for engine, _ in cells}
    bundlers = {bundler for _, bundler in cells}
    assert engines == {"node", "chromium", "gjs", "firefox", "jsc"}
    assert len(bundlers) >= 9 and {"esbuild", "rollup-terser", "webpack", "webpack-babel",
                                   "webpack-coarse", "vite"} <= bundlers
    for cell in cells.values():
        assert cell.frames >= 60  # JavaScriptCore drops tail calls' frames: fewer there
        # A frame unpaired is one the map puts on another line than the engine does.
        assert cell.paired >= 0.9 * cell.frames


def test_names_are_the_original_sources_in_every_engine_and_bundle(
        cells: dict[tuple[str, str], names_matrix.Cell]) -> None:
    for (engine, bundler), cell in cells.items():
        assert cell.ratio >= 0.99, (engine, bundler, cell.exact, cell.paired, cell.misses)
    exact = sum(c.exact for c in cells.values())
    paired = sum(c.paired for c in cells.values())
    assert exact / paired >= 0.99


def test_a_coarse_map_is_named_by_the_printed_frame_and_a_fine_one_by_the_position(
        cells: dict[tuple[str, str], names_matrix.Cell]) -> None:
    # webpack-coarse (the webpack build's stacks over its map coarsened to webpack-sources'
    # chunks) scored 84-85% per cell named by the position alone; the rules that read the
    # print name the frames there, and only there: a recorded build's map is fine.
    for (engine, bundler), cell in cells.items():
        read_the_print = cell.rules["span"] + cell.rules["printed_key"]
        if bundler == "webpack-coarse":
            assert read_the_print >= 0.1 * cell.paired, (engine, cell.rules)
        else:
            assert read_the_print == 0, (engine, bundler, cell.rules)


def test_coarsening_moves_columns_to_webpacks_chunk_starts() -> None:
    text = "const a = {\n  onSave: (f) => save(f),\n  x() { return 1; },\n};\n"
    # Chunks end after ";", "{" or "}" and the blanks that follow, and at line ends.
    assert names_matrix.token_starts(text) == {0: [0], 1: [0], 2: [0, 8, 19], 3: [0], 4: [0]}
    source_map = names_matrix.source_map("webpack")
    coarse = names_matrix.coarsen(source_map)
    fine, moved = names_matrix._segments(source_map), names_matrix._segments(coarse)
    assert [[s[:3] for s in line] for line in fine] == [[s[:3] for s in line] for line in moved]
    assert any(a[3] != b[3] for f, c in zip(fine, moved, strict=True)
               for a, b in zip(f, c, strict=True) if len(a) >= 4)
    assert names_matrix._segments({"mappings": names_matrix._mappings(fine)}) == fine


def test_file_and_line_are_the_maps_wherever_it_has_a_segment(
        cells: dict[tuple[str, str], names_matrix.Cell]) -> None:
    for (engine, bundler), cell in cells.items():
        assert cell.lines_checked == cell.frames, (engine, bundler)
        assert cell.line_misses == [], (engine, bundler)


def test_every_bundled_frame_says_its_name_came_from_the_source() -> None:
    data = names_matrix.load()
    stacks = data["engines"]["node"]["bundles"]["rollup-terser"]  # type: ignore[index]
    out = _symbolicate_fixture("rollup-terser", list(stacks.values()))
    bundle = f"{data['prefix']}dist/rollup-terser/bundle.js"
    for stack, frames in zip(stacks.values(), out, strict=True):
        for raw, frame in zip(parse_stack(stack).frames, frames, strict=True):
            if raw.url == bundle:
                assert frame.symbolicated and frame.function_source == "source", frame


def _symbolicate_fixture(bundler: str, stacks: list[str],
                         strip_contents: bool = False) -> list[list[FrameOut]]:
    dist = names_matrix.FIXTURE / "dist" / bundler
    source_map = json.loads((dist / "bundle.js.map").read_text())
    if strip_contents:
        del source_map["sourcesContent"]
    files = [UploadedFile(f"{bundler}/bundle.js", (dist / "bundle.js").read_bytes()),
             UploadedFile(f"{bundler}/bundle.js.map", json.dumps(source_map).encode())]

    async def main(tmp: Path) -> list[list[FrameOut]]:
        store = ArtifactStore(open_db(tmp / "meta.sqlite"), LocalStorage(str(tmp / "o")))
        await store.upload("prj_1", "1", plan_upload(
            files, f"{names_matrix.load()['prefix']}dist"))
        out = await Symbolicator(store, Registry()).symbolicate("prj_1", [
            StackInput(release="1", debug_ids={}, stack=s, header=None) for s in stacks])
        return [r.frames for r in out]

    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(main(Path(tmp)))


def test_a_map_without_sources_names_frames_from_the_minified_code_and_says_so() -> None:
    data = names_matrix.load()
    stack = data["engines"]["node"]["bundles"]["webpack"]["order-parse-sku"]  # type: ignore
    [frames] = _symbolicate_fixture("webpack", [stack], strip_contents=True)
    [with_sources] = _symbolicate_fixture("webpack", [stack])
    in_app = [f for f in frames if f.symbolicated]
    assert in_app and all(f.function_source in ("minified", None) for f in in_app)
    assert all(f.problem == "missing_sources_content" for f in in_app)
    assert [f.function_source for f in with_sources if f.symbolicated] == \
        ["source"] * len(in_app)


# --- V8 itself ---------------------------------------------------------------------------------

# Every construct V8 names from the source alone, each frame on a line of its own. Cases
# V8 decides when the code runs are left out (and documented in symbolicate/scopes.py): an
# inherited method called on a subclass, computed keys, array elements.
V8_MODULE = """\
const out = [];
function boom() { throw new Error("x"); }
function t(f) { try { f(); } catch (e) { out.push(e.stack); } }
class Cart {
  constructor(fail) {
    if (fail) boom();
  }
  total() {
    boom();
  }
  static make() {
    boom();
  }
  get size() {
    return boom();
  }
  #secret() {
    boom();
  }
  reveal() {
    this.#secret();
  }
  handler = () => {
    boom();
  };
  static build = function () {
    boom();
  };
}
const Box = class {
  open() {
    boom();
  }
};
function Legacy() {
  this.tick = function () {
    boom();
  };
}
const app = { ui: {} };
app.ui.onClick = function () {
  boom();
};
app.ui["on-drop"] = () => {
  boom();
};
const obj = {
  key() {
    boom();
  },
  arrow: () => {
    boom();
  },
  expr: function () {
    boom();
  },
  named: function inner() {
    boom();
  },
  "str key"() {
    boom();
  },
  7: () => {
    boom();
  },
};
const priceOf = (x) => {
  boom();
};
let later;
later = () => {
  boom();
};
function* gen() {
  boom();
}
function outer() {
  return [1].map((l) => {
    boom();
  });
}
function withDefault(f = () => {
  boom();
}) {
  f();
}
function iife() {
  (() => {
    boom();
  })();
}
function template() {
  return `a ${
    boom()
  } b`;
}
export default function () {
  boom();
}
import def from "./mod.mjs";
t(() => new Cart(true));
t(() => new Cart().total());
t(() => Cart.make());
t(() => new Cart().size);
t(() => new Cart().reveal());
t(() => new Cart().handler());
t(() => Cart.build());
t(() => new Box().open());
t(() => new Legacy().tick());
t(() => app.ui.onClick());
t(() => app.ui["on-drop"]());
t(() => obj.key());
t(() => obj.arrow());
t(() => obj.expr());
t(() => obj.named());
t(() => obj["str key"]());
t(() => obj[7]());
t(() => priceOf());
t(() => later());
t(() => gen().next());
t(() => outer());
t(() => withDefault());
t(() => iife());
t(() => template());
t(() => def());
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is installed by make test")
def test_names_from_the_source_are_the_ones_v8_prints(tmp_path: Path) -> None:
    module = tmp_path / "mod.mjs"
    module.write_text(V8_MODULE)
    stacks = json.loads(subprocess.run(["node", str(module)], capture_output=True, text=True,
                                       check=True, timeout=60).stdout)
    table = build_scopes(V8_MODULE, "mod.mjs")
    assert table is not None
    compared = 0
    for stack in stacks:
        parsed = parse_stack(stack)
        assert parsed.engine == "v8"
        for frame in parsed.frames:
            if frame.url != module.as_uri() or frame.line is None or frame.column is None:
                continue
            if V8_MODULE.splitlines()[frame.line - 1].startswith("t("):
                continue  # the calls of the cases: arrows passed to t()
            assert table.name_at(frame.line, frame.column)[1] == (frame.function or None), (
                frame.raw)
            compared += 1
    assert compared >= 50


# --- hostile sources -------------------------------------------------------------------------


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=400)
       | st.lists(st.sampled_from(["function f(", "){", "}", "=>", "(", ")", "class C{", "m(){",
                                   "`${", "`", "'", "/*", "*/", "\n", "\ud800", "😀", "x", "=",
                                   "{a:", "async ", "get ", "#p(){"]),
                  max_size=300).map("".join),
       positions=st.lists(st.tuples(st.integers(-5, 40), st.integers(-5, 400)), max_size=20),
       name=st.sampled_from(["a.js", "a.ts", "a.tsx", "a.mjs", ""]))
def test_any_source_parses_to_a_table_that_answers_any_position(
        text: str, positions: list[tuple[int, int]], name: str) -> None:
    table = build_scopes(text, name)
    assert table is not None
    assert all(-1 <= p < i for i, p in enumerate(table.parents))
    stored = PackedScopes(pack({name: table})).get(name)
    assert stored == table
    for line, column in positions:
        if line >= 1 and column >= 1:
            inside, found = table.name_at(line, column)
            assert inside or found is None


# Templates that name functions through what holds them, each holding one inner expression.
_TEMPLATES = [
    "function f() {{ return {}; }}", "(() => {})", "(async function* () {{ yield {}; }})",
    "class {{ m() {{ return {}; }} #p() {{}} }}", "class {{ static s = {}; }}",
    "({{ k: {}, 'q r'() {{}}, [c]: 1, get g() {{ return 1; }} }})", "(this.a = {})",
    "(a.b['c'] = {})", "class {{ constructor() {{ this.y = {}; }} }}", "[1].map((v) => {})",
    "`${{{}}}`", "(function named() {{ return {}; }})()", "({{ m() {{ return {}; }} }})",
]


@settings(max_examples=200, deadline=None)
@given(nesting=st.lists(st.sampled_from(_TEMPLATES), max_size=40),
       leaf=st.sampled_from(["1", "x", "f()", "this.a", "() => 1", "function () {}"]),
       name=st.sampled_from(["a.js", "a.ts"]),
       positions=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 2000)), max_size=30))
def test_any_nesting_of_naming_constructs_is_named(nesting: list[str], leaf: str, name: str,
                                                   positions: list[tuple[int, int]]) -> None:
    expression = leaf
    for template in nesting:
        expression = template.format(expression)
    source = f"export const top = {expression};\nexport default function () {{ {expression} }}\n"
    table = build_scopes(source, name)
    assert table is not None and table.starts
    assert all(-1 <= p < i for i, p in enumerate(table.parents))
    for line, column in positions:
        inside, found = table.name_at(line, column)
        assert inside or found is None


def test_deep_nesting_and_a_huge_source() -> None:
    # Names that refer to enclosing classes and functions, 1,500 deep: bounded, no
    # RecursionError (the owner is left out past 16 levels).
    n = 1500
    for source, innermost in [
            ("function F() {" + "this.a = class { m() { " * n + "} }" * n + "}", "a.m"),
            ("class A {" + "x = class { y = () => 1; " * n + "}" * n + "}", "x.y"),
            ("const o = " + "{ k: class { m() {} }, j: " * n + "1" + "}" * n, "k.m")]:
        table = build_scopes(source, "deep.js")
        assert table is not None and len(table.starts) >= n
        assert table.names[-1] == innermost
    deep = "function f() {" + "(() => {" * 3000 + "boom()" + "})();" * 3000 + "}"
    table = build_scopes(deep, "deep.js")
    assert table is not None and len(table.starts) == 3001
    assert table.name_at(1, len("function f() {" + "(() => {" * 3000) + 1) == (True, None)
    assert table.name_at(1, 10) == (True, "f")
    assert build_scopes("x" * (MAX_SOURCE_CHARS + 1), "big.js") is None


def test_a_parse_past_its_budget_gives_no_table(monkeypatch: pytest.MonkeyPatch) -> None:
    # Random punctuation sends tree-sitter's error recovery to ~70 k characters a second: a
    # parse is given up past 1 s + 2 s a megabyte, and the source named as if it had none.
    from symbolicate import scopes
    monkeypatch.setattr(scopes, "PARSE_SECONDS", 0.0)
    monkeypatch.setattr(scopes, "PARSE_SECONDS_PER_MB", 0.0)
    assert build_scopes("function f() { return 1 }\n" * 20_000, "a.js") is None
    monkeypatch.undo()
    assert build_scopes("function f() { return 1 }\n" * 20_000, "a.js") is not None
    # Unclosed braces and parentheses, 40,000 deep: linear (a tree-sitter query over such a
    # tree is quadratic; the functions are found by a walk).
    assert build_scopes("{" * 40_000 + "(" * 40_000, "a.js") == scopes.SourceScopes(
        [], [], [], [])


def test_columns_are_utf16_code_units_as_in_source_maps() -> None:
    source = 'const s = "😀😀é"; function f() { boom(); } const g = () => boom();\n'
    table = build_scopes(source, "u.js")
    assert table is not None
    utf16 = source.encode("utf-16-le")

    def column(text: str) -> int:  # 1-based, in UTF-16 code units
        return len(source[:source.index(text)].encode("utf-16-le")) // 2 + 1

    assert len(utf16) // 2 > len(source)  # the emoji are two code units each
    assert table.name_at(1, column("boom(); }")) == (True, "f")
    assert table.name_at(1, column("boom();\n")) == (True, "g")
    assert table.name_at(1, column("const s")) == (False, None)


def test_typescript_sources_parse_with_their_grammar() -> None:
    source = ("export class Store<T> {\n  private items: T[] = [];\n"
              "  add(item: T): void {\n    throw new Error(String(item));\n  }\n}\n"
              "export const load = async (url: string): Promise<void> => {\n"
              "  throw new Error(url);\n};\n")
    for name in ("src/store.ts", "src/store.tsx"):
        table = build_scopes(source, name)
        assert table is not None
        assert table.name_at(4, 5)[1] == "Store.add"
        assert table.name_at(8, 3)[1] == "load"


def test_stored_tables_that_are_damaged_or_stale_are_not_used() -> None:
    with pytest.raises(StaleScopes):
        PackedScopes(b"\x00garbage")
    with pytest.raises(StaleScopes):
        PackedScopes(b"\x93\xa3old\xc3\x80")  # msgpack ("old", True, {}): another format
    table = build_scopes("function f() { g(); }", "a.js")
    assert table is not None
    looped = table.__class__(table.starts, table.ends, [0], table.names)  # its own parent
    assert PackedScopes(pack({"a.js": looped})).get("a.js") is None
    short = table.__class__(table.starts, [], table.parents, table.names)
    assert PackedScopes(pack({"a.js": short})).get("a.js") is None


SOURCE = "function render(cart) {\n  return cart.owner.name;\n}\n"


def _handmade_upload(contents: list[str | None] | None) -> list[UploadedFile]:
    # Column 0 of the minified line maps to line 2, column 10 of src/app.js (in render).
    mapping = handmade.mappings([[(0, 0, 1, 9)]])
    source_map = handmade.source_map(mapping, sources=["src/app.js"], contents=contents)
    return [UploadedFile("assets/app.js", handmade.JS.encode()),
            UploadedFile("assets/app.js.map", handmade.dumps(source_map))]


def test_the_tables_are_stored_beside_the_map_and_rebuilt_when_damaged(tmp_path: Path) -> None:
    stack = "TypeError: x\n    at r (https://a.test/assets/app.js:1:1)"

    async def main() -> list[tuple[str | None, str | None]]:
        storage = LocalStorage(str(tmp_path / "o"))
        store, _ = wired(open_db(tmp_path / "meta.sqlite"), storage)  # builds at upload
        [row] = await store.upload("prj_1", "1", plan_upload(_handmade_upload([SOURCE]),
                                                             "https://a.test"))
        key = blob_key("prj_1", row.map_sha256) + ".scopes"
        stored = storage.get(key)  # built and kept by the upload
        seen = []
        for damage in (None, b"\xc1" * 40, b"\x93\xa3old\xc3\x80"):
            if damage is not None:
                storage.put(key, damage)
            # A fresh symbolicator: as after a restart, the tables come from storage.
            [out] = await Symbolicator(store, Registry()).symbolicate("prj_1", [
                StackInput(release="1", debug_ids={}, stack=stack, header=None)])
            seen.append((out.frames[0].function, out.frames[0].function_source))
            assert storage.get(key) == stored  # rebuilt and stored again when damaged
        return seen

    assert asyncio.run(main()) == [("render", "source")] * 3


def test_a_map_uploaded_without_its_js_still_names_frames_from_its_sources(
        tmp_path: Path) -> None:
    stack = "TypeError: x\n    at r (https://a.test/assets/app.js:1:1)"

    async def main(contents: list[str | None]) -> FrameOut:
        store, symbolicator = wired(
            open_db(tmp_path / f"{len(contents)}{contents[0] is None}.db"),
            LocalStorage(str(tmp_path / "o")))
        map_only = _handmade_upload(contents)[1:]
        await store.upload("prj_1", "1", plan_upload(map_only, "https://a.test"))
        [out] = await symbolicator.symbolicate("prj_1", [
            StackInput(release="1", debug_ids={}, stack=stack, header=None)])
        return out.frames[0]

    named = asyncio.run(main([SOURCE]))
    assert (named.function, named.function_source, named.problem) == ("render", "source", None)
    # Without sources either: no name to give, and the frame says what is missing.
    bare = asyncio.run(main([None]))
    assert (bare.function, bare.line, bare.problem) == (None, 2, "missing_minified_source")


def test_a_parser_failure_keeps_the_frame_rewritten_with_minified_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from symbolicate import lookup as lookup_module

    def broken(_source_map: bytes) -> bytes:
        raise RuntimeError("a bug in the parser")

    monkeypatch.setattr(lookup_module, "parse_scopes", broken)
    stack = "TypeError: x\n    at r (https://a.test/assets/app.js:1:1)"

    async def main() -> FrameOut:
        store, symbolicator = wired(open_db(tmp_path / "m.db"), LocalStorage(str(tmp_path / "o")))
        await store.upload("prj_1", "1", plan_upload(_handmade_upload([SOURCE]),
                                                     "https://a.test"))
        [out] = await symbolicator.symbolicate("prj_1", [
            StackInput(release="1", debug_ids={}, stack=stack, header=None)])
        return out.frames[0]

    frame = asyncio.run(main())
    assert (frame.symbolicated, frame.file, frame.line, frame.problem) == (
        True, "src/app.js", 2, None)
    assert frame.function_source in ("minified", None)


# --- coarse segments: the printed frame names the function ------------------------------------

FORMS = """\
export const actions = {
  onSave: (form) => save(form),
  onCount: (form) => form.lines.reduce((sum, line) => sum + line.qty, 0),
};
export function restock(levels) {
  return levels.map((level) => level.bin.capacity - level.qty);
}
export async function book(parcels) {
  return await Promise.all(parcels.map((p) => quote(p)));
}
"""


def _coarse(source: str) -> scopes.SourceScopes:
    """``source``'s table under a map with one segment a line, at its first column."""
    marks = np.array([line << 32 for line in range(source.count("\n") + 1)], np.int64)
    table = build_scopes(source, "forms.js", marks)
    assert table is not None
    return table


def test_a_coarse_segment_is_named_by_the_printed_key_or_the_missing_name() -> None:
    table = _coarse(FORMS)
    # The map says line 2, column 1, before the arrow; V8 printed "Object.onSave".
    assert table.name_for(2, 1, printed("Object.onSave", None, "v8")) == (
        "Object.onSave", "printed_key")
    assert table.name_for(2, 1, printed("onSave", None, "spidermonkey")) == (
        "Object.onSave", "printed_key")
    # The arrow that minifiers inlined into its caller prints without a name: top-level
    # code is far less likely than the one function there.
    assert table.name_for(2, 1, printed(None, None, "v8")) == ("Object.onSave", "span")
    # An anonymous callback inside a named function, and that function calling it.
    assert table.name_for(6, 1, printed(None, None, "v8")) == (None, "span")
    assert table.name_for(6, 1, printed("t", None, "v8")) == ("restock", "source")
    assert table.name_for(6, 1, printed("a/<", None, "spidermonkey")) == (None, "span")
    # Both printed without a name (the caller inlined as an IIFE): callee inside caller.
    callee = printed(None, None, "v8")
    assert table.name_for(3, 1, callee) == (None, "span")
    assert table.name_for(3, 1, callee._replace(depth=1)) == ("Object.onCount", "span")
    assert table.name_for(6, 1, callee._replace(depth=1)) == ("restock", "span")
    # V8's "at async": the async function, not the callback beside it.
    assert table.name_for(9, 1, printed(None, None, "v8", is_async=True)) == (
        "book", "source")
    assert table.name_for(9, 1, printed(None, None, "v8")) == (None, "span")
    # JavaScriptCore labels top-level code: it stays so.
    assert table.name_for(2, 1, printed("module code", None, "jsc")) == (None, "source")
    # No print to read: the position alone, as before.
    assert table.name_for(2, 1, None) == (None, "source")


def test_a_coarse_segment_over_an_iifes_closing_line_names_its_caller() -> None:
    # Maps put the call of "(() => {...})()" after its closing brace; webpack's segment for
    # that line starts at its first column, inside the arrow.
    table = _coarse("function sla(rows) {\n  return (() => {\n    throw rows;\n  })();\n}\n")
    assert table.name_for(4, 1, printed("t", None, "v8")) == ("sla", "span")
    assert table.name_for(4, 1, printed(None, None, "v8")) == (None, "source")
    assert table.name_for(3, 1, printed("t", None, "v8")) == (None, "source")


def test_a_fine_segment_keeps_the_function_holding_it() -> None:
    # A segment at every token start (as esbuild, terser, swc and Oxc write them): whatever
    # was printed, the function is the one holding the position.
    marks = sorted({line << 32 | column for line, text in enumerate(FORMS.split("\n"))
                    for column in range(len(text)) if column == 0 or text[column - 1] in " (.,"})
    table = build_scopes(FORMS, "forms.js", np.array(marks, np.int64))
    assert table is not None
    for said in (printed(None, None, "v8"), printed("Object.onSave", None, "v8"),
                 printed("t", None, "v8"), printed(None, None, "jsc")):
        assert table.name_for(6, 3, said) == ("restock", "source")
        assert table.name_for(2, 3, said) == (None, "source")
    # A table without the map's marks (an index map's, or one stored before them) names
    # by the position alone.
    coarse = _coarse(FORMS)
    legacy = scopes.SourceScopes(coarse.starts, coarse.ends, coarse.parents, coarse.names)
    assert legacy.name_for(2, 1, printed("Object.onSave", None, "v8")) == (None, "source")
    assert build_scopes(FORMS, "forms.js") == coarse.__class__(
        coarse.starts, coarse.ends, coarse.parents, coarse.names, coarse.keys, coarse.asyncs,
        coarse.bodies, [], [])


def test_printed_names_as_each_engine_prints_them() -> None:
    assert printed("Object.printLabel", "onLabel", "v8") == Printed(
        "named", frozenset({"printLabel", "onLabel"}))
    assert printed("get weight", None, "v8").keys == {"weight"}
    assert printed("summarize/</<.kg<", None, "spidermonkey").kind == "anonymous"
    assert printed("bookPickup/quotes", None, "spidermonkey").keys == {"quotes"}
    assert printed(None, None, "jsc").kind == "anonymous"
    assert printed("<anonymous>", None, "v8").kind == "unnamed"
    assert printed("global code", None, "jsc").kind == "top"
    assert printed("f", None, "spidermonkey", is_async=True).awaiting is False


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=st.lists(st.sampled_from([
           "const o = {", "  k: () => f(x),", "  m(a) { return a.map((v) => v.w); },", "};",
           "function g(y) {", "  return y.map((z) => z.q).filter(function (w) { return w; });",
           "}", "export default async () => { await h(); };", "(() => 1)();", "x.y = () => 2;",
           "`${() => 3}`", "class C { static s = () => 4; #p() {} }", "\ud800", "😀", "{", ")"]),
           max_size=30).map("\n".join) | st.text(max_size=300),
       marks=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 200)), max_size=40),
       names=st.lists(st.tuples(st.one_of(st.none(), st.text(max_size=30)),
                                st.one_of(st.none(), st.text(max_size=10)),
                                st.sampled_from(["v8", "spidermonkey", "jsc", "unknown"]),
                                st.booleans(), st.integers(0, 5)), max_size=8),
       positions=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 200)), max_size=10))
def test_any_print_over_any_source_names_a_function_of_the_source(
        source: str, marks: list[tuple[int, int]],
        names: list[tuple[str | None, str | None, str, bool, int]],
        positions: list[tuple[int, int]]) -> None:
    packed = np.array(sorted({line << 32 | column for line, column in marks}), np.int64)
    table = build_scopes(source, "h.js", packed)
    assert table is not None
    assert PackedScopes(pack({"h.js": table})).get("h.js") == table
    known = set(table.names) | {None}
    # The set the symbolicator checks first holds exactly the marks a rule may read the
    # print at (a frame's position is always one of the map's).
    coarse = table.coarse()
    for mark in packed.tolist():
        line, column = (mark >> 32) + 1, (mark & 0xFFFFFFFF) + 1
        rules = {table.name_for(line, column, printed(f, None, e))[1]
                 for f in (None, "t", "Object.k", "m") for e in ("v8", "jsc")}
        assert mark in coarse or rules == {"source"}, (mark, rules)
    for function, alias, engine, is_async, depth in names:
        said = printed(function, alias, engine, is_async)._replace(depth=depth)
        for line, column in positions:
            name, rule = table.name_for(line, column, said)
            assert name in known and rule in FROM_SOURCE, (name, rule)
            if rule == "source":
                assert name == table.name_at(line, column)[1]


@pytest.fixture(scope="module")
def coarse_symbolicator(tmp_path_factory: pytest.TempPathFactory
                        ) -> tuple[Symbolicator, set[str | None]]:
    """webpack-coarse uploaded, and every name its sources' tables hold."""
    tmp = tmp_path_factory.mktemp("coarse")
    source_map = names_matrix.source_map("webpack-coarse")
    files = [UploadedFile("webpack/bundle.js",
                          (names_matrix.FIXTURE / "dist/webpack/bundle.js").read_bytes()),
             UploadedFile("webpack/bundle.js.map", json.dumps(source_map).encode())]
    store, symbolicator = wired(open_db(tmp / "meta.sqlite"), LocalStorage(str(tmp / "o")))
    asyncio.run(store.upload("prj_1", "1", plan_upload(
        files, f"{names_matrix.load()['prefix']}dist")))
    names: set[str | None] = {None}
    for name, text in zip(source_map["sources"], source_map["sourcesContent"], strict=True):
        table = build_scopes(text, name)
        assert table is not None
        names.update(table.names)
    return symbolicator, names


_BUNDLE = "https://names.boxtrail.test/dist/webpack/bundle.js"


@settings(max_examples=100, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(frames=st.lists(st.tuples(
           st.sampled_from(["", "Object.", "t.", "async ", "get ", "new "]),
           st.one_of(st.just(""), st.sampled_from(["onSave", "onCount", "restock", "B<",
                                                     "B/</<", "module code", "<anonymous>"]),
                     st.text(st.characters(blacklist_categories=("Cs", "Zl", "Zp", "Cc")),
                             max_size=20)),
           st.one_of(st.none(), st.sampled_from(["onSave", "confirm"]), st.text(max_size=8)),
           st.integers(1, 12000)), min_size=1, max_size=9),
       engine=st.sampled_from(["v8", "spidermonkey", "jsc"]))
def test_any_printed_stack_over_a_coarse_map_names_functions_of_the_source(
        coarse_symbolicator: tuple[Symbolicator, set[str | None]],
        frames: list[tuple[str, str, str | None, int]], engine: str) -> None:
    symbolicator, known = coarse_symbolicator
    lines = []
    for prefix, name, alias, column in frames:
        if engine == "v8":
            shown = f"{prefix}{name}" + (f" [as {alias}]" if alias and name else "")
            lines.append(f"    at {shown} ({_BUNDLE}:1:{column})" if shown.strip()
                         else f"    at {_BUNDLE}:1:{column}")
        else:
            lines.append(f"{'async*' if prefix == 'async ' else ''}{name}@{_BUNDLE}:1:{column}")
    stack = ("Error: x\n" if engine == "v8" else "") + "\n".join(lines)
    [out] = asyncio.run(symbolicator.symbolicate("prj_1", [
        StackInput(release="1", debug_ids={}, stack=stack, header=None)]))
    for frame in out.frames:
        assert frame.problem != "internal_error", (stack, frame)
        if frame.symbolicated:
            assert frame.function in known and frame.function_source in FROM_SOURCE, frame
