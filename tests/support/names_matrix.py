"""The function-name matrix: real stacks from five engines over seven minified bundles of one
app (``tests/fixtures/names``), symbolicated by boxtrail and compared with what the same
engine printed for the unbundled modules.

Pairing. A bundled frame, once symbolicated, is paired with an unused frame of the
unbundled run (same engine, same scenario) at the same original file and line: the one at
the same column if there is one (a callback and the call that runs it often share a
line), else the first. A frame that
finds no partner is *unpaired*: the map put it on another line than the engine does (the
bundler's map has no segment there, or it inlined or merged statements), or the bundle ran
a frame the modules did not (an inlined call merges two frames into one). Names are scored
on paired frames.

Names compared. Engines spell one function differently; both sides are reduced to the same
key before comparing:

- V8 prints the receiver's type (``Cart.total``, ``Object.key``); boxtrail prints the
  defining class or ``Object``; SpiderMonkey and JavaScriptCore print neither. The key is
  the name after its last ``.``;
- SpiderMonkey names an anonymous function after where it sits (``merge/<``,
  ``scenarios<``, ``summarize/</<.kg<``): a name ending in ``<`` is anonymous, and of
  ``outer/inner`` the part after the last ``/`` is kept;
- getters and setters: ``get total`` is ``total`` (JavaScriptCore prints the bare name);
- no name, ``<anonymous>`` and the empty name are one key: anonymous.

Where engines disagree on *whether* a function has a name, V8's rules decide (the issue's
reference), and the frame counts as ``by_reference``:

- JavaScriptCore prints no name for a function that V8 names by inference (an arrow
  assigned to ``registry.handlers.onWeigh``, an async arrow held by a ``const`` once it
  resumes after ``await``): the name V8 prints for the unbundled modules at that place;
- V8 prints an inferred name for a function whose ``name`` is empty and that SpiderMonkey
  prints as anonymous (``scenarios<``): V8's inference reads names from the expression
  around the function, even from a later element's object literal (an arrow in an array
  printed ``discounts.tiered.over``); by V8's own rules for function names (declarations,
  methods, keys, variables, assignments) such a function is a callback: anonymous.

``exact`` counts names equal to the reference; ``printed`` counts names equal to what the
engine printed, without these two rules.

Lines. Every bundled frame in the bundle is checked against the map as node's
``@jridgewell/trace-mapping`` reads it (the fixture's oracle): boxtrail must give the same
original file and line wherever the map has a segment. Where the map has several segments
at the one generated column (swc writes an inlined argument's position beside the inlined
body's), any of them is the map's answer: trace-mapping takes the first, ``symbolic`` the
last.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from core.storage.local import LocalStorage
from metadata.sqlite import open_db
from symbolicate.built import source_path
from symbolicate.lookup import StackInput
from symbolicate.rewrite import FrameOut
from symbolicate.sourcemaps import UploadedFile, plan_upload
from symbolicate.stack import Frame, parse_stack
from tests.symbolicate.test_symbolicate_store import wired

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "names"
ANONYMOUS = "<anonymous>"


def name_key(name: str | None) -> str:
    """The comparable part of a function name, as the module's docstring says."""
    if not name or name == ANONYMOUS or name.endswith("<"):
        return ANONYMOUS
    name = name.rpartition("/")[2]
    for accessor in ("get ", "set "):
        if name.startswith(accessor):
            name = name[len(accessor):]
    return name.rpartition(".")[2] or ANONYMOUS


@dataclass
class Miss:
    engine: str
    bundler: str
    scenario: str
    where: str  # file:line
    expected: str | None
    got: str | None
    function_source: str | None


@dataclass
class Cell:
    """One engine x bundler: frames seen, paired, named alike; lines checked and missed."""

    frames: int = 0
    paired: int = 0
    exact: int = 0
    printed: int = 0  # equal to the engine's own print, without the reference rules
    by_reference: int = 0  # frames whose expected name came from the reference rules
    lines_checked: int = 0
    line_misses: list[str] = field(default_factory=list)
    misses: list[Miss] = field(default_factory=list)
    rules: Counter[str | None] = field(default_factory=Counter)  # paired, by functionSource

    @property
    def ratio(self) -> float:
        return self.exact / self.paired if self.paired else 1.0


