"""``GET /v1/projects/{project}/tail``: live rows over Server-Sent Events.

A tail is a cursor on event ids, not a queue: ids grow in the order rows become
visible, so each wake-up reads the matching rows above the last id sent (buffer
and Parquet alike) and ``Last-Event-ID`` resumes exactly where a client left off.

Tails of one project with the same filter that stand at the same cursor (all the
live ones, usually) share one page: it is read once and encoded once into SSE
frames, and every such tail writes it with a single send. A client that stops
reading blocks only its own stream (the socket buffer is its queue); when it reads
again and more than ``tail_max_behind`` matching rows wait, it gets
``event: dropped`` with their count and continues from the newest row, so nothing
piles up in memory and ingest never waits on a reader.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
from litestar import Request, Router, get
from litestar.datastructures import State
from litestar.params import Parameter
from litestar.response import Stream

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
# Rows arriving within this window after a wake-up go out together: one read per
# window per filter instead of one per ingest request.
GATHER_S = 0.02
HEARTBEAT = b": heartbeat\n\n"

_encode = msgspec.json.Encoder().encode


class TooManyTails(ApiError):
    """The tenant has as many open tails as it may have."""

    status_code = 429
    code = "too_many_tails"


class Dropped(msgspec.Struct, frozen=True):
    count: int


@dataclass(frozen=True)
class Page:
    frames: bytes  # SSE frames of the rows, ready to send
    rows: int
    last_id: int  # the cursor after this page


def encode_page(rows: list[tuple[object, ...]], cursor: int) -> Page:
    parts = []
    for r in rows:
        row = to_row(r)
        parts.append(b"id: %s\nevent: log\ndata: %s\n\n" % (row.id.encode(), _encode(row)))
    last = rows[-1][0] if rows else cursor
    return Page(b"".join(parts), len(rows), last)  # type: ignore[arg-type]


class Tails:
    def __init__(self, config: Config, tenancy: Tenancy, engine: QueryEngine,
                 buffer: LiveBuffer, metrics: Registry) -> None:
        self.config = config
        self.tenancy = tenancy
        self.engine = engine
        self.buffer = buffer
        self.open: dict[str, int] = {}
        # (project, box, filter, cursor) -> the page read at a buffer version, shared by
        # every tail asking for it; a pending future while the read is in flight.
        self._pages: dict[tuple[object, ...], tuple[int, asyncio.Future[Page]]] = {}
        metrics.callback("boxtrail_tail_subscribers", "Open tails",
                         lambda: sum(self.open.values()))
        self.m_dropped = metrics.counter("boxtrail_tail_dropped_total",
                                         "Rows skipped for tails that fell too far behind")
        self.m_pages = metrics.counter("boxtrail_tail_pages_total",
                                       "Tail pages read, and served to another tail",
                                       ("source",))

    def router(self) -> Router:
        tenancy = self.tenancy

        @get("/v1/projects/{project:str}/tail", summary="Live tail (logs_tail)",
             description="Server-Sent Events: `event: log` rows with `id:`; resume with "
                         "Last-Event-ID; `event: dropped` when a slow reader was skipped ahead.")
        async def tail(request: Request[object, object, State], project: str,
                       boxId: str | None = None,
                       text: str | None = Parameter(query="query", default=None),
                       lastEventId: str | None = None) -> Stream:
            authorization = request.headers.get("authorization")
            tenant = require_tenant(authorization, tenancy)
            found = require_project(authorization, tenancy, project)
            where = compile_query(text) if text else None
            last = request.headers.get("last-event-id") or lastEventId
            cursor = _parse_cursor(last) if last else self.buffer.last_id
            if self.open.get(tenant, 0) >= self.config.tail_max_per_tenant:
                raise TooManyTails(
                    f"{self.config.tail_max_per_tenant} tails are open for this tenant; "
                    "close one first", headers={"Retry-After": "5"})
            stream = self.stream(tenant, found.id, boxId or None, where, cursor)
            return Stream(stream, media_type="text/event-stream",
                          headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

        return Router("", route_handlers=[tail])

    async def page(self, project_id: str, box: str | None, where: Filter,
                   cursor: int) -> Page:
        """The page after ``cursor``: read once per buffer version, shared by all tails."""
        key = (project_id, box, where[0] if where else None,
               tuple(where[1]) if where else (), cursor)
        version = self.buffer.version
        cached = self._pages.get(key)
        if cached is not None and cached[0] == version:
            self.m_pages.inc(1, "shared")
            return await asyncio.shield(cached[1])
        future: asyncio.Future[Page] = asyncio.get_running_loop().create_future()
        self._pages[key] = (version, future)
        self.m_pages.inc(1, "read")
        try:
            rows = await self.engine.after(project_id, cursor, box, PAGE, where)
            future.set_result(encode_page(rows, cursor))
        except BaseException as exc:
            future.set_exception(exc)
            del self._pages[key]
            raise
        finally:
            # Forget pages of older versions: nobody will ask for them again.
            for stale in [k for k, (v, f) in self._pages.items() if v < version and f.done()]:
                del self._pages[stale]
        return future.result()

    async def stream(self, tenant: str, project_id: str, box: str | None, where: Filter,
                     cursor: int) -> AsyncIterator[bytes]:
        self.open[tenant] = self.open.get(tenant, 0) + 1
        try:
            while True:
                signal = self.buffer.signal(project_id)
                page = await self.page(project_id, box, where, cursor)
                if page.rows == PAGE:
                    newest = self.buffer.last_id
                    behind = await self.engine.count_between(project_id, cursor, newest, box,
                                                             where)
                    if behind > self.config.tail_max_behind:
                        self.m_dropped.inc(behind)
                        cursor = newest
                        yield b"id: %s\nevent: dropped\ndata: %s\n\n" % (
                            format_id(cursor).encode(), _encode(Dropped(behind)))
                        continue
                if page.rows:
                    cursor = page.last_id
                    yield page.frames
                if page.rows == PAGE:
                    continue
                try:
                    await asyncio.wait_for(signal.wait(), self.config.tail_heartbeat_s)
                except TimeoutError:
                    yield HEARTBEAT
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
