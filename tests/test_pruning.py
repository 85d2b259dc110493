"""The planner reads only the files whose time range overlaps the query, whatever the history."""

from __future__ import annotations

import time

import httpx

from tests.server import Server, create_project

DAY_MS = 86_400_000


def _wait_flushed(api: httpx.Client, project: str, files: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        r = api.get(f"/v1/projects/{project}/logs", params={"since": "1000d", "limit": 1})
        if int(r.headers["x-boxtrail-files-total"]) >= files:
            return
        time.sleep(0.1)
    raise AssertionError(f"{project}: fewer than {files} files after 20 s")


def _scanned(api: httpx.Client, project: str, since: str) -> tuple[int, int, int]:
    r = api.get(f"/v1/projects/{project}/logs", params={"since": since, "limit": 1000})
    assert r.status_code == 200, r.text
    return (int(r.headers["x-boxtrail-files-scanned"]), int(r.headers["x-boxtrail-files-total"]),
            len(r.json()["rows"]))


def test_since_10m_reads_only_overlapping_files(server: Server, api: httpx.Client) -> None:
    now = int(time.time() * 1000)
    results = {}
    for name, days in (("short", 3), ("long", 90)):
        key = str(create_project(api, name)["ingestKey"])
        # History: one file per (box, day), all older than a day.
        for day in range(1, days + 1):
            events = [{"ts": now - day * DAY_MS + i, "message": f"old {day}"} for i in range(5)]
            for box in ("a", "b"):
                r = httpx.post(f"{server.url}/v1/ingest", params={"key": key},
                               json={"context": {"boxId": box}, "events": events})
                assert r.status_code == 202
        _wait_flushed(api, name, 2 * days)
        recent = [{"ts": now - 60_000 + i, "message": "recent"} for i in range(7)]
        assert httpx.post(f"{server.url}/v1/ingest", params={"key": key},
                          json={"context": {"boxId": "a"}, "events": recent}).status_code == 202
        _wait_flushed(api, name, 2 * days + 1)
        results[name] = _scanned(api, name, "10m")
    assert results["short"] == (1, 7, 7)
    assert results["long"] == (1, 181, 7)
    # A wider window scans more files, and only those it needs.
    assert _scanned(api, "long", "36h")[0] == 1 + 2  # the recent file + day 1's two boxes
    # boxId narrows it further, through the catalog.
    r = api.get("/v1/projects/long/logs", params={"since": "36h", "boxId": "b"})
    assert r.headers["x-boxtrail-files-scanned"] == "1"
    assert {row["message"] for row in r.json()["rows"]} == {"old 1"}
    metrics = api.get("/metrics").text
    assert "boxtrail_query_files_pruned_total" in metrics


def test_a_later_page_reads_only_the_files_before_its_cursor(server: Server,
                                                             api: httpx.Client) -> None:
    now = int(time.time() * 1000)
    key = str(create_project(api, "pages")["ingestKey"])
    for day in range(10):  # one file per day, 10 rows each
        events = [{"ts": now - day * DAY_MS - i, "message": f"day {day}"} for i in range(10)]
        r = httpx.post(f"{server.url}/v1/ingest", params={"key": key},
                       json={"context": {"boxId": "a"}, "events": events})
        assert r.status_code == 202
    _wait_flushed(api, "pages", 10)
    scanned, seen, cursor = [], [], None
    while True:
        params: dict[str, str | int] = {"since": "30d", "limit": 10}
        if cursor:
            params["cursor"] = cursor
        r = api.get("/v1/projects/pages/logs", params=params)
        assert r.status_code == 200, r.text
        scanned.append(int(r.headers["x-boxtrail-files-scanned"]))
        seen += [row["message"] for row in r.json()["rows"]]
        cursor = r.json()["nextCursor"]
        if not cursor:
            break
    assert seen == [f"day {day}" for day in range(10) for _ in range(10)]
    # Page k (from 1) reads the files of days k-1..9: the file its cursor's row is in (more
    # rows may share that ms) and the older ones, never the newer ones again.
    assert scanned == [10] + [11 - page for page in range(1, 10)]
