"""Cluster crash soak: hundreds of SIGKILLs of one node of three under load, then every
acknowledged event exactly once, read the same on every node.

    python -m tests.soak.cluster_soak [--kills 200] [--seed 7] [--pause 0.1]

The same check as tests/cluster/test_cluster_crash.py (20 kills), long enough to hit the rare
moments: a node killed mid-publish, mid-join, mid-compaction under another node's lease.
Each sender waits ``--pause`` seconds between requests, so the rows stay few enough to
read back through the API from every node (at full speed, millions). Starts its own
PostgreSQL, Redis and `weed mini` on 127.0.0.1. Prints one JSON object; exits 1 on a
loss, a duplicate or nodes that disagree.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from tests.support import crashload
from tests.support.cluster import Cluster
from tests.support.pgserver import PgServer
from tests.support.redisserver import RedisServer
from tests.support.s3server import S3Server


def soak(kills: int, seed: int, pause_s: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="boxtrail-soak-") as tmp, PgServer() as pg, \
            RedisServer() as redis, S3Server() as s3:
        started = time.monotonic()
        cluster = Cluster(Path(tmp), pg.new_database(), redis.url(), s3, s3.new_bucket(),
                          env={"BOXTRAIL_COMPACT_INTERVAL_S": "1",
                               "BOXTRAIL_COMPACT_MIN_FILES": "3"}).start()
        try:
            ledger, reads = crashload.run_cluster(cluster.nodes, kills, seed, pause_s=pause_s)
        finally:
            cluster.stop()
        stats = [crashload.check(ledger, rows) for rows in reads]
        if any(s != stats[0] for s in stats):
            raise AssertionError(f"the nodes read different rows: {stats}")
        return {"nodes": len(cluster), "kills": kills, "seed": seed,
                "seconds": round(time.monotonic() - started, 1), **stats[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--pause", type=float, default=0.1)
    args = parser.parse_args()
    try:
        print(json.dumps(soak(args.kills, args.seed, args.pause)), flush=True)
    except AssertionError as exc:
        print(json.dumps({"kills": args.kills, "seed": args.seed, "error": str(exc)}))
        sys.exit(1)


if __name__ == "__main__":
    main()
