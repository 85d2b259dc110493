"""``/mcp``: the agent tools ``logs_search``, ``logs_errors`` and ``logs_tail`` over MCP.

A streamable-HTTP endpoint built on the official ``mcp`` SDK, mounted in the app by
``query.mcp_mount`` (which imports this module on the first request).
Each tool is a thin layer over what the HTTP endpoints run: ``QueryEngine.search``
(``query.errors_view.read_errors`` for errors, symbolicated in a worker process) and,
for the tail, ``Tails.follow``: the SSE tail's live hub and cursor reads, rows encoded as
JSON lines once per hub wake-up for every MCP tail with the same filter.

Auth is the HTTP API's: every request must carry ``Authorization: Bearer <key>``
(a 401 in the one error shape otherwise, before the SDK sees it), and every tool
call resolves its ``project`` with the key of the request that carries the call,
so another tenant's project is a "no such project" error, as a missing one is.
The transport is stateless: no MCP session outlives its request, so no session
can be borrowed by another key.

Output is compact JSON: null and empty fields are dropped, search rows carry the
error's type and message only, error rows carry frames reduced to where they point.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterator
from contextlib import aclosing, contextmanager
from typing import Annotated

import msgspec
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from core.errors import ApiError, NotFound
from core.storage import StorageError
from core.workers import Offload
from ingest.buffer import LiveBuffer
from query.engine import Filter, QueryEngine
from query.errors_view import ErrorRow, ErrorRows, read_errors
from query.frames import Closed, Skipped, one_line
from query.language import compile_query
from query.rows import Row, to_row
from query.since import parse_since
from query.tail import Tails
from symbolicate.artifacts import ArtifactStore
from symbolicate.side import SymbolicateSide
from tenancy.guard import require_key, require_project, require_scope
from tenancy.keys import READ
from tenancy.tenants import Project, Tenancy

SEARCH_ROWS = 100
ERROR_ROWS = 50
TAIL_ROWS = 500  # rows a tail returns at the end (the newest); all of them were streamed
TAIL_DEFAULT_S = 30
TAIL_MAX_S = 300
# The SDK's client refuses an SSE event over 1 MiB, and a result travels as text and as
# structured content in one event: rows stop at this many bytes of JSON (a row is at
# most ~150 KB: ingest caps messages, stacks and attributes).
RESULT_BYTES = 256 << 10
NOTIFY_BYTES = 64 << 10  # one progress notification of a tail
TAIL_WAKE_S = 0.25  # a quiet tail looks at its deadline this often

_encode = msgspec.json.Encoder().encode
_decode_row = msgspec.json.Decoder(dict[str, object]).decode

# --- what a model reads first: the tools' descriptions --------------------------------

_SINCE = ("How far back: a duration (30s, 10m, 2h, 7d, 1w) or an ISO-8601 time "
          "(2026-11-29T10:00:00Z).")
_QUERY = ('Search language. Words match message and error text, any case, all required '
          '(checkout failed); "exact phrase"; -word excludes; OR; (grouping); '
          'fields level: url: release: session: box: type: attr.NAME: with * wildcards '
          '(level:error -type:NetworkError, url:https://shop.test/cart*, attr.user-id:42, '
          'release:*); /RE2 regex/ on the message (/Timeout after \\d+ms/). Quote text '
          'holding / : or parentheses ("/api/cart"). Empty: everything.')
_BOX = "Only logs sent by pages inside this sandbox box (its box id)."
_PROJECT = "The log project: its id (prj_...) or its name."

_ROW_SHAPE = ("Each row: id, ts (ISO-8601 UTC), level (debug|info|warn|error), message, "
              "and when set boxId, url, sessionId, release, attrs, truncated; empty fields "
              "are left out.")

SEARCH_DESCRIPTION = (
    f"Search a project's browser logs, newest first, at most {SEARCH_ROWS} rows. "
    f"{_ROW_SHAPE} Rows carrying an error have error {{type, message}}; use logs_errors "
    "for their stack frames. `more: true` means older matches exist beyond these rows: "
    "narrow `since` or `query`. Returns {rows, more}.")
ERRORS_DESCRIPTION = (
    f"Errors of a project, newest first, at most {ERROR_ROWS} rows: rows of level error or "
    f"carrying an error (uncaught exceptions, rejections, failed requests). {_ROW_SHAPE} "
    "Each also has error {type, message, frames: [{function, file, line, column}] innermost "
    "first, rewritten to original source when source maps were uploaded} and a "
    "fingerprint shared by occurrences of the same error. Returns {rows, more}.")
TAIL_DESCRIPTION = (
    "Watch a project's logs live: listens for `seconds` (default "
    f"{TAIL_DEFAULT_S}, at most {TAIL_MAX_S}) and returns the rows that arrived meanwhile, "
    "oldest first (only rows sent after the call starts; use logs_search for earlier "
    f"ones). {_ROW_SHAPE} While the call is open each batch of new rows is also sent as a "
    "progress notification whose message is the rows as JSON lines (when the client asks "
    f"for progress). At most the newest {TAIL_ROWS} rows are returned; `omitted` counts "
    "older ones left out. Returns {rows, omitted, seconds}. Useful right after an action "
    "in a box, to see what its pages log.")

Since = Annotated[str, Field(description=_SINCE)]
Query = Annotated[str | None, Field(description=_QUERY)]
BoxId = Annotated[str | None, Field(description=_BOX)]
ProjectRef = Annotated[str, Field(description=_PROJECT)]
Seconds = Annotated[int, Field(ge=1, le=TAIL_MAX_S,
                                description=f"How long to listen, in seconds (1..{TAIL_MAX_S}).")]
_READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)


class McpEndpoint:
    def __init__(self, tenancy: Tenancy, engine: QueryEngine, buffer: LiveBuffer,
                 tails: Tails, offload: Offload[SymbolicateSide], store: ArtifactStore) -> None:
        self.tenancy = tenancy
        self.engine = engine
        self.buffer = buffer
        self.tails = tails  # MCP tails count toward the tenant's cap with the SSE ones
        self.offload = offload  # logs_errors's rows are built in a worker
        self.store = store
        # The SDK logs every stateless request at INFO ("Terminating session: None") and
        # every refused call; its warnings and crashes still reach the server log.
        logging.getLogger("mcp").setLevel(logging.WARNING)
        self.server: MCPServer = MCPServer(
            "boxtrail", version="1.0.0",
            instructions="Browser logs of pages running in sandbox boxes: search them "
                         "(logs_search), read errors with stack frames (logs_errors), or "
                         "watch them live (logs_tail).")
        self.server.add_tool(self.logs_search, name="logs_search",
                             description=SEARCH_DESCRIPTION, annotations=_READ_ONLY)
        self.server.add_tool(self.logs_errors, name="logs_errors",
                             description=ERRORS_DESCRIPTION, annotations=_READ_ONLY)
        self.server.add_tool(self.logs_tail, name="logs_tail",
                             description=TAIL_DESCRIPTION, annotations=_READ_ONLY)
        # Stateless: the tools keep nothing between calls, and a call is authorized by
        # the key of the very request that carries it. Answers are SSE streams (not one
        # JSON body), so a tail's notifications go out while it runs. The SDK's Host and
        # Origin checks guard unauthenticated local servers against DNS rebinding; every
        # request here needs the API key, and the host name is the deployment's.
        self.app = self.server.streamable_http_app(
            streamable_http_path="/", stateless_http=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))

    # --- the tools ---------------------------------------------------------------------

    async def logs_search(self, ctx: Context, project: ProjectRef, since: Since = "1h",
                          query: Query = None, boxId: BoxId = None) -> CallToolResult:
        with _as_tool_error():
            found = self._project(ctx, project)
            page, _ = await self.engine.search(found.id, _since(since), boxId or None,
                                               SEARCH_ROWS, None, _filter(query),
                                               source="mcp")
            rows, cut = _fit([search_row(r) for r in page.rows])
            return _result({"rows": rows, "more": cut or page.next_cursor is not None})

    async def logs_errors(self, ctx: Context, project: ProjectRef, since: Since = "24h",
                          boxId: BoxId = None) -> CallToolResult:
        with _as_tool_error():
            found = self._project(ctx, project)
            body, more, _ = await read_errors(self.engine, self.offload, self.store, found.id,
                                              _since(since), boxId or None, ERROR_ROWS,
                                              ERROR_ROWS, False, source="mcp")
            symbolicated = msgspec.json.decode(body, type=ErrorRows).rows
            rows, cut = _fit([error_out(r) for r in symbolicated])
            return _result({"rows": rows, "more": cut or more})

    async def logs_tail(self, ctx: Context, project: ProjectRef, boxId: BoxId = None,
                        query: Query = None, seconds: Seconds = TAIL_DEFAULT_S
                        ) -> CallToolResult:
        with _as_tool_error():
            found = self._project(ctx, project)
            where = _filter(query)
            key = require_key((ctx.headers or {}).get("authorization"), self.tenancy)
            require_scope(key.scopes, READ)
            with self.tails.slot(key.tenant_id):  # counts toward BOXTRAIL_TAIL_MAX_PER_TENANT
                return await self._tail(ctx, found.id, boxId or None, where, seconds,
                                        key.hash)

    async def _tail(self, ctx: Context, project_id: str, box: str | None, where: Filter,
                    seconds: int, holder: str) -> CallToolResult:
        kept: deque[bytes] = deque(maxlen=TAIL_ROWS)
        seen = skipped = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        # The SSE tail's path (its project's live hub), from the newest row visible now.
        start = await self.tails.start(project_id)
        follow = self.tails.follow(project_id, box, where, start, tail_line, TAIL_WAKE_S,
                                   holder)
        async with aclosing(follow) as parts:
            async for part in parts:
                if isinstance(part, Closed):
                    raise ToolError(part.message())
                if isinstance(part, Skipped):
                    skipped += part.count
                elif part is not None:
                    lines = part.split(b"\n")[:-1]
                    kept.extend(lines)
                    for count, text in _json_lines(lines):
                        seen += count
                        await ctx.report_progress(seen, None, text)
                if loop.time() >= deadline:
                    break
        newest, _ = _fit([_decode_row(line) for line in reversed(kept)])
        return _result({"rows": newest[::-1], "omitted": seen + skipped - len(newest),
                        "seconds": seconds})

    def _project(self, ctx: Context, ref: str) -> Project:
        headers = ctx.headers or {}
        try:
            return require_project(headers.get("authorization"), self.tenancy, ref, READ)
        except NotFound:
            # Missing and another tenant's read the same.
            raise ToolError(f"no such project {ref!r}: give the id (prj_...) or the name of "
                            "a project of this API key's tenant") from None


# --- compact rows ----------------------------------------------------------------------


def _compact(fields: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in fields.items() if v is not None and v != {} and v != []}


def search_row(row: Row) -> dict[str, object]:
    out = _compact(msgspec.to_builtins(row))
    if row.error is not None:
        out["error"] = _compact({"type": row.error.type, "message": row.error.message})
    return out


def error_out(row: ErrorRow) -> dict[str, object]:
    out = _compact(msgspec.to_builtins(row))
    error = row.error
    frames = [_compact({"function": f.function, "file": f.file, "line": f.line,
                        "column": f.column, "contextLine": f.context_line})
              for f in error.frames]
    # A stack no parser understood stays readable as text.
    out["error"] = _compact({"type": error.type, "message": error.message, "frames": frames,
                             "stack": None if frames else error.stack})
    return out


def _fit(rows: list[dict[str, object]]) -> tuple[list[dict[str, object]], bool]:
    """The leading rows whose JSON fits in ``RESULT_BYTES``, and whether any were cut."""
    size = 0
    for i, row in enumerate(rows):
        size += len(_encode(row)) + 1
        if size > RESULT_BYTES:
            return rows[:i], True
    return rows, False


def tail_line(r: tuple[object, ...]) -> bytes:
    """A tail's row as one JSON line (the hub encodes it once for every MCP tail)."""
    return one_line(_encode(search_row(to_row(r)))) + b"\n"


def _json_lines(lines: list[bytes]) -> Iterator[tuple[int, str]]:
    """The JSON lines in pieces of at most ``NOTIFY_BYTES`` (or one line): how many rows
    each piece holds, and its text."""
    piece: list[bytes] = []
    size = 0
    for line in lines:
        if piece and size + len(line) > NOTIFY_BYTES:
            yield len(piece), b"\n".join(piece).decode()
            piece, size = [], 0
        piece.append(line)
        size += len(line) + 1
    if piece:
        yield len(piece), b"\n".join(piece).decode()


def _result(payload: dict[str, object]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=_encode(payload).decode())],
                          structured_content=payload)


# --- inputs ------------------------------------------------------------------------------


def _since(text: str) -> int:
    return parse_since(text, int(time.time() * 1000))


def _filter(query: str | None) -> Filter:
    return compile_query(query) if query else None


@contextmanager
def _as_tool_error() -> Iterator[None]:
    """Expected failures (a bad ``since`` or ``query``, storage down) become a tool error
    the model reads, with the message the HTTP API would give, rather than a crash."""
    try:
        yield
    except ApiError as exc:
        raise ToolError(exc.message) from None
    except StorageError as exc:
        raise ToolError(f"storage is not reachable; retry later ({exc})") from None
