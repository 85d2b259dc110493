"""An artifact's lookups, built once and asked per frame: ``symbolic``'s ``SourceMapCache``
(position, scope-based function name) with the map's original sources split into lines for
context, and ``SourceMapView`` where the cache has no token.

``SourceMapCache`` (built with the minified JS) gives the original file, line, column and the
function from JS scopes; where it has no token (lines inside multi-line template literals),
``SourceMapView`` is asked, and its answer is kept only if the token it returns is on the
asked line (it returns the previous line's last token where a line has none).

:func:`lookup` never raises, whatever the numbers: a position is found, or it says why not
(:data:`Miss`). ECMA-426 shapes the answers: a position in a one-field segment has no
original source (code the bundler generated); a mapping to a source the map leaves unnamed
(``sources[i]`` null) is a position without a file; a mapping whose original line or column
is negative has no original position, which ``symbolic`` would report as line 4294967295
(or 0): uploads refuse such maps (``symbolicate.mappings``), this is for maps stored before.

The function :func:`lookup` gives is the one holding the original position; :func:`named`
reads the frame's printed name where the map's segment is coarse, from where the map has
segments (:func:`recorded`, decoded once when the tables are built).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import Literal, NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt
from symbolic.exceptions import SymbolicError
from symbolic.sourcemap import SourceMapView, SourceView
from symbolic.sourcemapcache import SourceMapCache

from symbolicate.mappings import LIMIT
from symbolicate.printed import Printed
from symbolicate.rewrite import CONTEXT_LINES, MAX_CONTEXT_CHARS, cut, trim
from symbolicate.scopes import Marks, PackedScopes, pack_sources
from symbolicate.sourcemaps import for_symbolic
from symbolicate.sources import OriginalSources, strip

# Why a position has no original location (the frame's ``problem``):
# - no_mapping: the map has no mapping at this line and column
# - no_original_source: its mapping says there is no original source here
# - invalid_location: not a position a map can hold (1-based, at most 2^31)
Miss = Literal["no_mapping", "no_original_source", "invalid_location"]
_NO_SOURCE = 2**32 - 1  # SourceMapView's source id for a one-field segment


class Built:
    """An artifact's lookups: the ``SourceMapCache``, the ``SourceMapView`` that answers where
    the cache has no token, and (``sources``) the original sources when the cache was built
    from the map without them (see ``symbolicate.sources``).

    ``view`` may be given as the map's bytes: it is parsed on first use, or by
    :meth:`prepare`."""

    __slots__ = ("_view", "_view_lock", "cache", "has_js", "scopes", "sources",
                 "sources_content")

    def __init__(self, cache: SourceMapCache | None, view: SourceMapView | bytes,
                 has_js: bool, sources_content: bool,
                 sources: OriginalSources | None = None) -> None:
        self.cache = cache  # None: symbolic could not parse the JS; the view answers
        self._view: SourceMapView | bytes | None = view
        self._view_lock = threading.Lock()
        self.has_js = has_js
        self.sources_content = sources_content
        self.sources = sources
        # The original sources' functions (``symbolicate.scopes``), set by whoever built this
        # (it may be read from storage); None: names come from the minified code.
        self.scopes: PackedScopes | None = None

    @property
    def view(self) -> SourceMapView | None:
        """None: the map could not be parsed (only when the cache was built from it)."""
        if isinstance(self._view, bytes):
            with self._view_lock:
                if isinstance(self._view, bytes):
                    try:
                        self._view = SourceMapView.from_json_bytes(self._view)
                    except SymbolicError:
                        self._view = None
        return self._view

    def prepare(self) -> None:
        """Do now what lookups would otherwise do on first need."""
        _ = self.view
        if self.sources is not None:
            self.sources.split_all()


def build(source_map: bytes, js: bytes, has_js: bool, sources_content: bool,
          scopes: PackedScopes | None = None) -> Built | None:
    """An artifact's lookups, or None when the map cannot be parsed at all (a map
    ``symbolic`` refuses that ECMA-426 allows is tried again as
    ``symbolicate.sourcemaps.for_symbolic`` rewrites it).

    The cache is built from the map without its sourcesContent where the sources can be told
    apart by name (``symbolicate.sources``). Meanwhile another thread parses the view and
    splits the sources into lines (``symbolic`` releases the GIL while it builds the cache),
    so no lookup on the built artifact has anything left to prepare.

    With ``scopes`` that name every source of the map (``symbolicate.scopes``), the cache
    is built without the minified JS: ``symbolic`` parses the JS only for its scopes' names,
    which the original sources give instead (80% of its build time on a 1.1 MB bundle)."""
    if scopes is not None and scopes.complete:
        js = b""
    built = _build(source_map, js, has_js, sources_content)
    if built is None and (rewritten := for_symbolic(source_map)) != source_map:
        built = _build(rewritten, js, has_js, sources_content)
    if built is not None:
        built.scopes = scopes
    return built


def _build(source_map: bytes, js: bytes, has_js: bool, sources_content: bool) -> Built | None:
    stripped = strip(source_map)
    cache_map = source_map if stripped is None else stripped.map
    built = Built(None, cache_map, has_js, sources_content,
                  None if stripped is None else stripped.sources)
    helper = threading.Thread(target=built.prepare, name="symbolicate-prepare", daemon=True)
    helper.start()
    try:
        built.cache = SourceMapCache.from_bytes(js, cache_map)
    except SymbolicError:
        pass
    finally:
        helper.join()
    if built.cache is None and built.view is None:
        return None
    return built


def parse_scopes(source_map: bytes) -> bytes | None:
    """The function tables of the map's original sources (``symbolicate.scopes``), packed,
    named as the lookups name the sources, with where the map has segments in each
    (:func:`recorded`); None when the map cannot be read."""
    marks = recorded(source_map)
    stripped = strip(source_map)
    if stripped is not None:
        return pack_sources(stripped.sources.texts(), marks)
    for candidate in (source_map, for_symbolic(source_map)):
        try:
            view = SourceMapView.from_json_bytes(candidate)
        except SymbolicError:
            continue
        return pack_sources(((name, view.get_source_contents(index))
                             for index, name in view.iter_sources()), marks)
    return None


class _Segments(msgspec.Struct):
    mappings: str = ""
    sources: list[str | None] = []
    sourceRoot: str | None = None
    sections: msgspec.Raw | None = None


_segments = msgspec.json.Decoder(_Segments)
_DIGITS = np.full(256, -1, np.int64)
_DIGITS[np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
                      np.uint8)] = np.arange(64)


def recorded(source_map: bytes) -> dict[str, Marks] | None:
    """By source name, every original position the map gives a segment (packed as
    ``SourceScopes.starts``, sorted, unique): what tells a coarse segment (one that covers
    functions starting after it, ``SourceScopes.name_for``) from a fine one. None where the
    names could differ from the lookups' (an index map, a ``sourceRoot``) or the mappings
    do not decode; a map stored before uploads checked mappings may give wrong marks, never
    an error. Vectorized, :data:`_CHUNK` bytes of mappings at a time (memory bounded by the
    marks): 0.14 s for the 5.9 MB map of the benchmark."""
    try:
        top = _segments.decode(source_map)
    except msgspec.DecodeError:
        return None
    if top.sections is not None or top.sourceRoot or not top.sources:
        return None
    text = top.mappings.encode("ascii", "replace")
    running = np.zeros(3, np.int64)  # source, original line, original column
    sources, positions = [], []
    start = 0
    while start < len(text):
        # Chunks end at a separator: the running values are all a segment carries over.
        cut = min((at for at in (text.find(b",", start + _CHUNK), text.find(b";", start + _CHUNK))
                   if at >= 0), default=len(text))
        decoded = _decode(np.frombuffer(text, np.uint8, cut - start, start), running)
        if decoded is None:
            return None
        source, packed = decoded
        sources.append(source)
        positions.append(packed)
        start = cut
    source = np.concatenate(sources) if sources else np.zeros(0, np.int64)
    packed = np.concatenate(positions) if positions else np.zeros(0, np.int64)
    order = np.argsort(source, kind="stable")
    source, packed = source[order], packed[order]
    bounds = np.searchsorted(source, np.arange(len(top.sources) + 1))
    marks: dict[str, Marks] = {}
    for index, name in enumerate(top.sources):
        if name and name not in marks:  # the first of two sources of one name, as lookups
            marks[name] = np.unique(packed[bounds[index]:bounds[index + 1]])
    return marks


_CHUNK = 1 << 16  # bytes of mappings decoded at once


def _decode(chunk: npt.NDArray[np.uint8], running: npt.NDArray[np.int64]
            ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """The (source, packed original position) of each segment of ``chunk`` that has them,
    the values running on from ``running`` (updated); None for a segment of 2 or 3 fields,
    which no map an upload accepts has."""
    values = _DIGITS[chunk]
    digit = values >= 0
    # Which segment each digit is in, and which VLQ: a VLQ ends at a digit without bit 32.
    segment_of = np.cumsum(~digit)[digit]
    values = values[digit]
    empty = np.zeros(0, np.int64)
    if not len(values):
        return empty, empty
    ends = (values & 32) == 0
    firsts = np.flatnonzero(np.concatenate(([True], ends[:-1])))
    place = np.arange(len(values)) - np.repeat(firsts, np.diff(np.append(firsts, len(values))))
    # Digits past the 7th add nothing to a VLQ an upload accepts (padding zeros).
    unsigned = np.add.reduceat((values & 31) << (5 * np.minimum(place, 7)), firsts)
    signed = np.where(unsigned & 1, -(unsigned >> 1), unsigned >> 1)
    segment = segment_of[firsts]
    starts = np.concatenate(([True], segment[1:] != segment[:-1]))
    field = np.arange(len(segment)) - np.maximum.accumulate(
        np.where(starts, np.arange(len(segment)), 0))
    deltas = [signed[field == f] for f in (1, 2, 3)]
    if not len(deltas[0]) == len(deltas[1]) == len(deltas[2]):
        return None
    if not len(deltas[0]):
        return empty, empty
    source, line, column = (running[i] + np.cumsum(d) for i, d in enumerate(deltas))
    running[:] = source[-1], line[-1], column[-1]
    valid = (source >= 0) & (line >= 0) & (line < LIMIT) & (column >= 0) & (column < LIMIT)
    return source[valid], (line[valid] << 32) | column[valid]


# The ``function_source`` values of names read from the original sources.
FROM_SOURCE = frozenset(("source", "span", "printed_key"))


class Found(NamedTuple):
    file: str | None  # None: the map's source at this position has no name
    line: int
    column: int
    function: str | None
    context_line: str | None
    pre_context: list[str]
    post_context: list[str]
    function_source: str | None  # FrameOut.function_source (FROM_SOURCE: the original's)
    src: str | None = None  # the map's source name, as the function tables name it


def named(built: Built, found: Found, printed: Printed) -> Found:
    """``found`` with its function chosen again with what the frame's printed name says,
    where the map's segment is coarse (``SourceScopes.name_for``); as it is elsewhere."""
    scopes = built.scopes
    if found.function_source != "source" or not found.src or scopes is None or (
            (found.line - 1) << 32 | (found.column - 1)) not in scopes.coarse(found.src):
        return found  # most frames: the segment covers no function starting after it
    table = scopes.get(found.src)
    if table is None:
        return found
    function, rule = table.name_for(found.line, found.column, printed)
    return found if rule == "source" else found._replace(function=function,
                                                         function_source=rule)


