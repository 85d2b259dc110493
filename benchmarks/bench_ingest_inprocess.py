"""The ingest pipeline without HTTP: boxtrail's ASGI app called directly, in one process.

    python benchmarks/bench_ingest_inprocess.py [--seconds 10] [--warmup 2] [--clients 32]

The same 100-event bodies as ``bench_ingest.py`` go to ``POST /v1/ingest`` through the real
app (real WAL with fsync, live buffer, Parquet flushes on a fresh data directory), from
``--clients`` coroutines in the app's own event loop, each with one request in flight. No
socket, no HTTP parser, no load generator process: what is left is the cost of the work
itself, the part of ``bench_ingest.py``'s figure that no server or framework can remove.
Prints one JSON object: events/s and the process's CPU per request over the counted
window (all threads: the event loop, the WAL thread, the flushes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

from benchmarks.datagen import make_bodies
from boxtrail.app import create_app
from boxtrail.cli import tune_gc
from core.config import load
from ingest.routes import ASGIApp
from metadata.sqlite import open_db
from tenancy.tenants import Tenancy

Message = dict[str, Any]


async def post(app: ASGIApp, key: bytes, body: bytes) -> list[int]:
    """One ``POST /v1/ingest`` through the app; the statuses it answered with."""
    messages: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
    statuses: list[int] = []

    async def receive() -> Message:
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    scope = {"type": "http", "method": "POST", "path": "/v1/ingest",
             "query_string": b"key=" + key,
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", b"%d" % len(body))]}
    await app(scope, receive, send)
    return statuses


def create_project(data_dir: Path) -> str:
    db = open_db(data_dir / "meta.sqlite")
    try:
        tenancy = Tenancy(db)
        return tenancy.create_project(tenancy.ensure_tenant("bench"), "bench", []).ingest_key
    finally:
        db.close()


async def run(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    config = load({"BOXTRAIL_DATA_DIR": str(data_dir), "BOXTRAIL_RATE_LIMIT_EVENTS": "0"})
    data_dir.mkdir(parents=True, exist_ok=True)
    key = create_project(data_dir).encode()
    app = create_app(config)
    lifespan_in: asyncio.Queue[Message] = asyncio.Queue()
    lifespan_out: asyncio.Queue[Message] = asyncio.Queue()

    async def lifespan_send(message: Message) -> None:
        await lifespan_out.put(message)

    async def lifespan_run() -> None:
        await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                  lifespan_in.get, lifespan_send)

    lifespan = asyncio.create_task(lifespan_run())
    await lifespan_in.put({"type": "lifespan.startup"})
    started = await lifespan_out.get()
    if started["type"] != "lifespan.startup.complete":
        raise SystemExit(f"the app did not start: {started}")
    bodies = make_bodies(args.seed, 64, args.batch, ts_ms=int(time.time() * 1000))
    tune_gc()
    done = 0
    failures: list[int] = []
    stop = asyncio.Event()

    async def client(first: int) -> None:
        nonlocal done
        turn = first
        while not stop.is_set():
            statuses = await post(app, key, bodies[turn % len(bodies)])
            turn += 1
            if statuses != [202]:
                failures.extend(statuses)
                stop.set()
            done += 1

    clients = [asyncio.create_task(client(i)) for i in range(args.clients)]
    await asyncio.sleep(args.warmup)
    first, wall, cpu = done, time.perf_counter(), time.process_time()
    await asyncio.sleep(args.seconds)
    requests = done - first
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stop.set()
    await asyncio.gather(*clients)
    await lifespan_in.put({"type": "lifespan.shutdown"})
    await lifespan_out.get()
    await lifespan
    if failures:
        raise SystemExit(f"ingest answered {sorted(set(failures))}, not 202")
    return {
        "benchmark": "ingest_inprocess",
        "clients": args.clients,
        "batch": args.batch,
        "seconds": round(wall, 3),
        "requests": requests,
        "events_per_s": round(requests * args.batch / wall, 1),
        "cpu_us_per_request": round(cpu / requests * 1e6, 1),
        "cores_used": round(cpu / wall, 3),
        "events_per_cpu_s": round(requests * args.batch / cpu, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="boxtrail-inprocess-") as tmp:
        result = uvloop.run(run(args, Path(tmp) / "data"))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
