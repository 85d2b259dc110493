"""``GET /v1/projects/{project}/errors`` (logs_errors): error rows with frames and fingerprints.

Frames come from ``symbolicate.stack`` and are rewritten to original files, lines and
functions by ``symbolicate.lookup`` with the source maps uploaded so far (at read time,
so a later upload applies to earlier errors); a frame that stays minified says why in
``problem``. The fingerprint groups the same error across events the way Sentry does
when it has a stack: error type + normalised message + the top in-app frames (function
and file without host or query), so ids, numbers and hosts do not split a group.

The server only plans and runs the DuckDB query, which writes the rows to a file; a worker
process (``core.workers``) turns them into the answer's JSON, so the Python work of
thousands of stacks never holds the server's GIL (ingest's 202s waited behind it).
"""

from __future__ import annotations

import functools
import hashlib
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Annotated
from urllib.parse import urlsplit

import msgspec
import pyarrow as pa
import pyarrow.ipc
from litestar import MediaType, Response, Router, get
from litestar.params import FromQuery, QueryParameter

from core.errors import InvalidParameter
from core.openapi import error_responses
from core.workers import Offload
from query.engine import Plan, QueryEngine
from query.routes import Limit, Since, check_limit
from query.rows import SELECT, Row, iso_ms, to_row
from query.since import parse_since
from symbolicate.artifacts import ArtifactStore
from symbolicate.lookup import StackInput, Symbolicated, Symbolicator
from symbolicate.rewrite import FrameOut, unsymbolicated
from symbolicate.side import SymbolicateSide
from symbolicate.stack import Frame, parse_stack
from tenancy.guard import TenantProject, scope
from tenancy.keys import READ

IS_ERROR = ("level = 'error' OR error_type IS NOT NULL OR error_message IS NOT NULL "
            "OR error_stack IS NOT NULL")
TOP_FRAMES = 3
GROUP_SCAN_ROWS = 10_000  # rows read to build groups; the answer says when it is cut
SERIES_BUCKETS = 24  # a group's sparkline: its counts over the window in this many buckets

_NOISE = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"  # uuids
    r"|0x[0-9a-f]+|\b[0-9a-f]{12,}\b"  # hex ids
    r"|\d+(?:\.\d+)?",  # numbers
    re.IGNORECASE)