def _named(built: Built, src: str | None, line: int, column: int, minified: str | None
           ) -> tuple[str | None, str | None]:
    """The function at an original position and where its name came from: the original
    source's scopes when the artifact has them for ``src``, else the minified code's scope
    name ``SourceMapCache`` found (None for the view, which has none)."""
    scopes = built.scopes
    if scopes is not None and src:
        table = scopes.get(src)
        if table is not None:
            return table.name_at(line, column)[1], "source"
    name = _function(minified)
    return name, "minified" if name else None


@functools.lru_cache(maxsize=4096)  # a map has few sources, looked up for every frame
def source_path(src: str) -> str:
    """A map's source as a project path: ``webpack://app/./src/a.js``, ``../src/a.js`` and
    ``./src/a.js`` all become ``src/a.js`` (bundlers write sources relative to the output
    directory or under a ``webpack://`` namespace); other URLs and absolute paths stay."""
    if src.startswith("webpack://"):
        src = src[len("webpack://"):].partition("/")[2]
    elif "://" in src or src.startswith("/"):
        return src
    parts = [p for p in src.split("/") if p not in ("", ".")]
    while parts and parts[0] == "..":
        parts.pop(0)
    return "/".join(parts) or src


def lookup(built: Built, line: int, column: int) -> Found | Miss:
    """The original position of the 1-based ``line``:``column``, or why there is none; its
    function is the one holding that position (:func:`named` reads the printed frame)."""
    if not (1 <= line <= LIMIT and 1 <= column <= LIMIT):
        return "invalid_location"
    sources = built.sources
    if built.cache is not None:
        if sources is None:  # the cache holds the sources: it gives the context lines
            token = built.cache.lookup(line, column, CONTEXT_LINES)
            if token is not None:
                if not _holds(token.line - 1, token.col - 1):
                    return "no_original_source"
                col = token.col
                function, origin = _named(built, token.src, token.line, col,
                                          token.function_name)
                return Found(_file(token.src), token.line, col, function,
                             trim(token.context_line, col) if token.context_line else None,
                             [trim(s, col) for s in token.pre_context],
                             [trim(s, col) for s in token.post_context], origin, token.src)
        else:
            token = built.cache.lookup(line, column, 0)
            if token is not None:
                if not _holds(token.line - 1, token.col - 1):
                    return "no_original_source"
                found = sources.lines(token.src) if token.src else None
                function, origin = _named(built, token.src, token.line, token.col,
                                          token.function_name)
                if found is None:
                    return Found(_file(token.src), token.line, token.col, function, None, [],
                                 [], origin, token.src)
                return _with_context(token.src, token.line, token.col, function, origin,
                                     found.lines, found.blank_end)
    view = built.view
    match = view.lookup(line - 1, column - 1) if view is not None else None
    # Where a line has no token, the view answers with the previous line's last one.
    if match is None or match.dst_line != line - 1:
        return "no_mapping"
    if match.src_id == _NO_SOURCE or not _holds(match.src_line, match.src_col):
        return "no_original_source"
    lines: Sequence[str] | SourceView | None = None
    if sources is not None:
        found_lines = sources.view_lines(match.src) if match.src else None
        lines = None if found_lines is None else found_lines.lines
    elif match.src_id is not None and view is not None:
        lines = view.get_sourceview(match.src_id)
    line, column = match.src_line + 1, match.src_col + 1
    function, origin = _named(built, match.src, line, column, None)
    if lines is None or line > len(lines):
        return Found(_file(match.src), line, column, function, None, [], [], origin,
                     match.src)
    return _with_context(match.src, line, column, function, origin, lines, False)


