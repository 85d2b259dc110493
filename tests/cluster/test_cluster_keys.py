"""API keys across three nodes (PostgreSQL, Redis, S3): a key revoked through node 3
while it holds an SSE tail on node 1 and an MCP ``logs_tail`` on node 2. Both end within a
second (measured and printed), its next request is 401 on every node, and the console
session it opened on node 1 is gone."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.query.test_mcp import call
from tests.support.cluster import Cluster
from tests.support.pgserver import PgServer
from tests.support.redisserver import RedisServer
from tests.support.s3server import S3Server
from tests.support.server import create_project
from tests.support.sse import Tail


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pg_server: PgServer,
            redis_server: RedisServer, s3_server: S3Server) -> Iterator[Cluster]:
    import redis

    with redis.Redis.from_url(redis_server.url()) as client:
        client.flushall()
    c = Cluster(tmp_path_factory.mktemp("keys"), pg_server.new_database(), redis_server.url(),
                s3_server, s3_server.new_bucket(),
                env={"BOXTRAIL_TAIL_HEARTBEAT_S": "0.3"}).start()
    yield c
    c.stop()


def test_a_key_revoked_on_one_node_ends_its_streams_and_sessions_on_the_others(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    one, two, three = cluster[0], cluster[1], cluster[2]
    with three.client() as admin:
        create_project(admin, "shop")
        made = admin.post("/v1/keys", json={"name": "leaked", "scopes": ["read"]})
        assert made.status_code == 201, made.text
    key: dict[str, Any] = made.json()
    auth = {"Authorization": f"Bearer {key['key']}"}

    console = httpx.Client(base_url=one.url, timeout=10)
    assert console.post("/v1/session", json={"apiKey": key["key"]},
                        headers={"Origin": one.url}).status_code == 201
    with httpx.Client(base_url=one.url, timeout=10) as client:
        tail = Tail(client, "/v1/projects/shop/tail", headers=auth)
        assert tail.status == 200
        ended: dict[str, float] = {}
        result: dict[str, Any] = {}

        def mcp_tail() -> None:
            result["r"] = asyncio.run(call(two, "auto", "logs_tail",
                                           {"project": "shop", "seconds": 30},
                                           key=key["key"]))
            ended["mcp"] = time.monotonic()

        runner = threading.Thread(target=mcp_tail, daemon=True)
        runner.start()
        time.sleep(1.5)
        assert runner.is_alive() and tail._thread.is_alive()
        with three.client() as admin:
            revoked_at = time.monotonic()
            assert admin.delete(f"/v1/keys/{key['id']}").status_code == 204
        tail._thread.join(5)
        ended["sse"] = time.monotonic()
        runner.join(5)
    sse_s, mcp_s = ended["sse"] - revoked_at, ended["mcp"] - revoked_at
    with capsys.disabled():
        print(f"\nrevoked on node 3: the SSE tail on node 1 ended after {sse_s * 1000:.0f} ms, "
              f"the MCP logs_tail on node 2 after {mcp_s * 1000:.0f} ms")
    assert sse_s < 1.0 and mcp_s < 1.0
    assert [m.json()["error"]["detail"] for m in tail.received if m.event == "closed"] == [
        {"reason": "revoked"}]
    assert result["r"].is_error and "revoked" in result["r"].content[0].text
    for node in (one, two, three):
        r = httpx.get(f"{node.url}/v1/projects/shop/logs", headers=auth, timeout=10)
        assert r.status_code == 401, (node.url, r.text)
    assert console.get("/v1/session").status_code == 401
    console.close()


def test_new_allowed_origins_set_through_one_node_hold_on_the_others_within_a_second(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    one, two, three = cluster[0], cluster[1], cluster[2]
    with three.client() as admin:
        key = str(create_project(admin, "web", ["https://a.example"])["ingestKey"])

    def send(node: Any, origin: str) -> int:
        return httpx.post(f"{node.url}/v1/ingest", params={"key": key}, timeout=10,
                          headers={"Origin": origin},
                          json={"events": [{"message": "hi"}]}).status_code

    assert [send(n, "https://a.example") for n in (one, two, three)] == [202] * 3
    with three.client() as admin:
        changed_at = time.monotonic()
        r = admin.patch("/v1/projects/web", json={"allowedOrigins": ["https://b.example"]})
        assert r.status_code == 200, r.text
    took = {}
    for name, node in (("node 1", one), ("node 2", two)):
        while send(node, "https://a.example") != 403:
            assert time.monotonic() - changed_at < 1.0, f"{name} still takes the old origin"
            time.sleep(0.02)
        took[name] = time.monotonic() - changed_at
        assert send(node, "https://b.example") == 202
    with capsys.disabled():
        print("\nallowedOrigins changed on node 3: in force on " + ", ".join(
            f"{n} after {s * 1000:.0f} ms" for n, s in took.items()))


def test_an_ingest_key_disabled_through_one_node_is_refused_on_the_others_within_a_second(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    one, two, three = cluster[0], cluster[1], cluster[2]
    with three.client() as admin:
        key = str(create_project(admin, "pages")["ingestKey"])

    def send(node: Any) -> httpx.Response:
        return httpx.post(f"{node.url}/v1/ingest", params={"key": key}, timeout=10,
                          json={"events": [{"message": "hi"}]})

    assert [send(n).status_code for n in (one, two, three)] == [202] * 3  # known everywhere
    with three.client() as admin:
        changed_at = time.monotonic()
        r = admin.patch(f"/v1/projects/pages/ingest-keys/{key}", json={"enabled": False})
        assert r.status_code == 200, r.text
    took = {}
    for name, node in (("node 1", one), ("node 2", two)):
        while (r := send(node)).status_code != 401:
            assert time.monotonic() - changed_at < 1.0, f"{name} still takes the disabled key"
            time.sleep(0.02)
        assert r.json()["error"]["code"] == "unknown_ingest_key"
        took[name] = time.monotonic() - changed_at
    assert send(three).status_code == 401
    with capsys.disabled():
        print("\ningest key disabled on node 3: refused on " + ", ".join(
            f"{n} after {s * 1000:.0f} ms" for n, s in took.items()))
