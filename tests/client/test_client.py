"""The client (``boxtrail_client``), every call against a real server: search pages by
itself, errors come back symbolicated with maps it uploaded, keys, usage and deletions; the
async tail resumes across a server restart with every row once; and the client alone, in a
fresh virtualenv without the server, installs with no DuckDB, pyarrow or tree-sitter and
uploads the maps CI builds, and its commands (list, keys, search, usage, deletions) work there."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from boxtrail_client import ApiError, Client, ClientError
from tests.query.test_mcp import MINIFIED, MINIFIED_STACK, source_map
from tests.support.pgserver import free_port
from tests.support.server import Server, create_project

CLIENT_DIR = Path(__file__).resolve().parents[2] / "client"
SERVER_ONLY = ("duckdb", "pyarrow", "tree-sitter", "tree_sitter", "litestar", "boto3",
               "numpy", "symbolic")


def ingest(server: Server, key: str, events: list[dict[str, Any]], box: str = "b1") -> None:
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, timeout=10,
                   json={"context": {"boxId": box, "release": "r1"}, "events": events})
    assert r.status_code == 202 and r.json()["accepted"] == len(events), r.text


def test_every_call_against_a_real_server(server: Server, tmp_path: Path) -> None:
    with server.client() as api:
        project = create_project(api, "shop")
    ingest(server, str(project["ingestKey"]),
           [{"message": f"row {i}", "attrs": {"i": i}} for i in range(250)]
           + [{"level": "error", "message": "render failed",
               "error": {"type": "TypeError", "message": "x", "stack": MINIFIED_STACK}}])
    dist = tmp_path / "dist" / "assets"
    dist.mkdir(parents=True)
    (dist / "app.min.js").write_text(MINIFIED)
    (dist / "app.min.js.map").write_bytes(source_map())
    with Client(server.url, server.api_key) as bt:
        rows = list(bt.search("shop", "row", since="1h", page_size=100))
        assert len(rows) == 250 and len({r.id for r in rows}) == 250
        assert [r.ts for r in rows] == sorted((r.ts for r in rows), reverse=True)
        assert {r.attrs["i"] for r in rows} == set(range(250))
        assert [r.message for r in bt.search("shop", "row", limit=3)] == [
            r.message for r in rows[:3]]
        uploaded = bt.upload_sourcemaps("shop", tmp_path / "dist", release="r1")
        assert [f.name for f in uploaded.files] == ["assets/app.min.js"]
        [error] = bt.errors("shop", since="1h")
        assert error.error is not None
        assert [f.function for f in error.error.frames] == ["renderCart", "checkout"]
        assert bt.error_groups("shop")["groups"][0]["count"] == 1
        assert [f["name"] for f in bt.sourcemaps("shop", "r1")] == ["assets/app.min.js"]
        made = bt.create_key("billing", ["usage:read"])
        assert made["scopes"] == ["usage:read"]
        assert made["id"] in {k["id"] for k in bt.api_keys()}
        with Client(server.url, made["key"]) as billing:
            with pytest.raises(ApiError) as refused:
                list(billing.search("shop"))
            assert (refused.value.status, refused.value.code) == (403, "insufficient_scope")
        bt.revoke_key(made["id"])
        assert made["id"] not in {k["id"] for k in bt.api_keys()}
        deadline = time.monotonic() + 20
        while not (used := list(bt.usage(kinds=["ingest.events"], since="1h"))) and (
                time.monotonic() < deadline):
            time.sleep(0.2)
        assert sum(u.quantity for u in used) == 251 and used[0].unit == "events"
        job = bt.delete_rows("shop", query="row 7")
        assert bt.deletion(job["id"])["id"] == job["id"]
        assert [j["id"] for j in bt.deletions("shop")] == [job["id"]]
        assert bt.delete_sourcemaps("shop", "r1") == 1
        with pytest.raises(ApiError) as missing:
            list(bt.search("nope"))
        assert (missing.value.status, missing.value.code) == (404, "not_found")
    with pytest.raises(ClientError, match="cannot reach"):
        list(Client(f"http://127.0.0.1:{free_port()}", "btk_x").search("shop"))
    with pytest.raises(ClientError, match="BOXTRAIL_API_KEY"):
        Client(server.url, environ={})


@pytest.fixture
def fixed(tmp_path: Path) -> Iterator[Server]:
    """A server on a port of its own, restarted on it."""
    srv = Server(tmp_path / "fixed", {"BOXTRAIL_PORT": str(free_port())}).start()
    yield srv
    srv.stop()


def test_the_tail_iterator_resumes_across_a_restart_with_every_row_once(fixed: Server) -> None:
    server = fixed
    with server.client() as api:
        key = str(create_project(api, "live")["ingestKey"])
    acked: list[int] = []
    stop = threading.Event()

    def send() -> None:
        n = 0
        with httpx.Client(timeout=5) as http:
            while not stop.is_set() and n < 400:
                try:
                    r = http.post(f"{server.url}/v1/ingest", params={"key": key},
                                  json={"events": [{"message": f"n={n + i}"} for i in range(5)]})
                    if r.status_code == 202:
                        acked.extend(range(n, n + 5))
                        n += 5
                except httpx.HTTPError:
                    time.sleep(0.1)
                time.sleep(0.02)

    ids: list[str] = []

    async def follow() -> list[int]:
        seen: list[int] = []
        async for row in Client(server.url, server.api_key).tail("live"):
            ids.append(row.id)
            seen.append(int(row.message.removeprefix("n=")))
            if seen[-1] == 399:
                return seen
        raise AssertionError("the tail ended")

    async def scenario() -> list[int]:
        tail = asyncio.ensure_future(follow())
        await asyncio.sleep(1.0)
        sender = threading.Thread(target=send)
        sender.start()
        await asyncio.sleep(1.5)
        server.kill()  # mid-stream: the iterator reconnects with Last-Event-ID
        await asyncio.to_thread(server.start)
        try:
            return await asyncio.wait_for(tail, 60)
        finally:
            stop.set()
            await asyncio.to_thread(sender.join, 10)

    seen = asyncio.run(scenario())
    # No row twice. (A batch the server made durable as it was killed, before its 202,
    # was sent again by the sender: two rows with the same text, each shown once.)
    assert len(ids) == len(set(ids)), "a row came twice"
    assert ids == sorted(ids)  # in the order they became visible, across the restart
    assert set(acked) <= set(seen), sorted(set(acked) - set(seen))[:10]


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the client alone (``pip install ./client``)."""
    venv = tmp_path_factory.mktemp("client-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    started = time.monotonic()
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", str(CLIENT_DIR)],
                   check=True, timeout=300)
    print(f"client install: {time.monotonic() - started:.1f} s")
    return venv


