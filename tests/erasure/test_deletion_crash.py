"""A deletion job survives SIGKILL in every phase: the server is killed at several moments
after the request (the phase it had reached is read from the catalog), restarted on the
same data directory, and the job completes with exactly the selected rows gone and every
other row intact; a project deletion leaves no object, no file row, no WAL record."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.erasure.test_deletions import (
    catalog,
    export,
    send,
    stored_messages,
    wait_done,
    wal_bytes,
)
from tests.support.server import Server, create_project

BOXES = 24  # one file per box per flush: the file step has files to work through
# Before the first round (queued), during the file step or just after, in the purge wait
# (the grace, shortened from 5 s).
GRACE_S = 2.0
KILL_AFTER_S = (0.05, 0.6, 1.6)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "data", {"BOXTRAIL_FLUSH_INTERVAL_S": "3600",
                                     "BOXTRAIL_WORKER_PROCESSES": "0",
                                     "BOXTRAIL_DELETION_GRACE_S": str(GRACE_S)}).start()
    yield srv
    srv.stop()


def fill(server: Server, name: str) -> dict[str, Any]:
    with server.client() as api:
        project = create_project(api, name)
    key = str(project["ingestKey"])
    for part in ("parquet", "buffer"):
        for box in range(BOXES):
            send(server, key, f"b{box}", [
                {"message": f"box=b{box} user={u} part={part} n={i} of={name}",
                 "attrs": {"userId": u}}
                for i in range(10) for u in (1, 2)])
        if part == "parquet":
            server.stop()
            server.start()
    return project


def phase_of(server: Server, job_id: str) -> str:
    [(state, phase)] = catalog(server, "SELECT state, phase FROM deletions WHERE id = ?",
                               (job_id,))
    return f"{state}/{phase}"


KINDS = {
    "query": ({"query": "attr.userId:2"}, lambda m: "user=2 " in m),
    "box-and-range": ({"box": "b3", "since": "1d"}, lambda m: m.startswith("box=b3 ")),
    "project": (None, lambda m: True),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_job_killed_in_any_phase_completes_after_a_restart(server: Server, kind: str) -> None:
    seen = set()
    for attempt, kill_after_s in enumerate(KILL_AFTER_S):
        seen.add(killed_once(server, kind, f"crash-{kind}-{attempt}", kill_after_s))
    # Between them, the kills cut the job before its first round and in its purge wait (a
    # file step of a few dozen files takes tens of milliseconds: a kill lands in it by
    # chance; a job cut before it runs all of it after the restart).
    assert any(p.startswith("queued") or p.endswith(("/nodes", "/files")) for p in seen), seen
    assert "running/purge" in seen, seen


def killed_once(server: Server, kind: str, name: str, kill_after_s: float) -> str:
    selector, selected = KINDS[kind]
    project = fill(server, name)
    pid = str(project["id"])
    before = export(server, name)
    assert len(before) == 2 * BOXES * 20
    with server.client() as api:
        if selector is None:
            r = api.delete(f"/v1/projects/{name}")
        else:
            r = api.post(f"/v1/projects/{name}/deletions", json=selector)
        assert r.status_code == 202, r.text
        job = r.json()
    time.sleep(kill_after_s)
    server.kill()
    phase = phase_of(server, job["id"])
    print(f"\n{kind}: killed {kill_after_s} s after the request, in {phase}")
    server.start()
    done = wait_done(server, job)
    gone = {i for i, row in before.items() if selected(row["message"])}
    if selector is None:
        with server.client() as api:
            assert api.get(f"/v1/projects/{name}").status_code == 404
        assert not stored_messages(server, pid)
        assert catalog(server, "SELECT count(*) FROM files WHERE project_id = ?",
                       (pid,)) == [(0,)]
        assert f"of={name}".encode() not in wal_bytes(server)
    else:
        after = export(server, name)
        assert set(after) == set(before) - gone
        assert all(after[i] == before[i] for i in after)
        assert not [m for m in stored_messages(server, pid) if selected(m)]
        wal = wal_bytes(server)
        assert not [i for i in gone if before[i]["message"].encode() in wal]
    # Counted once, whichever step the kill cut (each count commits with its step).
    removed = done["removed"]
    assert removed["rows"] + removed["bufferedRows"] == len(gone), (phase, done)
    return phase
