"""Limits that hold for the cluster, not per node: a project's ingest rate and a tenant's
open tails. Three nodes, load on all of them at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from tests.support.cluster import Cluster
from tests.support.s3server import S3Server
from tests.support.server import create_project
from tests.support.sse import Tail

RATE = 2000
BURST = 2000
SECONDS = 4.0
CAP = 4


def test_rate_limits_and_tail_caps_hold_across_the_cluster(
        tmp_path: Path, pg_url: str, redis_url: str, s3_server: S3Server,
        s3_bucket: str) -> None:
    cluster = Cluster(tmp_path, pg_url, redis_url, s3_server, s3_bucket,
                      env={"BOXTRAIL_RATE_LIMIT_EVENTS": str(RATE),
                           "BOXTRAIL_RATE_LIMIT_BURST": str(BURST),
                           "BOXTRAIL_TAIL_MAX_PER_TENANT": str(CAP),
                           # A tail whose client left ends at the next heartbeat it sends.
                           "BOXTRAIL_TAIL_HEARTBEAT_S": "0.5"}).start()
    clients = [node.client() for node in cluster.nodes]
    try:
        key = str(create_project(clients[0], "limited")["ingestKey"])
        admitted = [0, 0, 0]
        refusals: list[httpx.Response] = []
        deadline = time.monotonic() + SECONDS

        def send(i: int) -> None:
            with httpx.Client(timeout=10) as http:
                while time.monotonic() < deadline:
                    r = http.post(f"{cluster[i].url}/v1/ingest", params={"key": key},
                                  json={"events": [{"message": "m"}] * 100})
                    if r.status_code == 202:
                        admitted[i] += 100
                    else:
                        refusals.append(r)

        senders = [threading.Thread(target=send, args=(i,)) for i in range(3)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        bound = RATE * SECONDS + BURST  # one bucket for the whole cluster
        total = sum(admitted)
        print(f"\nrate {RATE}/s, burst {BURST}, {SECONDS:.0f} s on 3 nodes: admitted {total} "
              f"({total / bound:.2f}x the one-bucket bound {bound:.0f}; per-node buckets "
              f"would allow {3 * bound:.0f}); per node {admitted}")
        assert refusals and all(r.status_code == 429 and "retry-after" in r.headers
                                for r in refusals)
        assert 0.7 * RATE * SECONDS <= total <= 1.3 * bound

        # Tails: CAP open across the nodes, then the next one anywhere is refused.
        tails = []
        own = cluster[0].client()  # for the tail that will be closed: its own connection
        for i in range(CAP):
            tails.append(Tail(own if i == 0 else clients[i % 3], "/v1/projects/limited/tail"))
            time.sleep(0.4)  # the count reaches the other nodes on their next heartbeat
        assert all(t.status == 200 for t in tails)
        for client in clients:
            refused = client.get("/v1/projects/limited/tail", timeout=5)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "too_many_tails"
        own.close()  # the client leaves; its node notices at the tail's next heartbeat
        tails.pop(0).close()
        time.sleep(2.0)
        again = Tail(clients[1], "/v1/projects/limited/tail")
        assert again.status == 200
        again.close()
        for tail in tails:
            tail.close()
    finally:
        for client in clients:
            client.close()
        cluster.stop()
