"""``GET /v1/projects/{project}/logs``: newest-first search over Parquet and the live buffer."""

from __future__ import annotations

import time
from typing import Annotated

from litestar import Response, Router, get
from litestar.params import FromQuery, QueryParameter

from boxtrail.auth import TenantProject
from boxtrail.errors import InvalidParameter
from boxtrail.openapi import error_responses
from query.engine import QueryEngine
from query.language import compile_query
from query.rows import Page, decode_cursor
from query.since import parse_since

MAX_LIMIT = 1000


def check_limit(value: int) -> int:
    if not 1 <= value <= MAX_LIMIT:
        raise InvalidParameter(f"limit must be 1..{MAX_LIMIT}, got {value}",
                               detail={"parameter": "limit"})
    return value


def query_router(engine: QueryEngine) -> Router:
    @get("/v1/projects/{project:str}/logs", summary="Search logs (logs_search)",
         description="Newest first. `since`: 30s, 10m, 2h, 7d, 1w or ISO-8601; `query`: "
                     "the search language (README); `cursor`: the previous page's nextCursor.",
         responses=error_responses(400, 503))
    async def search(tenant_project: TenantProject, since: FromQuery[str] = "1h",
                     text: Annotated[str | None, QueryParameter(name="query")] = None,
                     boxId: FromQuery[str | None] = None,
                     limit: FromQuery[int] = 100,
                     cursor: FromQuery[str | None] = None) -> Response[Page]:
        since_ms = parse_since(since, int(time.time() * 1000))
        page, plan = await engine.search(tenant_project.id, since_ms, boxId or None,
                                         check_limit(limit),
                                         decode_cursor(cursor) if cursor else None,
                                         compile_query(text) if text else None)
        # The planner's pruning, visible to tests and to curious operators.
        headers = {"X-Boxtrail-Files-Scanned": str(len(plan.files)),
                   "X-Boxtrail-Files-Total": str(plan.files_total)}
        return Response(page, headers=headers)

    return Router("", route_handlers=[search])