_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_VLQ = {c: i for i, c in enumerate(_ALPHABET)}


def segments_at(source_map: dict[str, object], line: int, column: int
                ) -> list[tuple[str, int]]:
    """Every (source, 1-based original line) the map gives the 1-based generated
    ``line``:``column`` (its segments at the last generated column at or before it)."""
    sources: list[str] = source_map["sources"]  # type: ignore[assignment]
    lines = _segments(source_map)
    found: dict[int, list[tuple[str, int]]] = {}
    for segment in lines[line - 1] if line <= len(lines) else ():
        if len(segment) >= 4 and segment[0] <= column - 1:
            found.setdefault(segment[0], []).append((sources[segment[1]], segment[2] + 1))
    return found[max(found)] if found else []


def _segments(source_map: dict[str, object]) -> list[list[list[int]]]:
    """The map's segments, by generated line, with absolute values (generated column,
    then source, original line, original column and name where the segment has them)."""
    state = [0, 0, 0, 0]
    lines = []
    for text in str(source_map["mappings"]).split(";"):
        generated = 0
        out = []
        for segment in filter(None, text.split(",")):
            values, shift, value = [], 0, 0
            for char in segment:
                digit = _VLQ[char]
                value += (digit & 31) << shift
                shift += 5
                if not digit & 32:
                    values.append(-(value >> 1) if value & 1 else value >> 1)
                    shift = value = 0
            generated += values[0]
            for i, delta in enumerate(values[1:]):
                state[i] += delta
            out.append([generated, *state[:len(values) - 1]])
        lines.append(out)
    return lines


def _vlq(value: int) -> str:
    unsigned = (-value << 1) | 1 if value < 0 else value << 1
    out = ""
    while True:
        digit, unsigned = unsigned & 31, unsigned >> 5
        out += _ALPHABET[digit | (32 if unsigned else 0)]
        if not unsigned:
            return out


def _mappings(lines: list[list[list[int]]]) -> str:
    state = [0, 0, 0, 0]
    encoded = []
    for segments in lines:
        generated = 0
        parts = []
        for segment in segments:
            part = _vlq(segment[0] - generated)
            generated = segment[0]
            for i, value in enumerate(segment[1:]):
                part += _vlq(value - state[i])
                state[i] = value
            parts.append(part)
        encoded.append(",".join(parts))
    return ";".join(encoded)


def token_starts(text: str) -> dict[int, list[int]]:
    """By 0-based line, the UTF-16 columns where webpack-sources' ``OriginalSource`` starts
    a chunk of ``text`` (its "potential tokens": a run of characters up to one of ``;{}``
    or a line end, the ``;{}`` and blanks after it, and the line end)."""
    starts: dict[int, list[int]] = {}
    for number, line in enumerate(text.split("\n")):
        columns = starts[number] = [0]
        column, i = 0, 0
        while i < len(line):
            while i < len(line) and line[i] not in ";{}":
                column += len(line[i].encode("utf-16-le")) // 2
                i += 1
            while i < len(line) and line[i] in ";{} \r\t":
                column += 1
                i += 1
            if i < len(line):
                columns.append(column)
    return starts


def coarsen(source_map: dict[str, object]) -> dict[str, object]:
    """``source_map`` as webpack's map of plain modules would be without webpack-sources'
    identity mappings (webpack < 5 with terser-webpack-plugin < 1.4, or any tool chaining a
    minifier's map onto webpack's own): every original column moved back to the start of
    its ``OriginalSource`` chunk, most often the line's first column."""
    contents: list[str | None] = source_map["sourcesContent"]  # type: ignore[assignment]
    starts = [token_starts(text) if text is not None else {} for text in contents]
    lines = _segments(source_map)
    for segments in lines:
        for segment in segments:
            if len(segment) >= 4 and (columns := starts[segment[1]].get(segment[2])):
                segment[3] = columns[bisect.bisect_right(columns, segment[3]) - 1]
    return {**source_map, "mappings": _mappings(lines)}


# Builds derived from a recorded one: the same bundle and stacks, its map coarsened.
DERIVED = {"webpack-coarse": ("webpack", coarsen)}


def load() -> dict[str, object]:
    return json.loads((FIXTURE / "stacks.json").read_text())  # type: ignore[no-any-return]