def _holds(line: int, column: int) -> bool:
    """A 0-based original position as ``symbolic`` reports it is one a map can hold (not
    a negative value wrapped to u32, nor 0 - 1 wrapped again by the cache's +1)."""
    return 0 <= line < LIMIT and 0 <= column < LIMIT


def _file(src: str | None) -> str | None:
    return source_path(src) if src else None


def _function(name: str | None) -> str | None:
    return name if name and name != "<unknown>" else None


def _with_context(src: str | None, line: int, column: int, function: str | None,
                  origin: str | None, lines: Sequence[str] | SourceView, blank_end: bool
                  ) -> Found:
    """A found position with up to :data:`CONTEXT_LINES` lines of ``lines`` (without their
    line ends) around it. As ``SourceMapCache`` does, past the end there is no context line
    but the lines before that exist, and ``blank_end`` (the text ends with a newline) means
    no context line for the empty text after it."""
    at = line - 1
    end = len(lines)
    context_line = None
    if at < end - 1 or (at == end - 1 and not blank_end):
        context_line = lines[at]
        if len(context_line) > MAX_CONTEXT_CHARS:
            context_line = cut(context_line, column)
    first = max(at - CONTEXT_LINES, 0)
    return Found(_file(src), line, column, function, context_line,
                 [s if len(s) <= MAX_CONTEXT_CHARS else cut(s, column)
                  for s in lines[first:at]],
                 [s if len(s) <= MAX_CONTEXT_CHARS else cut(s, column)
                  for s in lines[at + 1:at + CONTEXT_LINES + 1]], origin, src)
