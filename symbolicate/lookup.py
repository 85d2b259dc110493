"""Stacks -> original locations: artifact matching, ``symbolic`` lookups, three caches.

Matching a frame to an artifact (:meth:`Symbolicator.resolve`), per DESIGN.md:

1. the debug id the SDK reported for the frame's script (``context.debugIds``, by URL with
   or without query), in any release and at any URL;
2. else the event's release + the frame's URL, query and fragment ignored, either exactly or
   as ``~/path`` (any scheme and host);
3. else the same URL in any release, newest upload first.

Nothing is looked up at ingest: errors are symbolicated when read, so a map uploaded after
an error applies to it.

Looking up a position: ``SourceMapCache`` (built with the minified JS) gives the original
file, line, column, the function from JS scopes and the context lines; where it has no token
(lines inside multi-line template literals), ``SourceMapView`` is asked, and its answer is
kept only if the token it returns is on the asked line (it returns the previous line's last
token where a line has none). A frame that stays minified says why in ``problem``:

- ``missing_sourcemap``: nothing uploaded at this URL or debug id
- ``url_mismatch``: a file of this name was uploaded, at another URL (check --url-prefix)
- ``malformed_sourcemap``: the stored artifact cannot be read or parsed
- ``no_mapping``: the map has no mapping at this line and column
- ``release_mismatch``: as ``no_mapping``, with a map of another release (the event's
  release has none at this URL)
- ``no_location`` / ``missing_column``: the engine printed no position (JavaScriptCore eval
  code) or no column (SpiderMonkey eval code)

and a rewritten frame may still carry ``missing_sources_content`` (no context lines: the
map has no ``sourcesContent``) or ``missing_minified_source`` (the map came without its JS:
no original function name).

Caches: built lookups per artifact content (an LRU bounded in estimated bytes), resolutions
per (project, upload generation, release, debug id, URL) - found and not found alike, so a
missing map costs one lookup per generation and an upload invalidates them all - and whole
rewritten stacks per (project, generation, release, debug ids, stack), so a repeated error
costs a dictionary lookup. Storage outages are not cached; malformed artifacts are (their
content never changes: a new upload is a new key).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Generic, NamedTuple, TypeVar

from symbolic.exceptions import SymbolicError
from symbolic.sourcemap import SourceMapView, SourceView
from symbolic.sourcemapcache import SourceMapCache

from boxtrail.metrics import Registry
from boxtrail.storage import NotFound, StorageError
from symbolicate.artifacts import ArtifactRow, ArtifactStore, strip_url, url_candidates
from symbolicate.rewrite import (
    CONTEXT_LINES,
    MAX_CONTEXT_CHARS,
    FrameOut,
    cut,
    stack_text,
    trim,
    unsymbolicated,
)
from symbolicate.sourcemaps import SourceMapError, check_debug_id
from symbolicate.sources import OriginalSources, strip
from symbolicate.stack import Frame, parse_stack

log = logging.getLogger("boxtrail.symbolicate")

MAX_BUILT_BYTES = 512 << 20
MAX_STACK_BYTES = 64 << 20
MAX_RESOLVED_BYTES = 16 << 20
# Memory of a built artifact per byte of map, measured on the 5.9 MB map of
# benchmarks/bench_symbolicate.py: 38 MB with its cache (the map's bytes held for its
# sources), 42 MB with the view too, 55 MB once every source is split into lines.
_BUILT_PER_MAP_BYTE = 9

_K = TypeVar("_K")
_V = TypeVar("_V")


class ByteLRU(Generic[_K, _V]):
    """Least recently used entries go first once their summed cost passes ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[_K, tuple[_V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: _K) -> _V | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, key: _K, value: _V, cost: int) -> None:
        if cost > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._items[key] = (value, cost)
            self.bytes += cost
            while self.bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self.bytes -= dropped

    def __len__(self) -> int:
        return len(self._items)


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


class Resolution(NamedTuple):
    artifact: ArtifactRow | None
    problem: str | None  # why there is no artifact
    other_release: bool = False  # matched by URL in a release other than the event's


class StackInput(NamedTuple):
    release: str | None
    debug_ids: dict[str, str]  # script URL -> debug id (context.debugIds)
    stack: str
    header: str | None  # "Type: message", for stacks that print no message line


class Symbolicated(NamedTuple):
    frames: list[FrameOut]
    stack: str


class _Pending(NamedTuple):
    position: int
    key: tuple[object, ...]
    frames: list[Frame]
    message: str | None
    omitted: int
    plans: list[Resolution]