def _app_path(url: str, prefix: str) -> str | None:
    """``https://names.boxtrail.test/app/src/x.js`` -> ``app/src/x.js``; None elsewhere."""
    if url.startswith(prefix + "app/"):
        return url[len(prefix):]
    return None


V8 = ("node", "chromium")


def _reference(engine: str, partner: Frame, at: tuple[str, str, int],
               lines: dict[str, dict[tuple[str, str, int], set[str]]]) -> str:
    """The key a frame's name is compared with, by the rules of the module's docstring.
    ``at`` is (scenario, file, line) of the unbundled ``partner``; engines' columns differ,
    so the other engine's frame is the one name it gives every frame on that line."""
    key = name_key(partner.function)
    if engine == "jsc" and key == ANONYMOUS:
        v8 = lines["node"].get(at, set())
        if len(v8) == 1 and (only := next(iter(v8))) != ANONYMOUS:
            return only
    if engine in V8 and "." in (partner.function or "") and \
            lines["gjs"].get(at) == {ANONYMOUS}:
        return ANONYMOUS
    return key


def _unbundled(stack: str, prefix: str) -> list[tuple[str, int, Frame]]:
    out = []
    for frame in parse_stack(stack).frames:
        path = _app_path(frame.url or "", prefix)
        if path is not None and frame.line is not None:
            out.append((path, frame.line, frame))
    return out


async def _symbolicate(data: dict[str, object], workdir: Path
                       ) -> dict[tuple[str, str, str], list[tuple[Frame, FrameOut]]]:
    store, symbolicator = wired(open_db(workdir / "meta.sqlite"),
                                LocalStorage(str(workdir / "o")))
    bundlers: dict[str, dict[str, str]] = data["bundlers"]  # type: ignore[assignment]
    # Each derived build in a project of its own: it has the URL of the one it comes from.
    projects = {bundler: "prj_names" for bundler in bundlers}
    for derived, (base, _) in DERIVED.items():
        if base in bundlers:
            projects[derived] = f"prj_names_{derived}"
    for bundler, project in projects.items():
        base = DERIVED[bundler][0] if bundler in DERIVED else bundler
        dist = FIXTURE / "dist" / base
        files = [UploadedFile(f"{base}/bundle.js", (dist / "bundle.js").read_bytes()),
                 UploadedFile(f"{base}/bundle.js.map",
                              json.dumps(source_map(bundler)).encode())]
        await store.upload(project, "1", plan_upload(files, f"{data['prefix']}dist"))
    out = {}
    engines: dict[str, dict[str, object]] = data["engines"]  # type: ignore[assignment]
    for engine, runs in engines.items():
        bundles: dict[str, dict[str, str]] = runs["bundles"]  # type: ignore[assignment]
        for bundler, project in projects.items():
            stacks = bundles[DERIVED[bundler][0] if bundler in DERIVED else bundler]
            keys = list(stacks)
            results = await symbolicator.symbolicate(project, [
                StackInput(release="1", debug_ids={}, stack=stacks[k], header=None)
                for k in keys])
            for scenario, result in zip(keys, results, strict=True):
                parsed = parse_stack(stacks[scenario]).frames
                out[engine, bundler, scenario] = list(zip(parsed, result.frames, strict=True))
    return out


def source_map(bundler: str) -> dict[str, object]:
    """The map of a recorded build, or of a derived one (:data:`DERIVED`)."""
    base, derive = DERIVED.get(bundler, (bundler, None))
    loaded: dict[str, object] = json.loads(
        (FIXTURE / "dist" / base / "bundle.js.map").read_text())
    return loaded if derive is None else derive(loaded)


