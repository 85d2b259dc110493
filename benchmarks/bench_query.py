"""Query and live-tail latency of boxtrail against DuckDB on the same files, in one run.

    python benchmarks/bench_query.py [--rows 10000000] [--requests 200] [--tail-seconds 10]

- Data: three projects with 1, 30 and 365 days of history at the same rate (``--rows``
  over 365 days), one Parquet file per (box, day), written by ``history.py`` through the
  service's own flusher functions, storage backend and catalog. Generated once into
  ``<cache-root>/boxtrail-bench-query-<hash of params and generator sources>`` and reused
  while younger than ``--cache-max-age-h``; each run works on a hard-linked copy, first
  topped up with the rows from the cache's end to now, so "last 10 minutes" has rows.
- Queries: ``python -m boxtrail serve`` on that copy; N sequential requests per case over
  one keep-alive connection after a warm-up, interleaved case by case with the ceiling:
  the same SQL run by DuckDB in this process (same threads, same connection settings) on
  the exact files the catalog gives for the same window. Interleaving means the data
  window that slides with the clock, and the machine's noise, hit both alike.
- Tail: ``tail_probe.py`` in its own process: 10 SSE subscribers and a paced ingest
  sender on one clock; time from the 202 (and from the send) to delivery.

Prints one JSON object on stdout, progress on stderr; exits 1 only when a part failed to
run (its section has an ``error``), not when a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import duckdb
import msgspec

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))  # run as a script, import the package beside it

from benchmarks.bench_ingest import (  # noqa: E402
    BOXTRAIL_LISTENING,
    CLEAN_EXITS,
    BenchError,
    ServerProcess,
    boxtrail_env,
    machine,
    tree_cpu_seconds,
)
from benchmarks.history import Pool, make_pool, write_history  # noqa: E402
from core.schema import SCHEMA  # noqa: E402
from core.storage import LocalStorage  # noqa: E402
from ingest.flusher import DAY_MS  # noqa: E402
from metadata.catalog import Catalog  # noqa: E402
from metadata.sqlite import open_db  # noqa: E402
from query.errors_view import IS_ERROR  # noqa: E402
from query.language import compile_query  # noqa: E402
from query.rows import SELECT  # noqa: E402
from tenancy.tenants import Tenancy  # noqa: E402

HISTORIES = (("1d", 1), ("30d", 30), ("365d", 365))
LARGEST = "365d"
# A word of datagen's vocabulary in ~1% of rows ("Maximum call stack size exceeded").
TEXT_WORD = "exceeded"
LIMIT = 100  # the API's default page; the server asks DuckDB for LIMIT + 1
FAR_FUTURE_MS = 1 << 62
TARGETS = {
    "since_10m_p50_365d_over_1d": 1.2,  # at most
    "text_1h_p50_ms": 50.0,  # under
    "text_1h_p50_over_ceiling": 1.5,  # at most
    "tail_p99_ms": 100.0,  # under
}
# What the cached data depends on besides the parameters: a change to any of these files
# (row schema, Parquet settings, the generator) makes a new cache.
SOURCES = ("benchmarks/history.py", "benchmarks/datagen.py", "ingest/flusher.py",
           "core/schema.py", "metadata/catalog.py", "metadata/db.py")
CACHE_VERSION = 1


def log(message: str) -> None:
    print(f"bench_query: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Params:
    rows: int
    boxes: int
    pool_per_box: int
    seed: int
    requests: int
    warmup_requests: int
    query_threads: int
    query_seconds_max: float
    cache_root: str
    cache_max_age_h: float
    tail_subscribers: int
    tail_rate: float
    tail_batch: int
    tail_seconds: float
    tail_warmup: float
    tail_query: str


# --- the data ---------------------------------------------------------------------------


class ProjectInfo(msgspec.Struct, kw_only=True):
    id: str
    index: int
    days: int
    rows: int
    files: int
    bytes: int


class Manifest(msgspec.Struct, kw_only=True):
    version: int
    anchor_ms: int  # the cached history ends here
    api_key: str
    rows_per_day: float
    projects: dict[str, ProjectInfo]
    box_ids: list[str]
    generation_s: float


def cache_dir(params: Params) -> Path:
    digest = hashlib.sha256()
    digest.update(json.dumps([CACHE_VERSION, params.rows, params.boxes, params.pool_per_box,
                              params.seed]).encode())
    for name in SOURCES:
        digest.update((REPO / name).read_bytes())
    return Path(params.cache_root) / f"boxtrail-bench-query-{digest.hexdigest()[:12]}"


def read_manifest(path: Path) -> Manifest | None:
    try:
        manifest = msgspec.json.decode((path / "manifest.json").read_bytes(), type=Manifest)
    except (OSError, msgspec.DecodeError):
        return None
    return manifest if manifest.version == CACHE_VERSION else None


def remove_stale_caches(params: Params, keep: Path) -> None:
    """Other caches of this benchmark past their age (made before a source change, say):
    each holds ~0.5 GB. A run using one is unaffected: it works on hard links."""
    cutoff_ms = (time.time() - params.cache_max_age_h * 3600) * 1000
    for path in keep.parent.glob("boxtrail-bench-query-*"):
        manifest = read_manifest(path) if path != keep else None
        if manifest is not None and manifest.anchor_ms < cutoff_ms:
            log(f"removing the stale cache {path}")
            shutil.rmtree(path, ignore_errors=True)


def generate(params: Params, pool: Pool, target: Path) -> Manifest:
    """The three projects' history, up to now, in a fresh data directory at ``target``."""
    remove_stale_caches(params, target)
    building = target.with_name(f"{target.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    started = time.monotonic()
    anchor = int(time.time() * 1000)
    rows_per_day = params.rows / 365
    db = open_db(building / "data" / "meta.sqlite")
    try:
        tenancy = Tenancy(db)
        tenant = tenancy.ensure_tenant("bench")
        api_key, _ = tenancy.keys.create(tenant, "bench")
        catalog = Catalog(db)
        storage = LocalStorage(str(building / "data" / "objects"))
        projects = {}
        for index, (name, days) in enumerate(HISTORIES):
            project = tenancy.create_project(tenant, f"history-{name}", [])
            log(f"generating {name}: {rows_per_day * days:,.0f} rows over {days} days")
            written = write_history(pool, catalog, storage, project.id, index,
                                    anchor - days * DAY_MS, anchor, rows_per_day, params.seed,
                                    progress=throttled(log, 5.0))
            projects[name] = ProjectInfo(id=project.id, index=index, days=days,
                                         rows=written.rows, files=written.files,
                                         bytes=written.bytes)
        storage.close()
    finally:
        db.close()
    manifest = Manifest(version=CACHE_VERSION, anchor_ms=anchor, api_key=api_key,
                        rows_per_day=rows_per_day, projects=projects, box_ids=pool.box_ids,
                        generation_s=round(time.monotonic() - started, 1))
    (building / "manifest.json").write_bytes(msgspec.json.encode(manifest))
    shutil.rmtree(target, ignore_errors=True)
    building.rename(target)  # the manifest inside it is what makes it a valid cache
    return manifest


def throttled(say: Callable[[str], None], every_s: float) -> Callable[[str], None]:
    last = [0.0]

    def emit(message: str) -> None:
        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            say(message)

    return emit


def working_copy(cache: Path, run: Path) -> Path:
    """``run/data``: the catalog copied, the (immutable) Parquet files hard-linked."""
    source, data = cache / "data", run / "data"
    shutil.copytree(source / "objects", data / "objects", copy_function=os.link)
    src = sqlite3.connect(source / "meta.sqlite")
    dst = sqlite3.connect(data / "meta.sqlite")
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return data


def top_up(params: Params, pool: Pool, manifest: Manifest, data: Path) -> dict[str, Any]:
    """Rows from the cache's end to now, in the working copy, the same way for each project."""
    now = int(time.time() * 1000)
    db = open_db(data / "meta.sqlite")
    out: dict[str, Any] = {"from_ms": manifest.anchor_ms, "to_ms": now,
                           "hours": round((now - manifest.anchor_ms) / 3_600_000, 3)}
    try:
        catalog = Catalog(db)
        storage = LocalStorage(str(data / "objects"))
        for name, project in manifest.projects.items():
            written = write_history(pool, catalog, storage, project.id, project.index,
                                    manifest.anchor_ms, now, manifest.rows_per_day,
                                    params.seed)
            out[name] = {"rows": written.rows, "files": written.files}
        storage.close()
    finally:
        db.close()
    return out


def prepare(params: Params, run: Path) -> tuple[Manifest, Path, dict[str, Any]]:
    pool = make_pool(params.seed, params.boxes, params.pool_per_box)
    cache = cache_dir(params)
    manifest = read_manifest(cache)
    age_h = (time.time() * 1000 - manifest.anchor_ms) / 3_600_000 if manifest else None
    generated = manifest is None or age_h is None or age_h > params.cache_max_age_h
    if generated:
        log(f"generating the data into {cache} (no cache younger than "
            f"{params.cache_max_age_h:g} h)")
        manifest = generate(params, pool, cache)
    else:
        log(f"reusing {cache} ({age_h:.2f} h old)")
    assert manifest is not None
    data = working_copy(cache, run)
    added = top_up(params, pool, manifest, data)
    busiest = pool.box_ids[0]  # the weights fall with the index
    facts = {
        "cache_dir": str(cache),
        "generated_this_run": generated,
        "generation_s": manifest.generation_s,
        "cache_age_h": 0.0 if generated else round(age_h or 0.0, 3),
        "rows_per_day": round(manifest.rows_per_day),
        "boxes": params.boxes,
        "layout": "one file per (box, day), as compaction leaves them; the top-up adds one "
                  "more file per box for the rows since the cache was made",
        "projects": {
            name: {"id": p.id, "history_days": round(p.days + added["hours"] / 24, 3),
                   "rows": p.rows + added[name]["rows"],
                   "files": p.files + added[name]["files"],
                   "bytes": p.bytes, "bytes_per_row": round(p.bytes / p.rows, 1)}
            for name, p in manifest.projects.items()},
        "top_up": added,
        "text_query": TEXT_WORD,
        "text_match_share": round(pool.text_fraction(TEXT_WORD), 4),
        "error_share": round(float(
            (pool.columns["level"].to_numpy(zero_copy_only=False) == "error")
            .reshape(params.boxes, -1).mean(axis=1) @ pool.weights), 4),
        "box_query": {"box": busiest, "row_share": round(float(pool.weights[0]), 4)},
    }
    return manifest, data, facts


# --- the cases ------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    project: str  # a key of HISTORIES
    endpoint: str  # logs | errors
    since_ms: int
    box: str | None = None
    text: str | None = None

    def path(self, project_id: str) -> str:
        unit, size = next((u, n) for u, n in (("d", DAY_MS), ("h", 3_600_000), ("m", 60_000))
                          if self.since_ms % n == 0)
        query: dict[str, str] = {"since": f"{self.since_ms // size}{unit}"}
        if self.text:
            query["query"] = self.text
        if self.box:
            query["boxId"] = self.box
        return f"/v1/projects/{quote(project_id, safe='')}/{self.endpoint}?{urlencode(query)}"

    def where(self, since_ms: int) -> tuple[list[str], list[object]]:
        """The WHERE terms and parameters query/engine.py builds for this request."""
        where: list[str] = []
        params: list[object] = []
        if self.box is not None:
            where.append("box = ?")
            params.append(self.box)
        compiled = compile_query(self.text) if self.text else None
        if self.endpoint == "errors":
            compiled = (IS_ERROR, [])
        if compiled is not None:
            where.append(f"({compiled[0]})")
            params += compiled[1]
        where.append("ts >= ?")
        params.append(datetime.fromtimestamp(since_ms / 1000, UTC))
        return where, params


def cases(box: str) -> list[Case]:
    return [
        *(Case(f"logs_10m_{name}", name, "logs", 10 * 60_000) for name, _ in HISTORIES),
        Case("logs_1h_text_365d", LARGEST, "logs", 3_600_000, text=TEXT_WORD),
        Case("errors_7d_365d", LARGEST, "errors", 7 * DAY_MS),
        Case("logs_1h_box_365d", LARGEST, "logs", 3_600_000, box=box),
    ]


@dataclass
class Samples:
    ms: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    files: list[int] = field(default_factory=list)
    files_total: list[int] = field(default_factory=list)


class Ceiling:
    """DuckDB in this process, configured as query/engine.py configures the server's."""

    def __init__(self, catalog: Catalog, storage: LocalStorage, threads: int) -> None:
        self.catalog = catalog
        self.storage = storage
        self.db = duckdb.connect(config={"threads": threads,
                                         "autoinstall_known_extensions": False,
                                         "autoload_known_extensions": False})

    def run(self, case: Case, project_id: str, out: Samples) -> None:
        since_ms = int(time.time() * 1000) - case.since_ms
        files = self.catalog.live_files(project_id, since_ms, FAR_FUTURE_MS, case.box)
        paths = [self.storage.local_path(f.key) for f in files]
        where, params = case.where(since_ms)
        listed = ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths)
        sql = (f"SELECT {', '.join(SELECT)} FROM (SELECT {', '.join(SCHEMA.names)} "
               f"FROM read_parquet([{listed}])) WHERE {' AND '.join(where)} "
               "ORDER BY ts DESC, id DESC LIMIT ?")
        started = time.perf_counter()
        con = self.db.cursor()
        try:
            rows = con.execute(sql, [*params, LIMIT + 1]).fetchall()
        finally:
            con.close()
        out.ms.append((time.perf_counter() - started) * 1000)
        out.rows.append(min(len(rows), LIMIT))
        out.files.append(len(files))

    def close(self) -> None:
        self.db.close()