class Symbolicator:
    def __init__(self, store: ArtifactStore, metrics: Registry,
                 max_built_bytes: int = MAX_BUILT_BYTES,
                 max_stack_bytes: int = MAX_STACK_BYTES) -> None:
        self.store = store
        self._built: ByteLRU[tuple[str | None, str], Built | str] = ByteLRU(max_built_bytes)
        self._stacks: ByteLRU[tuple[object, ...], Symbolicated] = ByteLRU(max_stack_bytes)
        self._resolved: ByteLRU[tuple[object, ...], Resolution] = ByteLRU(MAX_RESOLVED_BYTES)
        self._building: dict[tuple[str | None, str], threading.Lock] = {}
        self._building_lock = threading.Lock()
        self._prebuilding: set[asyncio.Task[None]] = set()
        store.uploaded = self.prebuild
        self.m_cache = metrics.counter(
            "boxtrail_symbolication_cache_total",
            "Symbolication cache lookups by cache (stack, artifact, resolution) and result",
            ("cache", "result"))
        self.m_frames = metrics.counter(
            "boxtrail_symbolication_frames_total",
            "Frames looked up, by problem ('none' when rewritten without one)", ("problem",))
        metrics.callback("boxtrail_symbolication_built_bytes",
                         "Estimated memory of built source map lookups held in the LRU",
                         lambda: self._built.bytes)

    # --- matching (event loop thread: SQLite) --------------------------------------------

    def resolve(self, project_id: str, release: str | None, debug_id: str | None, url: str
                ) -> Resolution:
        generation = self.store.generation(project_id)
        key = (project_id, generation, release, debug_id, strip_url(url))
        found = self._resolved.get(key)
        self.m_cache.inc(1, "resolution", "miss" if found is None else "hit")
        if found is None:
            found = self._resolve(project_id, release, debug_id, url)
            self._resolved.put(key, found, 256 + 2 * len(url))
        return found

    def _resolve(self, project_id: str, release: str | None, debug_id: str | None, url: str
                 ) -> Resolution:
        if debug_id is not None:
            row = self.store.by_debug_id(project_id, debug_id)
            if row is not None:
                return Resolution(row, None)
        candidates = url_candidates(url)
        if release:
            row = self.store.by_url(project_id, release, candidates)
            if row is not None:
                return Resolution(row, None)
        row = self.store.by_url(project_id, None, candidates)
        if row is not None:
            return Resolution(row, None, other_release=bool(release) and row.release != release)
        basename = strip_url(url).rstrip("/").rpartition("/")[2]
        if basename and self.store.urls_named(project_id, basename, 1):
            return Resolution(None, "url_mismatch")
        return Resolution(None, "missing_sourcemap")

    def _plan(self, project_id: str, item: StackInput, debug_ids: dict[str, str],
              frame: Frame, plans: dict[tuple[str | None, str | None], Resolution]
              ) -> Resolution:
        if frame.native:
            return Resolution(None, None)
        if frame.url is None or frame.line is None:
            return Resolution(None, "no_location")
        if frame.column is None:
            return Resolution(None, "missing_column")
        debug_id = debug_ids.get(frame.url) or debug_ids.get(strip_url(frame.url))
        found = plans.get((debug_id, frame.url))
        if found is None:
            found = plans[debug_id, frame.url] = self.resolve(
                project_id, item.release, debug_id, frame.url)
        return found

    # --- whole stacks --------------------------------------------------------------------

    async def symbolicate(self, project_id: str, items: list[StackInput]
                          ) -> list[Symbolicated]:
        generation = self.store.generation(project_id)
        done: dict[int, Symbolicated] = {}
        pending: list[_Pending] = []
        for index, item in enumerate(items):
            key = (project_id, generation, item.release,
                   tuple(sorted(item.debug_ids.items())), item.header, item.stack)
            hit = self._stacks.get(key)
            self.m_cache.inc(1, "stack", "miss" if hit is None else "hit")
            if hit is not None:
                done[index] = hit
                continue
            parsed = parse_stack(item.stack)
            debug_ids = _debug_ids(item.debug_ids)
            plans: dict[tuple[str | None, str | None], Resolution] = {}  # frames share scripts
            pending.append(_Pending(index, key, parsed.frames, parsed.message or item.header,
                                    parsed.omitted_frames,
                                    [self._plan(project_id, item, debug_ids, f, plans)
                                     for f in parsed.frames]))
        if pending:
            built: dict[tuple[str | None, str], Built | str] = {}
            for job in pending:
                for plan in job.plans:
                    if plan.artifact is not None:
                        artifact = _built_key(plan.artifact)
                        if artifact not in built:
                            found = self._built.get(artifact)
                            if found is not None:  # else load() counts it, and builds it
                                self.m_cache.inc(1, "artifact", "hit")
                                built[artifact] = found
            # Building an artifact's lookups takes up to hundreds of ms: a worker thread's
            # job. Lookups on built ones take microseconds: cheaper than the thread hop.
            if len(built) < len({_built_key(p.artifact) for job in pending for p in job.plans
                                 if p.artifact is not None}):
                results = await asyncio.to_thread(self._finish, project_id, pending, built)
            else:
                results = self._finish(project_id, pending, built)
            for job, result in zip(pending, results, strict=True):
                done[job.position] = result
                for out in result.frames:
                    self.m_frames.inc(1, out.problem or "none")
                # The key holds the raw stack: count it too.
                self._stacks.put(job.key, result, _cost(result) + 2 * len(str(job.key[-1])))
        return [done[i] for i in range(len(items))]

    def _finish(self, project_id: str, pending: list[_Pending],
                built: dict[tuple[str | None, str], Built | str]) -> list[Symbolicated]:
        results = []
        for job in pending:
            frames = [self._frame(project_id, frame, plan, built)
                      for frame, plan in zip(job.frames, job.plans, strict=True)]
            results.append(Symbolicated(frames, stack_text(job.message, job.frames, frames,
                                                           job.omitted)))
        return results

    def _frame(self, project_id: str, frame: Frame, plan: Resolution,
               built_by_key: dict[tuple[str | None, str], Built | str]) -> FrameOut:
        if plan.artifact is None:
            return unsymbolicated(frame, plan.problem)
        key = _built_key(plan.artifact)
        built = built_by_key.get(key)
        if built is None:
            built = built_by_key[key] = self.load(project_id, plan.artifact)
        if isinstance(built, str):
            return unsymbolicated(frame, built)
        assert frame.line is not None and frame.column is not None  # checked by _plan
        found = lookup(built, frame.line, frame.column)
        if found is None:
            return unsymbolicated(frame, "release_mismatch" if plan.other_release
                                  else "no_mapping")
        problem = None
        if not built.has_js:
            problem = "missing_minified_source"
        elif found.context_line is None:
            problem = "missing_sources_content"
        return FrameOut(function=found.function, file=found.file, line=found.line,
                        column=found.column, context_line=found.context_line,
                        pre_context=found.pre_context, post_context=found.post_context,
                        raw=frame.raw, symbolicated=True, problem=problem)

    # --- built artifacts (any thread) ----------------------------------------------------

    def prebuild(self, project_id: str, rows: list[ArtifactRow]) -> asyncio.Task[None] | None:
        """Build a fresh upload's lookups in a worker thread now (event loop thread); the
        upload answers once they are built (``ArtifactStore.uploaded``), so the first error
        read after a deploy does not wait for them (~0.25 s for a 6 MB map here), and CI,
        which can afford it, pays instead. At most half the LRU's budget, in upload order:
        a huge upload does not evict everything else; the rest is built by the first read
        that wants it. A read that wants an artifact being built waits for that build."""
        budget = self._built.max_bytes // 2
        wanted = []
        for row in rows:
            budget -= row.map_bytes * _BUILT_PER_MAP_BYTE + row.js_bytes
            if budget < 0:
                break
            wanted.append(row)
        if not wanted:
            return None
        task = asyncio.get_running_loop().create_task(
            asyncio.to_thread(self._prebuild, project_id, wanted))
        self._prebuilding.add(task)
        task.add_done_callback(self._prebuilding.discard)
        return task

    def _prebuild(self, project_id: str, rows: list[ArtifactRow]) -> None:
        for row in rows:
            try:
                self.load(project_id, row)
            except StorageError:
                continue  # not cached: the first read tries again
            except Exception:  # the upload is stored: never fail it over a build
                log.exception("building the lookups of %s failed; reads will retry", row.url)

    async def prebuilt(self) -> None:
        """Wait for the builds :meth:`prebuild` started."""
        await asyncio.gather(*self._prebuilding)

    def load(self, project_id: str, row: ArtifactRow) -> Built | str:
        """The artifact's lookups, built once; or the problem that prevents it."""
        key = _built_key(row)
        found = self._built.get(key)
        if found is not None:
            self.m_cache.inc(1, "artifact", "hit")
            return found
        with self._building_lock:
            lock = self._building.setdefault(key, threading.Lock())
        with lock:  # one build per artifact, however many requests want it at once
            found = self._built.get(key)
            if found is None:
                self.m_cache.inc(1, "artifact", "miss")
                found, cost = self._build(project_id, row)
                if cost:
                    self._built.put(key, found, cost)
        with self._building_lock:
            self._building.pop(key, None)
        return found

    def _build(self, project_id: str, row: ArtifactRow) -> tuple[Built | str, int]:
        try:
            source_map = self.store.read(project_id, row.map_sha256)
            js = self.store.read(project_id, row.js_sha256) if row.js_sha256 else b""
        except NotFound:  # deleted meanwhile: not a property of the content, not cached
            return "missing_sourcemap", 0
        built = build(source_map, js, bool(row.js_sha256), row.sources_content)
        if built is None:
            return "malformed_sourcemap", 256
        return built, len(source_map) * _BUILT_PER_MAP_BYTE + len(js)


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


def _built_key(row: ArtifactRow) -> tuple[str | None, str]:
    return (row.js_sha256, row.map_sha256)  # by content: shared by releases and projects


def _debug_ids(reported: dict[str, str]) -> dict[str, str]:
    """``context.debugIds`` with valid ids only, by URL as sent and without its query."""
    out: dict[str, str] = {}
    for url, value in list(reported.items())[:1000]:
        try:
            debug_id = check_debug_id("context.debugIds", value)
        except SourceMapError:
            continue
        if debug_id is not None:
            out[url] = debug_id
            out.setdefault(strip_url(url), debug_id)
    return out


def _cost(result: Symbolicated) -> int:
    text = len(result.stack)
    for frame in result.frames:
        text += len(frame.raw) + len(frame.context_line or "") \
            + sum(map(len, frame.pre_context)) + sum(map(len, frame.post_context))
    return 200 * len(result.frames) + 2 * text
