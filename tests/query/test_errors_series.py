"""``/errors?groupBy=fingerprint``: each group's sparkline over the window, through the real
server (MCP's ``logs_errors`` never groups: tests/query/test_mcp.py holds its answer)."""

from __future__ import annotations

import time
from datetime import datetime

import httpx

from tests.support.server import Server, create_project

HOUR = 3_600_000
WIDTH = 2 * HOUR // 24  # since=2h: 24 buckets of five minutes


def error(kind: str, ts: int) -> dict[str, object]:
    return {"ts": ts, "level": "error", "message": f"{kind} failed",
            "error": {"type": f"{kind}Error", "message": f"{kind} broke"}}


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000 + 0.5)


def test_each_group_counts_its_rows_per_bucket(server: Server, api: httpx.Client) -> None:
    key = str(create_project(api, "s")["ingestKey"])
    start = int(time.time() * 1000) - 2 * HOUR
    # Mid-bucket, so the request's own "now" (a moment later) cannot move a row across.
    buckets = {"Range": [0, 0, 5, 23], "Type": [10, 10, 10, 17], "Late": [23]}
    events = [error(kind, start + index * WIDTH + WIDTH // 2)
              for kind, indexes in buckets.items() for index in indexes]
    events.append(error("Range", start - HOUR))  # before the window: not read at all
    events.append(error("Late", int(time.time() * 1000) + 120_000))  # a clock 2 min ahead
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, json={"events": events})
    assert r.json()["accepted"] == len(events), r.text

    body = api.get("/v1/projects/s/errors", params={"since": "2h", "groupBy": "fingerprint"}
                   ).json()
    assert abs(ms(body["seriesStart"]) - start) < 5_000
    assert abs(body["seriesBucketSeconds"] * 1000 - WIDTH) < 1_000
    groups = {g["sample"]["error"]["type"]: g for g in body["groups"]}
    assert sorted(groups) == ["LateError", "RangeError", "TypeError"]
    for kind, indexes in buckets.items():
        group = groups[f"{kind}Error"]
        assert len(group["series"]) == 24
        assert sum(group["series"]) == group["count"]
        wanted = [0] * 24
        for index in indexes:
            wanted[index] += 1
        if kind == "Late":
            wanted[23] += 1  # stamped after the window's end: counted in its last bucket
        assert group["series"] == wanted, kind

    # Nothing in the window: no groups, the series' frame all the same.
    empty = api.get("/v1/projects/s/errors",
                    params={"since": "1m", "groupBy": "fingerprint", "boxId": "none"}).json()
    assert empty["groups"] == [] and empty["seriesBucketSeconds"] == 2.5
    # Without groupBy the rows are as they were: no series anywhere.
    rows = api.get("/v1/projects/s/errors", params={"since": "2h"}).json()
    assert set(rows) == {"rows"} and all("series" not in row for row in rows["rows"])