class Client:
    """Sequential GETs on one keep-alive connection, timed to the last body byte."""

    def __init__(self, host: str, port: int, api_key: str) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=30)
        self.headers = {"Authorization": f"Bearer {api_key}"}

    def get(self, path: str, out: Samples) -> None:
        for attempt in (1, 2):
            started = time.perf_counter()
            try:
                self.conn.request("GET", path, headers=self.headers)
                response = self.conn.getresponse()
                body = response.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # uvicorn closes keep-alive connections idle for 5 s: reconnect once,
                # and time only the attempt that got an answer.
                self.conn.close()
                if attempt == 2:
                    raise
        elapsed = (time.perf_counter() - started) * 1000
        if response.status != 200:
            raise BenchError(f"GET {path} answered {response.status}: {body[:300]!r}")
        out.ms.append(elapsed)
        out.rows.append(len(msgspec.json.decode(body)["rows"]))
        for header, values in (("X-Boxtrail-Files-Scanned", out.files),
                               ("X-Boxtrail-Files-Total", out.files_total)):
            if (value := response.getheader(header)) is not None:
                values.append(int(value))

    def close(self) -> None:
        self.conn.close()


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile, None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(max(math.ceil(q / 100 * len(ordered)), 1), len(ordered)) - 1], 3)