def test_the_client_installs_without_the_server_s_engines(client_venv: Path) -> None:
    listed = subprocess.run([str(client_venv / "bin" / "pip"), "list", "--format=freeze"],
                            capture_output=True, text=True, check=True).stdout.lower()
    names = {line.split("==")[0] for line in listed.splitlines()}
    assert "boxtrail-client" in names
    assert not names & set(SERVER_ONLY), names & set(SERVER_ONLY)
    assert not (client_venv / "lib" / "python3.11" / "site-packages" / "boxtrail").exists()


def test_ci_uploads_maps_with_the_client_alone(client_venv: Path, server: Server,
                                               tmp_path: Path) -> None:
    with server.client() as api:
        project = create_project(api, "shop")
    dist = tmp_path / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "assets" / "app.min.js").write_text(MINIFIED)
    (dist / "assets" / "app.min.js.map").write_bytes(source_map())
    ci = subprocess.run([str(client_venv / "bin" / "boxtrail"), "sourcemaps", "upload",
                         str(dist), "-p", "shop", "--release", "r1"],
                        env={"BOXTRAIL_URL": server.url, "BOXTRAIL_API_KEY": server.api_key,
                             "PATH": "/usr/bin:/bin"},
                        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert ci.returncode == 0, ci.stderr
    assert "stored 1 source maps" in ci.stdout
    ingest(server, str(project["ingestKey"]), [
        {"level": "error", "message": "render failed",
         "error": {"type": "TypeError", "message": "x", "stack": MINIFIED_STACK}}])
    with Client(server.url, server.api_key) as bt:
        [error] = bt.errors("shop", since="1h")
    assert error.error is not None and error.error.frames[0].function == "renderCart"
    assert shutil.which("boxtrail", path=str(client_venv / "bin"))

    def command(*args: str) -> str:
        done = subprocess.run([str(client_venv / "bin" / "boxtrail"), *args],
                              env={"BOXTRAIL_URL": server.url,
                                   "BOXTRAIL_API_KEY": server.api_key, "PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout

    assert "assets/app.min.js" in command("sourcemaps", "list", "-p", "shop")
    made = command("keys", "create", "--name", "agent", "--scope", "read").strip()
    assert made.startswith("btk_")
    assert "agent" in command("keys", "list")
    assert "render failed" in command("search", "-p", "shop", "--since", "1h")
    deadline = time.monotonic() + 20
    while "ingest.events" not in (used := command("usage", "--since", "1h")) and (
            time.monotonic() < deadline):
        time.sleep(0.3)
    assert "ingest.events" in used
    assert command("deletions") == ""
