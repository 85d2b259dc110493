"""logs_tail over SSE: filters, resume without loss or duplicates, slow readers, caps.

The tests share one server (``tserver`` below), each on a project of its own name and
starting once no tail of an earlier test is open: a tenant's cap counts all of its tails.
The slow reader's test reads exact /metrics counters and starts its own."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.server import Server, create_project
from tests.support.sse import Tail, messages

ENV = {"BOXTRAIL_TAIL_HEARTBEAT_S": "0.3", "BOXTRAIL_TAIL_MAX_BEHIND": "1000",
       "BOXTRAIL_TAIL_MAX_PER_TENANT": "3"}


@pytest.fixture(scope="module")
def shared_tserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(tmp_path_factory.mktemp("tail") / "data", ENV).start()
    yield server
    server.stop()


@pytest.fixture
def tserver(shared_tserver: Server) -> Server:
    """The module's server once the tails of earlier tests are gone (a closed tail is
    let go at its next heartbeat): each test finds its tenant's cap unused."""
    with shared_tserver.client() as api:
        wait_for(lambda: "boxtrail_tail_subscribers 0" in api.get("/metrics").text)
    return shared_tserver


@pytest.fixture
def own_tserver(tmp_path: Path) -> Iterator[Server]:
    """A fresh server: its /metrics count this test's rows and drops alone."""
    server = Server(tmp_path / "data", ENV).start()
    yield server
    server.stop()


def send(server: Server, key: str, box: str, messages_: list[str], level: str = "info") -> None:
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key},
                   json={"context": {"boxId": box},
                         "events": [{"level": level, "message": m} for m in messages_]})
    assert r.status_code == 202, r.text


def opened(api: httpx.Client, path: str, **kwargs: object) -> tuple[int, str]:
    """Status and (for refusals) body of a tail request, without reading a stream."""
    with api.stream("GET", path, **kwargs) as response:  # type: ignore[arg-type]
        body = response.read().decode() if response.status_code != 200 else ""
        return response.status_code, body


