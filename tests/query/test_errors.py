"""logs_errors: error rows with parsed frames, fingerprints and groups.

The tests share one server, each on a project of its own name (its rows, groups and
counts are the project's): a server per test was half of their time."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.server import Server, create_project

STACK = """TypeError: Cannot read properties of undefined (reading 'id')
    at renderCart (https://{box}.box.example/assets/app.js?v={v}:1:{col})
    at https://{box}.box.example/assets/app.js?v={v}:1:900
    at Array.map (<anonymous>)"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("errors") / "data").start()
    yield srv
    srv.stop()


def error(box: str, user: int, col: int = 120) -> dict[str, object]:
    return {"level": "error", "message": f"cart failed for user {user}",
            "error": {"type": "TypeError",
                      "message": f"Cannot read properties of undefined (reading 'id') {user}",
                      "stack": STACK.format(box=box, v=user, col=col)}}


def test_errors_with_frames_and_fingerprints(server: Server, api: httpx.Client) -> None:
    key = str(create_project(api, "e")["ingestKey"])
    events = [error("b1", 1), error("b2", 2), {"level": "info", "message": "fine"},
              {"level": "warn", "message": "handled", "error": {"type": "RangeError",
                                                                 "message": "too big"}},
              {"level": "error", "message": "plain error line"}]
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key},
                   json={"context": {"release": "1.0"}, "events": events})
    assert r.json()["accepted"] == 5
    response = api.get("/v1/projects/e/errors", params={"since": "1h"})
    scanned = int(response.headers["x-boxtrail-files-scanned"])
    assert 0 <= scanned <= int(response.headers["x-boxtrail-files-total"])
    rows = response.json()["rows"]
    assert [row["message"] for row in rows] == [
        "plain error line", "handled", "cart failed for user 2", "cart failed for user 1"]
    cart = rows[2]
    assert cart["error"]["type"] == "TypeError"
    assert cart["error"]["rawStack"].startswith("TypeError: Cannot read")
    frames = cart["error"]["frames"]
    assert [(f["function"], f["line"], f["column"]) for f in frames] == [
        ("renderCart", 1, 120), (None, 1, 900), ("Array.map", None, None)]
    assert frames[0]["file"] == "https://b2.box.example/assets/app.js?v=2"
    assert [f["problem"] for f in frames] == ["missing_sourcemap", "missing_sourcemap", None]
    assert all(f["symbolicated"] is False for f in frames)
    # Same error from another box and user: same fingerprint; other errors differ.
    assert rows[2]["fingerprint"] == rows[3]["fingerprint"]
    assert len({row["fingerprint"] for row in rows}) == 3
    assert rows[1]["error"]["frames"] == [] and rows[0]["error"]["type"] is None


def test_group_by_fingerprint(server: Server, api: httpx.Client) -> None:
    key = str(create_project(api, "g")["ingestKey"])
    sent = [(f"b{i % 3}", error(f"b{i % 3}", i)) for i in range(7)]
    sent.append(("b9", error("b9", 9, col=555)))
    for box, event in sent:
        r = httpx.post(f"{server.url}/v1/ingest", params={"key": key},
                       json={"context": {"boxId": box}, "events": [event]})
        assert r.json()["accepted"] == 1
    body = api.get("/v1/projects/g/errors", params={"groupBy": "fingerprint"}).json()
    assert body["truncated"] is False and body["scannedRows"] == 8
    groups = body["groups"]
    # A different column is the same frame: one group of 8.
    assert [g["count"] for g in groups] == [8]
    assert groups[0]["boxes"] == ["b0", "b1", "b2", "b9"]
    assert groups[0]["firstSeen"] <= groups[0]["lastSeen"]
    assert groups[0]["sample"]["error"]["type"] == "TypeError"
    bad = api.get("/v1/projects/g/errors", params={"groupBy": "box"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_parameter"


def test_group_by_returns_the_largest_groups_up_to_limit(server: Server,
                                                         api: httpx.Client) -> None:
    key = str(create_project(api, "many")["ingestKey"])
    # Five distinct errors (different messages): 5, 4, 3, 2 and 1 of each.
    events = [{"level": "error", "message": f"failure kind {'abcde'[k]}",
               "error": {"type": f"E{'abcde'[k]}", "message": f"kind {'abcde'[k]}"}}
              for k in range(5) for _ in range(5 - k)]
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, json={"events": events})
    assert r.json()["accepted"] == 15
    body = api.get("/v1/projects/many/errors",
                   params={"groupBy": "fingerprint", "limit": 2}).json()
    assert [g["count"] for g in body["groups"]] == [5, 4]
    assert body["groupsTotal"] == 5 and body["scannedRows"] == 15
    assert api.get("/v1/projects/many/errors",
                   params={"groupBy": "fingerprint", "limit": 0}).status_code == 400
