"""Small files of one (project, box, day) are merged; rows stay exactly once."""

from __future__ import annotations

import math
import time
from pathlib import Path

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.service import COMPACT_CHEAP_ROWS, COMPACT_MAX_ROWS, merge_set
from metadata.catalog import FileEntry
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


def _file(n: int, rows: int) -> FileEntry:
    return FileEntry(key=f"f{n:06d}", project_id="p", box="b", date="2026-12-07", min_ts=n,
                     max_ts=n, min_id=n, max_id=n, rows=rows, bytes=rows * 30)


@settings(max_examples=300, deadline=None)
@given(rounds=st.lists(st.lists(st.integers(1, 400_000), max_size=40), max_size=60),
       min_files=st.integers(2, 12))
def test_a_row_is_rewritten_a_logarithmic_number_of_times(rounds: list[list[int]],
                                                           min_files: int) -> None:
    """The compactor's rounds simulated over flushes of any sizes: each merge joins two
    files or more; the files it leaves apart each hold more rows than all the smaller
    ones together (so few are left); and a row goes through at most 2 + log2(rows /
    COMPACT_CHEAP_ROWS) merges that write more than one row group, where merging all
    small files at every round rewrote it at every round."""
    live: dict[str, tuple[FileEntry, int]] = {}  # key -> (file, its rows' costly rewrites)
    made = total = 0
    for flushes in rounds:
        for rows in flushes:
            made += 1
            total += rows
            live[f"f{made:06d}"] = (_file(made, rows), 0)
        small = [f for f, _ in live.values() if f.rows < COMPACT_MAX_ROWS]
        if len(small) < min_files:
            continue
        chosen = merge_set(small)
        assert chosen and {f.key for f in chosen} <= {f.key for f in small}
        merged = sum(f.rows for f in chosen)
        for f in small:
            if f not in chosen:
                assert f.rows > merged and f.rows + merged > COMPACT_CHEAP_ROWS
        if len(chosen) < 2:
            continue
        rewrites = max(live.pop(f.key)[1] for f in chosen) + (merged > COMPACT_CHEAP_ROWS)
        made += 1
        live[f"f{made:06d}"] = (_file(made, merged), rewrites)
        assert rewrites <= 2 + math.log2(max(total, COMPACT_CHEAP_ROWS) / COMPACT_CHEAP_ROWS)
        left = [f for f in small if f not in chosen]
        assert len(left) <= 1 + math.log2(max(total, 1))
