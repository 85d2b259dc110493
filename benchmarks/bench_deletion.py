"""Deletion jobs on a real server over 1 M rows in 100 Parquet files per project.

Two projects are written the way boxtrail stores them (``history.py``: one file per (box,
day), 5 boxes x 20 days, 10,000 rows each), into a fresh data directory, before the server
starts. Then, through the API:

- a query deletion that selects about 1% of one project's rows (``QUERY``):
  the time of its file step (every file read, the ones holding a selected row rewritten),
  the time from the request to ``purgedAt`` (which includes the 5 s grace the replaced
  files are kept for reads that planned them), and the bytes read, rewritten and deleted;
- ``DELETE`` of the other project: the time from the request to ``purgedAt``, and to the
  404 (at once).

Each is checked: the first project's rows are counted before and after (exactly the
selected ones gone), the second's objects are listed (none left). Prints JSON.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))  # run as a script, import the package beside it

from benchmarks.bench_ingest import (  # noqa: E402
    BOXTRAIL_LISTENING,
    BenchError,
    ServerProcess,
    boxtrail_env,
    machine,
)
from benchmarks.history import make_pool, write_history  # noqa: E402
from core.storage import LocalStorage  # noqa: E402
from erasure.jobs import FILE_THREADS  # noqa: E402
from ingest.flusher import DAY_MS, encode_parquet  # noqa: E402
from metadata.catalog import Catalog  # noqa: E402
from metadata.sqlite import open_db  # noqa: E402
from tenancy.tenants import Tenancy  # noqa: E402

QUERY = "attr.userId:u_99* OR attr.userId:u_98*"  # userIds u_1000..u_99999: ~1% of rows


def log(message: str) -> None:
    print(f"bench_deletion: {message}", file=sys.stderr, flush=True)


def prepare(data: Path, rows: int, days: int, boxes: int) -> tuple[str, dict[str, str]]:
    """The dev tenant's key and two projects' histories, written before the server runs."""
    db = open_db(data / "meta.sqlite")
    try:
        tenancy = Tenancy(db)
        tenant = tenancy.ensure_tenant("bench")
        api_key, _ = tenancy.keys.create(tenant, "bench")
        catalog = Catalog(db)
        storage = LocalStorage(str(data / "objects"))
        pool = make_pool(20261206, boxes, 4096)
        anchor = int(time.time() * 1000) - 3_600_000
        projects = {}
        for index, name in enumerate(("erased", "deleted")):
            project = tenancy.create_project(tenant, name, [])
            written = write_history(pool, catalog, storage, project.id, index,
                                    anchor - days * DAY_MS, anchor, rows / days, 7)
            log(f"{name}: {written.rows:,} rows in {written.files} files, "
                f"{written.bytes / 1e6:.1f} MB")
            projects[name] = project.id
        storage.close()
    finally:
        db.close()
    return api_key, projects


class Api:
    def __init__(self, host: str, port: int, key: str) -> None:
        self.host, self.port, self.key = host, port, key

    def call(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            headers = {"Authorization": f"Bearer {self.key}"}
            data = None
            if body is not None:
                data = json.dumps(body)
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        return response.status, json.loads(raw) if raw else None

    def count(self, project: str, query: str = "") -> int:
        path = f"/v1/projects/{project}/histogram?since=60d&buckets=1"
        if query:
            path += "&query=" + quote(query, safe="")
        status, body = self.call("GET", path)
        if status != 200:
            raise BenchError(f"histogram: {status} {body}")
        return int(body["total"])

    def wait_done(self, job_id: str, timeout_s: float = 600) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status, job = self.call("GET", f"/v1/deletions/{job_id}")
            if status != 200:
                raise BenchError(f"GET deletion: {status} {job}")
            if job["state"] == "done":
                return job  # type: ignore[no-any-return]
            time.sleep(0.05)
        raise BenchError(f"deletion {job_id} not done within {timeout_s} s")


def steps(data: Path, job_id: str) -> dict[str, float]:
    """From the catalog: the node's own step (the request to its acknowledgement: its
    buffer flushed without the rows, its WAL segments deleted) and the file step."""
    con = sqlite3.connect(data / "meta.sqlite")
    try:
        created, started, result = con.execute(
            "SELECT created_at, started_at, result FROM deletions WHERE id = ?",
            (job_id,)).fetchone()
        (acked,) = con.execute("SELECT max(at) FROM deletion_acks WHERE deletion_id = ?",
                               (job_id,)).fetchone()
    finally:
        con.close()
    return {"node_step_s": round(float(acked) - float(created), 3),
            "file_step_s": round(float(json.loads(result)["files_done_at"]) - float(started), 3)}


def buffer_rows(api: Api, project: str, batches: int, per_batch: int) -> int:
    """Rows sent through ingest now: in the buffer and the WAL when the deletion comes."""
    status, found = api.call("GET", f"/v1/projects/{project}")
    if status != 200:
        raise BenchError(f"GET project: {status} {found}")
    for b in range(batches):
        status, body = api.call("POST", f"/v1/ingest?key={found['ingestKey']}", {
            "context": {"boxId": "live"},
            "events": [{"message": f"live {b}-{i}",  # 1% of them selected, as in history
                        "attrs": {"userId": "u_99000" if i % 100 == 0 else "u_50000"}}
                       for i in range(per_batch)]})
        if status != 202:
            raise BenchError(f"ingest: {status} {body}")
    return batches * per_batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=20)
    parser.add_argument("--boxes", type=int, default=5)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"bench": "deletion", "params": vars(args) | {"query": QUERY}}
    with tempfile.TemporaryDirectory(prefix="bench-deletion-") as tmp:
        data = Path(tmp) / "data"
        started = time.monotonic()
        api_key, projects = prepare(data, args.rows, args.days, args.boxes)
        report["data"] = {"generation_s": round(time.monotonic() - started, 1),
                          "projects": projects}
        report["ceiling"] = ceiling(data, projects["erased"])
        server = ServerProcess("boxtrail serve", [sys.executable, "-m", "boxtrail", "serve"],
                               boxtrail_env(data, {"BOXTRAIL_FLUSH_INTERVAL_S": "3600"}), REPO)
        try:
            match = server.wait_for(BOXTRAIL_LISTENING, 60)
            api = Api("127.0.0.1", int(match.group(2)), api_key)
            report["query_deletion"] = query_deletion(api, data)
            report["project_deletion"] = project_deletion(api, data, projects["deleted"])
        except (BenchError, OSError) as exc:
            report["error"] = f"{exc}; server output:\n{server.output()}"
        finally:
            report["server_exit_code"] = server.stop(30)
    report["machine"] = machine()
    print(json.dumps(report, indent=2))
    return 1 if "error" in report else 0


def ceiling(data: Path, project_id: str) -> dict[str, Any]:
    """Beside the file step: the same files read and written again whole, by the same
    encoder and as many threads, with nothing else (no filter, no catalog, no storage
    write): what a rewrite of every file cannot go below. Median of three."""
    paths = sorted((data / "objects" / "logs" / f"project={project_id}").rglob("*.parquet"))

    def rewrite(path: Path) -> int:
        return len(encode_parquet(pq.read_table(path)))

    runs = []
    for _ in range(3):
        started = time.monotonic()
        with ThreadPoolExecutor(FILE_THREADS) as pool:
            written = sum(pool.map(rewrite, paths))
        runs.append(time.monotonic() - started)
    return {"what": "read + encode every file, no filter or catalog", "files": len(paths),
            "bytes_written": written, "seconds": round(statistics.median(runs), 3)}


def query_deletion(api: Api, data: Path) -> dict[str, Any]:
    buffered = buffer_rows(api, "erased", 100, 100)
    total, selected = api.count("erased"), api.count("erased", QUERY)
    log(f"erased: {total:,} rows, {selected:,} selected by {QUERY}")
    requested = time.monotonic()
    status, job = api.call("POST", "/v1/projects/erased/deletions", {"query": QUERY})
    if status != 202:
        raise BenchError(f"POST deletions: {status} {job}")
    done = api.wait_done(job["id"])
    to_purged = time.monotonic() - requested
    left, left_selected = api.count("erased"), api.count("erased", QUERY)
    if left != total - selected or left_selected != 0:
        raise BenchError(f"after the deletion {left:,} rows ({left_selected} selected); "
                         f"expected {total - selected:,} (0)")
    removed = done["removed"]
    return {"rows": total, "buffered_rows": buffered, "selected": selected,
            "share": round(selected / total, 4), **steps(data, job["id"]),
            "request_to_purged_s": round(to_purged, 3),
            "files_rewritten": removed["filesRewritten"],
            "files_deleted": removed["filesDeleted"],
            "bytes_deleted": removed["bytesDeleted"], "bytes_written": removed["bytesWritten"],
            "rows_removed": removed["rows"], "buffered_rows_removed": removed["bufferedRows"]}


def project_deletion(api: Api, data: Path, project_id: str) -> dict[str, Any]:
    total = api.count("deleted")
    requested = time.monotonic()
    status, job = api.call("DELETE", "/v1/projects/deleted")
    if status != 202:
        raise BenchError(f"DELETE project: {status} {job}")
    gone, _ = api.call("GET", "/v1/projects/deleted")
    to_404 = time.monotonic() - requested
    done = api.wait_done(job["id"])
    to_purged = time.monotonic() - requested
    left = list((data / "objects" / "logs" / f"project={project_id}").rglob("*.parquet")) \
        if (data / "objects" / "logs" / f"project={project_id}").exists() else []
    if gone != 404 or left:
        raise BenchError(f"after DELETE: GET answered {gone}, {len(left)} files left")
    removed = done["removed"]
    return {"rows": total, "request_to_404_s": round(to_404, 3),
            "request_to_purged_s": round(to_purged, 3), "node_step_s": steps(data, job["id"])[
                "node_step_s"],
            "files_deleted": removed["filesDeleted"], "objects_deleted": removed["objectsDeleted"],
            "rows_removed": removed["rows"] + removed["bufferedRows"]}


if __name__ == "__main__":
    sys.exit(main())
