"""What the Iceberg tables (``BOXTRAIL_ICEBERG=on``) cost boxtrail, and what they give readers.

    python benchmarks/bench_iceberg.py [--rounds 3] [--only ingest|publish|year|spark]

Each flush's Iceberg change (manifests and a ``metadata.json`` written, the table's pointer
moved in the publish's transaction: ``iceberg.tables``) rides the flush, not the request.
Measured, on one machine whose timings are noisy (so: alternating rounds, medians, ratios):

- ``ingest``: events per server CPU-second and the 202's p99 of ``python -m boxtrail serve``
  with the tables on and off: ``bench_ingest.py``'s boxtrail part run on two fresh data
  directories, the same server code, the rounds alternating (and their order too). Expected:
  within noise. Also each server's mean flush time (its ``/metrics``), and the whole run:
  the events each server acknowledged (warm-ups too) over every CPU-second it used from its
  first load to ``--final-wait`` seconds after the last, whenever it used it. A load window
  counts only what falls inside it, and a compaction (every 60 s) lands in one server's
  window or between rounds by chance: it halves that round's figure.
  ``--compact-interval 86400`` leaves compaction out of both servers, and its noise.
  ``--control`` runs the same with the tables off on both: what the ratio is by noise alone.
- ``publish``: the time of ``Catalog.publish`` of a flush (a few files of one day, one per
  box), in process on SQLite, with the tables' mirror and without, flush by flush
  alternating between two catalogs; the difference is what the Iceberg staging and commit
  add to a flush. Snapshots are not expired here (the server expires them after
  ``BOXTRAIL_ICEBERG_SNAPSHOT_RETAIN_S``), so the last flushes show the cost of a table
  with that many snapshots.
- ``year``: a year of one project, 20 boxes x 365 days = 7,300 small files written as
  boxtrail stores them (``history.py``), then added to its table all at once by
  ``Upkeep.repair`` (what turning the tables on over existing data does at start); then in
  pyiceberg the time to plan a one-day scan (``scan(row_filter=ts in the day).plan_files()``,
  which should find the day's 20 files) and to read it.
- ``spark``: Spark 3.5 with Iceberg 1.10's runtime (``spark_iceberg.py``; ``make
  bench-spark-deps`` installs it) (a) reads the table a real boxtrail server wrote (a few
  thousand rows over two days and several boxes) and returns exactly the rows ``/logs``
  returned before the server stopped, and the rows pyiceberg returns (count and a checksum
  over id, ts, message; also for ``ts`` filters, vectorized or not: the files hold
  microseconds, layout 3); (b) the time to count a one-day scan of the year's table.

Prints one JSON object on stdout, progress on stderr; exits 1 when a part failed (its
section has an ``error`` saying why).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import msgspec
import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))  # run as a script, import the package beside it

from benchmarks.bench_ingest import (  # noqa: E402
    BenchError,
    Params,
    Target,
    finish,
    http_json,
    machine,
    measure,
    server_metrics,
    settle,
    start_boxtrail,
    tree_cpu_seconds,
)
from benchmarks.datagen import make_bodies  # noqa: E402
from benchmarks.history import _table, make_pool, write_history  # noqa: E402
from core.schema import format_id  # noqa: E402
from core.storage import LocalStorage  # noqa: E402
from ingest.flusher import DAY_MS, encode_parquet, partitions  # noqa: E402
from metadata.catalog import Catalog  # noqa: E402
from metadata.sqlite import open_db  # noqa: E402
from query.rows import iso_ms  # noqa: E402

PROJECT = "prj_benchiceberg"
PARTS = ("ingest", "publish", "year", "spark")


def log(message: str) -> None:
    print(f"bench_iceberg: {message}", file=sys.stderr, flush=True)


def median(values: Iterable[float], digits: int = 3) -> float | None:
    values = list(values)
    return round(statistics.median(values), digits) if values else None


def quantile(values: list[float], q: float, digits: int = 3) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], digits)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def iso(ms: int) -> str:
    """An Iceberg ``timestamptz`` literal."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


