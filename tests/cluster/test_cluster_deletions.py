"""Deletions on three nodes (PostgreSQL, Redis, S3). Each node holds rows of the project in
Parquet (flushed by a restart), in its buffer and WAL, and the other nodes hold copies of
them (the bus). A query deletion made through node 2 removes exactly the selected rows as
every node reads them; a project deletion made through node 3 ends a tail open on node 1,
is a 404 and refuses the key on every node, and leaves no object, no catalog row and no
WAL record behind on any node."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import psycopg
import pytest

from cluster.wire import decode_sent
from core.config import load
from core.storage import open_storage
from tests.erasure.test_deletions import export, stored_messages, wal_bytes
from tests.support.cluster import Cluster
from tests.support.pgserver import PgServer
from tests.support.redisserver import RedisServer
from tests.support.s3server import S3Server
from tests.support.server import Server, create_project

DONE_WITHIN_S = 90.0  # a job whose runner died waits out its lease (30 s)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pg_server: PgServer,
            redis_server: RedisServer, s3_server: S3Server) -> Iterator[Cluster]:
    import redis

    with redis.Redis.from_url(redis_server.url()) as client:
        client.flushall()
    c = Cluster(tmp_path_factory.mktemp("deletions"), pg_server.new_database(),
                redis_server.url(), s3_server, s3_server.new_bucket(),
                env={"BOXTRAIL_FLUSH_INTERVAL_S": "3600", "BOXTRAIL_TAIL_HEARTBEAT_S": "0.3",
                     "BOXTRAIL_DELETION_GRACE_S": "0.5", "BOXTRAIL_BUS_RETAIN_S": "8",
                     "BOXTRAIL_WORKER_PROCESSES": "0"}).start()
    yield c
    c.stop()


def fill(cluster: Cluster, name: str) -> dict[str, Any]:
    with cluster[0].client() as api:
        project = create_project(api, name)
    key = str(project["ingestKey"])
    for part in ("parquet", "buffer"):
        for i, node in enumerate(cluster.nodes):
            events = [{"message": f"node={i} user={u} part={part} n={n} of={name}",
                       "attrs": {"userId": u}} for n in range(10) for u in (1, 2)]
            r = httpx.post(f"{node.url}/v1/ingest", params={"key": key}, timeout=10,
                           json={"context": {"boxId": f"b{i}"}, "events": events})
            assert r.status_code == 202, r.text
        if part == "parquet":
            for node in cluster.nodes:  # one at a time: the others keep the cluster going
                node.stop()
                node.start()
    # Every node reads every row: its own, and the others' (from the bus or Parquet).
    deadline = time.monotonic() + 10
    while any(len(export(node, name)) != 120 for node in cluster.nodes):
        assert time.monotonic() < deadline, [len(export(n, name)) for n in cluster.nodes]
        time.sleep(0.2)
    return project


def on_the_bus(cluster: Cluster, marker: bytes) -> list[bytes]:
    """The Redis stream's entries (the rows carried between nodes, LZ4-compressed) that
    hold ``marker``, raw or in a batch's payload."""
    import redis

    def holds(value: bytes) -> bool:
        if marker in value:
            return True
        try:
            batches = decode_sent(value)
        except Exception:  # not a field of batches
            return False
        return any(sent.size and marker in msgspec.msgpack.encode(sent.batch())
                   for sent in batches)

    with redis.Redis.from_url(cluster[0].env["BOXTRAIL_BUS_URL"]) as client:
        entries = client.xrange("boxtrail:rows")
    return [entry_id for entry_id, fields in entries if any(map(holds, fields.values()))]


def wait_done(node: Server, job: dict[str, Any]) -> dict[str, Any]:
    deadline = time.monotonic() + DONE_WITHIN_S
    with node.client() as api:
        while (r := api.get(f"/v1/deletions/{job['id']}")).json()["state"] != "done":
            assert r.status_code == 200, r.text
            assert time.monotonic() < deadline, r.json()
            time.sleep(0.2)
    return r.json()  # type: ignore[no-any-return]