def wait_for(condition: Callable[[], bool], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_tail_streams_matching_rows(tserver: Server) -> None:
    with tserver.client() as api:
        key = str(create_project(api, "streamed")["ingestKey"])
        everything = Tail(api, "/v1/projects/streamed/tail")
        boxed = Tail(api, "/v1/projects/streamed/tail", {"boxId": "b1"})
        queried = Tail(api, "/v1/projects/streamed/tail", {"query": "level:error checkout"})
        assert everything.status == boxed.status == queried.status == 200
        send(tserver, key, "b1", ["hello", "checkout failed"], level="error")
        send(tserver, key, "b2", ["checkout ok", "bye"])
        wait_for(lambda: len(everything.logs()) == 4)
        wait_for(lambda: len(queried.logs()) == 1)
        time.sleep(0.3)
        for tail in (everything, boxed, queried):
            tail.close()
        assert [r["message"] for r in everything.logs()] == [
            "hello", "checkout failed", "checkout ok", "bye"]
        assert [r["message"] for r in boxed.logs()] == ["hello", "checkout failed"]
        assert [r["message"] for r in queried.logs()] == ["checkout failed"]
        ids = [str(m.id) for m in everything.received if m.event == "log"]
        assert ids == [r["id"] for r in everything.logs()] and ids == sorted(ids)
        assert any(m.comment == "heartbeat" for m in everything.received)


def test_resume_with_last_event_id(tserver: Server) -> None:
    with tserver.client() as api:
        key = str(create_project(api, "resumed")["ingestKey"])
        first = Tail(api, "/v1/projects/resumed/tail")
        send(tserver, key, "b", [f"m{i}" for i in range(10)])
        wait_for(lambda: len(first.logs()) == 10)
        first.close()
        last_id = str(first.logs()[4]["id"])  # as if the connection dropped after m4
        send(tserver, key, "b", [f"n{i}" for i in range(10)])
        # Let the first rows reach Parquet, so the resume reads both sources.
        wait_for(lambda: api.get("/v1/projects/resumed/logs").headers["x-boxtrail-files-total"]
                 != "0")
        again = Tail(api, "/v1/projects/resumed/tail", headers={"Last-Event-ID": last_id})
        send(tserver, key, "b", ["after"])
        wait_for(lambda: len(again.logs()) == 16)
        time.sleep(0.3)
        again.close()
        expected = [f"m{i}" for i in range(5, 10)] + [f"n{i}" for i in range(10)] + ["after"]
        assert [r["message"] for r in again.logs()] == expected


def test_slow_reader_gets_dropped_count(own_tserver: Server) -> None:
    with own_tserver.client() as api:
        key = str(create_project(api, "t")["ingestKey"])
        total = 60_000
        padding = "x" * 300
        with api.stream("GET", "/v1/projects/t/tail",
                        timeout=httpx.Timeout(60, read=None)) as response:
            assert response.status_code == 200
            # Nothing is read while 60k rows (~25 MB of SSE) arrive: the socket buffers
            # fill up and the server's stream for this reader blocks.
            for start in range(0, total, 1000):
                send(own_tserver, key, "b", [f"{n} {padding}" for n in range(start, start + 1000)])
            delivered: list[int] = []
            dropped = 0
            deadline = time.monotonic() + 60
            for message in messages(response):  # heartbeats keep this loop turning
                assert time.monotonic() < deadline, (len(delivered), dropped)
                if message.event == "log":
                    delivered.append(int(str(message.json()["message"]).split()[0]))
                elif message.event == "dropped":
                    dropped += int(message.json()["count"])  # type: ignore[call-overload]
                if len(delivered) + dropped >= total:
                    break
        assert dropped > 0
        assert len(delivered) + dropped == total
        assert len(set(delivered)) == len(delivered) and delivered == sorted(delivered)
        assert f"boxtrail_tail_dropped_total {dropped}" in api.get("/metrics").text
        # Ingest never waited for the reader: every row is stored.
        assert "boxtrail_events_accepted_total 60000" in api.get("/metrics").text


def test_tails_per_tenant_are_capped_and_isolated(tserver: Server) -> None:
    with tserver.client() as api:
        create_project(api, "capped")
        tails = [Tail(api, "/v1/projects/capped/tail") for _ in range(3)]
        assert [t.status for t in tails] == [200, 200, 200]
        status, body = opened(api, "/v1/projects/capped/tail")
        assert status == 429 and '"too_many_tails"' in body
        for tail in tails:
            tail.close()
        wait_for(lambda: "boxtrail_tail_subscribers 0" in api.get("/metrics").text)
        assert opened(api, "/v1/projects/capped/tail", params={"query": "(("})[0] == 400
        assert opened(api, "/v1/projects/capped/tail", headers={"Last-Event-ID": "zz"})[0] == 400
    other_key = subprocess.run(
        [sys.executable, "-m", "boxtrail", "keys", "create", "--tenant", "other"],
        env={"BOXTRAIL_DATA_DIR": str(tserver.data_dir), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True).stdout.strip()
    with httpx.Client(base_url=tserver.url,
                      headers={"Authorization": f"Bearer {other_key}"}) as other:
        status, body = opened(other, "/v1/projects/capped/tail")
        assert status == 404 and '"not_found"' in body




def test_the_tail_cap_holds_for_simultaneous_opens(tserver: Server) -> None:
    """Tails opened at the same moment are counted when accepted, not when they first
    send: the cap of 3 admits exactly 3 of 8, and closing them frees the slots."""
    with tserver.client() as api:
        create_project(api, "simultaneous")

    async def open_all() -> list[int]:
        async with httpx.AsyncClient(base_url=tserver.url, timeout=10,
                                     headers={"Authorization": f"Bearer {tserver.api_key}"}
                                     ) as client:
            async def one() -> tuple[int, httpx.Response]:
                request = client.build_request("GET", "/v1/projects/simultaneous/tail")
                response = await client.send(request, stream=True)
                return response.status_code, response

            opened_ = await asyncio.gather(*(one() for _ in range(8)))
            statuses = sorted(status for status, _ in opened_)
            for _, response in opened_:
                await response.aclose()
            return statuses

    for _ in range(3):
        assert asyncio.run(open_all()) == [200] * 3 + [429] * 5
        with tserver.client() as api:
            wait_for(lambda: "boxtrail_tail_subscribers 0" in api.get("/metrics").text)