# 1. Ingest with the tables on and off.

def ingest_part(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    params = Params(seconds=args.seconds, warmup=args.warmup, connections=32, batch=100,
                    bodies=64, seed=1, rounds=args.rounds, settle=6.0,
                    max_requests=2_000_000, timeout=30.0, ceiling_server="uvicorn")
    bodies_file = tmp / "bodies.ndjson"
    bodies = make_bodies(params.seed, params.bodies, params.batch,
                         ts_ms=int(time.time() * 1000))
    bodies_file.write_bytes(b"\n".join(bodies) + b"\n")
    targets: dict[str, Target] = {}
    out: dict[str, Any] = {}
    try:
        for setting in ("off", "on"):
            # --control: both servers off, the same comparison: the noise floor of the ratio.
            value = "off" if args.control else setting
            settings = {"BOXTRAIL_ICEBERG": value}
            if args.compact_interval is not None:  # e.g. 86400: no compaction in the run
                settings["BOXTRAIL_COMPACT_INTERVAL_S"] = f"{args.compact_interval:g}"
            target = start_boxtrail(params, tmp / f"ingest-{setting}", settings)
            target.name = f"iceberg_{setting}"  # in the progress lines
            targets[setting] = target
        start = {}
        for setting, target in targets.items():
            settle(target.server, 1.0)  # start-up work is not the load's
            start[setting] = whole_run(target)
        for round_ in range(params.rounds):
            # Alternate which goes first too: the second load of a round finds the machine
            # warmer (and the first one's Parquet written).
            order = ("off", "on") if round_ % 2 == 0 else ("on", "off")
            for setting in order:
                measure(targets[setting], params, bodies_file, round_)
        # The whole run: every CPU-second each server spent from its first load on, whenever
        # it spent it (a compaction or a table's upkeep between rounds, or inside the other
        # server's load), after one more compaction period with both idle.
        log(f"whole run: both servers idle {args.final_wait:g} s")
        time.sleep(args.final_wait)
        whole: dict[str, Any] = {}
        for setting, target in targets.items():
            events, cpu = (b - a for a, b in zip(start[setting], whole_run(target), strict=True))
            whole[setting] = {"events": int(events), "cpu_s": round(cpu, 2),
                              "events_per_cpu_s": round(events / cpu, 1) if cpu else None}
        if whole["off"]["events_per_cpu_s"] and whole["on"]["events_per_cpu_s"]:
            whole["ratio_on_to_off"] = round(
                whole["on"]["events_per_cpu_s"] / whole["off"]["events_per_cpu_s"], 3)
        out["whole_run"] = whole
    finally:
        for target in targets.values():
            name = target.name
            target.name = "boxtrail"  # finish() reads back the logs of a "boxtrail" part
            out[name] = finish(target)
            metrics = out[name].get("server_metrics", {})
            if metrics.get("flush_seconds_count"):
                out[name]["flush_ms_mean"] = round(
                    1000 * metrics["flush_seconds_sum"] / metrics["flush_seconds_count"], 2)
    on, off = targets.get("on"), targets.get("off")
    if on and off and on.runs and off.runs:
        pairs = list(zip(off.runs, on.runs, strict=False))

        def ratio(key: str) -> float | None:
            return median(r_on[key] / r_off[key] for r_off, r_on in pairs
                          if r_off.get(key) and r_on.get(key))

        out["ratio_on_to_off"] = {
            "events_per_server_cpu_s": ratio("events_per_server_cpu_s"),
            "events_per_server_cpu_s_incl_after": ratio("events_per_server_cpu_s_incl_after"),
            "events_per_s": ratio("events_per_s"),
        }
        out["p99_202_ms"] = {
            "off_rounds": [r["latency_ms"]["p99"] for r in off.runs],
            "on_rounds": [r["latency_ms"]["p99"] for r in on.runs],
            "off_median": median(r["latency_ms"]["p99"] for r in off.runs),
            "on_median": median(r["latency_ms"]["p99"] for r in on.runs),
        }
        out["rounds"] = {
            key: {"off": [r[key] for r in off.runs], "on": [r[key] for r in on.runs]}
            for key in ("events_per_server_cpu_s", "events_per_server_cpu_s_incl_after",
                        "server_cpu_s", "after_load_cpu_s", "events_accepted")}
    out["params"] = {"seconds": params.seconds, "warmup": params.warmup,
                     "rounds": params.rounds, "connections": params.connections,
                     "batch": params.batch, "control": args.control,
                     "compact_interval_s": args.compact_interval,
                     "final_wait_s": args.final_wait}
    return out


def whole_run(target: Target) -> tuple[float, float]:
    """The events a server has acknowledged (warm-ups too) and the CPU-seconds it has used."""
    return (server_metrics(target)["events_accepted_total"],
            tree_cpu_seconds(target.server.pid))


# 2. A flush's publish with and without the mirror, in process.

class Store:
    """A data directory in process: metadata DB, catalog, local storage, and (with
    ``iceberg``) the tables as the catalog's mirror, as ``boxtrail.app`` wires them."""

    def __init__(self, root: Path, iceberg: bool) -> None:
        from iceberg.tables import Tables

        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.db = open_db(root / "meta.sqlite")
        self.catalog = Catalog(self.db)
        self.storage = LocalStorage(str(root / "objects"))
        self.tables = Tables(self.db, f"sqlite:///{root / 'meta.sqlite'}",
                             f"file://{root / 'objects'}", {})
        if iceberg:
            self.catalog.mirror = self.tables

    def write(self, table: Any) -> list[str]:
        """The rows as a flush writes them (a file per box and day), pending, not live."""
        encoded = []
        for entry, part in partitions(PROJECT, table):
            data = encode_parquet(part)
            encoded.append((msgspec.structs.replace(entry, bytes=len(data)), data))
        self.catalog.add_pending(entry for entry, _ in encoded)
        for entry, data in encoded:
            self.storage.put(entry.key, data)
        return [entry.key for entry, _ in encoded]

    def close(self) -> None:
        self.db.close()


def publish_part(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    pool = make_pool(args.seed, args.publish_boxes, 32)
    rng = np.random.default_rng(args.seed)
    stores = {"mirror": Store(tmp / "publish-mirror", True),
              "plain": Store(tmp / "publish-plain", False)}
    times: dict[str, list[float]] = {name: [] for name in stores}
    start_ms = (int(time.time() * 1000) // DAY_MS) * DAY_MS
    try:
        for i in range(args.publish_flushes + 1):
            # One flush: 5 s of rows from every box, within one day.
            t0 = start_ms + i * 5000
            ts = np.sort(rng.integers(t0, t0 + 5000, size=args.publish_rows))
            rows = _table(pool, rng, ts, 0)
            order = list(stores) if i % 2 == 0 else list(reversed(stores))
            for name in order:
                store = stores[name]
                keys = store.write(rows)
                seconds, _ = timed(lambda s=store, k=keys: s.catalog.publish(k))
                if i > 0:  # the first creates the table
                    times[name].append(seconds * 1000)
            if (i + 1) % 50 == 0:
                log(f"publish: {i + 1}/{args.publish_flushes + 1} flushes")
        table = stores["mirror"].tables.table(PROJECT, create=False)
        assert table is not None
        snapshot = table.current_snapshot()
        assert snapshot is not None
        manifests = len(snapshot.manifests(table.io))
        listed = len(stores["mirror"].tables.data_files(table))
        live = stores["mirror"].catalog.count_live(PROJECT)
    finally:
        for store in stores.values():
            store.close()
    mirror, plain = times["mirror"], times["plain"]
    tenth = max(1, len(mirror) // 10)
    return {
        "flushes": len(mirror), "files_per_flush": args.publish_boxes,
        "rows_per_flush": args.publish_rows,
        "publish_ms_median": {"with_mirror": median(mirror), "without": median(plain)},
        "publish_ms_p90": {"with_mirror": quantile(mirror, 0.9),
                           "without": quantile(plain, 0.9)},
        "iceberg_ms_per_flush_median": median(m - p for m, p in zip(mirror, plain,
                                                                    strict=True)),
        "with_mirror_ms_median_first_tenth": median(mirror[:tenth]),
        "with_mirror_ms_median_last_tenth": median(mirror[-tenth:]),
        "table_at_end": {"snapshots": len(table.metadata.snapshots),
                         "manifests_in_current": manifests, "files_listed": listed,
                         "files_live_in_catalog": live},
    }


# 3. A year of files in one table.

def year_part(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from iceberg.upkeep import Upkeep

    store = Store(tmp / "year", iceberg=False)  # written without; repair adds them
    try:
        pool = make_pool(args.seed, args.year_boxes, 64)
        end = (int(time.time() * 1000) // DAY_MS) * DAY_MS
        start = end - args.year_days * DAY_MS
        last = [0.0]

        def progress(message: str) -> None:
            if time.monotonic() - last[0] > 10:
                last[0] = time.monotonic()
                log(f"year: {message}")

        write_s, written = timed(lambda: write_history(
            pool, store.catalog, store.storage, PROJECT, 0, start, end,
            args.year_rows_per_day, args.seed, progress=progress))
        log(f"year: {written.files:,} files, {written.rows:,} rows in {write_s:.1f} s; "
            "repairing the table")
        upkeep = Upkeep(store.tables, store.catalog, store.storage, 3600.0)
        repair_s, added = timed(upkeep.repair)
        log(f"year: repair added {added:,} files in {repair_s:.1f} s")
        table = store.tables.table(PROJECT, create=False)
        assert table is not None
        # A day in the middle of the year.
        day = start + (args.year_days // 2) * DAY_MS
        row_filter = f"ts >= '{iso(day)}' AND ts < '{iso(day + DAY_MS)}'"
        expected = [e for e in store.catalog.live_files(PROJECT, day, day + DAY_MS - 1)
                    if e.date == datetime.fromtimestamp(day / 1000, UTC).strftime("%Y-%m-%d")]
        plans, loads = [], []
        planned: list[Any] = []
        for _ in range(args.plan_runs):
            load_s, loaded = timed(lambda: store.tables.catalog.load_table(
                ("boxtrail", PROJECT)))
            plan_s, planned = timed(lambda t=loaded: list(
                t.scan(row_filter=row_filter).plan_files()))
            loads.append(load_s * 1000)
            plans.append(plan_s * 1000)
        reads = []
        rows = 0
        for _ in range(args.read_runs):
            read_s, arrow = timed(lambda: table.scan(row_filter=row_filter).to_arrow())
            reads.append(read_s * 1000)
            rows = arrow.num_rows
        checksum = api_checksum(pyiceberg_rows(table, row_filter))
        full_plan_s, everything = timed(lambda: list(table.scan().plan_files()))
        planned_paths = {task.file.file_path for task in planned}
        out = {
            "files": written.files, "rows": written.rows, "bytes": written.bytes,
            "boxes": args.year_boxes, "days": args.year_days,
            "write_history_s": round(write_s, 1),
            "repair_s": round(repair_s, 2), "repair_files_added": added,
            "day": iso(day), "row_filter": row_filter,
            "load_table_ms_median": median(loads, 1),
            "plan_files_ms_median": median(plans, 1), "plan_files_ms_runs": [
                round(p, 1) for p in plans],
            "files_planned": len(planned),
            "files_planned_are_the_days_files": planned_paths == {
                store.tables.uri(e.key) for e in expected},
            "read_day_ms_median": median(reads, 1), "read_day_rows": rows,
            "read_day_rows_expected": sum(e.rows for e in expected),
            "read_day_checksum": checksum,
            "plan_whole_table_ms": round(full_plan_s * 1000, 1),
            "files_in_table": len(everything),
            "metadata_location": table.metadata_location,
        }
        if not out["files_planned_are_the_days_files"] or rows != out["read_day_rows_expected"]:
            out["error"] = "the one-day scan did not plan or read exactly the day's files"
        return out
    finally:
        store.close()


# 4. Spark.

def api_checksum(rows: Iterable[tuple[str, str, str | None]]) -> dict[str, Any]:
    """Count and sha256 of (id, ts, message) as ``/logs`` shows them, in id order."""
    ordered = sorted(rows)
    digest = hashlib.sha256()
    for row in ordered:
        digest.update(json.dumps(row).encode() + b"\n")
    return {"rows": len(ordered), "sha256": digest.hexdigest()[:16]}


def table_rows(ids: list[int], ts_us: list[int], messages: list[str | None]
               ) -> list[tuple[str, str, str | None]]:
    """Table rows as ``/logs`` shows them; the timestamps must be whole milliseconds."""
    return [(format_id(i), iso_ms(t // 1000), m) for i, t, m in zip(ids, ts_us, messages,
                                                                     strict=True)]


def post_events(base_url: str, ingest_path: str, box: str, events: list[dict[str, Any]]
                ) -> None:
    body = json.dumps({"context": {"boxId": box, "release": "r1"}, "events": events}).encode()
    request = urllib.request.Request(base_url + ingest_path, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        if response.status != 202:
            raise BenchError(f"ingest answered {response.status}")


def logs_rows(target: Target) -> list[dict[str, Any]]:
    """Every row ``/logs`` returns for the last 30 days, following ``nextCursor``."""
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = {"since": "30d", "limit": 1000, **({"cursor": cursor} if cursor else {})}
        status, page = http_json("GET", f"{target.base_url}/v1/projects/bench/logs?"
                                 + urlencode(query), target.api_key)
        if status != 200:
            raise BenchError(f"/logs answered {status}: {str(page)[:300]}")
        rows += page["rows"]
        cursor = page.get("nextCursor")
        if not cursor:
            return rows


def file_states(data_dir: Path, column: str = "state") -> dict[str, int]:
    """How many of the server's files are in each state (or live files of each layout)."""
    where = "" if column == "state" else "WHERE state = 'live' "
    con = sqlite3.connect(data_dir / "meta.sqlite")
    try:
        return dict(con.execute(f"SELECT {column}, count(*) FROM files {where}"
                                f"GROUP BY {column}").fetchall())
    finally:
        con.close()


def served_table(args: argparse.Namespace, tmp: Path) -> tuple[dict[str, Any], Path]:
    """A real server with the tables on: rows over two days and several boxes ingested in
    several flushes, ``/logs`` read back once the table lists them all, then stopped."""
    from pyiceberg.catalog.sql import SqlCatalog

    params = Params(seconds=0, warmup=0, connections=1, batch=1, bodies=1, seed=args.seed,
                    rounds=1, settle=1.0, max_requests=1, timeout=30.0,
                    ceiling_server="uvicorn")
    settings = {"BOXTRAIL_ICEBERG": "on", "BOXTRAIL_FLUSH_INTERVAL_S": "0.5"}
    target = start_boxtrail(params, tmp / "spark-server", settings)
    data_dir = tmp / "spark-server" / "boxtrail-data"
    try:
        rng = np.random.default_rng(args.seed)
        now = int(time.time() * 1000)
        boxes = [f"box-{b}" for b in range(args.spark_boxes)]
        sent = 0
        for round_ in range(args.spark_flushes):
            for box in boxes:
                events = []
                for _ in range(args.spark_events_per_post):
                    day = int(rng.integers(0, 2))  # today or yesterday
                    ts = now - day * DAY_MS - int(rng.integers(0, 20 * 3_600_000))
                    sent += 1
                    events.append({"ts": ts, "level": ("info", "warn", "error")[sent % 3],
                                   "message": f"{box} round {round_} n={sent} é"})
                post_events(target.base_url, target.path, box, events)
            time.sleep(1.0)  # the next round in another flush
        project_id = http_json("GET", f"{target.base_url}/v1/projects/bench",
                               target.api_key)[1]["id"]
        catalog = SqlCatalog("boxtrail", uri=f"sqlite:///{data_dir / 'meta.sqlite'}")
        deadline = time.monotonic() + 60
        while True:
            states = file_states(data_dir)
            table = catalog.load_table(("boxtrail", project_id))
            listed = len(table.inspect.files())
            api = logs_rows(target)
            if len(api) == sent and not states.get("pending") and \
                    listed == states.get("live"):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"after 60 s /logs has {len(api)} of {sent} rows, files "
                                 f"{states}, the table lists {listed}")
            time.sleep(0.5)
    finally:
        target.server.stop(30)
    info = {"rows_sent": sent, "boxes": len(boxes), "days": 2, "files": states,
            "live_files_by_layout": file_states(data_dir, "layout"),
            "project_id": project_id, "metadata_location": table.metadata_location,
            "snapshots": len(table.metadata.snapshots),
            "api": [(r["id"], r["ts"], r.get("message")) for r in api]}
    return info, data_dir


def api_columns(frame: Any) -> Any:
    """A Spark frame's id, ts (as epoch microseconds: never through Python's local time)
    and message."""
    return frame.selectExpr("id", "unix_micros(ts) AS ts_us", "message")


def spark_rows(selected: Any) -> list[tuple[str, str, str | None]]:
    """An :func:`api_columns` frame's rows as ``/logs`` shows them."""
    got = selected.collect()
    return table_rows([r.id for r in got], [r.ts_us for r in got], [r.message for r in got])


def pyiceberg_rows(table: Any, row_filter: str = "True") -> list[tuple[str, str, str | None]]:
    import pyarrow as pa

    arrow = table.scan(row_filter=row_filter, selected_fields=("id", "ts", "message")).to_arrow()
    return table_rows(arrow["id"].to_pylist(), arrow["ts"].cast(pa.int64()).to_pylist(),
                      arrow["message"].to_pylist())


def spark_part(args: argparse.Namespace, tmp: Path, year: dict[str, Any] | None
               ) -> dict[str, Any]:
    from pyiceberg.catalog.sql import SqlCatalog

    from benchmarks.spark_iceberg import session

    out: dict[str, Any] = {}
    served, data_dir = served_table(args, tmp)
    api = served.pop("api")
    out["served"] = served
    log(f"spark: server wrote {served['rows_sent']} rows in {served['files']} files; "
        "starting Spark")
    up_s, spark = timed(session)
    out["spark_version"] = spark.version
    out["session_start_s"] = round(up_s, 1)
    try:
        table = SqlCatalog("boxtrail", uri=f"sqlite:///{data_dir / 'meta.sqlite'}").load_table(
            ("boxtrail", served["project_id"]))
        df = spark.read.format("iceberg").load(served["metadata_location"])
        # The whole table, then a ts window inside the older day (not on a file boundary)
        # and the day it starts on: the same rows as /logs and pyiceberg.
        timestamps = sorted(r[1] for r in api)
        low, high = timestamps[len(timestamps) // 10], timestamps[len(timestamps) // 3]
        checks: dict[str, Any] = {}
        windows = {"all": None, "window": (low, high)}
        for name, window in windows.items():
            if window is None:
                expected, where, row_filter = api, None, "True"
            else:
                expected = [r for r in api if window[0] <= r[1] < window[1]]
                where = f"ts >= '{window[0]}' AND ts < '{window[1]}'"
                row_filter = (f"ts >= '{window[0].replace('Z', '+00:00')}' AND "
                              f"ts < '{window[1].replace('Z', '+00:00')}'")
            logs_sum = api_checksum(expected)
            by_pyiceberg = api_checksum(pyiceberg_rows(table, row_filter))
            check: dict[str, Any] = {"logs": logs_sum, "pyiceberg": by_pyiceberg,
                                     **({"filter": where} if where else {})}
            for vectorized in ("true", "false"):
                frame = spark.read.format("iceberg").option(
                    "vectorization-enabled", vectorized).load(served["metadata_location"])
                if where:
                    frame = frame.where(where)
                check[f"spark_vectorized_{vectorized}"] = api_checksum(
                    spark_rows(api_columns(frame)))
            check["all_equal"] = all(v == logs_sum for k, v in check.items()
                                     if k in ("pyiceberg", "spark_vectorized_true",
                                              "spark_vectorized_false"))
            checks[name] = check
        out["same_rows_as_logs"] = checks
        ts_type = dict(df.dtypes)["ts"]
        out["spark_ts_type"] = ts_type
        if not all(c["all_equal"] for c in checks.values()):
            out["error"] = "Spark, pyiceberg and /logs disagree (see same_rows_as_logs)"
        if year is not None and "metadata_location" in year:
            out["year"] = spark_year(spark, year, args.spark_runs)
            if "error" in out["year"]:
                out.setdefault("error", out["year"]["error"])
    finally:
        spark.stop()
    return out


def scan_metrics(frame: Any) -> dict[str, int]:
    """The Iceberg scan's own metrics of a collected frame (its ``BatchScanExec``): data
    files planned and skipped, planning time."""
    plan = frame._jdf.queryExecution().executedPlan()
    if plan.getClass().getSimpleName() == "AdaptiveSparkPlanExec":
        plan = plan.executedPlan()
    wanted = ("resultDataFiles", "skippedDataFiles", "totalPlanningDuration",
              "scannedDataManifests", "numSplits")
    leaves = plan.collectLeaves().iterator()
    while leaves.hasNext():
        leaf = leaves.next()
        if leaf.getClass().getSimpleName() == "BatchScanExec":
            metrics = leaf.metrics()
            return {k: int(metrics.apply(k).value()) for k in wanted if metrics.contains(k)}
    return {}


def spark_year(spark: Any, year: dict[str, Any], runs: int) -> dict[str, Any]:
    """A one-day scan of the year's table in Spark, the first time (cold: the table's
    metadata read, classes loaded) and again: the day's rows collected (id, ts, message:
    the files read), with Iceberg's scan metrics (files planned, planning time); and
    ``count()``, which Iceberg answers from the manifests alone when the filter selects
    whole partitions (aggregate push-down), no file opened."""
    where = year["row_filter"].replace("+00:00", "")
    reads, plannings, counts = [], [], []
    metrics: dict[str, int] = {}
    rows: list[tuple[str, str, str | None]] = []
    count = 0
    for _ in range(runs + 1):
        frame = spark.read.format("iceberg").load(year["metadata_location"]).where(where)
        day = api_columns(frame)
        read_s, rows = timed(lambda d=day: spark_rows(d))
        metrics = scan_metrics(day)
        reads.append(read_s * 1000)
        plannings.append(metrics.get("totalPlanningDuration", -1))
        counted = frame.groupBy().count()
        count_s, count = timed(lambda c=counted: c.collect()[0][0])
        counts.append(count_s * 1000)
    count_plan = counted._jdf.queryExecution().executedPlan().toString()
    checksum = api_checksum(rows)
    out = {
        "filter": where,
        "read_day_ms_cold": round(reads[0], 1), "read_day_ms_median": median(reads[1:], 1),
        "read_day_ms_runs": [round(r, 1) for r in reads],
        "planning_ms_cold": plannings[0], "planning_ms_median": median(plannings[1:], 1),
        "files_planned": metrics.get("resultDataFiles"),
        "files_skipped": metrics.get("skippedDataFiles"),
        "scan_metrics_last": metrics,
        "day_rows": checksum, "day_rows_pyiceberg": year.get("read_day_checksum"),
        "count_ms_cold": round(counts[0], 1), "count_ms_median": median(counts[1:], 1),
        "count": count,
        "count_from_metadata_only": "LocalTableScan" in count_plan,
    }
    if checksum != year.get("read_day_checksum") or count != checksum["rows"]:
        out["error"] = "Spark's rows of the day are not pyiceberg's"
    return out


# Running it.

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("all", *PARTS), default="all")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="ingest: alternate N times")
    parser.add_argument("--seconds", type=float, default=10.0, help="ingest: counted load")
    parser.add_argument("--compact-interval", type=float, default=None,
                        help="ingest: both servers' BOXTRAIL_COMPACT_INTERVAL_S (default: "
                             "theirs); 86400 leaves compaction, and its noise, out")
    parser.add_argument("--final-wait", type=float, default=70.0,
                        help="ingest: idle after the last round, in the whole run's CPU")
    parser.add_argument("--warmup", type=float, default=2.0, help="ingest: uncounted load")
    parser.add_argument("--control", action="store_true",
                        help="ingest: both servers with the tables off (the ratio's noise)")
    parser.add_argument("--publish-flushes", type=int, default=200)
    parser.add_argument("--publish-boxes", type=int, default=4, help="files per flush")
    parser.add_argument("--publish-rows", type=int, default=2000, help="rows per flush")
    parser.add_argument("--year-boxes", type=int, default=20)
    parser.add_argument("--year-days", type=int, default=365)
    parser.add_argument("--year-rows-per-day", type=float, default=2000)
    parser.add_argument("--plan-runs", type=int, default=7)
    parser.add_argument("--read-runs", type=int, default=5)
    parser.add_argument("--spark-boxes", type=int, default=5)
    parser.add_argument("--spark-flushes", type=int, default=4)
    parser.add_argument("--spark-events-per-post", type=int, default=200)
    parser.add_argument("--spark-runs", type=int, default=5)
    return parser.parse_args(argv)


@contextlib.contextmanager
def part(report: dict[str, Any], name: str) -> Iterator[dict[str, Any]]:
    """A part's section; a failure is its ``error``, and the next part still runs."""
    section: dict[str, Any] = {}
    started = time.monotonic()
    log(f"{name}: starting")
    try:
        yield section
    except Exception as exc:  # a benchmark part: reported, not raised
        log(f"{name} FAILED:\n{traceback.format_exc()}")
        section["error"] = f"{type(exc).__name__}: {exc}"
    section["part_s"] = round(time.monotonic() - started, 1)
    report[name] = section


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wanted = PARTS if args.only == "all" else (args.only,)
    report: dict[str, Any] = {"bench": "iceberg"}
    facts = machine()
    with tempfile.TemporaryDirectory(prefix="bench-iceberg-", ignore_cleanup_errors=True) as t:
        tmp = Path(t)
        if "ingest" in wanted:
            with part(report, "ingest") as section:
                section |= ingest_part(args, tmp)
        if "publish" in wanted:
            with part(report, "publish") as section:
                section |= publish_part(args, tmp)
        year = None
        if "year" in wanted or "spark" in wanted:
            with part(report, "year") as section:
                section |= year_part(args, tmp)
            year = report["year"]
        if "spark" in wanted:
            with part(report, "spark") as section:
                section |= spark_part(args, tmp, year)
    report["machine"] = facts | {"loadavg_at_end": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(report, indent=2))
    failed = [name for name in PARTS if "error" in report.get(name, {})]
    if failed:
        log(f"FAILED: {', '.join(failed)} (see their 'error')")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
