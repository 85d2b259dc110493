"""Stacks -> original locations: artifact matching, ``symbolic`` lookups, three caches.

Matching a frame to an artifact (:meth:`Symbolicator.resolve`), per DESIGN.md:

1. the debug id the SDK reported for the frame's script (``context.debugIds``, by URL with
   or without query), in any release and at any URL;
2. else the event's release + the frame's URL, query and fragment ignored, either exactly or
   as ``~/path`` (any scheme and host);
3. else the same URL in any release, newest upload first.

Nothing is looked up at ingest: errors are symbolicated when read, so a map uploaded after
an error applies to it.

Positions are looked up in an artifact's built lookups (``symbolicate.built``). A frame
that stays minified says why in ``problem``, one of a closed set:

- ``missing_sourcemap``: nothing uploaded at this URL or debug id
- ``url_mismatch``: a file of this name was uploaded, at another URL (check --url-prefix)
- ``malformed_sourcemap``: the stored artifact cannot be read or parsed
- ``no_mapping``: the map has no mapping at this line and column
- ``release_mismatch``: as ``no_mapping``, with a map of another release (the event's
  release has none at this URL)
- ``no_original_source``: the map's mapping here has no original source (ECMA-426's
  one-field segment: code the bundler generated); the frame keeps its printed position
- ``invalid_location``: the printed line or column is not a position a map can hold
  (1-based: 0, negative, or past 2^31)
- ``no_location`` / ``missing_column``: the engine printed no position (JavaScriptCore eval
  code) or no column (SpiderMonkey eval code)
- ``sourcemap_unavailable``: the artifact's bytes could not be read from storage just now
- ``internal_error``: symbolicating this frame (or its whole stack) failed; logged

and a rewritten frame may still carry ``missing_source_name`` (the map's source here is
``null``: original line and column, ``file`` null), ``missing_sources_content`` (no context
lines: the map has no ``sourcesContent``) or ``missing_minified_source`` (the map came
without its JS: no original function name), in that order of precedence.

A frame's printed name is read where the map's segment is coarse (``symbolicate.built.named``),
and so is its place in the stack: a frame printed without a name where its callee, printed so
too, maps to the same position is in the function that holds the callee's.

No input makes :meth:`Symbolicator.symbolicate` raise: what fails, fails for its frame or
its stack, marked as above, never for the page that shows it.

Caches: built lookups per artifact content (an LRU bounded in estimated bytes), resolutions
per (project, upload generation, release, debug id, URL) - found and not found alike, so a
missing map costs one lookup per generation and an upload invalidates them all - and whole
rewritten stacks per (project, generation, release, debug ids, stack), so a repeated error
costs a dictionary lookup. Storage outages are not cached; malformed artifacts are (their
content never changes: a new upload is a new key), and neither are internal errors.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import NamedTuple

from core.metrics import Counter, Registry
from core.storage import NotFound, StorageError
from symbolicate.artifacts import ArtifactRow, ArtifactStore, strip_url, url_candidates
from symbolicate.built import FROM_SOURCE, Built, build, lookup, named, parse_scopes
from symbolicate.lru import ByteLRU
from symbolicate.printed import Printed, printed
from symbolicate.rewrite import (
    PROBLEMS,
    FrameOut,
    Problem,
    stack_text,
    unsymbolicated,
)
from symbolicate.scopes import PackedScopes, StaleScopes
from symbolicate.sourcemaps import SourceMapError, check_debug_id
from symbolicate.stack import MAX_FRAMES, Frame, ParsedStack, parse_stack

log = logging.getLogger("boxtrail.symbolicate")

MAX_BUILT_BYTES = 512 << 20
MAX_STACK_BYTES = 64 << 20
MAX_RESOLVED_BYTES = 16 << 20
# Memory of a built artifact per byte of map, measured on the 5.9 MB map of
# benchmarks/bench_symbolicate.py: 38 MB with its cache (the map's bytes held for its
# sources), 42 MB with the view too, 55 MB once every source is split into lines.
_BUILT_PER_MAP_BYTE = 9
_SCOPES_PER_BYTE = 4  # decoded function tables per byte of their stored msgpack

# Not properties of the content: results that carry them are not cached, the next read retries.
_RETRIED = frozenset(("internal_error", "sourcemap_unavailable"))


class Resolution(NamedTuple):
    artifact: ArtifactRow | None
    problem: Problem | None  # why there is no artifact
    other_release: bool = False  # matched by URL in a release other than the event's


class StackInput(NamedTuple):
    release: str | None
    debug_ids: dict[str, str]  # script URL -> debug id (context.debugIds)
    stack: str
    header: str | None  # "Type: message", for stacks that print no message line
    # The frames as the client sent them structured (innermost first): used as they are
    # instead of parsing ``stack``, which is their printed form.
    frames: list[Frame] | None = None


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
    engine: str  # who printed the stack (``ParsedStack.engine``): it reads printed names


def symbolication_metrics(metrics: Registry, built_bytes: Callable[[], float]
                          ) -> tuple[Counter, Counter]:
    """Register the symbolicator's counters (cache lookups, frames) and its memory gauge."""
    cache = metrics.counter(
        "boxtrail_symbolication_cache_total",
        "Symbolication cache lookups by cache (stack, artifact, resolution) and result",
        ("cache", "result"))
    frames = metrics.counter(
        "boxtrail_symbolication_frames_total",
        "Frames looked up, by problem ('none' when rewritten without one)", ("problem",),
        ("none", *PROBLEMS))
    metrics.callback("boxtrail_symbolication_built_bytes",
                     "Estimated memory of built source map lookups held in the LRU",
                     built_bytes)
    return cache, frames