class ErrorDetail(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    type: str | None
    message: str | None
    stack: str | None
    raw_stack: str | None
    frames: list[FrameOut]


class ErrorRow(Row, frozen=True, kw_only=True, rename="camel"):
    """A search row whose error has frames, and its group's fingerprint."""

    error: ErrorDetail  # type: ignore[assignment]  # a Row whose error always has frames
    fingerprint: str


class ErrorRows(msgspec.Struct, frozen=True):
    rows: list[ErrorRow]


class Group(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    fingerprint: str
    count: int
    first_seen: str
    last_seen: str
    series: list[int]  # its rows per bucket of the window, oldest first (Groups.series_*)
    boxes: list[str]
    sample: ErrorRow


class Groups(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    groups: list[Group]  # the ``limit`` largest
    groups_total: int
    scanned_rows: int
    truncated: bool
    series_start: str  # the window's start: ``since``
    series_bucket_seconds: float  # SERIES_BUCKETS of them end at the time of the request


# The window of a groups' series: (start, end) in epoch milliseconds.
Window = tuple[int, int]


def frame_out(frame: Frame) -> FrameOut:
    """A frame without symbolication (no symbolicator, or no map for it)."""
    return unsymbolicated(frame, "missing_sourcemap")


def normalize(message: str) -> str:
    return _NOISE.sub("<n>", message.strip())[:300]


def fingerprint(error_type: str | None, message: str, frames: list[FrameOut]) -> str:
    in_app = [f for f in frames if f.file and not f.raw.endswith("[native code]")]
    top = tuple((f.function, f.file or "") for f in in_app[:TOP_FRAMES])
    if len(message) + sum(len(fn or "") + len(file) for fn, file in top) > 2048:
        # Not kept: the cache holds at most 16k keys of ~2 KB.
        return _fingerprint.__wrapped__(error_type, message, top)
    return _fingerprint(error_type, message, top)


# The same error is read again by every page and every groupBy that shows it: its message
# normalized, its frames' paths and the hash are worked out once.
@functools.lru_cache(maxsize=16384)
def _fingerprint(error_type: str | None, message: str,
                 top: tuple[tuple[str | None, str], ...]) -> str:
    parts = [error_type or "", normalize(message)]
    parts += [f"{function or '?'}@{_path(file)}" for function, file in top]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _path(url: str) -> str:
    """The URL's path, or the URL as printed when it does not parse (``https://[x/a.js``)."""
    try:
        return urlsplit(url).path or url
    except ValueError:
        return url


def error_row(row: Row, symbolicated: Symbolicated | None = None) -> ErrorRow:
    """The row with its frames: as ``symbolicated`` when given, else only parsed."""
    error = row.error
    stack = error.stack if error else None
    etype = error.type if error else None
    emessage = (error.message if error else None) or row.message
    text: str | None
    if symbolicated is not None:
        frames, text = symbolicated.frames, symbolicated.stack
    else:
        parsed = parse_stack(stack) if stack else None
        frames = [frame_out(f) for f in parsed.frames] if parsed else []
        text = stack
    detail = ErrorDetail(type=etype, message=emessage, stack=text, raw_stack=stack,
                         frames=frames)
    return ErrorRow(**msgspec.structs.asdict(row)
                    | {"error": detail, "fingerprint": fingerprint(etype, emessage, frames)})


# What a worker reads of each error row: a row's columns, then ``context.debugIds`` and the
# frames a client sent structured.
COLUMNS = (*SELECT, "debug_ids", "error_frames")
_DEBUG_IDS, _FRAMES = len(SELECT), len(SELECT) + 1

_debug_ids_decoder = msgspec.json.Decoder(dict[str, str])


_frames_decoder = msgspec.json.Decoder(list[Frame])


def _frames(text: object) -> list[Frame] | None:
    if not isinstance(text, str):
        return None
    try:
        return _frames_decoder.decode(text)
    except msgspec.DecodeError:
        return None  # the stack text is parsed instead


def _debug_ids(text: object) -> dict[str, str]:
    if not isinstance(text, str):
        return {}
    try:
        return _debug_ids_decoder.decode(text)
    except msgspec.DecodeError:
        return {}


async def read_errors(engine: QueryEngine, offload: Offload[SymbolicateSide], store: ArtifactStore,
                      project_id: str, since_ms: int, box: str | None, wanted: int,
                      limit: int, grouped: bool, now_ms: int | None = None,
                      source: str = "errors") -> tuple[bytes, bool, Plan]:
    """The newest ``wanted`` error rows, symbolicated with the project's uploaded maps, as
    the JSON of :class:`ErrorRows` or (``grouped``) of the ``limit`` largest
    :class:`Groups` (their series over ``since_ms`` to ``now_ms``, default now), and
    whether older rows were left out. DuckDB writes the rows to a
    file here; a worker process builds the answer from it (``core.workers``: ~0.3 s of
    Python for 10,000 stacks, which on the server held ingest's 202s behind it)."""
    window = (since_ms, int(time.time() * 1000) if now_ms is None else now_ms)
    path = offload.temp_path("errors")
    try:
        plan, count = await engine.export(project_id, since_ms, box, wanted + 1,
                                          (IS_ERROR, []), COLUMNS, path, source)
        if not count:
            return _encode([], False, limit, grouped, window), False, plan
        body, more, frames = await offload.run(errors_job, project_id,
                                               store.generation(project_id), str(path),
                                               wanted, limit, grouped, window)
        engine.meter.note(project_id, "symbolicate.frames", frames, source)
        return body, more, plan
    finally:
        path.unlink(missing_ok=True)


def errors_job(side: SymbolicateSide, project_id: str, generation: int, path: str, wanted: int,
               limit: int, grouped: bool, window: Window) -> tuple[bytes, bool, int]:
    """In a worker: the answer of :func:`read_errors` from the rows DuckDB wrote to ``path``."""
    with pa.memory_map(path) as source:
        table = pa.ipc.open_file(source).read_all()
    raws = list(zip(*(column.to_pylist() for column in table.columns), strict=True))
    truncated = len(raws) > wanted
    raws = raws[:wanted]
    side.store.observe(project_id, generation)
    rows = side.run(error_rows(side.symbolicator, project_id,
                               [to_row(r[:_DEBUG_IDS]) for r in raws],
                               [_debug_ids(r[_DEBUG_IDS]) for r in raws],
                               [_frames(r[_FRAMES]) for r in raws]))
    frames = sum(f.symbolicated for r in rows for f in r.error.frames)
    return _encode(rows, truncated, limit, grouped, window), truncated, frames


def _encode(rows: list[ErrorRow], truncated: bool, limit: int, grouped: bool,
            window: Window) -> bytes:
    return msgspec.json.encode(group(rows, truncated, limit, window) if grouped
                               else ErrorRows(rows))


async def error_rows(symbolicator: Symbolicator | None, project_id: str, rows: list[Row],
                     debug_ids: list[dict[str, str]], frames: list[list[Frame] | None]
                     ) -> list[ErrorRow]:
    """``rows`` as error rows, their stacks symbolicated with the project's uploaded source
    maps (``debug_ids``: each row's ``context.debugIds``; ``frames``: its frames as sent
    structured, else None and its stack is parsed); only parsed without ``symbolicator``."""
    if symbolicator is None:
        return [error_row(r) for r in rows]
    wanted = [(i, r) for i, r in enumerate(rows) if _stack(r)]
    inputs = [StackInput(release=r.release, debug_ids=debug_ids[i], stack=_stack(r),
                         header=_header(r), frames=frames[i]) for i, r in wanted]
    done = dict(zip((i for i, _ in wanted),
                    await symbolicator.symbolicate(project_id, inputs), strict=True))
    return [error_row(r, done.get(i)) for i, r in enumerate(rows)]


def _stack(row: Row) -> str:
    return (row.error.stack or "") if row.error else ""


def _header(row: Row) -> str | None:
    error = row.error
    if error is None or not (error.type or error.message):
        return None
    return ": ".join(part for part in (error.type, error.message) if part)


def group(rows: list[ErrorRow], truncated: bool, limit: int, window: Window) -> Groups:
    """The ``limit`` largest groups of ``rows`` (then the most recent), each with its
    series over ``window``: an answer of every group could hold 10,000 samples, tens of MB
    encoded in one piece on the event loop."""
    groups: dict[str, list[ErrorRow]] = {}
    for row in rows:  # newest first, as search returns them
        groups.setdefault(row.fingerprint, []).append(row)
    # Most frequent first, then most recent; only the groups returned are built.
    ranked = sorted(groups.values(), key=lambda members: (len(members), members[0].ts),
                    reverse=True)[:limit]
    start, end = window
    width_ms = max(end - start, 1) / SERIES_BUCKETS
    out = [Group(fingerprint=members[0].fingerprint, count=len(members),
                 first_seen=members[-1].ts, last_seen=members[0].ts,
                 series=series(members, start, width_ms),
                 boxes=sorted({r.box_id for r in members if r.box_id}), sample=members[0])
           for members in ranked]
    return Groups(groups=out, groups_total=len(groups), scanned_rows=len(rows),
                  truncated=truncated, series_start=iso_ms(start),
                  series_bucket_seconds=width_ms / 1000)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def series(members: list[ErrorRow], start_ms: int, width_ms: float) -> list[int]:
    """How many of ``members`` fall in each of the ``SERIES_BUCKETS`` from ``start_ms``.
    Search has no end: a row stamped after the window's end (a client clock up to the
    10 minutes ahead ingest allows) counts in the last bucket, so the series sums to the
    group's count."""
    counts = [0] * SERIES_BUCKETS
    for row in members:
        offset = (datetime.fromisoformat(row.ts) - _EPOCH) // _MS - start_ms
        counts[min(max(int(offset // width_ms), 0), SERIES_BUCKETS - 1)] += 1
    return counts


GROUPINGS = ("", "fingerprint")  # "": rows, not groups
GroupBy = Annotated[str, QueryParameter(schema_extra={"enum": list(GROUPINGS)})]


def errors_router(engine: QueryEngine, offload: Offload[SymbolicateSide],
                  store: ArtifactStore) -> Router:
    @get("/v1/projects/{project:str}/errors", summary="Errors with frames (logs_errors)",
         description="Rows of level error or carrying an error, newest first, each with "
                     "parsed frames and a fingerprint; groupBy=fingerprint groups them, each "
                     "group with its counts in 24 equal buckets from since to now (series, "
                     "from seriesStart, seriesBucketSeconds wide).",
         responses=error_responses(400, 503))
    async def errors(tenant_project: TenantProject, since: Since = "24h",
                     boxId: FromQuery[str | None] = None, limit: Limit = 100,
                     groupBy: GroupBy = "") -> Response[ErrorRows | Groups]:
        now_ms = int(time.time() * 1000)
        since_ms = parse_since(since, now_ms)
        if groupBy not in GROUPINGS:
            raise InvalidParameter("groupBy takes only 'fingerprint'",
                                   detail={"parameter": "groupBy"})
        check_limit(limit)  # rows, or with groupBy the groups returned
        body, _, plan = await read_errors(engine, offload, store, tenant_project.id, since_ms,
                                       boxId or None, GROUP_SCAN_ROWS if groupBy else limit,
                                       limit, bool(groupBy), now_ms)
        headers = {"X-Boxtrail-Files-Scanned": str(len(plan.files)),
                   "X-Boxtrail-Files-Total": str(plan.files_total)}
        # The worker's JSON as it is: the schema is the annotation's.
        return Response(body, headers=headers,  # type: ignore[arg-type]
                        media_type=MediaType.JSON)

    return Router("", route_handlers=[errors], opt=scope(READ))