def spread(values: list[int]) -> int | list[int] | None:
    """One number when constant over the run (the usual case), else [min, max]."""
    if not values:
        return None
    return values[0] if min(values) == max(values) else [min(values), max(values)]


def describe(samples: Samples) -> dict[str, Any]:
    return {
        "requests": len(samples.ms),
        **{f"p{q}_ms": percentile(samples.ms, q) for q in (50, 90, 99)},
        "mean_ms": round(sum(samples.ms) / len(samples.ms), 3) if samples.ms else None,
        "rows": spread(samples.rows),
        "files_scanned": spread(samples.files),
    }


def measure_queries(params: Params, base: tuple[str, int], api_key: str,
                    manifest: Manifest, data: Path) -> dict[str, Any]:
    box = manifest.box_ids[0]
    todo = cases(box)
    server = {c.name: Samples() for c in todo}
    ceiling = {c.name: Samples() for c in todo}
    db = open_db(data / "meta.sqlite")  # read-only use beside the server (SQLite WAL mode)
    direct = Ceiling(Catalog(db), LocalStorage(str(data / "objects")), params.query_threads)
    client = Client(*base, api_key)
    deadline = time.monotonic() + params.query_seconds_max
    rounds = params.warmup_requests + params.requests
    done = 0
    try:
        for i in range(rounds):
            if time.monotonic() > deadline:
                log(f"query phase cut at {params.query_seconds_max:g} s (--query-seconds-max)")
                break
            counted = i >= params.warmup_requests
            for case in todo:
                project_id = manifest.projects[case.project].id
                # Alternate which goes first, so neither always follows the other's caches.
                order = (0, 1) if i % 2 else (1, 0)
                for side in order:
                    sink = (server if side == 0 else ceiling)[case.name]
                    target = sink if counted else Samples()
                    if side == 0:
                        client.get(case.path(project_id), target)
                    else:
                        direct.run(case, project_id, target)
            done += counted
            if counted and done % 50 == 0:
                log(f"queries: {done}/{params.requests} rounds")
    finally:
        client.close()
        direct.close()
        db.close()
    out: dict[str, Any] = {}
    for case in todo:
        s, c = describe(server[case.name]), describe(ceiling[case.name])
        s["files_total"] = spread(server[case.name].files_total)
        if case.endpoint == "errors" and s["files_scanned"] is None:
            s["files_scanned"] = None
            s["note"] = ("the errors endpoint sends no X-Boxtrail-Files-Scanned; the catalog "
                         f"gives {c['files_scanned']} files for this window (ceiling)")
        out[case.name] = {
            "request": case.path(manifest.projects[case.project].id),
            "server": s, "ceiling": c,
            "p50_over_ceiling": ratio(s["p50_ms"], c["p50_ms"]),
            "p99_over_ceiling": ratio(s["p99_ms"], c["p99_ms"]),
        }
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


