"""The MCP endpoint ``/mcp`` through the official ``mcp`` client over streamable HTTP.

Every tool is called against the real server, on both protocol eras the SDK speaks:
``legacy`` (the initialize handshake) and ``auto`` (which settles on the stateless
2026-07-28 protocol with this server).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp_types import CallToolResult, TextContent

from tests.support.server import Server, create_project

MODES = ["legacy", "auto"]
CALL_TIMEOUT_S = 60.0
T = TypeVar("T")

STACK = ("TypeError: Cannot read properties of undefined (reading 'id')\n"
         "    at renderCart (https://b1.box.parallelsandbox.com/assets/app.js:1:2045)\n"
         "    at onClick (https://b1.box.parallelsandbox.com/assets/app.js:1:990)")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("mcp") / "data").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def shop(server: Server) -> dict[str, Any]:
    """A project with rows in two boxes, one of them two hours old, and one error."""
    with server.client() as api:
        project = create_project(api, "shop")
    two_hours_ago = int(time.time() * 1000) - 2 * 3_600_000
    ingest(server, str(project["ingestKey"]), "b1", [
        {"level": "info", "message": "checkout started", "attrs": {"cart": 3}},
        {"level": "error", "message": "checkout failed",
         "error": {"type": "TypeError",
                   "message": "Cannot read properties of undefined (reading 'id')",
                   "stack": STACK}},
        {"level": "info", "message": "old checkout", "ts": two_hours_ago},
    ])
    ingest(server, str(project["ingestKey"]), "b2", [
        {"level": "warn", "message": "slow render", "attrs": {"ms": 870}},
        {"level": "info", "message": "checkout started"},
    ])
    return project


@pytest.fixture(scope="module")
def live(server: Server) -> dict[str, Any]:
    """A project of its own for the tails, so their rows do not reach other tests."""
    with server.client() as api:
        return create_project(api, "live")


def ingest(server: Server, key: str, box: str, events: list[dict[str, object]]) -> None:
    response = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, timeout=10,
                          json={"context": {"boxId": box}, "events": events})
    assert response.status_code == 202, response.text
    assert response.json()["accepted"] == len(events)


def run(coro: Awaitable[T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, CALL_TIMEOUT_S)
    return asyncio.run(bounded())


@asynccontextmanager
async def connect(server: Server, key: str, mode: str) -> AsyncIterator[Client]:
    # The SDK's transport takes its headers from the HTTP client it is handed.
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"},
                              timeout=httpx2.Timeout(30, read=CALL_TIMEOUT_S))
    async with http, Client(streamable_http_client(f"{server.url}/mcp", http_client=http),
                            mode=mode) as client:
        yield client


async def call(server: Server, mode: str, tool: str, arguments: dict[str, object],
               key: str | None = None, progress: ProgressFnT | None = None
               ) -> CallToolResult:
    async with connect(server, key or server.api_key, mode) as client:
        return await client.call_tool(tool, arguments, progress_callback=progress)


def payload(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    [content] = result.content
    assert isinstance(content, TextContent)
    data: dict[str, Any] = json.loads(content.text)
    assert result.structured_content == data
    return data


def error_text(result: CallToolResult) -> str:
    assert result.is_error
    [content] = result.content
    assert isinstance(content, TextContent)
    return content.text


def messages(data: dict[str, Any]) -> list[str]:
    return [row["message"] for row in data["rows"]]


def no_nulls(value: object) -> bool:
    if isinstance(value, dict):
        return all(v is not None and v != {} and v != [] and no_nulls(v)
                   for v in value.values())
    if isinstance(value, list):
        return all(no_nulls(v) for v in value)
    return True


# --- the tools as a model sees them ---------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_lists_the_three_tools_with_the_frozen_inputs(server: Server, mode: str) -> None:
    async def tools() -> dict[str, Any]:
        async with connect(server, server.api_key, mode) as client:
            return {t.name: t for t in (await client.list_tools()).tools}

    listed = run(tools())
    assert sorted(listed) == ["logs_errors", "logs_search", "logs_tail"]
    schemas = {name: tool.input_schema for name, tool in listed.items()}
    assert list(schemas["logs_search"]["properties"]) == ["project", "since", "query", "boxId"]
    assert list(schemas["logs_errors"]["properties"]) == ["project", "since", "boxId"]
    assert list(schemas["logs_tail"]["properties"]) == ["project", "boxId", "query", "seconds"]
    for schema in schemas.values():
        assert schema["required"] == ["project"]
    tail_seconds = schemas["logs_tail"]["properties"]["seconds"]
    assert (tail_seconds["default"], tail_seconds["maximum"]) == (30, 300)
    since = schemas["logs_search"]["properties"]["since"]["description"]
    assert all(form in since for form in ("30s", "10m", "2h", "7d", "1w", "ISO-8601"))
    assert "level:error" in schemas["logs_search"]["properties"]["query"]["description"]
    for tool in listed.values():
        assert tool.description and tool.annotations and tool.annotations.read_only_hint


# --- logs_search and logs_errors ------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_search_newest_first_with_each_filter(server: Server, shop: dict[str, Any],
                                              mode: str) -> None:
    def search(**arguments: object) -> dict[str, Any]:
        return payload(run(call(server, mode, "logs_search", {"project": "shop", **arguments})))

    everything = search()
    assert messages(everything) == ["checkout started", "slow render", "checkout failed",
                                    "checkout started"]
    assert everything["more"] is False
    assert no_nulls(everything)
    failed = everything["rows"][2]
    assert failed["boxId"] == "b1" and failed["level"] == "error"
    assert failed["error"] == {"type": "TypeError", "message": "Cannot read properties of "
                                                               "undefined (reading 'id')"}
    assert "url" not in failed and "release" not in failed and "attrs" not in failed
    assert everything["rows"][3]["attrs"] == {"cart": 3}

    # By id as well as by name.
    assert messages(search(project=shop["id"])) == messages(everything)
    assert messages(search(boxId="b2")) == ["checkout started", "slow render"]
    assert messages(search(query="checkout -started")) == ["checkout failed"]
    assert messages(search(query="level:error OR attr.ms:870")) == ["slow render",
                                                                    "checkout failed"]
    assert messages(search(query="checkout", boxId="b1")) == ["checkout failed",
                                                              "checkout started"]
    assert "old checkout" in messages(search(since="3h"))
    three_hours_ago = datetime.fromtimestamp(time.time() - 3 * 3600, UTC).isoformat()
    assert "old checkout" in messages(search(since=three_hours_ago))
    assert messages(search(since="2999-01-01T00:00:00Z")) == []


@pytest.mark.parametrize("mode", MODES)
def test_errors_carry_frames_and_a_fingerprint(server: Server, shop: dict[str, Any],
                                               mode: str) -> None:
    def errors(**arguments: object) -> dict[str, Any]:
        return payload(run(call(server, mode, "logs_errors", {"project": "shop", **arguments})))

    found = errors()
    assert no_nulls(found)
    [row] = found["rows"]
    assert row["message"] == "checkout failed" and row["boxId"] == "b1"
    assert len(row["fingerprint"]) == 32
    assert row["error"]["type"] == "TypeError"
    assert row["error"]["frames"] == [
        {"function": "renderCart", "file": "https://b1.box.parallelsandbox.com/assets/app.js",
         "line": 1, "column": 2045},
        {"function": "onClick", "file": "https://b1.box.parallelsandbox.com/assets/app.js",
         "line": 1, "column": 990},
    ]
    assert errors(boxId="b2")["rows"] == []
    assert errors(since="2999-01-01T00:00:00Z")["rows"] == []


# A minified build of SOURCE with its source map, written out by hand: each segment maps a
# column of the one minified line to (source line, column[, name]), all 0-based.
SOURCE = ("export function renderCart(cart) {\n  return cart.owner.name;\n}\n"
          "export function checkout(cart) {\n  return renderCart(cart);\n}\n")
MINIFIED = ("function n(t){return t.owner.name}function r(t){return n(t)}\n"
            "//# sourceMappingURL=app.min.js.map\n")
SEGMENTS = [(0, 0, 0, 0), (9, 0, 0, 16, 0), (14, 0, 1, 2), (21, 0, 1, 9, 1), (29, 0, 1, 20),
            (34, 0, 3, 0), (43, 0, 3, 16, 2), (48, 0, 4, 2), (55, 0, 4, 9, 0)]
MINIFIED_STACK = (
    "TypeError: Cannot read properties of undefined (reading 'name')\n"
    "    at n (https://shop.box.parallelsandbox.com/assets/app.min.js:1:30)\n"
    "    at r (https://shop.box.parallelsandbox.com/assets/app.min.js:1:56)")
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def vlq(value: int) -> str:
    rest = value << 1 if value >= 0 else (-value << 1) | 1
    digits = ""
    while True:
        digit, rest = rest & 31, rest >> 5
        digits += _B64[digit | (32 if rest else 0)]
        if not rest:
            return digits


def source_map() -> bytes:
    previous = [0] * 5
    encoded = []
    for segment in SEGMENTS:
        encoded.append("".join(vlq(v - previous[i]) for i, v in enumerate(segment)))
        previous[:len(segment)] = segment
    return json.dumps({"version": 3, "file": "app.min.js", "sources": ["src/cart.js"],
                       "sourcesContent": [SOURCE], "names": ["renderCart", "cart", "checkout"],
                       "mappings": ",".join(encoded)}).encode()


@pytest.mark.parametrize("mode", MODES)
def test_errors_frames_are_rewritten_with_uploaded_source_maps(server: Server,
                                                               mode: str) -> None:
    name = f"mapped-{mode}"
    with server.client() as api:
        key = str(create_project(api, name)["ingestKey"])
        uploaded = api.post(f"/v1/projects/{name}/sourcemaps", files=[
            ("file", ("assets/app.min.js", MINIFIED.encode(), "application/javascript")),
            ("file", ("assets/app.min.js.map", source_map(), "application/json"))])
        assert uploaded.status_code == 201, uploaded.text
    ingest(server, key, "b1", [{"level": "error", "message": "render failed",
                                "error": {"type": "TypeError", "message": "x",
                                          "stack": MINIFIED_STACK}}])
    data = payload(run(call(server, mode, "logs_errors", {"project": name})))
    assert data["rows"][0]["error"]["frames"] == [
        {"function": "renderCart", "file": "src/cart.js", "line": 2, "column": 21,
         "contextLine": "  return cart.owner.name;"},
        {"function": "checkout", "file": "src/cart.js", "line": 5, "column": 10,
         "contextLine": "  return renderCart(cart);"},
    ]


@pytest.mark.parametrize("mode", MODES)
def test_bad_arguments_are_error_results(server: Server, shop: dict[str, Any],
                                         mode: str) -> None:
    def refused(tool: str, **arguments: object) -> str:
        return error_text(run(call(server, mode, tool, {"project": "shop", **arguments})))

    assert "position 1" in refused("logs_search", query="((")
    assert "neither a duration" in refused("logs_search", since="yesterday")
    assert "neither a duration" in refused("logs_errors", since="5 minutes")
    assert "position" in refused("logs_tail", query='"open', seconds=1)
    assert "300" in refused("logs_tail", seconds=301)


# --- logs_tail -------------------------------------------------------------------------


def tail_while_sending(server: Server, mode: str, arguments: dict[str, object],
                       ping: Callable[[], None], send: Callable[[], None]
                       ) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    """Call logs_tail; ``ping`` until a row comes back (the tail listens), then ``send``.

    Returns the result, the rows streamed as progress notifications, and the call's time.
    """
    streamed: list[dict[str, Any]] = []
    listening = threading.Event()

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        assert message is not None and len(message.encode()) <= (64 << 10) + (40 << 10)
        streamed.extend(json.loads(line) for line in message.splitlines())
        listening.set()

    def sender() -> None:
        for _ in range(50):
            ping()
            if listening.wait(0.2):
                send()
                return

    thread = threading.Thread(target=sender)
    started = time.monotonic()
    thread.start()
    try:
        result = run(call(server, mode, "logs_tail", arguments, progress=progress))
    finally:
        thread.join(30)
    return payload(result), streamed, time.monotonic() - started


@pytest.mark.parametrize("mode", MODES)
def test_tail_streams_the_rows_that_arrive_while_it_is_open(server: Server,
                                                            live: dict[str, Any],
                                                            mode: str) -> None:
    key = str(live["ingestKey"])
    tag = f"tail-{mode}"

    def send() -> None:
        for i in range(3):
            ingest(server, key, "b1", [{"level": "info", "message": f"{tag} {i} b1"},
                                       {"level": "info", "message": f"noise {i}"}])
            ingest(server, key, "b2", [{"level": "info", "message": f"{tag} {i} b2"}])
            time.sleep(0.3)

    data, streamed, elapsed = tail_while_sending(
        server, mode, {"project": "live", "boxId": "b1", "query": tag, "seconds": 5},
        lambda: ingest(server, key, "b1", [{"level": "debug", "message": f"{tag} ping"}]), send)
    pings = sum(1 for m in messages(data) if m == f"{tag} ping")
    # Oldest first, only b1, only the query's rows.
    assert pings >= 1
    assert messages(data) == [f"{tag} ping"] * pings + [f"{tag} {i} b1" for i in range(3)]
    assert data["omitted"] == 0 and data["seconds"] == 5
    assert streamed == data["rows"]
    assert 5 <= elapsed < 5 + 10


@pytest.mark.parametrize("mode", MODES)
def test_tail_with_nothing_arriving_returns_when_its_time_is_up(server: Server,
                                                                live: dict[str, Any],
                                                                mode: str) -> None:
    started = time.monotonic()
    data = payload(run(call(server, mode, "logs_tail", {"project": "live", "seconds": 1})))
    assert data == {"rows": [], "omitted": 0, "seconds": 1}
    assert 1 <= time.monotonic() - started < 1 + 10


# --- large rows ------------------------------------------------------------------------


def big_rows(server: Server, key: str, tag: str, count: int = 80) -> None:
    """``count`` rows of ~15 KB each (ingest keeps messages up to 16 KB)."""
    for start in range(0, count, 20):
        ingest(server, key, "b1", [
            {"level": "error", "message": f"{tag} {i} " + "x" * 15_000,
             "error": {"type": "Error", "message": "y" * 15_000, "stack": STACK}}
            for i in range(start, min(count, start + 20))])


@pytest.mark.parametrize("mode", MODES)
def test_large_results_stop_at_a_byte_budget_the_client_accepts(server: Server,
                                                                 mode: str) -> None:
    # The SDK's client refuses an SSE event over 1 MiB: 80 rows of 30 KB would not fit.
    with server.client() as api:
        key = str(create_project(api, f"big-{mode}")["ingestKey"])
    big_rows(server, key, "big")
    for tool in ("logs_search", "logs_errors"):
        data = payload(run(call(server, mode, tool, {"project": f"big-{mode}"})))
        assert 4 <= len(data["rows"]) < 80 and data["more"] is True
        assert len(json.dumps(data)) <= 256 << 10
        assert data["rows"][0]["message"].startswith("big 79 ")  # newest first

    data, streamed, _ = tail_while_sending(
        server, mode, {"project": f"big-{mode}", "seconds": 3},
        lambda: ingest(server, key, "b2", [{"level": "info", "message": "ping"}]),
        lambda: big_rows(server, key, "tail"))
    tails = [row["message"].split(" ")[:2] for row in streamed if row["message"] != "ping"]
    assert tails == [["tail", str(i)] for i in range(80)]
    assert 4 <= len(data["rows"]) < 80
    assert data["omitted"] == len(streamed) - len(data["rows"])
    assert data["rows"][-1]["message"].startswith("tail 79 ")  # the newest are kept


# --- auth and tenants ------------------------------------------------------------------


def test_another_tenant_sees_no_such_project_on_every_tool(server: Server,
                                                           shop: dict[str, Any]) -> None:
    env = {"BOXTRAIL_DATA_DIR": str(server.data_dir), "PATH": "/usr/bin:/bin"}
    other = subprocess.run([sys.executable, "-m", "boxtrail", "keys", "create", "--tenant",
                            "other"], env=env, capture_output=True, text=True, check=True,
                           timeout=60).stdout.strip()
    for mode in MODES:
        for tool, extra in (("logs_search", {}), ("logs_errors", {}),
                            ("logs_tail", {"seconds": 1})):
            for ref in ("shop", shop["id"]):
                foreign = error_text(run(call(server, mode, tool, {"project": ref, **extra},
                                              key=other)))
                missing = error_text(run(call(server, mode, tool,
                                              {"project": ref + "-x", **extra})))
                assert "no such project" in foreign
                # Exactly what a project that does not exist gives.
                assert foreign == missing.replace(ref + "-x", ref)
                assert "checkout" not in foreign


def test_requests_without_a_valid_key_are_refused(server: Server) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    for headers in ({}, {"Authorization": "Bearer btk_nope"}, {"Authorization": "Basic x"}):
        response = httpx.post(f"{server.url}/mcp", json=body, headers=headers, timeout=10)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "unauthorized"
    response = httpx.post(f"{server.url}/mcp/other", json=body, timeout=10,
                          headers={"Authorization": f"Bearer {server.api_key}"})
    assert response.status_code == 404


def test_the_server_stops_cleanly_with_the_endpoint_mounted(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data").start()
    run(call(srv, "legacy", "logs_search", {"project": "nope"}))
    run(call(srv, "auto", "logs_search", {"project": "nope"}))
    started = time.monotonic()
    srv.stop()
    # SIGTERM is re-raised by uvicorn once it has shut down: -15, not a SIGKILL (-9).
    assert srv.proc is not None and srv.proc.returncode == -15, "".join(srv.output)
    assert time.monotonic() - started < 5  # well within the 10 s graceful shutdown
    assert "Traceback" not in "".join(srv.output)
