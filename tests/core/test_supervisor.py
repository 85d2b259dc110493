"""Every long-lived background task, made to die of an exception nobody listed, is
restarted with backoff, counted in /metrics, and named by /readyz (503) while it keeps
dying; /readyz is 200 again once it has run a while (issue 35, point 1).

The app is the real one (``assemble``), in process: a single node for the WAL's commit
loop, the flusher, the compactor, the membership keeper and a live tail's hub, a cluster
node (real PostgreSQL and Redis) for the bus's four loops. The fault is put where each
loop really calls out: Redis commands for the publisher and the reader, the peers for the
trimmer; where a loop calls nothing outside its own error handling, it raises as it
starts. A hub is made when a tail opens, so that case opens one, and checks that its rows
keep coming while its hub keeps dying (each death sends the tail back to its cursor)."""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio.client as redis_client
from litestar.testing import AsyncTestClient

from boxtrail import app as app_module
from boxtrail.app import assemble
from cluster.bus import RedisBus
from cluster.peers import Peers
from core import supervisor as supervisor_module
from core.config import load
from core.metrics import Registry
from core.supervisor import FAILING_DEATHS, Supervisor
from ingest.service import IngestService
from ingest.wal import Wal
from metadata.sqlite import open_db
from query.frames import frame
from query.hubs import Hub
from tenancy.tenants import Tenancy

HEALTHY_S = 1.0  # instead of 10 s: a test waits it out


class Fault:
    """An exception no loop handles, raised while ``on``."""

    def __init__(self) -> None:
        self.on = False

    def check(self) -> None:
        if self.on:
            raise RuntimeError("injected: a failure nobody listed")


def _raising_first(original: Callable[..., Awaitable[None]], fault: Fault
                   ) -> Callable[..., Awaitable[None]]:
    async def loop(*args: Any) -> None:
        fault.check()
        await original(*args)

    return loop


def _raising_in(original: Callable[..., Any], fault: Fault) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        fault.check()
        return original(*args, **kwargs)

    return call


# task -> how its fault goes in, and whether it is on from the start (a loop that calls
# nothing outside its own handlers dies as it starts), or turned on once the app runs.
def _inject(task: str, fault: Fault, monkeypatch: pytest.MonkeyPatch) -> bool:
    at_start = {"flush": (IngestService, "_flush_loop"),
                "compact": (IngestService, "_compact_loop"),
                "wal-commit": (Wal, "_commit_loop"),
                "bus-answer": (RedisBus, "_answer_loop"),
                "membership": (app_module, "_keep_membership"),
                "tail-hub": (Hub, "run")}
    if task in at_start:
        owner, name = at_start[task]
        monkeypatch.setattr(owner, name, _raising_first(getattr(owner, name), fault))
        return True
    if task == "bus-read":  # what a reset connection did (uvloop's RuntimeError)
        monkeypatch.setattr(redis_client.Redis, "xread",
                            _raising_in(redis_client.Redis.xread, fault))
    elif task == "bus-publish":
        monkeypatch.setattr(redis_client.Pipeline, "execute",
                            _raising_in(redis_client.Pipeline.execute, fault))
    elif task == "bus-trim":
        monkeypatch.setattr(Peers, "holding", _raising_in(Peers.holding, fault))
    return False


def _metric(text: str, name: str, task: str) -> int:
    found = re.search(rf'^{name}{{task="{task}"}} (\d+)$', text, re.M)
    assert found, f"{name} has no series for {task}"
    return int(found.group(1))