# --- the server and the tail ------------------------------------------------------------


def start_server(params: Params, data: Path) -> tuple[ServerProcess, str, int]:
    env = boxtrail_env(data) | {"BOXTRAIL_QUERY_THREADS": str(params.query_threads)}
    server = ServerProcess("boxtrail serve", [sys.executable, "-m", "boxtrail", "serve"],
                           env, REPO)
    try:
        match = server.wait_for(BOXTRAIL_LISTENING, 60)
    except BaseException as exc:
        server.stop(10)
        raise BenchError(f"{exc}; server output:\n{server.output()}") from exc
    host = match.group(1).strip("[]")
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return server, host, int(match.group(2))


def create_tail_project(host: str, port: int, api_key: str) -> str:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("POST", "/v1/projects", body=json.dumps({"name": "tail"}),
                     headers={"Authorization": f"Bearer {api_key}",
                              "Content-Type": "application/json"})
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    if response.status != 201:
        raise BenchError(f"POST /v1/projects answered {response.status}: {body[:300]!r}")
    return str(json.loads(body)["ingestKey"])


def run_probe(params: Params, server: ServerProcess, host: str, port: int, api_key: str,
              ingest_key: str, subscribers: int) -> dict[str, Any]:
    argv = [sys.executable, str(HERE / "tail_probe.py"), "--url", f"http://{host}:{port}",
            "--api-key", api_key, "--project", "tail", "--ingest-key", ingest_key,
            "--subscribers", str(subscribers), "--rate", str(params.tail_rate),
            "--batch", str(params.tail_batch), "--seconds", str(params.tail_seconds),
            "--warmup", str(params.tail_warmup), "--query", params.tail_query]
    log(f"tail: {subscribers} subscribers, {params.tail_rate:g} events/s for "
        f"{params.tail_warmup:g} + {params.tail_seconds:g} s")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, cwd=REPO)
    # The probe bounds itself (sending, then at most 10 s of draining); this is the backstop.
    watchdog = threading.Timer(params.tail_warmup + params.tail_seconds + 60, proc.kill)
    watchdog.start()
    cpu: dict[str, float] = {}
    when: dict[str, float] = {}
    result: dict[str, Any] | None = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            message = json.loads(line)
            if message["phase"] in ("measure", "done"):
                cpu[message["phase"]] = tree_cpu_seconds(server.pid)
                when[message["phase"]] = time.monotonic()
            elif message["phase"] == "result":
                result = message
        proc.wait()
    finally:
        watchdog.cancel()
    if result is None or len(cpu) != 2:
        raise BenchError(f"tail_probe exited with {proc.returncode} without a result")
    del result["phase"]
    server_cpu = cpu["done"] - cpu["measure"]
    result["server_cpu_s"] = round(server_cpu, 2)
    # Over the counted sending only: the event loop is one thread, so ~1.0 means saturated.
    result["server_cores_used"] = round(server_cpu / (when["done"] - when["measure"]), 2)
    return result


