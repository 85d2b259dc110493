"""A Hypothesis state machine over one real server: ingest, deletions (a box, a query, a
time range), flushes and compactions (every second, in the background), graceful restarts
and SIGKILLs, and reads, interleaved. At every read, against a model of what was
acknowledged and what each job selects (the rows acknowledged before it, matching it):

- no row a finished job selected is returned;
- every acknowledged row that no job selected is returned, intact;
- nothing else is returned.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.support.server import Server, create_project, search_all

BOXES = ("a", "b", "c")
USERS = (1, 2, 3)
MINUTE_MS = 60_000


@dataclass
class Job:
    id: str
    selects: Callable[[dict[str, Any]], bool]
    upto: int  # rows numbered at or below it existed when it was made
    done: bool = False


@dataclass
class Model:
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)  # n -> what was sent
    jobs: list[Job] = field(default_factory=list)


class Deletions(RuleBasedStateMachine):
    root: Path

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.n = 0
        self.now_ms = int(time.time() * 1000)
        self.server = Server(self.root / f"data-{time.monotonic_ns()}", {
            "BOXTRAIL_FLUSH_INTERVAL_S": "1", "BOXTRAIL_COMPACT_INTERVAL_S": "1",
            "BOXTRAIL_COMPACT_MIN_FILES": "2", "BOXTRAIL_WORKER_PROCESSES": "0",
            "BOXTRAIL_DELETION_GRACE_S": "1"}).start()
        with self.server.client() as api:
            self.key = str(create_project(api, "m")["ingestKey"])

    def teardown(self) -> None:
        self.server.stop()

    @rule(box=st.sampled_from(BOXES), users=st.lists(st.sampled_from(USERS), min_size=1,
                                                     max_size=6),
          ago=st.integers(0, 90))
    def ingest(self, box: str, users: list[int], ago: int) -> None:
        events = []
        for user in users:
            self.n += 1
            ts = self.now_ms - ago * MINUTE_MS
            self.model.rows[self.n] = {"box": box, "user": user, "ts": ts}
            events.append({"message": f"n={self.n}", "ts": ts,
                           "attrs": {"userId": user, "n": self.n}})
        r = httpx.post(f"{self.server.url}/v1/ingest", params={"key": self.key}, timeout=10,
                       json={"context": {"boxId": box}, "events": events})
        assert r.status_code == 202, r.text

    @precondition(lambda self: self.model.rows)
    @rule(kind=st.sampled_from(("box", "query", "range")), box=st.sampled_from(BOXES),
          user=st.sampled_from(USERS), start=st.integers(0, 90), width=st.integers(1, 60))
    def delete(self, kind: str, box: str, user: int, start: int, width: int) -> None:
        body: dict[str, Any]
        if kind == "box":
            body = {"box": box}
            selects: Callable[[dict[str, Any]], bool] = lambda r: r["box"] == box  # noqa: E731
        elif kind == "query":
            body = {"query": f"attr.userId:{user}"}
            selects = lambda r: r["user"] == user  # noqa: E731
        else:
            since = self.now_ms - (start + width) * MINUTE_MS
            until = self.now_ms - start * MINUTE_MS
            body = {"box": box, "since": _iso(since), "until": _iso(until)}
            selects = lambda r: r["box"] == box and since <= r["ts"] < until  # noqa: E731
        with self.server.client() as api:
            r = api.post("/v1/projects/m/deletions", json=body)
        assert r.status_code == 202, r.text
        self.model.jobs.append(Job(r.json()["id"], selects, self.n))

    @rule()
    def settle(self) -> None:
        """Time for flushes, compactions and the jobs' steps to run."""
        time.sleep(1.5)

    @precondition(lambda self: any(not j.done for j in self.model.jobs))
    @rule()
    def finish_jobs(self) -> None:
        """Until every job is done (a job's purge waits its grace, 1 s here)."""
        deadline = time.monotonic() + 30
        with self.server.client() as api:
            for job in self.model.jobs:
                while api.get(f"/v1/deletions/{job.id}").json()["state"] != "done":
                    assert time.monotonic() < deadline, job
                    time.sleep(0.25)
                job.done = True

    @rule()
    def restart(self) -> None:
        self.server.stop()
        self.server.start()

    @rule()
    def kill(self) -> None:
        self.server.kill()
        self.server.start()

    @invariant()
    def reads_are_exact(self) -> None:
        with self.server.client() as api:
            for job in self.model.jobs:
                if not job.done:
                    r = api.get(f"/v1/deletions/{job.id}")
                    assert r.status_code == 200, r.text
                    job.done = r.json()["state"] == "done"
            stored = {int(str(row["message"]).removeprefix("n=")): row
                      for row in search_all(api, "m", since="1d")}
        for n, sent in self.model.rows.items():
            selected_by = [j for j in self.model.jobs if n <= j.upto and j.selects(sent)]
            if any(j.done for j in selected_by):
                assert n not in stored, (n, sent)
            elif not selected_by:
                assert n in stored, (n, sent)
                row = stored[n]
                assert row["boxId"] == sent["box"] and row["attrs"]["userId"] == sent["user"]
        assert set(stored) <= set(self.model.rows)


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


@pytest.mark.timeout(600)
def test_deletions_interleaved_with_ingest_flushes_compactions_restarts_and_reads(
        tmp_path: Path) -> None:
    Deletions.root = tmp_path
    run = Deletions.TestCase
    run.settings = settings(max_examples=4, stateful_step_count=14, deadline=None,
                            suppress_health_check=list(HealthCheck))
    run().runTest()
