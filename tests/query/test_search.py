"""logs_search: filters through the real server, and pagination while logs arrive.

The tests share one server, each on a project of its own name (it reads that project's
rows only): a server per test was half of the module's time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.server import Server, create_project


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("search") / "data").start()
    yield srv
    srv.stop()


def test_search_filters(server: Server, api: httpx.Client) -> None:
    key = str(create_project(api, "f")["ingestKey"])
    batches = [
        ("b1", "1.0", [{"level": "info", "message": "user signed in", "attrs": {"plan": "pro"}},
                       {"level": "error", "message": "checkout failed",
                        "error": {"type": "TypeError", "message": "x is undefined"}}]),
        ("b2", "2.0", [{"level": "warn", "message": "slow checkout", "url": "https://a/cart"},
                       {"level": "info", "message": "user signed out",
                        "attrs": {"plan": "free"}}]),
    ]
    for box, release, events in batches:
        r = httpx.post(f"{server.url}/v1/ingest", params={"key": key},
                       json={"context": {"boxId": box, "release": release,
                                         "sessionId": f"s-{box}"}, "events": events})
        assert r.status_code == 202

    def found(query: str, **params: str) -> list[str]:
        r = api.get("/v1/projects/f/logs", params={"query": query, **params})
        assert r.status_code == 200, r.text
        return sorted(row["message"] for row in r.json()["rows"])

    assert found("checkout") == ["checkout failed", "slow checkout"]
    assert found("checkout -level:warn") == ["checkout failed"]
    assert found('"signed in" OR type:TypeError') == ["checkout failed", "user signed in"]
    assert found("release:2.*") == ["slow checkout", "user signed out"]
    assert found("attr.plan:pro") == ["user signed in"]
    assert found("session:s-b1 level:info") == ["user signed in"]
    assert found("url:*cart") == ["slow checkout"]
    assert found("/sign(ed)? (in|out)/") == ["user signed in", "user signed out"]
    assert found("undefined") == ["checkout failed"]  # error text is searched too
    assert found("user", boxId="b2") == ["user signed out"]
    bad = api.get("/v1/projects/f/logs", params={"query": "level:error )"})
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == "invalid_query"
    assert bad.json()["error"]["detail"]["position"] == 12


def test_pagination_has_no_gaps_or_repeats_while_ingest_continues(server: Server,
                                                                  api: httpx.Client) -> None:
    key = str(create_project(api, "p")["ingestKey"])
    now = int(time.time() * 1000)
    for start in range(0, 2500, 500):  # 2,500 rows over the last 20 minutes, some same-ms
        events = [{"ts": now - 1_200_000 + (n // 2) * 900, "message": f"old {n}"}
                  for n in range(start, start + 500)]
        assert httpx.post(f"{server.url}/v1/ingest", params={"key": key},
                          json={"events": events}).status_code == 202
    stop = threading.Event()

    def keep_ingesting() -> None:
        with httpx.Client() as client:
            n = 0
            while not stop.is_set():
                client.post(f"{server.url}/v1/ingest", params={"key": key},
                            json={"events": [{"message": f"new {n + i}"} for i in range(20)]})
                n += 20
                time.sleep(0.01)

    writer = threading.Thread(target=keep_ingesting)
    writer.start()
    try:
        time.sleep(0.3)
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            params: dict[str, str | int] = {"since": "30m", "limit": 100, "query": "old"}
            if cursor:
                params["cursor"] = cursor
            page = api.get("/v1/projects/p/logs", params=params).json()
            seen += [row["message"] for row in page["rows"]]
            pages += 1
            cursor = page["nextCursor"]
            if not cursor:
                break
            time.sleep(0.02)  # the flusher moves rows to Parquet under our feet
    finally:
        stop.set()
        writer.join(10)
    assert pages == 25
    assert len(seen) == 2500 and len(set(seen)) == 2500
    assert set(seen) == {f"old {n}" for n in range(2500)}
