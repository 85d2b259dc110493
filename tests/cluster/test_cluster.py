"""Three nodes behind no balancer at all: the test is the balancer, sending each request to
a node of its choosing, as round-robin would. Real PostgreSQL, Redis and S3 (weed)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.cluster import Cluster
from tests.support.pgserver import PgServer
from tests.support.redisserver import RedisServer
from tests.support.s3server import S3Server
from tests.support.server import create_project, search_all


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pg_server: PgServer,
            redis_server: RedisServer, s3_server: S3Server) -> Iterator[Cluster]:
    """One three-node cluster for the module (each test has its own projects). Flushes
    every 3 s: a row read on another node within a second came over the bus."""
    import redis

    with redis.Redis.from_url(redis_server.url()) as client:
        client.flushall()
    c = Cluster(tmp_path_factory.mktemp("cluster"), pg_server.new_database(),
                redis_server.url(), s3_server, s3_server.new_bucket(),
                env={"BOXTRAIL_FLUSH_INTERVAL_S": "3"}).start()
    yield c
    c.stop()


def ingest(url: str, key: str, box: str, messages: list[str]) -> None:
    r = httpx.post(f"{url}/v1/ingest", params={"key": key},
                   json={"context": {"boxId": box}, "events": [{"message": m} for m in messages]})
    assert r.status_code == 202, r.text


def box_rows(client: httpx.Client, box: str) -> list[str]:
    r = client.get("/v1/projects/fresh/logs", params={"since": "1h", "boxId": box, "limit": 1000})
    assert r.status_code == 200, r.text
    return [row["message"] for row in r.json()["rows"]]


def test_every_acked_row_is_searchable_on_every_node_within_a_second(cluster: Cluster) -> None:
    clients = [node.client() for node in cluster.nodes]
    key = str(create_project(clients[0], "fresh")["ingestKey"])
    latencies: list[float] = []
    for i in range(24):
        box = f"box{i}"
        messages = [f"{box}-{n}" for n in range(10)]
        ingest(cluster[i % 3].url, key, box, messages)  # round-robin
        acked = time.monotonic()
        for client in clients:
            while sorted(box_rows(client, box)) != sorted(messages):
                assert time.monotonic() - acked < 1.0, f"{box} not on {client.base_url} in 1 s"
                time.sleep(0.005)
            latencies.append(time.monotonic() - acked)
    print(f"\ncross-node freshness over {len(latencies)} (batch, node) pairs: "
          f"p50 {statistics.median(latencies) * 1000:.0f} ms, "
          f"max {max(latencies) * 1000:.0f} ms")
    for client in clients:
        everything = search_all(client, "fresh", since="1h")
        assert len(everything) == 240 and len({r["id"] for r in everything}) == 240
        client.close()


def test_rows_move_from_the_bus_to_parquet_once(cluster: Cluster) -> None:
    """With flushes every 0.5 s, rows pass from the peers' buffers to Parquet while the
    nodes are read: no read ever has a row twice or misses one acked a second earlier."""
    clients = [node.client() for node in cluster.nodes]
    key = str(create_project(clients[0], "move")["ingestKey"])
    acked: list[tuple[float, str]] = []
    deadline = time.monotonic() + 6
    i = 0
    while time.monotonic() < deadline:
        message = f"m{i}"
        ingest(cluster[i % 3].url, key, "box1", [message])
        acked.append((time.monotonic(), message))
        i += 1
        if i % 10 == 0:
            for client in clients:
                read_at = time.monotonic()
                rows = search_all(client, "move", since="1h", box="box1")
                messages = [r["message"] for r in rows]
                assert len(messages) == len(set(messages)), "a row read twice"
                missing = {m for t, m in acked if t < read_at - 1.0} - set(messages)
                assert not missing, f"acked over 1 s ago and not read: {sorted(missing)[:5]}"
    for client in clients:
        client.close()


def metric(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {name} in /metrics")


def test_a_project_nobody_read_is_read_whole_at_once_on_another_node(
        cluster: Cluster) -> None:
    """Nodes send a project's rows to the others only once one of them reads it: until
    then the batches go bare. The first read asks, and has every acked row."""
    clients = [node.client() for node in cluster.nodes]
    key = str(create_project(clients[0], "cold")["ingestKey"])
    before = [metric(c, "boxtrail_bus_rows_answered") for c in clients[1:]]
    sent = []
    for i in range(40):
        messages = [f"c{i}-{n}" for n in range(5)]
        ingest(cluster[1 + i % 2].url, key, f"box{i % 4}", messages)  # nodes 2 and 3
        sent += messages
    for client in (clients[0], clients[1]):
        rows = search_all(client, "cold", since="1h")
        assert sorted(r["message"] for r in rows) == sorted(sent)
    # The rows came through asks: nodes 2 and 3 read them back from their WALs.
    after = [metric(c, "boxtrail_bus_rows_answered") for c in clients[1:]]
    assert after[0] > before[0] and after[1] > before[1]
    for client in clients:
        client.close()


def test_a_tail_on_one_node_gets_every_nodes_rows_in_id_order(cluster: Cluster) -> None:
    from tests.support.sse import Tail

    clients = [node.client() for node in cluster.nodes]
    key = str(create_project(clients[0], "tails")["ingestKey"])
    tail = Tail(clients[0], "/v1/projects/tails/tail")
    queried = Tail(clients[0], "/v1/projects/tails/tail", params={"query": "level:error"})
    sent: list[str] = []
    for i in range(30):
        node = cluster[1 + i % 2]  # nodes 2 and 3 only
        r = httpx.post(f"{node.url}/v1/ingest", params={"key": key},
                       json={"events": [{"message": f"r{i}-{n}",
                                         "level": "error" if n == 0 else "info"}
                                        for n in range(5)]})
        assert r.status_code == 202
        sent += [f"r{i}-{n}" for n in range(5)]
    deadline = time.monotonic() + 10
    while len(tail.logs()) < len(sent) and time.monotonic() < deadline:
        time.sleep(0.05)
    got = tail.logs()
    assert sorted(r["message"] for r in got) == sorted(sent)  # each once
    ids = [int(str(r["id"]), 16) for r in got]
    assert ids == sorted(ids)  # in id order, across nodes
    while len(queried.logs()) < 30 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(r["message"] for r in queried.logs()) == sorted(f"r{i}-0" for i in range(30))
    tail.close()
    queried.close()
    for client in clients:
        client.close()


def test_a_tail_resumed_on_another_node_gets_everything_once(cluster: Cluster) -> None:
    """A client reads a tail from one node, drops it, and reconnects to the next with its
    Last-Event-ID while all three take ingest: every row arrives exactly once."""
    import contextlib
    import threading

    from tests.support.sse import messages

    clients = [node.client() for node in cluster.nodes]
    key = str(create_project(clients[0], "resume")["ingestKey"])
    stop = threading.Event()
    sent: list[str] = []

    def produce() -> None:
        i = 0
        with httpx.Client(timeout=10) as http:
            while not stop.is_set():
                node = cluster[i % 3]
                r = http.post(f"{node.url}/v1/ingest", params={"key": key},
                              json={"events": [{"message": f"p{i}-{n}"} for n in range(3)]})
                assert r.status_code == 202
                sent.extend(f"p{i}-{n}" for n in range(3))
                i += 1
                time.sleep(0.01)

    # The tail starts before any row, from the beginning (Last-Event-ID 0).
    last_id = "0000000000000000"
    got: list[str] = []
    producer = threading.Thread(target=produce)
    producer.start()
    try:
        for hop in range(9):  # nine connections, each on the next node, ~0.4 s each
            client = clients[hop % 3]
            until = time.monotonic() + 0.4
            with client.stream("GET", "/v1/projects/resume/tail",
                               headers={"Last-Event-ID": last_id},
                               timeout=httpx.Timeout(10, read=5)) as response:
                assert response.status_code == 200
                for message in messages(response):
                    if message.event == "log":
                        got.append(message.json()["message"])  # type: ignore[arg-type]
                        assert message.id is not None
                        last_id = message.id
                    if time.monotonic() > until:
                        break
    finally:
        stop.set()
        producer.join()
    # The rest, after ingest stopped, from the first node again.
    expected = len(sent)
    with contextlib.suppress(httpx.ReadTimeout), clients[0].stream(
            "GET", "/v1/projects/resume/tail", headers={"Last-Event-ID": last_id},
            timeout=httpx.Timeout(10, read=5)) as response:
        for message in messages(response):
            if message.event == "log":
                got.append(message.json()["message"])  # type: ignore[arg-type]
            if len(got) >= expected:
                break
    print(f"\n{len(sent)} rows sent, {len(got)} received over 10 connections;",
          "missing:", sorted(set(sent) - set(got))[:10])
    assert len(got) == len(set(got)), "a row came twice"
    assert sorted(got) == sorted(sent)
    for client in clients:
        client.close()


def test_maps_uploaded_through_one_node_symbolicate_on_another(cluster: Cluster) -> None:
    """An error read on node 2 before the upload is cached there as unmapped; maps
    uploaded through node 3 are used by node 2's next read (REST and logs_errors)."""
    from tests.query.test_mcp import MINIFIED, MINIFIED_STACK, call, payload, run, source_map

    clients = [node.client() for node in cluster.nodes]
    key = str(create_project(clients[0], "shop")["ingestKey"])
    r = httpx.post(f"{cluster[1].url}/v1/ingest", params={"key": key},
                   json={"context": {"boxId": "b1"},
                         "events": [{"level": "error", "message": "render failed",
                                     "error": {"type": "TypeError", "message": "x",
                                               "stack": MINIFIED_STACK}}]})
    assert r.status_code == 202
    before = clients[1].get("/v1/projects/shop/errors", params={"since": "1h"}).json()
    assert before["rows"][0]["error"]["frames"][0]["symbolicated"] is False
    uploaded = clients[2].post("/v1/projects/shop/sourcemaps", files=[
        ("file", ("assets/app.min.js", MINIFIED.encode(), "application/javascript")),
        ("file", ("assets/app.min.js.map", source_map(), "application/json"))])
    assert uploaded.status_code == 201, uploaded.text
    after = clients[1].get("/v1/projects/shop/errors", params={"since": "1h"}).json()
    frame = after["rows"][0]["error"]["frames"][0]
    assert (frame["function"], frame["file"], frame["line"]) == ("renderCart", "src/cart.js", 2)
    for node in cluster.nodes:  # the tool answers the same on every node
        data = payload(run(call(node, "auto", "logs_errors", {"project": "shop"})))
        assert data["rows"][0]["error"]["frames"][0] == {
            "function": "renderCart", "file": "src/cart.js", "line": 2, "column": 21,
            "contextLine": "  return cart.owner.name;"}
    for client in clients:
        client.close()