class Symbolicator:
    def __init__(self, store: ArtifactStore, metrics: Registry,
                 max_built_bytes: int = MAX_BUILT_BYTES,
                 max_stack_bytes: int = MAX_STACK_BYTES) -> None:
        self.store = store
        self._built: ByteLRU[tuple[str | None, str], Built | Problem] = ByteLRU(max_built_bytes)
        self._stacks: ByteLRU[tuple[object, ...], Symbolicated] = ByteLRU(max_stack_bytes)
        self._resolved: ByteLRU[tuple[object, ...], Resolution] = ByteLRU(MAX_RESOLVED_BYTES)
        self._failures: ByteLRU[int, bool] = ByteLRU(64 << 10)  # stacks logged as failing
        self._building: dict[tuple[str | None, str], threading.Lock] = {}
        self._building_lock = threading.Lock()
        self._prebuilding: set[asyncio.Task[None]] = set()
        self.m_cache, self.m_frames = symbolication_metrics(metrics, lambda: self._built.bytes)

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
        """One result per item, in order. Never raises: a frame that fails comes back as
        printed with ``internal_error`` (or ``sourcemap_unavailable``), a stack that fails
        as a whole with its frames so marked; neither is cached, both are logged."""
        generation = self.store.generation(project_id)
        done: dict[int, Symbolicated] = {}
        pending: list[_Pending] = []
        for index, item in enumerate(items):
            try:
                # Frames sent structured are in the key too: two lists can print alike
                # (a URL holding ":1:2" and a URL with line 1, column 2).
                key = (project_id, generation, item.release,
                       tuple(sorted(item.debug_ids.items())), item.header,
                       None if item.frames is None else tuple(item.frames), item.stack)
                hit = self._stacks.get(key)
                self.m_cache.inc(1, "stack", "miss" if hit is None else "hit")
                if hit is not None:
                    done[index] = hit
                    continue
                parsed = (parse_stack(item.stack) if item.frames is None else
                          ParsedStack(engine="unknown", message=None,
                                      frames=item.frames[:MAX_FRAMES]))
                debug_ids = _debug_ids(item.debug_ids)
                plans: dict[tuple[str | None, str | None], Resolution] = {}  # shared scripts
                pending.append(_Pending(index, key, parsed.frames,
                                        parsed.message or item.header, parsed.omitted_frames,
                                        [self._plan(project_id, item, debug_ids, f, plans)
                                         for f in parsed.frames], parsed.engine))
            except Exception:
                self._log_failure(item.stack)
                done[index] = self._count(_failed(item.stack, item.header))
        if pending:
            built: dict[tuple[str | None, str], Built | Problem] = {}
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
                done[job.position] = self._count(result)
                if not any(out.problem in _RETRIED for out in result.frames):
                    # The key holds the raw stack: count it too.
                    self._stacks.put(job.key, result,
                                     _cost(result) + (2 if job.key[-2] is None else 4)
                                     * len(str(job.key[-1])))
        return [done[i] for i in range(len(items))]

    def _count(self, result: Symbolicated) -> Symbolicated:
        for out in result.frames:
            self.m_frames.inc(1, out.problem or "none")
        return result

    def _log_failure(self, stack: str) -> None:
        """Log the exception being handled, once per stack for a while (a poison row is
        read again by every page that shows it)."""
        seen = hash(stack)
        if self._failures.get(seen) is None:
            self._failures.put(seen, True, 64)
            log.exception("symbolicating a stack failed; it is returned as printed, "
                          "marked internal_error (stack starts %r)", stack[:200])

    def _finish(self, project_id: str, pending: list[_Pending],
                built: dict[tuple[str | None, str], Built | Problem]) -> list[Symbolicated]:
        results = []
        for job in pending:
            try:
                frames = self._frames(project_id, job, built)
                results.append(Symbolicated(frames, stack_text(job.message, job.frames,
                                                               frames, job.omitted)))
            except Exception:
                self._log_failure(str(job.key[-1]))
                results.append(_failed(str(job.key[-1]), job.message))
        return results

    def _frames(self, project_id: str, job: _Pending,
                built: dict[tuple[str | None, str], Built | Problem]) -> list[FrameOut]:
        """The stack's frames rewritten. A frame printed without a name that the map puts
        where the frame above it is (built-in frames aside), printed so too, is its
        caller: it is asked again with that depth (``symbolicate.printed.Printed``), which
        decides between nested functions a coarse segment covers."""
        out: list[FrameOut] = []
        above: tuple[object, ...] | None = None  # the last frame's position, if nameless
        depth = 0
        for frame, plan in zip(job.frames, job.plans, strict=True):
            if frame.native:
                out.append(self._frame(project_id, frame, plan, built, job.engine))
                continue
            said = printed(frame.function, frame.alias, job.engine, frame.is_async)
            found = self._frame(project_id, frame, plan, built, job.engine, said)
            here = None
            if found.symbolicated and said.kind in ("anonymous", "unnamed"):
                here = (plan.artifact and _built_key(plan.artifact), found.file, found.line,
                        found.column)
            depth = depth + 1 if here is not None and here == above else 0
            if depth and found.function_source in FROM_SOURCE:
                found = self._frame(project_id, frame, plan, built, job.engine,
                                    said._replace(depth=depth))
            above = here
            out.append(found)
        return out

    def _frame(self, project_id: str, frame: Frame, plan: Resolution,
               built_by_key: dict[tuple[str | None, str], Built | Problem], engine: str,
               said: Printed | None = None) -> FrameOut:
        if plan.artifact is None:
            return unsymbolicated(frame, plan.problem)
        key = _built_key(plan.artifact)
        built = built_by_key.get(key)
        if built is None:
            try:
                built = self.load(project_id, plan.artifact)
            except StorageError:  # an outage: not cached, the next read tries again
                built = "sourcemap_unavailable"
            except Exception:
                self._log_failure(frame.raw)
                built = "internal_error"
            built_by_key[key] = built  # for this call: the other frames of this artifact
        if isinstance(built, str):
            return unsymbolicated(frame, built)
        assert frame.line is not None and frame.column is not None  # checked by _plan
        try:
            found = lookup(built, frame.line, frame.column)
            if not isinstance(found, str):
                found = named(built, found, said or printed(frame.function, frame.alias,
                                                            engine, frame.is_async))
        except Exception:
            self._log_failure(frame.raw)
            return unsymbolicated(frame, "internal_error")
        if isinstance(found, str):
            return unsymbolicated(frame, "release_mismatch" if plan.other_release
                                  and found == "no_mapping" else found)
        problem: Problem | None = None
        if found.file is None:
            problem = "missing_source_name"
        elif not built.has_js and found.function_source not in FROM_SOURCE:
            problem = "missing_minified_source"
        elif found.context_line is None:
            problem = "missing_sources_content"
        return FrameOut(function=found.function, file=found.file, line=found.line,
                        column=found.column, context_line=found.context_line,
                        pre_context=found.pre_context, post_context=found.post_context,
                        raw=frame.raw, symbolicated=True, problem=problem,
                        function_source=found.function_source)

    # --- built artifacts (any thread) ----------------------------------------------------

    def prebuild(self, project_id: str, rows: list[ArtifactRow]) -> asyncio.Task[None] | None:
        """Build a fresh upload's lookups in a worker thread now (event loop thread); the
        upload answers once they are built (given as ``ArtifactStore``'s ``uploaded``), so
        the first error read after a deploy does not wait for them (~0.25 s for a 6 MB map
        here), and CI, which can afford it, pays instead. At most half the LRU's budget, in
        upload order:
        a huge upload does not evict everything else; the rest is built by the first read
        that wants it. A read that wants an artifact being built waits for that build."""
        if not rows:
            return None
        task = asyncio.get_running_loop().create_task(
            asyncio.to_thread(self.build_all, project_id, rows))
        self._prebuilding.add(task)
        task.add_done_callback(self._prebuilding.discard)
        return task

    def build_all(self, project_id: str, rows: list[ArtifactRow]) -> None:
        """Build the lookups of an upload's ``rows`` (any thread), as many as fit in half the
        cache, in upload order; the rest is built by the first read that wants it."""
        budget = self._built.max_bytes // 2
        for row in rows:
            budget -= row.map_bytes * _BUILT_PER_MAP_BYTE + row.js_bytes
            if budget < 0:
                break
            try:
                self.load(project_id, row)
            except StorageError:
                continue  # not cached: the first read tries again
            except Exception:  # the upload is stored: never fail it over a build
                log.exception("building the lookups of %s failed; reads will retry", row.url)

    def load(self, project_id: str, row: ArtifactRow) -> Built | Problem:
        """The artifact's lookups, built once; or the problem that prevents it."""
        key = _built_key(row)
        found = self._built.get(key)
        if found is not None:
            self.m_cache.inc(1, "artifact", "hit")
            return found
        with self._building_lock:
            lock = self._building.setdefault(key, threading.Lock())
        try:
            with lock:  # one build per artifact, however many requests want it at once
                found = self._built.get(key)
                if found is None:
                    self.m_cache.inc(1, "artifact", "miss")
                    found, cost = self._build(project_id, row)
                    if cost:
                        self._built.put(key, found, cost)
        finally:
            with self._building_lock:
                self._building.pop(key, None)
        return found

    def _build(self, project_id: str, row: ArtifactRow) -> tuple[Built | Problem, int]:
        try:
            source_map = self.store.read(project_id, row.map_sha256)
            scopes = self._scopes(project_id, row, source_map)
            js = b""
            if row.js_sha256 and (scopes is None or not scopes.complete):
                js = self.store.read(project_id, row.js_sha256)
        except NotFound:  # deleted meanwhile: not a property of the content, not cached
            return "missing_sourcemap", 0
        built = build(source_map, js, bool(row.js_sha256), row.sources_content, scopes)
        if built is None:
            return "malformed_sourcemap", 256
        scopes_cost = 0 if scopes is None else scopes.raw_bytes * _SCOPES_PER_BYTE
        return built, len(source_map) * _BUILT_PER_MAP_BYTE + len(js) + scopes_cost

    def _scopes(self, project_id: str, row: ArtifactRow, source_map: bytes
                ) -> PackedScopes | None:
        """The functions of the map's original sources (``symbolicate.scopes``): as stored
        beside the map, else parsed now (once per map: an upload does it before it answers)
        and stored, so the next process reads them. Nothing here fails the build: without
        tables, names come from the minified code, marked so."""
        if not row.sources_content:
            return None
        store = True
        try:
            return PackedScopes(self.store.read_derived(project_id, row.map_sha256, "scopes"))
        except NotFound:
            pass
        except StaleScopes:  # damaged, or built by another parser: parse again
            pass
        except StorageError:  # an outage: parse, and leave storing to the next build
            store = False
        try:
            data = parse_scopes(source_map)
        except Exception:  # a parser bug: this map's frames keep the minified names
            log.exception("parsing the original sources of %s failed; its frames are named "
                          "from the minified code", row.url)
            return None
        if data is None:
            return None
        if store:
            try:
                self.store.write_derived(project_id, row.map_sha256, "scopes", data)
            except StorageError:
                log.warning("could not store the function tables of %s; the next build "
                            "parses its sources again", row.url, exc_info=True)
        return PackedScopes(data)


def _failed(stack: str, header: str | None) -> Symbolicated:
    """``stack`` as printed, each frame marked ``internal_error`` (no frames if even the
    parse fails)."""
    try:
        parsed = parse_stack(stack)
        frames = [unsymbolicated(f, "internal_error") for f in parsed.frames]
        return Symbolicated(frames, stack_text(parsed.message or header, parsed.frames, frames,
                                               parsed.omitted_frames))
    except Exception:
        return Symbolicated([], stack)


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
