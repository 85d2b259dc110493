"""``GET /v1/projects/{project}/errors`` (logs_errors): error rows with frames and fingerprints.

Frames come from ``symbolicate.stack`` and are rewritten to original files, lines and
functions by ``symbolicate.lookup`` with the source maps uploaded so far (at read time,
so a later upload applies to earlier errors); a frame that stays minified says why in
``problem``. The fingerprint groups the same error across events the way Sentry does
when it has a stack: error type + normalised message + the top in-app frames (function
and file without host or query), so ids, numbers and hosts do not split a group.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
import time
from urllib.parse import urlsplit

import msgspec
from litestar import Response, Router, get
from litestar.params import FromQuery

from boxtrail.auth import TenantProject
from boxtrail.errors import InvalidParameter
from boxtrail.openapi import error_responses
from boxtrail.schema import format_id, parse_id
from query.engine import Plan, QueryEngine
from query.routes import check_limit
from query.rows import Row
from query.since import parse_since
from symbolicate.lookup import StackInput, Symbolicated, Symbolicator
from symbolicate.rewrite import FrameOut, unsymbolicated
from symbolicate.stack import Frame, parse_stack

IS_ERROR = ("level = 'error' OR error_type IS NOT NULL OR error_message IS NOT NULL "
            "OR error_stack IS NOT NULL")
TOP_FRAMES = 3
GROUP_SCAN_ROWS = 10_000  # rows read to build groups; the answer says when it is cut
SLICE_ROWS = 250  # error rows built between two yields to the event loop

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
    boxes: list[str]
    sample: ErrorRow


class Groups(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    groups: list[Group]  # the ``limit`` largest
    groups_total: int
    scanned_rows: int
    truncated: bool


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


async def error_rows(engine: QueryEngine, symbolicator: Symbolicator | None,
                     project_id: str, rows: list[Row], plan: Plan) -> list[ErrorRow]:
    """``rows`` (from ``engine.search``, which returned ``plan``) as error rows, their stacks
    symbolicated with the project's uploaded source maps."""
    debug_ids: dict[str, dict[str, str]] = {}
    if symbolicator is not None and symbolicator.store.has_debug_ids(project_id):
        debug_ids = await _debug_ids(engine, plan, [r.id for r in rows if _stack(r)])
    out: list[ErrorRow] = []
    # In slices, giving the event loop back between them: groupBy reads up to 10,000 rows,
    # and parsing and fingerprinting them at once held every ingest 202 behind it.
    for start in range(0, len(rows), SLICE_ROWS):
        if start:
            await asyncio.sleep(0)
        part = rows[start:start + SLICE_ROWS]
        if symbolicator is None:
            out += [error_row(r) for r in part]
            continue
        wanted = [(i, r) for i, r in enumerate(part) if _stack(r)]
        inputs = [StackInput(release=r.release, debug_ids=debug_ids.get(r.id, {}),
                             stack=_stack(r), header=_header(r)) for _, r in wanted]
        done = dict(zip((i for i, _ in wanted),
                        await symbolicator.symbolicate(project_id, inputs), strict=True))
        out += [error_row(r, done.get(i)) for i, r in enumerate(part)]
    return out


def _stack(row: Row) -> str:
    return (row.error.stack or "") if row.error else ""


def _header(row: Row) -> str | None:
    error = row.error
    if error is None or not (error.type or error.message):
        return None
    return ": ".join(part for part in (error.type, error.message) if part)


_debug_ids_decoder = msgspec.json.Decoder(dict[str, str])


async def _debug_ids(engine: QueryEngine, plan: Plan, ids: list[str]
                     ) -> dict[str, dict[str, str]]:
    """``context.debugIds`` of the rows ``ids`` (a column rows do not carry)."""
    out: dict[str, dict[str, str]] = {}
    for event_id, text in await engine.debug_ids(plan, [parse_id(i) for i in ids]):
        try:
            out[format_id(event_id)] = _debug_ids_decoder.decode(text)
        except msgspec.DecodeError:
            continue
    return out


def group(rows: list[ErrorRow], truncated: bool, limit: int) -> Groups:
    """The ``limit`` largest groups of ``rows`` (then the most recent): an answer of every
    group could hold 10,000 samples, tens of MB encoded in one piece on the event loop."""
    groups: dict[str, list[ErrorRow]] = {}
    for row in rows:  # newest first, as search returns them
        groups.setdefault(row.fingerprint, []).append(row)
    # Most frequent first, then most recent; only the groups returned are built.
    ranked = sorted(groups.values(), key=lambda members: (len(members), members[0].ts),
                    reverse=True)[:limit]
    out = [Group(fingerprint=members[0].fingerprint, count=len(members),
                 first_seen=members[-1].ts, last_seen=members[0].ts,
                 boxes=sorted({r.box_id for r in members if r.box_id}), sample=members[0])
           for members in ranked]
    return Groups(groups=out, groups_total=len(groups), scanned_rows=len(rows),
                  truncated=truncated)


def errors_router(engine: QueryEngine, symbolicator: Symbolicator | None = None) -> Router:
    @get("/v1/projects/{project:str}/errors", summary="Errors with frames (logs_errors)",
         description="Rows of level error or carrying an error, newest first, each with "
                     "parsed frames and a fingerprint; groupBy=fingerprint groups them.",
         responses=error_responses(400, 503))
    async def errors(tenant_project: TenantProject, since: FromQuery[str] = "24h",
                     boxId: FromQuery[str | None] = None, limit: FromQuery[int] = 100,
                     groupBy: FromQuery[str | None] = None
                     ) -> Response[ErrorRows | Groups]:
        since_ms = parse_since(since, int(time.time() * 1000))
        if groupBy not in (None, "", "fingerprint"):
            raise InvalidParameter("groupBy takes only 'fingerprint'",
                                   detail={"parameter": "groupBy"})
        check_limit(limit)  # rows, or with groupBy the groups returned
        wanted = GROUP_SCAN_ROWS if groupBy else limit
        page, plan = await engine.search(tenant_project.id, since_ms, boxId or None, wanted, None,
                                         (IS_ERROR, []))
        rows = await error_rows(engine, symbolicator, tenant_project.id, page.rows, plan)
        headers = {"X-Boxtrail-Files-Scanned": str(len(plan.files)),
                   "X-Boxtrail-Files-Total": str(plan.files_total)}
        if groupBy:
            return Response(group(rows, page.next_cursor is not None, limit), headers=headers)
        return Response(ErrorRows(rows), headers=headers)

    return Router("", route_handlers=[errors])
