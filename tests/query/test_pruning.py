"""The planner reads only the files whose time range overlaps the query, whatever the history.

The tests share one server, each on projects of their own names (the file counts and
scans they check are per project). The projects of one test are written side by side,
each flush making every project's next file at once: waiting for flushes one project
after another was most of the module's time."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.server import Server, create_project

DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("pruning") / "data").start()
    yield srv
    srv.stop()


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
    plan = (("short", 3), ("long", 90))
    keys = {name: str(create_project(api, name)["ingestKey"]) for name, _ in plan}
    # History: one file per (box, day), all older than a day.
    for name, days in plan:
        for day in range(1, days + 1):
            events = [{"ts": now - day * DAY_MS + i, "message": f"old {day}"} for i in range(5)]
            for box in ("a", "b"):
                r = httpx.post(f"{server.url}/v1/ingest", params={"key": keys[name]},
                               json={"context": {"boxId": box}, "events": events})
                assert r.status_code == 202
    for name, days in plan:
        _wait_flushed(api, name, 2 * days)
    recent = [{"ts": now - 60_000 + i, "message": "recent"} for i in range(7)]
    for name, _ in plan:
        assert httpx.post(f"{server.url}/v1/ingest", params={"key": keys[name]},
                          json={"context": {"boxId": "a"}, "events": recent}).status_code == 202
    for name, days in plan:
        _wait_flushed(api, name, 2 * days + 1)
    results = {name: _scanned(api, name, "10m") for name, _ in plan}
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


def test_a_page_reads_only_the_newest_files_that_hold_it(server: Server,
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
    # A page never reads the files newer than its cursor again. Page 1 reads the latest
    # stretch its files' rows per ms say holds it twice over (11 rows: one past the page
    # says whether there is a next): days 0-1. A later page starts at its cursor's day
    # (more rows may share that ms), finds the next day's 10 rows one short, and a
    # longer stretch would read over a quarter of these small files: it reads them all.
    assert scanned == [2, 10, 9, 8, 7, 6, 5, 4, 3, 2]


def test_pages_over_overlapping_files_and_tied_timestamps_are_the_one_ordering(
        server: Server, api: httpx.Client) -> None:
    """Newest-first reading stops early only when no file left out can hold a row of the
    page: files whose times overlap or not, rows sharing a millisecond across files,
    filters that leave a file with no match, all page like one sorted read."""
    rng = random.Random(3)
    now = int(time.time() * 1000)
    # Six rounds, each its own file per box. "overlap": all over the same 40 ms (ties
    # everywhere); "mixed": odd rounds so, even ones each over a second of their own;
    # "same": every row at one millisecond (the order is the ids').
    projects = (("overlap", (), 40), ("mixed", (0, 2, 4), 40), ("same", (), 1))
    rounds: dict[str, list[list[tuple[str, list[dict[str, object]]]]]] = {}
    for project, apart, spread in projects:
        rounds[project] = []
        for flush in range(6):
            start = now - 3_600_000 + (1000 * (flush + 1) if flush in apart else 0)
            rounds[project].append([
                (box, [{"ts": start + rng.randrange(spread), "message": f"r{flush}",
                        "level": rng.choice(["info", "info", "info", "error"])}
                       for _ in range(rng.randrange(1, 12))])
                for box in ("c", "b", "a")])  # ids against the files' (box) order
    keys = {project: str(create_project(api, project)["ingestKey"]) for project in rounds}
    for flush in range(6):  # a round of every project, then its flush
        for project, sent in rounds.items():
            for box, events in sent[flush]:
                r = httpx.post(f"{server.url}/v1/ingest", params={"key": keys[project]},
                               json={"context": {"boxId": box}, "events": events})
                assert r.status_code == 202
        for project in rounds:
            _wait_flushed(api, project, 3 * (flush + 1))

    def pages(project: str, limit: int, **params: str) -> list[str]:
        ids: list[str] = []
        cursor = None
        while True:
            query: dict[str, str | int] = {"since": "2h", "limit": limit, **params}
            if cursor:
                query["cursor"] = cursor
            r = api.get(f"/v1/projects/{project}/logs", params=query)
            assert r.status_code == 200, r.text
            assert len(r.json()["rows"]) <= limit
            ids += [row["id"] for row in r.json()["rows"]]
            cursor = r.json()["nextCursor"]
            if not cursor:
                return ids

    def check(project: str, params: dict[str, str]) -> None:
        whole = api.get(f"/v1/projects/{project}/logs",
                        params={"since": "2h", "limit": 1000, **params}).json()["rows"]
        assert whole, params
        stamps = [(row["ts"], row["id"]) for row in whole]
        assert stamps == sorted(stamps, reverse=True)
        for limit in (1, 2, 5, 17):
            assert pages(project, limit, **params) == [row["id"] for row in whole], (
                project, limit, params)

    # ~1,500 pages, read four at a time (the rows no longer change): one after another,
    # waiting on each answer, they took 15 s.
    checks = [(project, params) for project, _, _ in projects
              for params in ({}, {"boxId": "b"}, {"query": "level:error"},
                             {"query": "r5 OR r0"})]
    with ThreadPoolExecutor(4) as pool:
        for done in [pool.submit(check, *args) for args in checks]:
            done.result()  # re-raises a check's failure