def score(data: dict[str, object] | None = None) -> dict[tuple[str, str], Cell]:
    """Every engine x bundler cell of the fixture, symbolicated now."""
    data = data or load()
    prefix: str = data["prefix"]  # type: ignore[assignment]
    oracle: dict[str, dict[str, dict[str, object] | None]] = data["oracle"]  # type: ignore
    with tempfile.TemporaryDirectory() as tmp:
        symbolicated = asyncio.run(_symbolicate(data, Path(tmp)))
    engines: dict[str, dict[str, object]] = data["engines"]  # type: ignore[assignment]
    # The names each engine printed for the modules, by scenario, file and line.
    lines: dict[str, dict[tuple[str, str, int], set[str]]] = {}
    for engine, runs in engines.items():
        at = lines[engine] = {}
        for scenario, stack in runs["unbundled"].items():  # type: ignore[attr-defined]
            for path, line, frame in _unbundled(stack, prefix):
                at.setdefault((scenario, path, line), set()).add(name_key(frame.function))
    maps = {bundler: source_map(bundler) for bundler in {b for _, b, _ in symbolicated}}
    cells: dict[tuple[str, str], Cell] = {}
    for (engine, bundler, scenario), frames in symbolicated.items():
        cell = cells.setdefault((engine, bundler), Cell())
        unbundled: dict[str, str] = engines[engine]["unbundled"]  # type: ignore[assignment]
        partners = _unbundled(unbundled[scenario], prefix)
        used: set[int] = set()
        base = DERIVED[bundler][0] if bundler in DERIVED else bundler
        bundle_url = f"{prefix}dist/{base}/bundle.js"
        for raw, out in frames:
            if raw.url != bundle_url:
                continue
            cell.frames += 1
            expected = oracle[base].get(f"{raw.line}:{raw.column}")
            if expected is not None:
                cell.lines_checked += 1
                mapped = (source_path(str(expected["source"])), expected["line"])
                assert raw.line is not None and raw.column is not None
                if (out.file, out.line) != mapped and not {mapped, (out.file, out.line)} <= {
                        (source_path(src), n)
                        for src, n in segments_at(maps[bundler], raw.line, raw.column)}:
                    cell.line_misses.append(
                        f"{scenario} {raw.line}:{raw.column}: {out.file}:{out.line} "
                        f"(map: {mapped[0]}:{mapped[1]})")
            # The frame at the same column if there is one (a callback and its caller can
            # share a line), else the first on the line.
            candidates = sorted(
                (index for index, (path, line, _) in enumerate(partners)
                 if index not in used and (path, line) == (out.file, out.line)),
                key=lambda index: partners[index][2].column != out.column)
            if not candidates:
                continue
            index = candidates[0]
            path, line, partner = partners[index]
            used.add(index)
            cell.paired += 1
            cell.rules[out.function_source] += 1
            got = name_key(out.function)
            want = _reference(engine, partner, (scenario, path, line), lines)
            cell.printed += got == name_key(partner.function)
            cell.by_reference += want != name_key(partner.function)
            if got == want:
                cell.exact += 1
            else:
                cell.misses.append(Miss(engine, bundler, scenario, f"{path}:{line}",
                                        partner.function, out.function, out.function_source))
    return cells


def table(cells: dict[tuple[str, str], Cell]) -> Iterator[tuple[str, str, Cell]]:
    for (engine, bundler), cell in sorted(cells.items()):
        yield engine, bundler, cell


def markdown(cells: dict[tuple[str, str], Cell]) -> str:
    """docs/sdk.md's table: names exact by bundler (rows) and engine (columns)."""
    engines = sorted({e for e, _ in cells}, key=["node", "chromium", "firefox", "gjs",
                                                 "jsc"].index)
    bundlers = sorted({b for _, b in cells})
    lines = ["| bundler | " + " | ".join(engines) + " |",
             "|---|" + "---|" * len(engines)]
    for bundler in bundlers:
        row = []
        for engine in engines:
            cell = cells[engine, bundler]
            row.append(f"{100 * cell.ratio:.1f}% ({cell.exact}/{cell.paired})")
        lines.append(f"| {bundler} | " + " | ".join(row) + " |")
    exact = sum(c.exact for c in cells.values())
    printed = sum(c.printed for c in cells.values())
    paired = sum(c.paired for c in cells.values())
    frames = sum(c.frames for c in cells.values())
    lines.append("")
    lines.append(f"All: {exact}/{paired} paired frames exact ({100 * exact / paired:.1f}%); "
                 f"{printed}/{paired} ({100 * printed / paired:.1f}%) equal to the engine's "
                 f"own print; {paired}/{frames} bundled frames paired; lines as the map "
                 f"says: {sum(c.lines_checked - len(c.line_misses) for c in cells.values())}"
                 f"/{sum(c.lines_checked for c in cells.values())}.")
    return "\n".join(lines)


if __name__ == "__main__":  # .venv/bin/python -m tests.support.names_matrix
    print(markdown(score()))
