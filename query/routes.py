"""The search endpoints over Parquet and the live buffer: ``GET /v1/projects/{project}/logs``
(newest-first rows) and ``GET /v1/projects/{project}/histogram`` (their counts over time,
``query.histogram``)."""

from __future__ import annotations

import time
from typing import Annotated

from litestar import Response, Router, get
from litestar.params import FromQuery, QueryParameter

from core.errors import InvalidParameter
from core.openapi import error_responses
from query.engine import Plan, QueryEngine
from query.histogram import MAX_BUCKETS, Histogram, bucket_width_ms, check_buckets, histogram
from query.language import MAX_LENGTH, compile_query
from query.rows import MAX_ID, Page, decode_cursor
from query.since import DURATION, ISO_8601, TIME_PATTERN, parse_since, parse_until
from tenancy.guard import TenantProject, scope
from tenancy.keys import READ

MAX_LIMIT = 1000

# What the schema states of each parameter, from the constants the handlers' checks use
# (parse_time, check_limit, check_buckets, the query language's length), so a client
# generated from /schema/openapi.json sends nothing they refuse. The checks stay the
# handlers' own: their errors name the parameter in the one error shape. What no schema
# can state stays unstated: the query's grammar, and `until` after `since`.
Since = Annotated[str, QueryParameter(schema_extra={"pattern": TIME_PATTERN})]
# Empty: no end, as when absent.
Until = Annotated[str, QueryParameter(schema_extra={"pattern": f"^(?:{DURATION}|{ISO_8601})?$"})]
QueryText = Annotated[str, QueryParameter(name="query", schema_extra={"maxLength": MAX_LENGTH})]
Limit = Annotated[int, QueryParameter(schema_extra={"minimum": 1, "maximum": MAX_LIMIT})]
Buckets = Annotated[int, QueryParameter(schema_extra={"minimum": 1, "maximum": MAX_BUCKETS})]


def _hex_up_to(top: int) -> str:
    """A pattern of the hex numbers 0..top, for a top whose hex digits after the first are
    all f (MAX_ID, 7fff...)."""
    digits = f"{top:x}"
    assert set(digits[1:]) <= {"f"}, digits
    rest = len(digits) - 1
    return f"^(?:[0-9a-fA-F]{{1,{rest}}}|[0-{digits[0]}][0-9a-fA-F]{{{rest}}})$"


# A row's id as rows carry it (query.rows.parse_event_id): what a tail resumes from.
EVENT_ID_PATTERN = _hex_up_to(MAX_ID)
EventId = Annotated[str, QueryParameter(schema_extra={"pattern": f"^$|{EVENT_ID_PATTERN}"})]
_WINDOW = ("`since` and `until`: 30s, 10m, 2h, 7d, 1w ago or ISO-8601; rows with "
           "since <= ts < until")


def check_limit(value: int) -> int:
    if not 1 <= value <= MAX_LIMIT:
        raise InvalidParameter(f"limit must be 1..{MAX_LIMIT}, got {value}",
                               detail={"parameter": "limit"})
    return value


def _scanned(plan: Plan) -> dict[str, str]:
    # The planner's pruning, visible to tests and to curious operators.
    return {"X-Boxtrail-Files-Scanned": str(len(plan.files)),
            "X-Boxtrail-Files-Total": str(plan.files_total)}


def query_router(engine: QueryEngine) -> Router:
    @get("/v1/projects/{project:str}/logs", summary="Search logs (logs_search)",
         description=f"Newest first. {_WINDOW} (default: no end); `query`: the search "
                     "language (docs/search.md); `cursor`: the previous page's nextCursor.",
         responses=error_responses(400, 503))
    async def search(tenant_project: TenantProject, since: Since = "1h", until: Until = "",
                     text: QueryText = "", boxId: FromQuery[str | None] = None,
                     limit: Limit = 100,
                     cursor: FromQuery[str | None] = None) -> Response[Page]:
        now_ms = int(time.time() * 1000)
        since_ms = parse_since(since, now_ms)
        until_ms = parse_until(until, now_ms, since_ms) if until else None
        page, plan = await engine.search(tenant_project.id, since_ms, boxId or None,
                                         check_limit(limit),
                                         decode_cursor(cursor) if cursor else None,
                                         compile_query(text) if text else None, until_ms)
        return Response(page, headers=_scanned(plan))

    @get("/v1/projects/{project:str}/histogram", summary="Rows per time bucket and level",
         description=f"The rows /logs would return, counted per bucket and level. {_WINDOW} "
                     "(default: now, rows stamped this millisecond included); `query` and "
                     "`boxId` as on /logs. The bucket width is the narrowest of 1s 2s 5s 10s "
                     "15s 30s 1m 2m 5m 10m 15m 30m 1h 2h 3h 6h 12h 1d 7d 30d 90d 1y 2y 5y ... "
                     "giving at most `buckets` (1..500) buckets aligned to the epoch; every "
                     "bucket is listed, oldest first, with the levels that have rows.",
         responses=error_responses(400, 503))
    async def counts(tenant_project: TenantProject, since: Since = "1h", until: Until = "",
                     text: QueryText = "", boxId: FromQuery[str | None] = None,
                     buckets: Buckets = 60) -> Response[Histogram]:
        now_ms = int(time.time() * 1000)
        since_ms = parse_since(since, now_ms)
        # A row acked a moment ago may carry this very millisecond: the default end is after it.
        until_ms = parse_until(until, now_ms, since_ms) if until else max(now_ms + 1,
                                                                          since_ms + 1)
        width_ms = bucket_width_ms(since_ms, until_ms, check_buckets(buckets))
        rows, plan = await engine.histogram(tenant_project.id, since_ms, until_ms,
                                            boxId or None,
                                            compile_query(text) if text else None, width_ms)
        return Response(histogram(since_ms, until_ms, width_ms, rows), headers=_scanned(plan))

    return Router("", route_handlers=[search, counts], opt=scope(READ))
