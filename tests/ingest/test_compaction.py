"""Small files of one (project, box, day) are merged; rows stay exactly once."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.support.server import Server, create_project, search_all


def wait_for_files(api: httpx.Client, count: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        r = api.get("/v1/projects/c/logs", params={"since": "1h", "limit": 1})
        if int(r.headers["x-boxtrail-files-total"]) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} files after 20 s")


def test_small_files_are_merged(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", {"BOXTRAIL_COMPACT_INTERVAL_S": "1",
                                        "BOXTRAIL_COMPACT_MIN_FILES": "5"}).start()
    try:
        with server.client() as api:
            key = str(create_project(api, "c")["ingestKey"])
            for n in range(5):  # each batch flushed on its own: five small files
                events = [{"message": f"{n}-{i}", "attrs": {"n": n}} for i in range(20)]
                r = httpx.post(f"{server.url}/v1/ingest", params={"key": key},
                               json={"context": {"boxId": "box1"}, "events": events})
                assert r.status_code == 202
                wait_for_files(api, n + 1)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                r = api.get("/v1/projects/c/logs", params={"since": "1h", "limit": 1})
                if r.headers["x-boxtrail-files-total"] == "1":
                    break
                time.sleep(0.2)
            assert r.headers["x-boxtrail-files-total"] == "1"
            rows = search_all(api, "c", since="1h")
            assert sorted(row["message"] for row in rows) == sorted(
                f"{n}-{i}" for n in range(5) for i in range(20))
            metrics = api.get("/metrics").text
            assert 'boxtrail_parquet_files_written_total{by="compaction"} 1' in metrics
        # The merged file is the one live file; the five it replaced wait out their grace
        # period for queries still reading them, then go.
        files = list((tmp_path / "data" / "objects").rglob("*.parquet"))
        assert len(files) == 6
    finally:
        server.stop()
