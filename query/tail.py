"""``GET /v1/projects/{project}/tail``: live rows over Server-Sent Events.

A tail is a cursor on event ids, not a queue: ids grow in the order rows become
visible, so each wake-up reads the matching rows above the last id sent (buffer
and Parquet alike) and ``Last-Event-ID`` resumes exactly where a client left off.
A client that stops reading blocks only its own stream (the server's socket
buffer is its queue); when it reads again and more than ``tail_max_behind``
matching rows wait, it gets ``event: dropped`` with their count and continues
from the newest row, so nothing piles up in memory and ingest never waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
from litestar import Request, Router, get
from litestar.datastructures import State
from litestar.params import Parameter
from litestar.response import ServerSentEvent, ServerSentEventMessage

from boxtrail.auth import require_project, require_tenant
from boxtrail.buffer import LiveBuffer
from boxtrail.config import Config
from boxtrail.errors import ApiError, InvalidParameter
from boxtrail.metrics import Registry
from boxtrail.schema import format_id
from boxtrail.tenancy import Tenancy
from query.engine import Filter, QueryEngine
from query.language import compile_query
from query.rows import to_row

PAGE = 500
# Rows arriving within this window after a wake-up go out together: one query per
# window per tail instead of one per ingest request.
GATHER_S = 0.02

_encode = msgspec.json.Encoder().encode


class TooManyTails(ApiError):
    """The tenant has as many open tails as it may have."""

    status_code = 429
    code = "too_many_tails"


class Dropped(msgspec.Struct, frozen=True):
    count: int


class Tails:
    def __init__(self, config: Config, tenancy: Tenancy, engine: QueryEngine,
                 buffer: LiveBuffer, metrics: Registry) -> None:
        self.config = config
        self.tenancy = tenancy
        self.engine = engine
        self.buffer = buffer
        self.open: dict[str, int] = {}
        metrics.callback("boxtrail_tail_subscribers", "Open tails",
                         lambda: sum(self.open.values()))
        self.m_dropped = metrics.counter("boxtrail_tail_dropped_total",
                                         "Rows skipped for tails that fell too far behind")

    def router(self) -> Router:
        @get("/v1/projects/{project:str}/tail", summary="Live tail (logs_tail)",
             description="Server-Sent Events: `event: log` rows with `id:`; resume with "
                         "Last-Event-ID; `event: dropped` when a slow reader was skipped ahead.")
        async def tail(request: Request[object, object, State], project: str,
                       boxId: str | None = None,
                       text: str | None = Parameter(query="query", default=None),
                       lastEventId: str | None = None) -> ServerSentEvent:
            authorization = request.headers.get("authorization")
            tenant = require_tenant(authorization, self.tenancy)
            found = require_project(authorization, self.tenancy, project)
            where = compile_query(text) if text else None
            last = request.headers.get("last-event-id") or lastEventId
            cursor = _parse_cursor(last) if last else self.buffer.last_id
            if self.open.get(tenant, 0) >= self.config.tail_max_per_tenant:
                raise TooManyTails(
                    f"{self.config.tail_max_per_tenant} tails are open for this tenant; "
                    "close one first", headers={"Retry-After": "5"})
            stream = self.stream(tenant, found.id, boxId or None, where, cursor)
            return ServerSentEvent(stream, headers={"Cache-Control": "no-cache",
                                                    "X-Accel-Buffering": "no"})

        return Router("", route_handlers=[tail])

    async def stream(self, tenant: str, project_id: str, box: str | None, where: Filter,
                     cursor: int) -> AsyncIterator[ServerSentEventMessage]:
        self.open[tenant] = self.open.get(tenant, 0) + 1
        try:
            while True:
                signal = self.buffer.signal(project_id)
                rows = await self.engine.after(project_id, cursor, box, PAGE, where)
                if len(rows) == PAGE:
                    newest = self.buffer.last_id
                    behind = await self.engine.count_between(project_id, cursor, newest, box,
                                                             where)
                    if behind > self.config.tail_max_behind:
                        self.m_dropped.inc(behind)
                        cursor = newest
                        yield ServerSentEventMessage(data=_encode(Dropped(behind)).decode(),
                                                     event="dropped", id=format_id(cursor))
                        continue
                for r in rows:
                    row = to_row(r)
                    cursor = r[0]  # type: ignore[assignment]
                    yield ServerSentEventMessage(data=_encode(row).decode(), event="log",
                                                 id=row.id)
                if len(rows) == PAGE:
                    continue
                try:
                    await asyncio.wait_for(signal.wait(), self.config.tail_heartbeat_s)
                except TimeoutError:
                    yield ServerSentEventMessage(comment="heartbeat")
                    continue
                await asyncio.sleep(GATHER_S)
        finally:
            self.open[tenant] -= 1


def _parse_cursor(text: str) -> int:
    try:
        return int(text, 16)
    except ValueError:
        raise InvalidParameter(f"Last-Event-ID {text[:40]!r} is not an id this server sent",
                               detail={"parameter": "Last-Event-ID"}) from None
