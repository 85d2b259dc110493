"""Real boxtrail servers sharing one PostgreSQL catalog (and one S3 bucket): what a node
learns from the catalog, and how node ids are kept apart.

Cross-node freshness of unflushed rows, tails and the bus are not in here: what is
checked is what the shared catalog gives by itself, once a node has flushed.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.s3server import S3Server
from tests.support.server import Server, create_project, search_all


def node(tmp_path: Path, name: str, pg_url: str, s3: dict[str, str] | None = None,
         **env: str) -> Server:
    return Server(tmp_path / name, {"BOXTRAIL_CATALOG_URL": pg_url,
                                    "BOXTRAIL_NODE_ID": name, **(s3 or {}), **env})


def ingest(url: str, key: str, messages: list[str], box: str = "box1") -> None:
    r = httpx.post(f"{url}/v1/ingest", params={"key": key},
                   json={"context": {"boxId": box}, "events": [{"message": m} for m in messages]})
    assert r.status_code == 202, r.text


def wait_rows(client: httpx.Client, project: str, count: int, timeout: float = 20) -> list[dict]:
    deadline = time.monotonic() + timeout
    rows: list[dict] = []
    while time.monotonic() < deadline:
        rows = search_all(client, project, since="1h")
        if len(rows) >= count:
            return rows
        time.sleep(0.1)
    raise AssertionError(f"{len(rows)} of {count} rows after {timeout} s")


def test_a_node_on_postgres_keeps_every_acked_row_across_a_crash(tmp_path: Path,
                                                                  pg_url: str) -> None:
    srv = node(tmp_path, "solo", pg_url).start()
    try:
        with srv.client() as api:
            key = str(create_project(api, "web")["ingestKey"])
            ingest(srv.url, key, [f"a{i}" for i in range(50)])
            wait_rows(api, "web", 50)
        srv.kill()  # SIGKILL, with the next batch only in the WAL
        srv.env["BOXTRAIL_FLUSH_INTERVAL_S"] = "3600"
        srv.start()
        ingest(srv.url, key, [f"b{i}" for i in range(30)])
        srv.kill()
        srv.env["BOXTRAIL_FLUSH_INTERVAL_S"] = "0.5"
        srv.start()
        with srv.client() as api:
            rows = wait_rows(api, "web", 80)
            time.sleep(1.5)  # replayed rows flushed: still each once
            rows = search_all(api, "web", since="1h")
        assert sorted(r["message"] for r in rows) == sorted(
            [f"a{i}" for i in range(50)] + [f"b{i}" for i in range(30)])
    finally:
        srv.stop()


def test_two_nodes_share_tenants_projects_and_files(tmp_path: Path, pg_url: str,
                                                     s3_server: S3Server, s3_bucket: str) -> None:
    s3 = {**s3_server.env(), "BOXTRAIL_S3_BUCKET": s3_bucket}
    a = node(tmp_path, "node-a", pg_url, s3).start()
    b = node(tmp_path, "node-b", pg_url, s3).start()
    try:
        assert a.api_key == b.api_key  # one dev tenant, one key, in both data directories
        with a.client() as api_a, b.client() as api_b:
            project = create_project(api_b, "shop")  # made on b ...
            ingest(a.url, str(project["ingestKey"]), [f"m{i}" for i in range(20)])  # ... on a
            rows = wait_rows(api_b, "shop", 20)  # a flushed: b reads the file
            assert sorted(r["message"] for r in rows) == sorted(f"m{i}" for i in range(20))
            assert [p["name"] for p in api_a.get("/v1/projects").json()] == ["shop"]
            # Another tenant, its key made through node a's CLI, is a stranger on node b.
            other = subprocess.run(
                [sys.executable, "-m", "boxtrail", "keys", "create", "--tenant", "other"],
                env={"BOXTRAIL_DATA_DIR": str(a.data_dir), "BOXTRAIL_CATALOG_URL": pg_url,
                     "PATH": "/usr/bin:/bin"},
                capture_output=True, text=True, check=True, timeout=60).stdout.strip()
            stranger = {"Authorization": f"Bearer {other}"}
            assert httpx.get(f"{b.url}/v1/projects", headers=stranger).json() == []
            r = httpx.get(f"{b.url}/v1/projects/shop/logs", headers=stranger)
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    finally:
        a.stop()
        b.stop()


def test_a_live_node_id_is_refused_and_freed_when_its_node_dies(tmp_path: Path,
                                                                 pg_url: str) -> None:
    first = node(tmp_path, "n1", pg_url).start()
    try:
        twin = subprocess.run(
            [sys.executable, "-m", "boxtrail", "serve"], capture_output=True, text=True,
            timeout=60, env={"PATH": "/usr/bin:/bin", "BOXTRAIL_PORT": "0",
                             "BOXTRAIL_DATA_DIR": str(tmp_path / "twin"),
                             "BOXTRAIL_CATALOG_URL": pg_url, "BOXTRAIL_NODE_ID": "n1"})
        assert twin.returncode != 0
        refusal = twin.stderr.strip().splitlines()
        assert refusal == ["boxtrail: node id 'n1' is in use by a live node of this catalog; "
                           "give each node its own BOXTRAIL_NODE_ID"], twin.stderr
        first.kill()  # SIGKILL: its lock goes with its connection, at once
        started = time.monotonic()
        first.start()
        assert time.monotonic() - started < 30
    finally:
        first.stop()


def test_a_data_directory_keeps_its_node_id(tmp_path: Path, pg_url: str) -> None:
    srv = node(tmp_path, "keeper", pg_url).start()
    srv.stop()
    assert (tmp_path / "keeper" / "node-id").read_text().strip() == "keeper"
    moved = subprocess.run(
        [sys.executable, "-m", "boxtrail", "serve"], capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "BOXTRAIL_PORT": "0",
             "BOXTRAIL_DATA_DIR": str(tmp_path / "keeper"), "BOXTRAIL_CATALOG_URL": pg_url,
             "BOXTRAIL_NODE_ID": "someone-else"})
    assert moved.returncode != 0
    assert "belongs to node 'keeper'" in moved.stderr and len(moved.stderr.splitlines()) == 1
    srv.env.pop("BOXTRAIL_NODE_ID")  # unset: the directory's id
    srv.start()
    srv.stop()


def test_an_unreachable_catalog_at_start_is_one_line(tmp_path: Path) -> None:
    from tests.support.pgserver import free_port

    r = subprocess.run(
        [sys.executable, "-m", "boxtrail", "serve"], capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "BOXTRAIL_PORT": "0", "BOXTRAIL_DATA_DIR": str(tmp_path),
             "BOXTRAIL_CATALOG_URL": f"postgresql://u:secret@127.0.0.1:{free_port()}/x"})
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "metadata database is not reachable" in lines[0], r.stderr
    assert "secret" not in r.stderr


@pytest.mark.parametrize("path", ["/v1/projects/a%00b/logs", "/v1/projects/%ED%A0%80/logs"])
def test_text_postgres_cannot_hold_is_a_clear_error(tmp_path: Path, pg_url: str,
                                                    path: str) -> None:
    srv = node(tmp_path, "n", pg_url).start()
    try:
        with srv.client() as api:
            r = api.get(path, params={"since": "1h"})
            assert r.status_code in (400, 404), r.text
            assert set(r.json()["error"]) == {"code", "message", "detail"}
            r = httpx.post(f"{srv.url}/v1/ingest", params={"key": "bti_\x00"}, json={"events": []})
            assert r.status_code in (400, 401), r.text
    finally:
        srv.stop()


def test_a_name_too_long_for_postgres_to_index_is_a_400(tmp_path: Path, pg_url: str) -> None:
    """A 1,024-character file name is a valid upload, but ~3 KB of UTF-8 is more than a
    PostgreSQL btree entry holds: the answer is a 400, not 'retry later'."""
    srv = node(tmp_path, "n", pg_url).start()
    try:
        with srv.client() as api:
            create_project(api, "maps")
            rng = random.Random(7)  # text that does not compress
            name = "assets/" + "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(1000))
            name += ".js"
            r = api.post("/v1/projects/maps/sourcemaps", files=[
                ("file", (name, b"function a(){}\n//# sourceMappingURL=x.js.map\n",
                          "application/javascript")),
                ("file", (name + ".map", b'{"version":3,"sources":["a.js"],"names":[],'
                                          b'"mappings":"AAAA"}', "application/json"))])
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == "invalid_parameter"
    finally:
        srv.stop()