def measure_tail(params: Params, server: ServerProcess, host: str, port: int,
                 api_key: str) -> dict[str, Any]:
    """The same paced ingest with no tail (the reference), one tail, then the target's."""
    ingest_key = create_tail_project(host, port, api_key)
    steps = sorted({0, 1, params.tail_subscribers})
    return {f"subscribers_{n}": run_probe(params, server, host, port, api_key, ingest_key, n)
            for n in steps}


# --- the report ----------------------------------------------------------------------------


def verdict(queries: dict[str, Any], tails: dict[str, Any], subscribers: int
            ) -> dict[str, Any]:
    def p50(case: str, side: str = "server") -> float | None:
        value = queries.get(case, {}).get(side, {}).get("p50_ms")
        return float(value) if value is not None else None

    tail = tails.get(f"subscribers_{subscribers}", {})
    figures = {
        "since_10m_p50_365d_over_1d": ratio(p50("logs_10m_365d"), p50("logs_10m_1d")),
        "since_10m_p50_30d_over_1d": ratio(p50("logs_10m_30d"), p50("logs_10m_1d")),
        "since_10m_ceiling_p50_365d_over_1d": ratio(p50("logs_10m_365d", "ceiling"),
                                                    p50("logs_10m_1d", "ceiling")),
        "text_1h_p50_ms": p50("logs_1h_text_365d"),
        "text_1h_p50_over_ceiling": queries.get("logs_1h_text_365d", {}).get(
            "p50_over_ceiling"),
        "tail_p99_ms": tail.get("latency_from_202_ms", {}).get("p99"),
        "tail_p50_ms": tail.get("latency_from_202_ms", {}).get("p50"),
        "tail_missing_rows": tail.get("missing_rows"),
        "tail_delivered_share": ratio(tail.get("delivered_rows"), tail.get(
            "expected_rows_per_subscriber", 0) * tail.get("subscribers", 0)),
        "ingest_202_p50_ms_without_tail": tails.get("subscribers_0", {}).get(
            "ingest_202_ms", {}).get("p50"),
        "ingest_202_p50_ms_with_tails": tail.get("ingest_202_ms", {}).get("p50"),
        "ingest_202_p99_ms_without_tail": tails.get("subscribers_0", {}).get(
            "ingest_202_ms", {}).get("p99"),
        "ingest_202_p99_ms_with_tails": tail.get("ingest_202_ms", {}).get("p99"),
    }
    at_most = ("since_10m_p50_365d_over_1d", "text_1h_p50_over_ceiling")
    meets: dict[str, bool | None] = {}
    for name, limit in TARGETS.items():
        value = figures[name]
        meets[name] = None if value is None else (
            value <= limit if name in at_most else value < limit)
    if tail and (tail.get("missing_rows") or tail.get("dropped_notices")):
        meets["tail_p99_ms"] = False  # a fast tail that loses rows does not count
    return {"figures": figures, "targets": TARGETS, "meets_targets": meets}


