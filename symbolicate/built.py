"""An artifact's lookups, built once and asked per frame: ``symbolic``'s ``SourceMapCache``
(position, scope-based function name) with the map's original sources split into lines for
context, and ``SourceMapView`` where the cache has no token.

``SourceMapCache`` (built with the minified JS) gives the original file, line, column and the
function from JS scopes; where it has no token (lines inside multi-line template literals),
``SourceMapView`` is asked, and its answer is kept only if the token it returns is on the
asked line (it returns the previous line's last token where a line has none).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import NamedTuple

from symbolic.exceptions import SymbolicError
from symbolic.sourcemap import SourceMapView, SourceView
from symbolic.sourcemapcache import SourceMapCache

from symbolicate.rewrite import CONTEXT_LINES, MAX_CONTEXT_CHARS, cut, trim
from symbolicate.sources import OriginalSources, strip


class Built:
    """An artifact's lookups: the ``SourceMapCache``, the ``SourceMapView`` that answers where
    the cache has no token, and (``sources``) the original sources when the cache was built
    from the map without them (see ``symbolicate.sources``).

    ``view`` may be given as the map's bytes: it is parsed on first use, or by
    :meth:`prepare`."""

    __slots__ = ("_view", "_view_lock", "cache", "has_js", "sources", "sources_content")

    def __init__(self, cache: SourceMapCache | None, view: SourceMapView | bytes,
                 has_js: bool, sources_content: bool,
                 sources: OriginalSources | None = None) -> None:
        self.cache = cache  # None: symbolic could not parse the JS; the view answers
        self._view: SourceMapView | bytes | None = view
        self._view_lock = threading.Lock()
        self.has_js = has_js
        self.sources_content = sources_content
        self.sources = sources

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


def build(source_map: bytes, js: bytes, has_js: bool, sources_content: bool) -> Built | None:
    """An artifact's lookups, or None when the map cannot be parsed at all.

    The cache is built from the map without its sourcesContent where the sources can be told
    apart by name (``symbolicate.sources``). Meanwhile another thread parses the view and
    splits the sources into lines (``symbolic`` releases the GIL while it builds the cache),
    so no lookup on the built artifact has anything left to prepare."""
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


class Found(NamedTuple):
    file: str
    line: int
    column: int
    function: str | None
    context_line: str | None
    pre_context: list[str]
    post_context: list[str]


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


def lookup(built: Built, line: int, column: int) -> Found | None:
    """The original position of the 1-based ``line``:``column``, or None."""
    sources = built.sources
    if built.cache is not None:
        if sources is None:  # the cache holds the sources: it gives the context lines
            token = built.cache.lookup(line, column, CONTEXT_LINES)
            if token is not None and token.src:
                col = token.col
                return Found(source_path(token.src), token.line, col,
                             _function(token.function_name),
                             trim(token.context_line, col) if token.context_line else None,
                             [trim(s, col) for s in token.pre_context],
                             [trim(s, col) for s in token.post_context])
        else:
            token = built.cache.lookup(line, column, 0)
            if token is not None and token.src:
                found = sources.lines(token.src)
                if found is None:
                    return Found(source_path(token.src), token.line, token.col,
                                 _function(token.function_name), None, [], [])
                return _with_context(token.src, token.line, token.col,
                                     _function(token.function_name), found.lines,
                                     found.blank_end)
    view = built.view
    match = view.lookup(line - 1, column - 1) if view is not None else None
    # Where a line has no token, the view answers with the previous line's last one.
    if match is None or match.dst_line != line - 1 or not match.src:
        return None
    lines: Sequence[str] | SourceView | None = None
    if sources is not None:
        found_lines = sources.view_lines(match.src)
        lines = None if found_lines is None else found_lines.lines
    elif match.src_id is not None and view is not None:
        lines = view.get_sourceview(match.src_id)
    line, column = match.src_line + 1, match.src_col + 1
    if lines is None or line > len(lines):
        return Found(source_path(match.src), line, column, None, None, [], [])
    return _with_context(match.src, line, column, None, lines, False)


def _function(name: str | None) -> str | None:
    return name if name and name != "<unknown>" else None


def _with_context(src: str, line: int, column: int, function: str | None,
                  lines: Sequence[str] | SourceView, blank_end: bool) -> Found:
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
    return Found(source_path(src), line, column, function, context_line,
                 [s if len(s) <= MAX_CONTEXT_CHARS else cut(s, column)
                  for s in lines[first:at]],
                 [s if len(s) <= MAX_CONTEXT_CHARS else cut(s, column)
                  for s in lines[at + 1:at + CONTEXT_LINES + 1]])
