"""Ingest -> read back through the real server: the newcomer's first five minutes.

The tests share one server, each on a project of its own name (one restarts it, which
the others do not mind): a server per test was 1.5 s of each ~2 s test. The one that
lists every project of the tenant starts its own."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.server import Server, create_project, search_all


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("ingest-api") / "data").start()
    yield srv
    srv.stop()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "data").start()
    yield srv
    srv.stop()


@pytest.fixture
def own_api(own_server: Server) -> Iterator[httpx.Client]:
    with own_server.client() as client:
        yield client


def _ingest(server: Server, key: str, body: object, **headers: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/ingest", params={"key": key}, json=body,
                      headers=headers, timeout=10)


def test_post_then_read_back_within_a_second_and_after_restart(server: Server,
                                                                api: httpx.Client) -> None:
    project = create_project(api, "shop")
    assert project["name"] == "shop" and str(project["id"]).startswith("prj_")
    events = [{"level": lvl, "message": f"m{i}", "attrs": {"i": i}}
              for i, lvl in enumerate(["debug", "info", "warn", "error"])]
    sent = time.monotonic()
    r = _ingest(server, str(project["ingestKey"]),
                {"context": {"sessionId": "s1", "release": "1.0", "boxId": "b1"},
                 "events": events})
    assert r.status_code == 202 and r.json() == {"accepted": 4, "rejected": []}
    rows = api.get("/v1/projects/shop/logs", params={"since": "5m"}).json()["rows"]
    assert time.monotonic() - sent < 1.0
    assert [row["message"] for row in rows] == ["m3", "m2", "m1", "m0"]
    assert rows[0]["level"] == "error" and rows[0]["boxId"] == "b1"
    assert rows[0]["sessionId"] == "s1" and rows[0]["release"] == "1.0"
    assert rows[0]["attrs"] == {"i": 3}
    # By project id too.
    by_id = api.get(f"/v1/projects/{project['id']}/logs").json()["rows"]
    assert len(by_id) == 4

    server.stop()
    server.start()
    with server.client() as again:
        rows = search_all(again, "shop")
        assert sorted(row["message"] for row in rows) == ["m0", "m1", "m2", "m3"]


def test_rows_survive_the_flush_to_parquet(server: Server, api: httpx.Client) -> None:
    project = create_project(api, "flushy")
    key = str(project["ingestKey"])
    for batch in range(3):
        events = [{"message": f"b{batch}-{i}"} for i in range(50)]
        assert _ingest(server, key, {"events": events}).status_code == 202
    deadline = time.monotonic() + 10
    while True:  # the flusher runs every 0.5 s in tests
        r = api.get("/v1/projects/flushy/logs", params={"since": "1h", "limit": 1})
        if int(r.headers["x-boxtrail-files-total"]) >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert int(r.headers["x-boxtrail-files-total"]) >= 1
    rows = search_all(api, "flushy")
    assert len(rows) == 150 and len({row["id"] for row in rows}) == 150
    assert list(server.data_dir.glob("objects/logs/project=*/box=_/date=*/*.parquet"))


def test_box_id_from_origin_wins_over_context(server: Server, api: httpx.Client) -> None:
    project = create_project(api, "boxes")
    r = _ingest(server, str(project["ingestKey"]),
                {"context": {"boxId": "claimed"}, "events": [{"message": "x"}]},
                Origin="https://real7.box.parallelsandbox.com")
    assert r.status_code == 202
    assert r.headers["access-control-allow-origin"] == "https://real7.box.parallelsandbox.com"
    rows = api.get("/v1/projects/boxes/logs", params={"boxId": "real7"}).json()["rows"]
    assert [row["boxId"] for row in rows] == ["real7"]
    assert api.get("/v1/projects/boxes/logs", params={"boxId": "claimed"}).json()["rows"] == []


def test_allowed_origins_and_preflight(server: Server, api: httpx.Client) -> None:
    project = create_project(api, "strict", ["https://*.box.parallelsandbox.com"])
    key = str(project["ingestKey"])
    ok = httpx.options(f"{server.url}/v1/ingest", params={"key": key},
                       headers={"Origin": "https://a1.box.parallelsandbox.com",
                                "Access-Control-Request-Method": "POST"})
    assert ok.status_code == 204
    assert ok.headers["access-control-allow-origin"] == "https://a1.box.parallelsandbox.com"
    assert "POST" in ok.headers["access-control-allow-methods"]
    bad = httpx.options(f"{server.url}/v1/ingest", params={"key": key},
                        headers={"Origin": "https://evil.example.com"})
    assert bad.status_code == 403
    r = _ingest(server, key, {"events": [{"message": "x"}]}, Origin="https://evil.example.com")
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    r = _ingest(server, key, {"events": [{"message": "x"}]},
                Origin="https://a1.box.parallelsandbox.com")
    assert r.status_code == 202


def test_projects_are_per_tenant(own_server: Server, own_api: httpx.Client) -> None:
    """On a server of its own: the tenant's list holds its one project."""
    create_project(own_api, "mine")
    assert own_api.post("/v1/projects", json={"name": "mine"}).status_code == 409
    other_key = subprocess.run(
        [sys.executable, "-m", "boxtrail", "keys", "create", "--tenant", "other"],
        env={"BOXTRAIL_DATA_DIR": str(own_server.data_dir), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True).stdout.strip()
    with httpx.Client(base_url=own_server.url, headers={"Authorization": f"Bearer {other_key}"}
                      ) as other:
        assert other.get("/v1/projects").json() == []
        for path in ("/v1/projects/mine", "/v1/projects/mine/logs",
                     "/v1/projects/mine/errors", "/v1/projects/mine/tail"):
            r = other.get(path)
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        # The same name is free in another tenant.
        assert other.post("/v1/projects", json={"name": "mine"}).status_code == 201
    names = [p["name"] for p in own_api.get("/v1/projects").json()]
    assert names == ["mine"]


def test_dev_key_file_is_private(server: Server) -> None:
    mode = (server.data_dir / "dev-api-key").stat().st_mode & 0o777
    assert mode == 0o600
    assert any("boxtrail listening on http://127.0.0.1:" in line for line in server.output)


def test_health_and_metrics(server: Server, api: httpx.Client) -> None:
    assert api.get("/healthz").json() == {"status": "ok"}
    assert api.get("/readyz").json() == {"status": "ready"}
    metrics = api.get("/metrics").text
    for name in ("boxtrail_events_accepted_total", "boxtrail_wal_bytes",
                 "boxtrail_flush_seconds_count", "boxtrail_parquet_files"):
        assert name in metrics
    schema = api.get("/schema/openapi.json").json()
    assert "/v1/ingest" in schema["paths"] and "/v1/projects/{project}/logs" in schema["paths"]


def test_since_forms(server: Server, api: httpx.Client) -> None:
    project = create_project(api, "since")
    now = int(time.time() * 1000)
    events = [{"ts": now - 3 * 3600_000, "message": "3h"}, {"ts": now - 60_000, "message": "1m"},
              {"ts": now - 9 * 86400_000, "message": "9d"}]
    assert _ingest(server, str(project["ingestKey"]), {"events": events}).status_code == 202
    def messages(since: str) -> list[str]:
        r = api.get("/v1/projects/since/logs", params={"since": since})
        assert r.status_code == 200, r.text
        return [row["message"] for row in r.json()["rows"]]
    assert messages("10m") == ["1m"]
    assert messages("2h") == ["1m"]
    assert messages("4h") == ["1m", "3h"]
    assert messages("1w") == ["1m", "3h"]
    assert messages("2w") == ["1m", "3h", "9d"]
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now / 1000 - 7200))
    assert messages(iso) == ["1m"]
    bad = api.get("/v1/projects/since/logs", params={"since": "yesterday"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_parameter"


def test_make_run_prints_url_and_key(tmp_path: Path) -> None:
    """What `make run` runs (boxtrail serve on an empty data dir) prints both."""
    server = Server(tmp_path / "fresh").start()
    try:
        text = "".join(server.output)
        assert "created tenant 'dev' with API key btk_" in text
        assert server.api_key in text
    finally:
        server.stop()
