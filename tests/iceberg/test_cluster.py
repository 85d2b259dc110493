"""Three nodes (PostgreSQL, Redis, S3) publishing into the same tables at once: each node's
flushes and compactions change a project's one table, its compare-and-set settles who goes
first and the other stages again. After ingest on every node, compaction and a box's
deletion, pyiceberg (Arrow, DuckDB) and ClickHouse (chDB) read exactly what ``/logs``
returns on any node."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from tests.iceberg.test_tables import agree, files, iceberg_catalog, root_of
from tests.support.cluster import Cluster
from tests.support.pgserver import PgServer
from tests.support.redisserver import RedisServer
from tests.support.s3server import S3Server
from tests.support.server import create_project

WITHIN_S = 30.0


@pytest.fixture
def cluster(tmp_path: Path, pg_url: str, redis_url: str, s3_server: S3Server,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    monkeypatch.chdir(tmp_path)
    c = Cluster(tmp_path, pg_url, redis_url, s3_server, s3_server.new_bucket(),
                env={"BOXTRAIL_ICEBERG": "on", "BOXTRAIL_FLUSH_INTERVAL_S": "0.3",
                     "BOXTRAIL_COMPACT_INTERVAL_S": "0.5", "BOXTRAIL_COMPACT_MIN_FILES": "4",
                     "BOXTRAIL_DELETION_GRACE_S": "0.5", "BOXTRAIL_BUS_RETAIN_S": "2",
                     "BOXTRAIL_WORKER_PROCESSES": "0"}).start()
    yield c
    c.stop()


def test_three_nodes_publish_into_one_table_and_every_reader_agrees(
        cluster: Cluster, pg_server: PgServer, redis_server: RedisServer) -> None:
    with cluster[0].client() as api:
        project = create_project(api, "shared")
    key = str(project["ingestKey"])
    counts = [0, 0, 0]

    def send(node: int) -> None:
        # Rounds of every box from each node at once: their flushes commit together.
        for round_ in range(6):
            for box in ("b1", "b2"):
                events = [{"message": f"node{node} {box} r{round_} i{i}"} for i in range(10)]
                r = httpx.post(f"{cluster[node].url}/v1/ingest", params={"key": key},
                               json={"context": {"boxId": box}, "events": events}, timeout=10)
                assert r.status_code == 202, r.text
                counts[node] += len(events)
            time.sleep(0.35)

    threads = [threading.Thread(target=send, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    catalog = iceberg_catalog(cluster[0])
    try:
        check(cluster, catalog, project, counts)
    finally:
        catalog.engine.dispose()


def check(cluster: Cluster, catalog: SqlCatalog, project: dict[str, Any], counts: list[int]
          ) -> None:
    root = root_of(cluster[0])
    deadline = time.monotonic() + WITHIN_S
    while not files(cluster[0], "retired"):  # compaction ran
        assert time.monotonic() < deadline, "no compaction"
        time.sleep(0.2)
    rows = agree(cluster[0], catalog, project, root)
    assert len(rows) == sum(counts) == 360
    assert agree(cluster[2], catalog, project, root) == rows

    with cluster[1].client() as api:
        r = api.post("/v1/projects/shared/deletions", json={"box": "b2"})
        assert r.status_code == 202, r.text
        job = r.json()
        deadline = time.monotonic() + WITHIN_S
        while api.get(f"/v1/deletions/{job['id']}").json()["state"] != "done":
            assert time.monotonic() < deadline
            time.sleep(0.2)
    after = agree(cluster[0], catalog, project, root)
    assert after == {i: r for i, r in rows.items() if r["boxId"] != "b2"}
