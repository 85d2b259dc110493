"""The three tools over stdio (``mcp-stdio/``, the npm package an agent host spawns), driven
by the official MCP client's stdio transport against a real server: the same tools as
``/mcp`` (list and results equal), ``logs_tail``'s rows streamed as progress, and a clear
tool error, soon, for a wrong key, a server that is down and a server restarted mid-tail."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import CallToolResult, TextContent

from tests.query.test_mcp import MINIFIED_STACK, connect, payload, run
from tests.support.pgserver import free_port
from tests.support.server import Server, create_project

ADAPTER = Path(__file__).resolve().parents[2] / "mcp-stdio" / "bin" / "boxtrail-mcp.js"
BOUND_S = 20.0  # a failing call answers within this


def adapter(url: str, key: str) -> StdioServerParameters:
    node = shutil.which("node")
    assert node is not None, "node is needed for the stdio adapter"
    return StdioServerParameters(command=node, args=[str(ADAPTER)],
                                 env={"BOXTRAIL_URL": url, "BOXTRAIL_API_KEY": key,
                                      "PATH": os.environ.get("PATH", "/usr/bin:/bin")})


async def over_stdio(url: str, key: str, tool: str | None, arguments: dict[str, object],
                     progress: Any = None) -> Any:
    async with Client(adapter(url, key), mode="legacy") as client:
        if tool is None:
            return await client.list_tools()
        return await client.call_tool(tool, arguments, progress_callback=progress)


def error_text(result: CallToolResult) -> str:
    assert result.is_error, result
    [content] = result.content
    assert isinstance(content, TextContent)
    return content.text


@pytest.fixture
def shop(server: Server) -> dict[str, Any]:
    with server.client() as api:
        project = create_project(api, "shop")
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": project["ingestKey"]},
                   timeout=10, json={"context": {"boxId": "b1"}, "events": [
                       {"level": "error", "message": "render failed",
                        "error": {"type": "TypeError", "message": "x",
                                  "stack": MINIFIED_STACK}},
                       *({"message": f"row {i}", "attrs": {"i": i}} for i in range(5))]})
    assert r.status_code == 202, r.text
    return project


def test_the_tools_and_their_results_are_the_servers(server: Server,
                                                     shop: dict[str, Any]) -> None:
    calls = (("logs_search", {"project": "shop", "since": "1h"}),
             ("logs_search", {"project": "shop", "query": "row -level:error"}),
             ("logs_errors", {"project": "shop"}),
             ("logs_tail", {"project": "shop", "seconds": 1}),  # nothing arrives: equal
             ("logs_search", {"project": "nope"}))

    async def both(client: Client) -> tuple[Any, list[Any]]:
        return (await client.list_tools(),
                [await client.call_tool(tool, arguments) for tool, arguments in calls])

    async def over_http() -> tuple[Any, list[Any]]:
        async with connect(server, server.api_key, "legacy") as client:
            return await both(client)

    async def stdio() -> tuple[Any, list[Any]]:
        async with Client(adapter(server.url, server.api_key), mode="legacy") as client:
            return await both(client)

    direct, direct_results = run(over_http())
    tools, results = run(stdio())
    assert [t.model_dump() for t in tools.tools] == [t.model_dump() for t in direct.tools]
    assert {t.name for t in tools.tools} == {"logs_search", "logs_errors", "logs_tail"}
    for (tool, _), got, want in zip(calls, results, direct_results, strict=True):
        assert got.model_dump() == want.model_dump(), tool
    assert payload(results[0])["rows"] and results[-1].is_error


def test_logs_tail_streams_its_rows_as_progress(server: Server, shop: dict[str, Any]) -> None:
    streamed: list[dict[str, Any]] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        assert message is not None
        streamed.extend(json.loads(line) for line in message.splitlines())

    def send() -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any(r["message"] == "live 2"
                                                       for r in streamed):
            httpx.post(f"{server.url}/v1/ingest", params={"key": shop["ingestKey"]}, timeout=10,
                       json={"context": {"boxId": "b2"},
                             "events": [{"message": f"live {i}"} for i in range(3)]})
            time.sleep(0.5)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        result = run(over_stdio(server.url, server.api_key, "logs_tail",
                                {"project": "shop", "seconds": 3}, progress))
    finally:
        sender.join(20)
    data = payload(result)
    assert any(row["message"] == "live 2" for row in data["rows"])
    assert streamed == data["rows"]  # each row as it came, then the whole in the result


def test_failures_are_clear_tool_errors_and_soon(server: Server, shop: dict[str, Any]) -> None:
    started = time.monotonic()
    wrong = run(over_stdio(server.url, "btk_wrong", "logs_search", {"project": "shop"}))
    assert "401" in error_text(wrong) and "BOXTRAIL_API_KEY" in error_text(wrong)
    down = f"http://127.0.0.1:{free_port()}"
    unreachable = run(over_stdio(down, server.api_key, "logs_search", {"project": "shop"}))
    assert "not reachable" in error_text(unreachable) and down in error_text(unreachable)
    assert time.monotonic() - started < 2 * BOUND_S


@pytest.fixture
def fixed(tmp_path: Path) -> Iterator[Server]:
    """A server on a port of its own, to be restarted on it."""
    srv = Server(tmp_path / "fixed", {"BOXTRAIL_PORT": str(free_port())}).start()
    yield srv
    srv.stop()


def test_a_server_restarted_mid_tail_ends_the_call_with_a_tool_error(fixed: Server) -> None:
    server = fixed
    with server.client() as api:
        create_project(api, "shop")
    got: dict[str, Any] = {}

    def tail() -> None:
        started = time.monotonic()
        got["result"] = run(over_stdio(server.url, server.api_key, "logs_tail",
                                       {"project": "shop", "seconds": 120}))
        got["took"] = time.monotonic() - started

    caller = threading.Thread(target=tail)
    caller.start()
    time.sleep(3)  # the tail is open
    killed = time.monotonic()
    server.kill()
    server.start()  # on the same port: the session the adapter had is unknown to it
    caller.join(BOUND_S + 10)
    assert not caller.is_alive(), "the call hung"
    assert time.monotonic() - killed < BOUND_S
    text = error_text(got["result"])
    print(text)
    assert "lost" in text or "not reachable" in text, text



def test_a_cancelled_call_lets_go_at_once_and_the_next_call_works(
        server: Server, shop: dict[str, Any]) -> None:
    """The host gives up on a logs_tail: the adapter lets go of it at once (and passes the
    cancellation on to /mcp) and answers the next call. (The server's stateless /mcp does
    not end a tool call on a cancellation yet: its tail runs to its ``seconds``.)"""

    def open_tails() -> float:
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("boxtrail_tail_subscribers "))

    async def give_up() -> None:
        async with Client(adapter(server.url, server.api_key), mode="legacy") as client:
            call = asyncio.ensure_future(client.call_tool("logs_tail",
                                                          {"project": "shop", "seconds": 60}))
            deadline = time.monotonic() + BOUND_S
            while open_tails() < 1:  # the server's tail is open
                assert time.monotonic() < deadline and not call.done()
                await asyncio.sleep(0.2)
            cancelled = time.monotonic()
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call
            assert time.monotonic() - cancelled < 1
            assert payload(await client.call_tool("logs_search", {"project": "shop"}))["rows"]

    run(give_up())


def test_a_quiet_tail_longer_than_a_minute_ends_as_the_server_ends_it(
        server: Server, shop: dict[str, Any]) -> None:
    """A ``logs_tail`` of 65 s on a box where nothing arrives (no row, so no progress to
    keep the call alive): the adapter waits the call's ``seconds``, and the answer is the
    server's, not a timeout reported as boxtrail being unreachable (it was cut at 60 s)."""
    call = over_stdio(server.url, server.api_key, "logs_tail",
                      {"project": "shop", "boxId": "quiet", "seconds": 65})
    result = asyncio.run(asyncio.wait_for(call, 65 + BOUND_S))  # run() bounds a call at 60 s
    assert not result.is_error, result
    answer = payload(result)
    assert answer["rows"] == [] and answer["seconds"] == 65, answer
