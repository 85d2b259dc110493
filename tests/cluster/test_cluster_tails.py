"""Live tails through a partial failure (issue 35, point 2): one node of three loses its
Redis, PostgreSQL or S3 link (reset, blackhole, flap, or a delay on every chunk),
under paced ingest on every node, with a tail open on each node. A backlog the cluster
held is not its readers' fault: after the heal every tail delivers every acked row once,
in id order, and none is told ``dropped``.

``BOXTRAIL_TAIL_MAX_BEHIND`` is lowered to 500 so a cut of a few seconds at ~400 events/s
holds several times more rows than a reader may fall behind by itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.cluster import Cluster
from tests.support.partial import DELAY_S
from tests.support.pgserver import PgServer
from tests.support.redisserver import RedisServer
from tests.support.s3server import S3Server
from tests.support.sse import Tail

# Bounds on latencies and catch-up times under a cut: run alone (make test, after the rest).
pytestmark = pytest.mark.serial

MAX_BEHIND = 500
PER_REQUEST = 13  # events per request; a request every 0.1 s per node: ~130/s per node
CUT_S = 4.0
DRAIN_S = 20.0  # how long the tails get to deliver everything after ingest stops


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pg_server: PgServer,
            redis_server: RedisServer, s3_server: S3Server) -> Iterator[Cluster]:
    import redis

    with redis.Redis.from_url(redis_server.url()) as client:
        client.flushall()
    c = Cluster(tmp_path_factory.mktemp("tails"), pg_server.new_database(),
                redis_server.url(), s3_server, s3_server.new_bucket(), proxied=True,
                env={"BOXTRAIL_TAIL_MAX_BEHIND": str(MAX_BEHIND),
                     # Heartbeats let a closed tail's reader thread see that it is closed.
                     "BOXTRAIL_TAIL_HEARTBEAT_S": "0.3"}).start()
    yield c
    c.stop()


class Ingest:
    """Paced ingest on every node, recording what was acked (the ledger)."""

    def __init__(self, cluster: Cluster, key: str, tag: str) -> None:
        self.acked: list[str] = []
        self.failed = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(node.url, key, f"{tag}-{i}"))
                         for i, node in enumerate(cluster.nodes)]
        for thread in self._threads:
            thread.start()

    def _run(self, url: str, key: str, tag: str) -> None:
        with httpx.Client(timeout=10) as http:
            i = 0
            next_at = time.monotonic()
            while not self._stop.is_set():
                messages = [f"{tag}-{i}-{n}" for n in range(PER_REQUEST)]
                try:
                    r = http.post(f"{url}/v1/ingest", params={"key": key},
                                  json={"events": [{"message": m} for m in messages]})
                except httpx.HTTPError:
                    r = None
                if r is not None and r.status_code == 202:
                    self.acked.extend(messages)
                else:
                    self.failed += 1
                i += 1
                next_at += 0.1
                time.sleep(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)


def count_logs(tail: Tail) -> int:
    return sum(1 for m in list(tail.received) if m.event == "log")


def new_project(client: httpx.Client, name: str) -> str:
    """The project's ingest key. A node whose catalog link was cut in an earlier case may
    answer 503 with Retry-After for a while after the heal: retried, as a client would."""
    deadline = time.monotonic() + 15
    while (r := client.post("/v1/projects", json={"name": name})).status_code == 503:
        assert "retry-after" in r.headers and time.monotonic() < deadline, r.text
        print(f"\ncreating {name}: 503 {r.json()['error']['code']}; retrying")
        time.sleep(0.5)
    assert r.status_code == 201, r.text
    return str(r.json()["ingestKey"])


def cut_and_heal(cluster: Cluster, engine: str, mode: str, project: str) -> None:
    clients = [node.client() for node in cluster.nodes]
    try:
        key = new_project(clients[0], project)
        tails = [Tail(client, f"/v1/projects/{project}/tail") for client in clients]
        assert [t.status for t in tails] == [200] * len(tails)
        time.sleep(0.5)  # every tail's cursor is set before the first row
        ingest = Ingest(cluster, key, project)
        try:
            time.sleep(1.0)
            link = cluster.proxies[0][engine]
            cut_at = time.monotonic()
            if mode == "flap":  # cut, healed, cut, healed, cut: 0.8 s each, then healed
                link.flap(0.8)
            elif mode == "delay":  # every chunk, each way, as over a slow link
                link.delay(DELAY_S)
            else:
                getattr(link, mode)()
            time.sleep(CUT_S)
            link.heal()
            healed = time.monotonic()
            # When each tail has as many rows as were acked before the heal: caught up.
            before_heal = len(ingest.acked)
            caught: list[float | None] = [None] * len(tails)

            def note() -> None:
                for i, tail in enumerate(tails):
                    if caught[i] is None and count_logs(tail) >= before_heal:
                        caught[i] = time.monotonic() - healed

            while time.monotonic() < healed + 2.0:
                note()
                time.sleep(0.05)
        finally:
            ingest.stop()
        acked = ingest.acked
        assert ingest.failed == 0, f"{ingest.failed} requests not acked"
        deadline = time.monotonic() + DRAIN_S
        while (any(count_logs(t) < len(acked) for t in tails)
               and time.monotonic() < deadline):
            note()
            time.sleep(0.05)
        for i, tail in enumerate(tails):
            dropped = [m.data for m in list(tail.received) if m.event == "dropped"]
            messages = [str(r["message"]) for r in tail.logs()]
            at = "never" if caught[i] is None else f"{caught[i]:.2f} s"
            print(f"\n{engine} {mode}: node{i + 1}'s tail: {len(messages)} rows of "
                  f"{len(acked)} acked "
                  f"({len(set(acked) - set(messages))} missing, "
                  f"{len(messages) - len(set(messages))} twice), dropped {dropped}; "
                  f"the {before_heal} rows acked before the heal in {at} after it "
                  f"({CUT_S:.0f} s cut at {before_heal / (healed - cut_at + 1.0):.0f} "
                  "events/s)")
        for i, tail in enumerate(tails):
            dropped = [m.data for m in list(tail.received) if m.event == "dropped"]
            got = tail.logs()
            messages = [str(r["message"]) for r in got]
            ids = [int(str(r["id"]), 16) for r in got]
            assert not tail.ended, f"node{i + 1}'s tail ended: {tail.ended}"
            assert not dropped, f"node{i + 1}'s tail was told dropped {dropped}"
            assert len(messages) == len(set(messages)), f"node{i + 1}'s tail repeated rows"
            assert sorted(messages) == sorted(acked), (
                f"node{i + 1}'s tail: {len(set(acked) - set(messages))} acked rows missing")
            assert ids == sorted(ids), f"node{i + 1}'s tail: rows out of id order"
        for tail in tails:
            tail.close()
    finally:
        for client in clients:
            client.close()


@pytest.mark.parametrize("mode", ["reset", "blackhole", "flap", "delay"])
def test_every_tail_gets_every_row_once_in_order_through_a_redis_cut(
        cluster: Cluster, mode: str) -> None:
    cut_and_heal(cluster, "redis", mode, f"redis-{mode}")


@pytest.mark.parametrize("engine", ["pg", "s3"])
@pytest.mark.parametrize("mode", ["reset", "blackhole", "flap", "delay"])
def test_every_tail_gets_every_row_once_in_order_through_a_catalog_or_storage_cut(
        cluster: Cluster, engine: str, mode: str) -> None:
    cut_and_heal(cluster, engine, mode, f"{engine}-{mode}")