def parse_args(argv: list[str] | None) -> tuple[Params, str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000,
                        help="rows of the 365-day project; the others get the same rate")
    parser.add_argument("--boxes", type=int, default=20)
    parser.add_argument("--pool-per-box", type=int, default=4000,
                        help="distinct datagen events drawn from per box")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--requests", type=int, default=200, help="counted requests per case")
    parser.add_argument("--warmup-requests", type=int, default=20)
    parser.add_argument("--query-threads", type=int, default=2,
                        help="DuckDB threads, for the server and the ceiling alike")
    parser.add_argument("--query-seconds-max", type=float, default=300.0,
                        help="the query phase stops here, whatever is left")
    parser.add_argument("--cache-root", default=tempfile.gettempdir())
    parser.add_argument("--cache-max-age-h", type=float, default=6.0,
                        help="regenerate the data when older (the top-up grows with age)")
    parser.add_argument("--tail-subscribers", type=int, default=10)
    parser.add_argument("--tail-rate", type=float, default=10_000, help="events per second")
    parser.add_argument("--tail-batch", type=int, default=100)
    parser.add_argument("--tail-seconds", type=float, default=10.0)
    parser.add_argument("--tail-warmup", type=float, default=2.0)
    parser.add_argument("--tail-query", default="",
                        help="the tails' search query (the probe's rows all match "
                             "'checkout'); empty: none")
    parser.add_argument("--only", choices=("all", "queries", "tail"), default="all")
    args = parser.parse_args(argv)
    only = args.only
    del args.only
    return Params(**vars(args)), only


