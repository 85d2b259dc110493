"""``/mcp`` mounted at start, built on its first request.

Importing the official ``mcp`` SDK costs ~1.2 s of a server's ~2.5 s of imports (its
pydantic types), paid by every start (``make run``, each test's server) though most
servers never see an MCP call. The route is mounted at start, so the tenancy guard and
the schema see it as before; the SDK is imported and the endpoint (``query.mcp``) built
on a worker thread when the first request arrives, and its session manager runs in a
task of its own until the server stops (an anyio task group must end in the task that
began it).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from litestar import Litestar
from litestar.handlers import ASGIRouteHandler, asgi
from litestar.types import Receive, Scope, Send

from core.errors import NotFound
from tenancy.guard import scope
from tenancy.keys import ANY

if TYPE_CHECKING:
    from query.mcp import McpEndpoint

Build = Callable[["type[McpEndpoint]"], "McpEndpoint"]


class LazyMcp:
    def __init__(self, build: Build) -> None:
        self.build = build  # given the class, the endpoint (called on a worker thread)
        self.endpoint: McpEndpoint | None = None
        self._lock: asyncio.Lock | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _make(self) -> McpEndpoint:
        module = importlib.import_module("query.mcp")
        return self.build(module.McpEndpoint)

    async def ready(self) -> McpEndpoint:
        if self.endpoint is not None:
            return self.endpoint
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if self.endpoint is None:
                endpoint = await asyncio.to_thread(self._make)
                started = asyncio.Event()
                self._task = asyncio.create_task(self._serve(endpoint, started))
                waiter = asyncio.create_task(started.wait())
                await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if self._task.done():  # it failed to start: raise why
                    self._task.result()
                self.endpoint = endpoint
        return self.endpoint

    async def _serve(self, endpoint: McpEndpoint, started: asyncio.Event) -> None:
        async with endpoint.server.session_manager.run():
            started.set()
            await self._stop.wait()

    @asynccontextmanager
    async def lifespan(self, _: Litestar) -> AsyncIterator[None]:
        try:
            yield
        finally:  # MCP requests end before the service they read from stops
            self._stop.set()
            if self._task is not None:
                await self._task

    def handler(self) -> ASGIRouteHandler:
        # Any key: the tools ask for "read" themselves, so a key without it gets a tool
        # error the model reads (tenancy.guard.require_project), not an HTTP 403.
        @asgi("/mcp", is_mount=True, copy_scope=True, opt=scope(ANY))
        async def mcp(scope: Scope, receive: Receive, send: Send) -> None:
            # The app's tenancy guard has checked the API key (tenancy.guard); exceptions
            # raised before anything is sent are answered in the one error shape.
            if scope["path"] != "/":  # the mount also takes /mcp/x and /mcpx
                raise NotFound("the MCP endpoint is /mcp")
            endpoint = await self.ready()
            await endpoint.app(scope, receive, send)  # type: ignore[arg-type]

        return mcp