def test_a_query_deletion_made_on_one_node_holds_on_every_node(cluster: Cluster) -> None:
    project = fill(cluster, "erase-user")
    before = export(cluster[0], "erase-user")
    carried = on_the_bus(cluster, b"of=erase-user")
    print(f"\n{len(carried)} stream entries hold rows of the project before the job")
    assert carried
    with cluster[1].client() as api:
        r = api.post("/v1/projects/erase-user/deletions", json={"query": "attr.userId:2"})
        assert r.status_code == 202, r.text
    done = wait_done(cluster[2], r.json())
    gone = {i for i, row in before.items() if "user=2 " in row["message"]}
    assert len(gone) == 60
    # The stream carried them (the project was read, so its batches went with their rows),
    # and holds none once the job is done: it waits out the stream's retention, then trims.
    assert not on_the_bus(cluster, b"of=erase-user")
    for node in cluster.nodes:
        after = export(node, "erase-user")
        assert set(after) == set(before) - gone, node.url
        assert all(after[i] == before[i] for i in after)
        assert not [m for m in wal_bytes(node).split(b"\x00") if b"user=2 part" in m
                    and b"of=erase-user" in m]
    assert not [m for m in stored_messages(cluster[0], str(project["id"])) if "user=2 " in m]
    removed = done["removed"]
    assert removed["rows"] + removed["bufferedRows"] == 60, (done, removed)
    assert done["unacknowledgedNodes"] == []


def test_a_project_deleted_on_one_node_is_gone_from_every_node(
        cluster: Cluster, pg_server: PgServer) -> None:
    project = fill(cluster, "doomed")
    assert on_the_bus(cluster, b"of=doomed")  # its rows went to the other nodes this way
    pid, key = str(project["id"]), str(project["ingestKey"])
    events: list[str] = []
    tailing = threading.Thread(target=_tail, args=(cluster[0], events), daemon=True)
    tailing.start()
    time.sleep(1.0)
    with cluster[2].client() as api:
        r = api.delete("/v1/projects/doomed")
        assert r.status_code == 202, r.text
        deleted_at = time.monotonic()
    # At once a 404 everywhere; the key refused on every node within a second.
    for node in cluster.nodes:
        with node.client() as api:
            assert api.get("/v1/projects/doomed").status_code == 404
    for node in cluster.nodes:
        while (httpx.post(f"{node.url}/v1/ingest", params={"key": key},
                          json={"events": [{"message": "late"}]}).status_code != 401):
            assert time.monotonic() - deleted_at < 1.0, node.url
            time.sleep(0.05)
    tailing.join(10)
    assert events and events[-1] == "closed", events
    done = wait_done(cluster[0], r.json())
    removed = done["removed"]
    assert removed["rows"] + removed["bufferedRows"] == 120, done
    storage = open_storage(load({**cluster[0].env,
                                 "BOXTRAIL_DATA_DIR": str(cluster[0].data_dir)}))
    assert not list(storage.list(f"logs/project={pid}/"))
    for node in cluster.nodes:
        assert b"of=doomed" not in wal_bytes(node), node.url
    assert not on_the_bus(cluster, b"of=doomed")
    url = cluster[0].env["BOXTRAIL_CATALOG_URL"]
    with psycopg.connect(url) as con:
        for table, column in (("files", "project_id"), ("ingest_keys", "project_id"),
                              ("projects", "id"), ("sourcemap_artifacts", "project_id")):
            count = con.execute(f"SELECT count(*) FROM {table} WHERE {column} = %s",
                                (pid,)).fetchone()
            assert count == (0,), table
    with cluster[1].client() as api:
        again = create_project(api, "doomed")
        assert again["id"] != pid
    for node in cluster.nodes:
        assert export(node, "doomed") == {}


def _tail(node: Server, events: list[str]) -> None:
    with httpx.stream("GET", f"{node.url}/v1/projects/doomed/tail",
                      headers={"Authorization": f"Bearer {node.api_key}"}, timeout=15) as r:
        for line in r.iter_lines():
            if line.startswith("event: "):
                events.append(line.removeprefix("event: "))


def test_a_job_whose_node_dies_is_finished_by_the_others(cluster: Cluster) -> None:
    """The node a deletion was asked of is killed at once (it may hold the job's lease):
    the others finish it (once its lease lapses), and the node, started again, applies it
    to what its WAL held before it serves."""
    project = fill(cluster, "orphaned")
    before = export(cluster[0], "orphaned")
    with cluster[2].client() as api:
        r = api.post("/v1/projects/orphaned/deletions", json={"query": "attr.userId:1"})
        assert r.status_code == 202, r.text
    time.sleep(0.3)
    cluster[2].kill()
    try:
        done = wait_done(cluster[0], r.json())
    finally:
        cluster[2].start()
    gone = {i for i, row in before.items() if "user=1 " in row["message"]}
    for node in cluster.nodes:
        after = export(node, "orphaned")
        assert set(after) == set(before) - gone, node.url
        assert b"of=orphaned" not in wal_bytes(node) or not [
            i for i in gone if before[i]["message"].encode() in wal_bytes(node)], node.url
    assert not [m for m in stored_messages(cluster[0], str(project["id"])) if "user=1 " in m]
    print(f"\nfinished without the node it was asked of; removed {done['removed']}, "
          f"unacknowledged {done['unacknowledgedNodes']}")
