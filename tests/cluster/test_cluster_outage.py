"""PostgreSQL or Redis stops for 10 s while two nodes take load: ingest keeps acking into
the WAL (or answers 503 with Retry-After), nothing acked is lost or doubled, and the
cluster recovers without a restart: rows flush, and cross the nodes again."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import crashload
from tests.support.cluster import Cluster
from tests.support.pgserver import PgServer
from tests.support.redisserver import RedisServer
from tests.support.s3server import S3Server
from tests.support.server import create_project, search_all

OUTAGE_S = 10.0


@pytest.fixture
def engines() -> Iterator[tuple[PgServer, RedisServer]]:
    """A PostgreSQL and a Redis of this test's own, to stop and start."""
    with PgServer() as pg, RedisServer() as redis:
        yield pg, redis


def send(nodes: list, key: str, ledger: crashload.Ledger, refusals: list[httpx.Response],
         stop: threading.Event, offset: int) -> None:
    turn = offset
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            node = nodes[turn % len(nodes)]
            turn += 1
            with ledger.lock:
                numbers = [next(ledger.numbers) for _ in range(crashload.BATCH)]
            r = client.post(f"{node.url}/v1/ingest", params={"key": key},
                            json={"events": [{"message": f"n={n}", "attrs": {"n": n}}
                                             for n in numbers]})
            with ledger.lock:
                (ledger.acked if r.status_code == 202 else ledger.unacked).update(numbers)
                if r.status_code != 202:
                    refusals.append(r)
            time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine", ["postgresql", "redis"])
def test_an_engine_stops_for_ten_seconds_under_load(
        tmp_path: Path, engines: tuple[PgServer, RedisServer], s3_server: S3Server,
        s3_bucket: str, engine: str) -> None:
    pg, redis = engines
    cluster = Cluster(tmp_path, pg.new_database(), redis.url(), s3_server, s3_bucket,
                      nodes=2).start()
    try:
        with cluster[0].client() as api:
            key = str(create_project(api, "load")["ingestKey"])
        ledger = crashload.Ledger()
        refusals: list[httpx.Response] = []
        stop = threading.Event()
        senders = [threading.Thread(target=send, args=(cluster.nodes, key, ledger, refusals,
                                                       stop, i)) for i in range(2)]
        for sender in senders:
            sender.start()
        try:
            time.sleep(2)
            before = len(ledger.acked)
            if engine == "postgresql":
                pg.stop("fast")
            else:
                redis.stop()
            time.sleep(OUTAGE_S)
            during = len(ledger.acked) - before
            if engine == "postgresql":
                pg.start()
            else:
                redis.start()
            time.sleep(3)
        finally:
            stop.set()
            for sender in senders:
                sender.join(20)
        # Refused requests (if any) were 503s with Retry-After, never anything else.
        assert all(r.status_code == 503 and "retry-after" in r.headers for r in refusals), [
            (r.status_code, r.text[:200]) for r in refusals[:5]]
        assert during > 1000, f"only {during} events acked during the {engine} outage"
        # Every acked row, once, on every node, without a restart.
        deadline = time.monotonic() + 60
        for node in cluster.nodes:
            with node.client() as api:
                while True:
                    rows = search_all(api, "load", since="1h")
                    if len(rows) >= len(ledger.acked) or time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
            stats = crashload.check(ledger, rows)
        print(f"\n{engine} out for {OUTAGE_S:.0f} s: {during} events acked meanwhile; {stats}")
        # Rows cross the nodes again within a second.
        marker = [f"after-{engine}"]
        r = httpx.post(f"{cluster[0].url}/v1/ingest", params={"key": key},
                       json={"context": {"boxId": "marker"},
                             "events": [{"message": marker[0]}]})
        assert r.status_code == 202
        with cluster[1].client() as api:
            seen_by = time.monotonic() + 5
            while [row["message"] for row in api.get(
                    "/v1/projects/load/logs",
                    params={"since": "1h", "boxId": "marker"}).json()["rows"]] != marker:
                assert time.monotonic() < seen_by, "the bus did not recover"
                time.sleep(0.05)
    finally:
        cluster.stop()