def _metric_plain(text: str, name: str, labels: str) -> float:
    found = re.search(rf'^{name}{{{labels}}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


async def _until(check: Callable[[], Awaitable[bool]], limit_s: float, what: str) -> float:
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < limit_s, what
        await asyncio.sleep(0.05)
    return time.monotonic() - started


@pytest.fixture
def quick_health(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(supervisor_module, "HEALTHY_S", HEALTHY_S)
    yield


SINGLE = ["wal-commit", "flush", "compact", "membership", "tail-hub"]
CLUSTER = ["bus-publish", "bus-read", "bus-trim", "bus-answer"]


@pytest.mark.parametrize("task", SINGLE + CLUSTER)
def test_a_task_that_keeps_dying_is_restarted_counted_and_named_by_readyz(
        task: str, tmp_path: Path, quick_health: None, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    env = {"BOXTRAIL_DATA_DIR": str(tmp_path / "data"), "BOXTRAIL_FLUSH_INTERVAL_S": "0.2",
           "BOXTRAIL_COMPACT_INTERVAL_S": "0.2"}
    ingest_key = project_id = ""
    if task in CLUSTER:
        env.update(BOXTRAIL_CATALOG_URL=request.getfixturevalue("pg_url"),
                   BOXTRAIL_BUS_URL=request.getfixturevalue("redis_url"),
                   BOXTRAIL_NODE_ID="n1")
    else:  # a project to ingest into, made before the app opens its database
        (tmp_path / "data").mkdir()
        db = open_db(tmp_path / "data" / "meta.sqlite")
        tenancy = Tenancy(db)
        project = tenancy.create_project(tenancy.ensure_tenant("t"), "p", [])
        ingest_key, project_id = project.ingest_key, project.id
        db.close()
    fault = Fault()
    fault.on = _inject(task, fault, monkeypatch)
    app, served = assemble(load(env))

    async def main() -> None:
        async with AsyncTestClient(app) as client:
            async def failing() -> bool:
                return (await client.get("/readyz")).status_code == 503

            async def ready() -> bool:
                return (await client.get("/readyz")).status_code == 200

            async def ingest(message: str = "m") -> int:
                r = await client.post(f"/v1/ingest?key={ingest_key}",
                                      json={"events": [{"message": message}]})
                return r.status_code

            tailed: list[bytes] = []

            async def tail() -> None:
                async with aclosing(served.tails.follow(project_id, None, None, 0, frame,
                                                        0.2)) as parts:
                    async for part in parts:
                        if isinstance(part, bytes):
                            tailed.append(part)

            async def tailed_has(message: str) -> bool:
                return any(message.encode() in part for part in tailed)

            if task == "tail-hub":
                reader = asyncio.create_task(tail())  # its hub is made, and dies
            fault.on = True
            took = await _until(failing, 10, f"/readyz never named {task}")
            answer = await client.get("/readyz")
            body = answer.json()
            # The one error shape, naming the task and what it dies of.
            assert set(body) == {"error"} and body["error"]["code"] == "unavailable"
            assert task in body["error"]["message"]
            [named] = body["error"]["detail"]["failing"]
            assert named["task"] == task and named["error"] == "RuntimeError"
            assert named["deaths"] >= FAILING_DEATHS
            text = (await client.get("/metrics")).text
            deaths = _metric(text, "boxtrail_task_deaths_total", task)
            assert deaths >= FAILING_DEATHS
            assert _metric(text, "boxtrail_task_restarts_total", task) >= FAILING_DEATHS - 1
            assert re.search(r"^boxtrail_tasks_failing 1$", text, re.M)
            if task == "wal-commit":  # nothing is acknowledged while it cannot commit
                assert await ingest() == 503
            if task == "tail-hub":  # its tail reads from its cursor meanwhile
                assert await ingest("while-dying") == 202
                await _until(lambda: tailed_has("while-dying"), 10, "the tail stopped")
            fault.on = False
            mended = await _until(ready, 5 * supervisor_module.MAX_BACKOFF_S + HEALTHY_S,
                                  f"/readyz stayed 503 after {task} was mended")
            text = (await client.get("/metrics")).text
            assert (_metric(text, "boxtrail_task_restarts_total", task)
                    == _metric(text, "boxtrail_task_deaths_total", task))
            assert re.search(r"^boxtrail_tasks_failing 0$", text, re.M)
            if task in SINGLE:
                assert await ingest("mended") == 202
            if task == "tail-hub":  # live again, through the hub
                live = _metric_plain(text, "boxtrail_tail_pages_total", 'source="live"')
                await _until(lambda: tailed_has("mended"), 10, "the tail stopped")
                text = (await client.get("/metrics")).text
                assert _metric_plain(text, "boxtrail_tail_pages_total",
                                     'source="live"') > live
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
            print(f"\n{task}: named by /readyz {took:.2f} s after the fault, ready "
                  f"{mended:.2f} s after it ended; {deaths} deaths by then")

    asyncio.run(main())


# The supervisor alone: backoff, what counts as a death, when a task is well again.


def test_deaths_back_off_and_a_run_of_healthy_s_ends_the_streak(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor_module, "HEALTHY_S", 0.3)
    registry = Registry()
    supervisor = Supervisor(registry)
    starts: list[float] = []
    dying = [5]

    async def loop() -> None:
        starts.append(time.monotonic())
        if dying[0]:
            dying[0] -= 1
            raise ValueError("again")
        await asyncio.sleep(3600)

    async def main() -> None:
        task = supervisor.start("t", loop)
        while len(starts) < 6:
            await asyncio.sleep(0.01)
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        # 0.1, 0.2, 0.4, 0.8, 1.6 s, doubling (the sleep's own slack aside)
        for gap, backoff in zip(gaps, [0.1, 0.2, 0.4, 0.8, 1.6], strict=True):
            assert backoff <= gap < backoff + 0.1
        assert [f.task for f in supervisor.failing()] == ["t"]  # running, not yet well
        await asyncio.sleep(0.35)
        assert supervisor.failing() == []
        assert 'boxtrail_task_deaths_total{task="t"} 5' in registry.render()
        assert 'boxtrail_task_restarts_total{task="t"} 5' in registry.render()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_a_stop_is_never_a_death_even_when_a_library_turns_it_into_an_error() -> None:
    registry = Registry()
    supervisor = Supervisor(registry)

    async def loop(ready: asyncio.Event) -> None:
        ready.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise ConnectionError("Connection closed") from None  # as redis-py may

    async def ends(ready: asyncio.Event) -> None:
        ready.set()

    async def main() -> None:
        ready = asyncio.Event()
        task = supervisor.start("stopped", lambda: loop(ready))
        await ready.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        done = asyncio.Event()
        returned = supervisor.start("returned", lambda: ends(done))
        await returned  # a loop that returns has ended on purpose
        text = registry.render()
        for name in ("stopped", "returned"):
            assert f'boxtrail_task_deaths_total{{task="{name}"}} 0' in text
            assert f'boxtrail_task_restarts_total{{task="{name}"}} 0' in text

    asyncio.run(main())