def test_tenants_are_apart_and_the_tools_agree_on_every_node(cluster: Cluster) -> None:
    from tests.query.test_mcp import call, payload, run

    clients = [node.client() for node in cluster.nodes]
    key = str(create_project(clients[0], "apart")["ingestKey"])
    for i in range(3):
        ingest(cluster[i].url, key, "b1", [f"row{i}-{n}" for n in range(5)])
    other = cluster[1].create_key("other")  # a second tenant, made through node 2's CLI
    time.sleep(1.0)
    answers = []
    for node in cluster.nodes:
        stranger = httpx.get(f"{node.url}/v1/projects/apart/logs",
                             headers={"Authorization": f"Bearer {other}"})
        assert stranger.status_code == 404
        assert httpx.get(f"{node.url}/v1/projects",
                         headers={"Authorization": f"Bearer {other}"}).json() == []
        refused = run(call(node, "auto", "logs_search", {"project": "apart"}, key=other))
        assert refused.is_error
        data = payload(run(call(node, "auto", "logs_search",
                                {"project": "apart", "limit": 100})))
        answers.append([(r["id"], r["message"]) for r in data["rows"]])
    assert len(answers[0]) == 15 and answers[0] == answers[1] == answers[2]
    for client in clients:
        client.close()


def test_paging_that_alternates_nodes_while_ingest_goes_on_has_no_gap_or_repeat(
        cluster: Cluster) -> None:
    import threading

    clients = [node.client() for node in cluster.nodes]
    key = str(create_project(clients[0], "pages")["ingestKey"])
    for i in range(30):
        ingest(cluster[i % 3].url, key, "b1", [f"old{i}-{n}" for n in range(10)])
    time.sleep(1.0)  # every acked row is on every node by now
    stop = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.is_set():
            ingest(cluster[i % 3].url, key, "b1", [f"new{i}-{n}" for n in range(5)])
            i += 1

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        seen: list[str] = []
        cursor = None
        hop = 0
        while True:
            params: dict[str, str | int] = {"since": "1h", "limit": 17}
            if cursor:
                params["cursor"] = cursor
            page = clients[hop % 3].get("/v1/projects/pages/logs", params=params).json()
            hop += 1
            seen += [r["message"] for r in page["rows"]]
            cursor = page["nextCursor"]
            if not cursor:
                break
    finally:
        stop.set()
        producer.join()
    assert len(seen) == len(set(seen)), "a row on two pages"
    old = [m for m in seen if m.startswith("old")]
    assert sorted(old) == sorted(f"old{i}-{n}" for i in range(30) for n in range(10))
    assert hop > 15  # many pages, on all three nodes
    for client in clients:
        client.close()
