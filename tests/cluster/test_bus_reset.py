"""A node's Redis connections are reset: its bus comes back by itself, and its rows cross
to the other nodes live again, without a restart (issue 35, point 1).

Two ways a reset reaches the bus. Redis closing the connections (``CLIENT KILL``, or
redis-server restarted on its port) arrives as redis-py's ``ConnectionError``, which the
loops retry. A connection whose transport was closed before redis-py noticed makes
uvloop raise ``RuntimeError`` from the next write ("the handler is closed"), which no loop
handles: before the supervisor, that ended the loop for good. The first test closes the
node's transports under redis-py, under uvloop as the server runs, and gets exactly that
error; the second resets the connections of real nodes from the Redis side.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
import redis
import uvloop

from core.metrics import Registry
from core.supervisor import Supervisor
from tests.cluster.test_bus_asks import ids_of, nodes, read, until
from tests.support.pgserver import PgServer
from tests.support.redisserver import RedisServer
from tests.support.server import Server, create_project


def _reset_transports(client: object) -> int:
    """Close every socket of a redis-py client's pool under it, as a reset does, without
    telling redis-py; how many there were."""
    pool = client.connection_pool  # type: ignore[attr-defined]
    closed = 0
    for conn in [*pool._available_connections, *pool._in_use_connections]:
        if conn._writer is not None:
            conn._writer.transport.abort()
            closed += 1
    return closed


def _metric(text: str, name: str, task: str) -> int:
    found = re.search(rf'^{name}{{task="{task}"}} (\d+)$', text, re.M)
    assert found, f"{name} has no series for {task}"
    return int(found.group(1))


def test_a_reset_that_makes_uvloop_raise_stops_nothing(redis_url: str) -> None:
    """The error of the issue: the loops that die of it are restarted and counted, and
    the node's rows reach the other node live again, both ways."""
    registry = Registry()

    async def main() -> None:
        async with nodes(redis_url, 2, Supervisor(registry)) as (a, b):
            sent, theirs = [a.ingest("p", 5)], []
            await b.peers.prepare("p")  # b reads p: a's batches of it carry their rows
            await until(lambda: read(b, "p") == ids_of(sent, "p"))
            for round_ in range(3):
                assert _reset_transports(a.bus.redis) > 0
                reset_at = time.monotonic()
                sent.append(a.ingest("p", 5))
                await until(lambda: read(b, "p") == ids_of(sent, "p"), 10)
                across = time.monotonic() - reset_at
                theirs.append(b.ingest("q", 3))
                await a.peers.prepare("q")
                await until(lambda: read(a, "q") == ids_of(theirs, "q"), 10)
                deaths = {task: _metric(registry.render(), "boxtrail_task_deaths_total", task)
                          for task in ("bus-publish", "bus-read")}
                print(f"\nreset {round_ + 1}: a's rows on b {across * 1000:.0f} ms after "
                      f"it; deaths so far {deaths}")
            # The reset made at least one loop die of what no loop handles, as in the
            # issue; every death was followed by a restart, and every loop still runs.
            assert sum(deaths.values()) >= 1
            for task in ("bus-publish", "bus-read", "bus-trim", "bus-answer"):
                text = registry.render()
                assert (_metric(text, "boxtrail_task_restarts_total", task)
                        == _metric(text, "boxtrail_task_deaths_total", task))
            assert not any(task.done() for task in a.bus._tasks)

    uvloop.run(main())


@pytest.mark.timeout(180)
def test_real_nodes_share_rows_live_again_after_their_connections_are_reset(
        tmp_path: Path, pg_server: PgServer) -> None:
    """Two real nodes with flushes held back (a row reaches the other node over the bus
    or not at all): Redis kills every client connection three times, then restarts on
    its port; each time, rows sent to node 1 afterwards are read on node 2 within 5 s,
    and both nodes stay ready."""
    with RedisServer() as redis_server:
        shared = {"BOXTRAIL_CATALOG_URL": pg_server.new_database(),
                  "BOXTRAIL_BUS_URL": redis_server.url(),
                  "BOXTRAIL_FLUSH_INTERVAL_S": "3600"}
        first = Server(tmp_path / "n1", {**shared, "BOXTRAIL_NODE_ID": "n1"}).start()
        second = Server(tmp_path / "n2", {**shared, "BOXTRAIL_NODE_ID": "n2"}).start()
        try:
            with first.client() as api:
                key = str(create_project(api, "reset")["ingestKey"])
            with httpx.Client(timeout=10) as plain, second.client() as reader:

                def send(box: str) -> None:
                    r = plain.post(f"{first.url}/v1/ingest", params={"key": key},
                                   json={"context": {"boxId": box},
                                         "events": [{"message": box}]})
                    assert r.status_code == 202, r.text

                def seen(box: str, limit_s: float = 5.0) -> float:
                    """How long until node 2 reads the row sent from ``box``."""
                    started = time.monotonic()
                    while True:
                        rows = reader.get("/v1/projects/reset/logs",
                                          params={"since": "1h", "boxId": box})
                        assert rows.status_code == 200, rows.text
                        if [row["message"] for row in rows.json()["rows"]] == [box]:
                            return time.monotonic() - started
                        assert time.monotonic() - started < limit_s, f"{box} not seen"
                        time.sleep(0.05)

                send("before")
                seen("before")
                with redis.Redis.from_url(redis_server.url()) as admin:
                    for n in range(3):
                        killed = admin.client_kill_filter(_type="normal", skipme=True)
                        assert killed >= 2  # at least each node's reader
                        send(f"after-kill-{n}")
                        took = seen(f"after-kill-{n}")
                        print(f"\nCLIENT KILL {n + 1} ({killed} connections): on node 2 "
                              f"{took * 1000:.0f} ms after the send")
                redis_server.stop()
                redis_server.start()  # the same port: the nodes reconnect on their own
                send("after-restart")
                took = seen("after-restart", 10.0)
                print(f"redis-server restarted: on node 2 {took * 1000:.0f} ms after the send")
            for node in (first, second):
                assert httpx.get(f"{node.url}/readyz", timeout=10).status_code == 200
                text = httpx.get(f"{node.url}/metrics", timeout=10).text
                for task in ("bus-publish", "bus-read"):
                    assert (_metric(text, "boxtrail_task_restarts_total", task)
                            == _metric(text, "boxtrail_task_deaths_total", task))
        finally:
            first.stop()
            second.stop()