def main(argv: list[str] | None = None) -> int:
    params, only = parse_args(argv)
    facts = machine()
    facts["packages"] |= {name: _version(name) for name in ("duckdb", "pyarrow")}
    report: dict[str, Any] = {"bench": "query", "params": asdict(params)}
    errors: dict[str, str] = {}
    queries: dict[str, Any] = {}
    tail: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-query-run-", ignore_cleanup_errors=True
                                     ) as tmp:
        try:
            manifest, data, report["data"] = prepare(params, Path(tmp))
        except (BenchError, OSError) as exc:
            errors["data"] = str(exc)
            log(f"data FAILED: {exc}")
            return finish(report, errors, queries, tail, facts)
        try:
            server, host, port = start_server(params, data)
        except BenchError as exc:
            errors["server"] = str(exc)
            log(f"server FAILED: {exc}")
            return finish(report, errors, queries, tail, facts)
        log(f"server on http://{host}:{port}, data {data}")
        try:
            if only in ("all", "queries"):
                try:
                    queries = measure_queries(params, (host, port), manifest.api_key,
                                              manifest, data)
                except (BenchError, OSError, http.client.HTTPException) as exc:
                    errors["queries"] = f"{exc}; server output:\n{server.output()}"
                    log(f"queries FAILED: {errors['queries']}")
            if only in ("all", "tail"):
                try:
                    tail = measure_tail(params, server, host, port, manifest.api_key)
                except (BenchError, OSError, ValueError) as exc:
                    errors["tail"] = f"{exc}; server output:\n{server.output()}"
                    log(f"tail FAILED: {errors['tail']}")
        finally:
            code = server.stop(30)
            report["server_exit_code"] = code
            if code not in CLEAN_EXITS:
                log(f"server exited with {code}; its output:\n{server.output()}")
    return finish(report, errors, queries, tail, facts)


def finish(report: dict[str, Any], errors: dict[str, str], queries: dict[str, Any],
           tail: dict[str, Any], facts: dict[str, Any]) -> int:
    report["queries"] = queries | ({"error": errors["queries"]} if "queries" in errors else {})
    report["tail"] = tail | ({"error": errors["tail"]} if "tail" in errors else {})
    report |= verdict(queries, tail, report["params"]["tail_subscribers"])
    if errors.keys() - {"queries", "tail"}:
        report["errors"] = {k: v for k, v in errors.items() if k not in ("queries", "tail")}
    report["machine"] = facts | {"loadavg_at_end": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(report, indent=2))
    if errors:
        log(f"FAILED: {', '.join(errors)} (see their 'error')")
    return 1 if errors else 0


def _version(name: str) -> str | None:
    import importlib.metadata

    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        return importlib.metadata.version(name)
    return None


if __name__ == "__main__":
    sys.exit(main())
