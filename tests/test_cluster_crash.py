"""A cluster under load loses a node to SIGKILL twenty times: every acknowledged event is
stored exactly once, cluster-wide, and every node reads the same rows. Two nodes compact
the same partitions meanwhile (compaction every second)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import crashload
from tests.cluster import Cluster
from tests.s3server import S3Server

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
    finally:
        cluster.stop()
    print(f"\n{KILLS} kills: {stats[0]}")
    assert stats[0]["acked"] > 1000, stats[0]  # the load really ran between kills
    assert stats[0] == stats[1] == stats[2]  # every node reads the same rows
