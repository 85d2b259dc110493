"""Data written before a column was added (``error_frames``) stays readable: WAL records
replay, Parquet files (layout 1 in the catalog) are searched and their errors read, and
compaction merges them with files that have it."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx
import msgspec
import pyarrow.parquet as pq

from core.schema import RowBatch, to_table
from ingest.wal import _decoder as wal_decoder
from tests.support.server import Server, create_project, search_all

STACK = "TypeError: x\n    at f (https://b.example/app.js:1:5)"


def test_a_wal_record_without_the_column_decodes() -> None:
    batch = RowBatch(project_id="p", box=None, session_id=None, release=None, user_agent=None,
                     sdk=None, debug_ids=None, received=1, id_start=7, ts=[1, 2],
                     level=["info", "error"], message=["a", "b"], url=[None, None],
                     attrs=[None, None], error_type=[None, "E"], error_message=[None, "m"],
                     error_stack=[None, STACK], truncated=[None, None])
    old = msgspec.msgpack.encode(msgspec.to_builtins(batch)[:-1])  # as written before
    decoded = wal_decoder.decode(old)
    assert decoded.error_frames == []
    assert to_table([decoded]).column("error_frames").to_pylist() == [None, None]


def _make_old(data: Path) -> int:
    """The files as a build before ``error_frames`` wrote them, and the catalog as the
    metadata upgrade leaves it for them (layout 1)."""
    files = list((data / "objects").rglob("*.parquet"))
    for path in files:
        table = pq.read_table(path)
        pq.write_table(table.drop_columns(["error_frames"]), path)
    con = sqlite3.connect(data / "meta.sqlite")
    with con:
        con.execute("UPDATE files SET layout = 1")
    con.close()
    return len(files)


def test_old_files_are_read_and_merged(tmp_path: Path) -> None:
    env = {"BOXTRAIL_COMPACT_INTERVAL_S": "1", "BOXTRAIL_COMPACT_MIN_FILES": "3"}
    server = Server(tmp_path / "data", {"BOXTRAIL_COMPACT_MIN_FILES": "1000"}).start()
    with server.client() as api:
        key = str(create_project(api, "old")["ingestKey"])
        for n in range(2):
            r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, json={
                "context": {"boxId": "b"}, "events": [
                    {"level": "error", "message": f"old {n}",
                     "error": {"type": "TypeError", "message": "x", "stack": STACK}}]})
            assert r.status_code == 202
            time.sleep(1.2)  # flushed on its own
    server.stop()
    assert _make_old(tmp_path / "data") == 2

    server = Server(tmp_path / "data", env).start()
    try:
        with server.client() as api:
            r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, json={
                "context": {"boxId": "b"}, "events": [{"message": "new"}]})
            assert r.status_code == 202
            errors = api.get("/v1/projects/old/errors", params={"since": "1h"}).json()["rows"]
            assert sorted(e["message"] for e in errors) == ["old 0", "old 1"]
            assert errors[0]["error"]["frames"][0]["function"] == "f"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the three files merged into one
                r = api.get("/v1/projects/old/logs", params={"since": "1h", "limit": 1})
                if r.headers["x-boxtrail-files-total"] == "1":
                    break
                time.sleep(0.2)
            assert r.headers["x-boxtrail-files-total"] == "1"
            assert sorted(row["message"] for row in search_all(api, "old", "1h")) == [
                "new", "old 0", "old 1"]
    finally:
        server.stop()
