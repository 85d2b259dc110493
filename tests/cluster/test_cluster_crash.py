"""A cluster under load loses a node to SIGKILL twenty times: every acknowledged event is
stored exactly once, cluster-wide, and every node reads the same rows. Two nodes compact
the same partitions meanwhile (compaction every second). The usage summed over the nodes
(each counts its own share at its flushes) is the stored rows, per box: each event once."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support import crashload
from tests.support.cluster import Cluster
from tests.support.s3server import S3Server

KILLS = 20


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigkill_a_node_under_load(tmp_path: Path, pg_url: str, redis_url: str,
                                   s3_server: S3Server, s3_bucket: str) -> None:
    cluster = Cluster(tmp_path, pg_url, redis_url, s3_server, s3_bucket,
                      env={"BOXTRAIL_COMPACT_INTERVAL_S": "1",
                           "BOXTRAIL_COMPACT_MIN_FILES": "3"}).start()
    try:
        ledger, reads = crashload.run_cluster(cluster.nodes, KILLS, seed=13)
        stats = [crashload.check(ledger, rows) for rows in reads]
        stored = Counter(str(row["boxId"]) for row in reads[0])
        deadline = time.monotonic() + 30  # the rows still buffered reach Parquet
        while (used := usage_per_box(cluster)) != stored and time.monotonic() < deadline:
            time.sleep(0.25)
        assert used == stored
    finally:
        cluster.stop()
    print(f"\n{KILLS} kills: {stats[0]}")
    assert stats[0]["acked"] > 1000, stats[0]  # the load really ran between kills
    assert stats[0] == stats[1] == stats[2]  # every node reads the same rows


def test_a_node_whose_disk_is_lost_takes_its_unflushed_rows_and_nothing_else(
        tmp_path: Path, pg_url: str, redis_url: str, s3_server: S3Server,
        s3_bucket: str) -> None:
    """Node 1 is killed and its volume deleted; a replacement starts with its id on an
    empty one. Lost: exactly node 1's acked rows that were not yet in Parquet."""
    import shutil

    import httpx

    from tests.support.server import create_project, search_all

    cluster = Cluster(tmp_path, pg_url, redis_url, s3_server, s3_bucket, nodes=2,
                      env={"BOXTRAIL_FLUSH_INTERVAL_S": "3600"}).start()
    first, second = cluster.nodes
    try:
        with first.client() as api:
            key = str(create_project(api, "disk")["ingestKey"])

        def send(node: object, tag: str, batches: int) -> set[str]:
            sent = set()
            for b in range(batches):
                messages = [f"{tag}-{b}-{n}" for n in range(20)]
                r = httpx.post(f"{node.url}/v1/ingest", params={"key": key},  # type: ignore[attr-defined]
                               json={"events": [{"message": m} for m in messages]})
                assert r.status_code == 202
                sent.update(messages)
            return sent

        on_first = send(first, "first", 25)
        on_second = send(second, "second", 25)
        first.kill()
        shutil.rmtree(first.data_dir)  # the disk is gone for good
        first.start()  # a replacement with the same id, on an empty volume
        after = send(first, "after", 10) | send(second, "after2", 10)
        cluster.stop()  # a clean stop flushes what each node holds
        for node in cluster.nodes:
            node.env["BOXTRAIL_FLUSH_INTERVAL_S"] = "0.5"
        cluster.start()
        with second.client() as api:
            stored = [r["message"] for r in search_all(api, "disk", since="1h")]
    finally:
        cluster.stop()
    assert len(stored) == len(set(stored))
    lost = (on_first | on_second | after) - set(stored)
    print(f"\ndisk lost: {len(lost)} of {len(on_first)} rows acked by the node and not yet "
          f"flushed are gone; {len(on_second) + len(after)} others all kept")
    assert lost == on_first


def usage_per_box(cluster: Cluster) -> Counter[str]:
    """``ingest.events`` per box, as any node reads it for the whole cluster."""
    with cluster[2].client() as api:
        answer = api.get("/v1/usage", params={"since": "1d", "interval": "day",
                                              "kind": "ingest.events", "groupBy": "box"})
    assert answer.status_code == 200, answer.text
    out: Counter[str] = Counter()
    for row in answer.json()["rows"]:
        out[row["box"]] += row["quantity"]
    return out
