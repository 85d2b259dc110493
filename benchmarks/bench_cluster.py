"""What cluster mode costs, in one run on loopback: four deployments of boxtrail, each
started fresh and measured alone, on the shared 2-core machine (~4.5 min by default).

    python benchmarks/bench_cluster.py [--seconds 10] [--connections 32] [--rounds 1]

- ``sqlite``: one node on the default settings (SQLite catalog, local Parquet): the peer
  the other two are divided by;
- ``pg_1node``: one node on PostgreSQL + the Redis bus + S3 (``weed mini``);
- ``pg_3node``: three such nodes sharing them (``tests/support/cluster.py``), the load split evenly;
- ``sqlite_3solo``: three independent SQLite nodes sharing nothing, the load split the same
  way: no cluster at all, only what three busy processes cost on this machine beside one
  (the floor under ``pg_3node``'s ratio that no cluster design can go below).

For each: the CPU it uses idle; ingest events per server CPU-second through
``loadgen.py`` (one process per node, the connections split between them, the same
pre-encoded ``datagen`` bodies, after a warm-up), and the CPU it spends catching up after;
the latency of one fixed search over the same rows (``--search-bodies`` requests sent
round-robin, flushed everywhere first); on three nodes, how soon a batch acked by one node
is searchable on another, beside the same on the acking node (one query's latency); and
what the first read of a project nobody has read yet costs (its batches went out bare).

CPU is read from ``/proc``: utime+stime of each process tree, plus what its reaped
children used. ``boxtrail`` is the server processes and their workers; ``postgres``,
``redis`` and ``s3`` are the servers started here, reported apart so "boxtrail only" and
"with PostgreSQL and Redis" can both be read. The loadgens start a little apart, so CPU
rates are taken over the part of their windows they all share and divide the sum of their
event rates.

With ``--rounds N`` the deployments alternate N times (each on a fresh database, bucket
and bus) and the median round is reported. The machine is noisy and shared with the
client: read the ratios, not the absolutes. Prints one JSON object on stdout, progress on
stderr; exits 1 when a part failed (its ``error``) or boxtrail misbehaved (``problems``:
failed requests, missing or repeated rows, busy idle nodes, logged errors, bad exits).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))  # run as a script, import the package and tests beside it

import httpx  # noqa: E402
import redis  # noqa: E402

from benchmarks.bench_ingest import CLEAN_EXITS, machine  # noqa: E402
from benchmarks.datagen import make_bodies  # noqa: E402
from benchmarks.loadgen import percentile  # noqa: E402
from cluster.bus import HEARTBEAT_S, STREAM  # noqa: E402
from tests.support.cluster import Cluster  # noqa: E402
from tests.support.pgserver import PgServer  # noqa: E402
from tests.support.redisserver import RedisServer  # noqa: E402
from tests.support.s3server import S3Server, weed_binary  # noqa: E402
from tests.support.server import Server  # noqa: E402

KINDS = ("sqlite", "sqlite_3solo", "pg_1node", "pg_3node")
SOLO = "sqlite_3solo"
TARGET_RATIO = 0.8  # 3 nodes' events per boxtrail CPU-second over one SQLite node's
# tests/support/server.py flushes every 0.5 s for the tests' sake; measure the documented default.
SETTINGS = {"BOXTRAIL_FLUSH_INTERVAL_S": "5.0"}
SEARCH_PATH = "/v1/projects/search/logs?since=1h&limit=100"
CLK_TCK = os.sysconf("SC_CLK_TCK")
IDLE_S = 3.0
LOUD_LOG = re.compile(r" (WARNING|ERROR|CRITICAL) |Traceback")
FRESHNESS_TIMEOUT_S = 10.0
IDLE_NODE_CORES = 0.1  # an idle node using more than this is reported as a problem
EXTRA_PACKAGES = ("psycopg", "redis", "boto3", "duckdb", "httpx")
WATCHED_METRICS = ("events_accepted_total", "events_rejected_total", "flush_failures_total",
                   "parquet_files_written_total", "parquet_rows_written_total",
                   "parquet_files", "buffer_rows", "peer_rows", "flush_seconds_count",
                   "flush_seconds_sum", "flush_seconds_max", "wal_fsync_seconds_max")


class BenchError(Exception):
    """A part of the benchmark could not run; the message says why."""


@dataclass(frozen=True)
class Params:
    seconds: float
    warmup: float
    connections: int
    batch: int
    bodies: int
    seed: int
    rounds: int
    settle: float
    search_bodies: int
    search_requests: int
    search_seconds: float
    freshness_samples: int
    freshness_seconds: float
    freshness_batch: int
    cold_reads: int
    timeout: float


def log(message: str) -> None:
    print(f"bench_cluster: {message}", file=sys.stderr, flush=True)


# --- CPU from /proc ----------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    parent: int
    command: str
    ticks: int  # utime+stime, plus cutime+cstime: what its reaped children used


def processes() -> dict[int, Proc]:
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # The command may hold spaces or parentheses: the fields start after the last ')'.
        fields = text[text.rindex(")") + 2 :].split()
        table[int(entry.name)] = Proc(int(fields[1]), text[text.index("(") + 1 : text.rindex(")")],
                                      sum(int(f) for f in fields[11:15]))
    return table


def tree(table: dict[int, Proc], roots: list[int]) -> set[int]:
    """The live processes among ``roots`` and below them."""
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.parent, []).append(pid)
    found, frontier = set(), [pid for pid in roots if pid in table]
    while frontier:
        pid = frontier.pop()
        if pid not in found:
            found.add(pid)
            frontier.extend(children.get(pid, ()))
    return found


def cpu_seconds(roots: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds of each group of process trees, from one pass over /proc. PostgreSQL's
    backends come and go: their CPU stays with the postmaster that reaped them."""
    table = processes()
    return {group: sum(table[pid].ticks for pid in tree(table, pids)) / CLK_TCK
            for group, pids in roots.items()}


def child_named(command: str) -> int:
    """The pid of this process's child running ``command`` (weed, started by S3Server)."""
    for pid, proc in processes().items():
        if proc.command == command and proc.parent == os.getpid():
            return pid
    raise BenchError(f"no child process {command!r}")


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {group: after[group] - before[group] for group in after}


def settle(roots: dict[str, list[int]], quiet_s: float, over_cores: float,
           limit_s: float = 60.0) -> tuple[dict[str, float], float]:
    """Wait until boxtrail used at most ``over_cores`` for ``quiet_s``: the CPU each group
    used meanwhile, and how long it took."""
    started = time.monotonic()
    first = last = cpu_seconds(roots)
    while time.monotonic() - started < limit_s:
        time.sleep(quiet_s)
        now = cpu_seconds(roots)
        quiet = now["boxtrail"] - last["boxtrail"] <= over_cores * quiet_s
        last = now
        if quiet:
            break
    return diff(last, first), time.monotonic() - started


def wait_steady(roots: dict[str, list[int]], nodes: int, limit_s: float = 20.0) -> None:
    """Past start-up work: boxtrail near idle, or using the same CPU two seconds running
    (a node that is never idle must not cost the whole ``limit_s``)."""
    started = time.monotonic()
    last = cpu_seconds(roots)["boxtrail"]
    rate = -1.0
    while time.monotonic() - started < limit_s:
        time.sleep(1.0)
        now = cpu_seconds(roots)["boxtrail"]
        rate, previous = now - last, rate
        last = now
        if rate <= 0.1 * nodes or abs(rate - previous) <= 0.05 * nodes:
            return


# --- Backing services and deployments ----------------------------------------------------


@dataclass
class Services:
    """PostgreSQL, Redis and S3, started once; each deployment gets fresh room on them."""

    pg: PgServer
    redis: RedisServer
    s3: S3Server

    def roots(self) -> dict[str, list[int]]:
        postmaster = int((self.pg.data / "postmaster.pid").read_text().split()[0])
        assert self.redis.proc is not None
        return {"postgres": [postmaster], "redis": [self.redis.proc.pid],
                "s3": [child_named("weed")]}


@contextlib.contextmanager
def services() -> Iterator[Services]:
    with contextlib.ExitStack() as stack:
        log("starting PostgreSQL, Redis and S3 (weed mini)")
        pg = stack.enter_context(PgServer())
        redis_server = stack.enter_context(RedisServer())
        s3 = stack.enter_context(S3Server())
        yield Services(pg, redis_server, s3)


@dataclass
class Deployment:
    kind: str
    nodes: list[Server]
    roots: dict[str, list[int]]
    bus_url: str | None
    keys: dict[str, str] = field(default_factory=dict)  # project -> ingest key
    # Each node's keys: the same dict for a cluster; for independent nodes, each its own.
    node_keys: list[dict[str, str]] = field(default_factory=list)

    def client(self, node: int = 0) -> httpx.Client:
        return self.nodes[node].client(timeout=30)


def make_nodes(kind: str, root: Path, backing: Services | None) -> list[Server]:
    if kind == "sqlite":
        return [Server(root / "node", SETTINGS)]
    if kind == SOLO:
        return [Server(root / f"node{i + 1}", SETTINGS) for i in range(3)]
    if backing is None:
        raise BenchError("PostgreSQL, Redis or S3 did not start (see services_error)")
    # A fresh catalog, bucket and bus: rounds must not see each other's rows.
    with redis.Redis.from_url(backing.redis.url()) as bus:
        bus.flushall()
    cluster = Cluster(root, backing.pg.new_database(), backing.redis.url(), backing.s3,
                      backing.s3.new_bucket(), nodes=3 if kind == "pg_3node" else 1,
                      env=SETTINGS)
    return cluster.nodes


@contextlib.contextmanager
def deployment(kind: str, root: Path, backing: Services | None,
               problems: list[str]) -> Iterator[Deployment]:
    nodes = make_nodes(kind, root, backing)
    started: list[Server] = []
    try:
        for node in nodes:
            try:
                node.start()
            except RuntimeError as exc:  # its output says why
                raise BenchError(f"{kind}: {exc}") from exc
            started.append(node)
        pids = [node.proc.pid for node in nodes if node.proc is not None]
        shared = kind.startswith("pg_")
        roots = {"boxtrail": pids} | (backing.roots() if backing and shared else {})
        dep = Deployment(kind, nodes, roots, nodes[0].env.get("BOXTRAIL_BUS_URL"))
        for i in range(len(nodes) if kind == SOLO else 1):
            keys: dict[str, str] = {}
            with dep.client(i) as client:
                for project in ("bench", "search", "fresh"):
                    response = client.post("/v1/projects", json={"name": project})
                    if response.status_code != 201:
                        raise BenchError(f"POST /v1/projects answered {response.status_code} "
                                         f"{response.text[:300]}")
                    keys[project] = str(response.json()["ingestKey"])
            dep.node_keys.append(keys)
        dep.keys = dep.node_keys[0]
        dep.node_keys += [dep.keys] * (len(nodes) - len(dep.node_keys))
        yield dep
    finally:
        for node in started:
            stop_node(kind, node, problems)


def stop_node(kind: str, node: Server, problems: list[str]) -> None:
    """SIGTERM (tests/support/server.py), then note a bad exit or a process left behind."""
    assert node.proc is not None
    name = f"{kind} {node.env.get('BOXTRAIL_NODE_ID', 'node')}"
    if node.proc.poll() is not None:
        problems.append(f"{name} had exited with {node.proc.returncode} before the stop: "
                        + "".join(node.output[-20:]))
        return
    table = processes()
    commands = {pid: table[pid].command for pid in tree(table, [node.proc.pid])}
    node.stop()
    noted = [line.strip() for line in node.output if LOUD_LOG.search(line)]
    if noted:
        problems.append(f"{name} logged {len(noted)} warning(s) or error(s), the first: "
                        + " | ".join(dict.fromkeys(noted[:5])))
    if node.proc.returncode not in CLEAN_EXITS:
        problems.append(f"{name} exited with {node.proc.returncode} on SIGTERM: "
                        + "".join(node.output[-20:]))
    deadline = time.monotonic() + 5
    while (left := [pid for pid, proc in processes().items()
                    if commands.get(pid) == proc.command]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:  # processes this script started, through the server
        problems.append(f"{name}: process {pid} ({commands[pid]}) still running 5 s after "
                        "the server exited")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def node_metrics(dep: Deployment) -> list[dict[str, float]]:
    """Selected /metrics of each node, summed over labels."""
    out = []
    for i in range(len(dep.nodes)):
        with dep.client(i) as client:
            text = client.get("/metrics").text
        values: dict[str, float] = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            name = name.split("{", 1)[0].removeprefix("boxtrail_")
            if name in WATCHED_METRICS:
                values[name] = values.get(name, 0.0) + float(value.rsplit(" ", 1)[-1])
        out.append(values)
    return out


# --- Ingest per CPU-second ---------------------------------------------------------------


@dataclass
class Mark:
    at: float
    cpu: dict[str, float]


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def run_loadgens(dep: Deployment, bodies_file: Path, params: Params) -> dict[str, Any]:
    """One loadgen.py per node at once; the servers' CPU sampled at each window's edges."""
    procs = []
    for node, keys, connections in zip(dep.nodes, dep.node_keys,
                                       split(params.connections, len(dep.nodes)), strict=True):
        path = "/v1/ingest?key=" + quote(keys["bench"], safe="")
        argv = [sys.executable, str(HERE / "loadgen.py"), "--url", node.url, "--path", path,
                "--bodies", str(bodies_file), "--connections", str(connections),
                "--warmup", str(params.warmup), "--seconds", str(params.seconds),
                "--timeout", str(params.timeout)]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                      text=True))
    marks: dict[tuple[int, str], Mark] = {}
    results: dict[int, dict[str, Any]] = {}

    def read(i: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            message = json.loads(line)
            if message["phase"] in ("measure", "done"):
                marks[i, message["phase"]] = Mark(time.monotonic(), cpu_seconds(dep.roots))
            elif message["phase"] == "result":
                results[i] = message

    readers = [threading.Thread(target=read, args=(i, p)) for i, p in enumerate(procs)]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + params.warmup + params.seconds + params.timeout + 30
    for proc, reader in zip(procs, readers, strict=True):
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()  # loadgen bounds itself; this is the backstop should it wedge
            proc.wait()
        reader.join()
    if len(results) != len(procs) or len(marks) != 2 * len(procs):
        codes = [p.returncode for p in procs]
        raise BenchError(f"a loadgen exited without a result (exit codes {codes})")
    return window([results[i] for i in range(len(procs))], marks)


def window(results: list[dict[str, Any]], marks: dict[tuple[int, str], Mark]) -> dict[str, Any]:
    """Each server's CPU rate over the part of the counted windows they all share, and
    events per CPU-second from the sum of the loadgens' rates."""
    starts = [marks[i, "measure"] for i in range(len(results))]
    ends = [marks[i, "done"] for i in range(len(results))]
    first_end = min(ends, key=lambda m: m.at)
    last_start = max(starts, key=lambda m: m.at)
    shared_s = first_end.at - last_start.at
    if shared_s <= 0:
        raise BenchError("the loadgens' counted windows did not overlap")
    cores = {group: cpu / shared_s for group, cpu in diff(first_end.cpu, last_start.cpu).items()}
    events_per_s = sum(float(r["events_per_s"]) for r in results)
    return {
        "events_per_s": round(events_per_s, 1),
        "events_accepted": sum(int(r["events_accepted"]) for r in results),
        "shared_window_s": round(shared_s, 3),
        "window_start_skew_s": round(last_start.at - min(m.at for m in starts), 3),
        "cores_used": {group: round(c, 3) for group, c in cores.items()}
        | {"loadgen": round(sum(r["client_cpu_s"] / r["duration_s"] for r in results), 3)},
        "events_per_cpu_s": per_cpu_s(events_per_s, cores),
        "per_node": [{key: r[key] for key in ("connections", "events_per_s", "latency_ms",
                                              "status_counts", "errors", "error_samples")}
                     for r in results],
    }


def per_cpu_s(events: float, cpu: dict[str, float]) -> dict[str, float | None]:
    """Events per CPU-second of boxtrail alone, and with the services it needs added."""
    sums = {"boxtrail": cpu["boxtrail"]}
    if "postgres" in cpu:
        sums["boxtrail_postgres_redis"] = sums["boxtrail"] + cpu["postgres"] + cpu["redis"]
        sums["boxtrail_postgres_redis_s3"] = sums["boxtrail_postgres_redis"] + cpu["s3"]
    return {name: round(events / c, 1) if c > 0 else None for name, c in sums.items()}


def bus_entries_added(bus: redis.Redis) -> int:
    with contextlib.suppress(redis.ResponseError):  # no stream yet
        return int(bus.xinfo_stream(STREAM)["entries-added"])
    return 0


def measure_idle(dep: Deployment, problems: list[str]) -> dict[str, Any]:
    """The CPU of the deployment doing nothing and, with a bus, the entries it adds to the
    stream meanwhile (by design a heartbeat per node every ``HEARTBEAT_S``)."""
    n = len(dep.nodes)
    wait_steady(dep.roots, n)
    with contextlib.ExitStack() as stack:
        bus = stack.enter_context(redis.Redis.from_url(dep.bus_url)) if dep.bus_url else None
        added = bus_entries_added(bus) if bus else 0
        before, started = cpu_seconds(dep.roots), time.monotonic()
        time.sleep(IDLE_S)
        elapsed = time.monotonic() - started
        cores = {g: c / elapsed for g, c in diff(cpu_seconds(dep.roots), before).items()}
        out: dict[str, Any] = {"cores": {g: round(c, 3) for g, c in cores.items()}}
        if bus:
            out["bus_entries_per_s"] = round((bus_entries_added(bus) - added) / elapsed, 1)
            out["bus_entries_per_s_by_design"] = round(n / HEARTBEAT_S, 1)
    if cores["boxtrail"] > IDLE_NODE_CORES * n:
        problems.append(f"{dep.kind}: {n} idle node(s) used {cores['boxtrail']:.2f} cores "
                        f"(more than {IDLE_NODE_CORES:g} a node)"
                        + (f"; the bus stream grew by {out['bus_entries_per_s']} entries/s "
                           f"against {out['bus_entries_per_s_by_design']} by design"
                           if bus else ""))
    return out


def measure_ingest(dep: Deployment, bodies_file: Path, params: Params,
                   problems: list[str]) -> dict[str, Any]:
    """Idle rate first, then the load, then the CPU spent catching up (Parquet, S3, the
    catalog) above that idle rate."""
    n = len(dep.nodes)
    idle_state = measure_idle(dep, problems)
    idle: dict[str, float] = idle_state["cores"]
    log(f"{dep.kind}: {n} node(s), warm-up {params.warmup:g} s, load {params.seconds:g} s")
    result = run_loadgens(dep, bodies_file, params)
    after, after_s = settle(dep.roots, params.settle, idle["boxtrail"] + 0.05 * n)
    catch_up = {g: max(0.0, c - idle[g] * after_s) for g, c in after.items()}
    # Rates over the window, times its length: the events and CPU of one --seconds.
    cpu = {g: result["cores_used"][g] * params.seconds + catch_up[g] for g in catch_up}
    result["idle"] = idle_state
    result["after_load"] = {"seconds": round(after_s, 1),
                            "cpu_s_above_idle": {g: round(c, 3) for g, c in catch_up.items()}}
    result["events_per_cpu_s_incl_after"] = per_cpu_s(result["events_per_s"] * params.seconds,
                                                      cpu)
    for i, node in enumerate(result["per_node"]):
        if node["errors"] or set(node["status_counts"]) - {"202"}:
            problems.append(f"{dep.kind} node {i + 1}: ingest answered {node['status_counts']}"
                            f", errors {node['errors']}: {node['error_samples']}")
    return result


# --- Search latency and cross-node freshness ----------------------------------------------


def latency_ms(samples: list[float]) -> dict[str, float | None]:
    values = sorted(samples)
    # None, not NaN, when nothing was measured: NaN is not JSON.
    out: dict[str, float | None] = dict.fromkeys(("p50", "p90", "p99", "max"))
    if values:
        out = {f"p{q:g}": round(percentile(values, q), 2) for q in (50, 90, 99)}
        out["max"] = round(values[-1], 2)
    return out


def ingest_search_rows(dep: Deployment, params: Params, problems: list[str]) -> int:
    """The same bodies on every deployment, sent round-robin over its nodes."""
    bodies = make_bodies(params.seed + 1, params.search_bodies, params.batch,
                         ts_ms=int(time.time() * 1000))
    clients = [dep.client(i) for i in range(len(dep.nodes))]
    accepted = 0
    try:
        for k, body in enumerate(bodies):
            response = clients[k % len(clients)].post(
                "/v1/ingest", params={"key": dep.keys["search"]}, content=body,
                headers={"Content-Type": "application/json"})
            if response.status_code != 202:
                problems.append(f"{dep.kind}: search data ingest answered "
                                f"{response.status_code} {response.text[:300]}")
                continue
            accepted += int(response.json()["accepted"])
    finally:
        for client in clients:
            client.close()
    return accepted


def wait_flushed(dep: Deployment, limit_s: float = 60.0) -> float | None:
    """Seconds until no node holds unflushed rows of its own or of its peers (None: some
    still did after ``limit_s``)."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        held = sum(m.get("buffer_rows", 0.0) + m.get("peer_rows", 0.0)
                   for m in node_metrics(dep))
        if held == 0:
            return time.monotonic() - started
        time.sleep(0.25)
    return None


def count_rows(client: httpx.Client, project: str) -> tuple[int, int]:
    """Rows and distinct ids of the last hour, following nextCursor."""
    ids: list[str] = []
    cursor: str | None = None
    while True:
        query: dict[str, str | int] = {"since": "1h", "limit": 1000}
        if cursor:
            query["cursor"] = cursor
        response = client.get(f"/v1/projects/{project}/logs", params=query)
        if response.status_code != 200:
            raise BenchError(f"GET .../logs answered {response.status_code} "
                             f"{response.text[:300]}")
        page = response.json()
        ids += [str(row["id"]) for row in page["rows"]]
        cursor = page["nextCursor"]
        if not cursor:
            return len(ids), len(set(ids))


def measure_search(dep: Deployment, params: Params, problems: list[str]) -> dict[str, Any]:
    """``SEARCH_PATH`` on the first node, once every node has flushed the same rows."""
    accepted = ingest_search_rows(dep, params, problems)
    flushed_s = wait_flushed(dep)
    if flushed_s is None:
        problems.append(f"{dep.kind}: rows still unflushed (buffer_rows or peer_rows) 60 s "
                        "after the search data was acked")
    # Every row once on the node searched below; as many rows on the others (cheaper).
    with dep.client(0) as client:
        rows, distinct = count_rows(client, "search")
    if rows != accepted or distinct != rows:
        problems.append(f"{dep.kind} node 1: search read {rows} rows ({distinct} distinct "
                        f"ids) of the {accepted} acked")
    for i in range(1, len(dep.nodes)):
        with dep.client(i) as client:
            response = client.get("/v1/projects/search/histogram", params={"since": "1h"})
        total = response.json().get("total") if response.status_code == 200 else None
        if total != accepted:
            problems.append(f"{dep.kind} node {i + 1}: the histogram counted {total} rows of "
                            f"the {accepted} acked ({response.status_code})")
    samples: list[float] = []
    failures: list[str] = []
    deadline = time.monotonic() + params.search_seconds
    with dep.client(0) as client:
        for k in range(10 + params.search_requests):  # the first 10 warm up
            if time.monotonic() > deadline:
                break
            started = time.perf_counter()
            response = client.get(SEARCH_PATH)
            elapsed = (time.perf_counter() - started) * 1000
            if response.status_code != 200 or len(response.json()["rows"]) != 100:
                failures.append(f"{response.status_code} {response.text[:300]}")
            elif k >= 10:
                samples.append(elapsed)
    if failures:
        problems.append(f"{dep.kind}: {len(failures)} of the searches failed, e.g. "
                        f"{failures[0]}")
    return {"query": SEARCH_PATH, "rows_in_project": accepted,
            "flushed_after_s": flushed_s and round(flushed_s, 2), "requests": len(samples),
            "failures": len(failures), "latency_ms": latency_ms(samples)}


def visible_after(writer: httpx.Client, reader: httpx.Client, key: str, box: str,
                  batch: int) -> tuple[float | None, int, str | None]:
    """Ingest ``batch`` events of ``box`` through ``writer``, poll ``reader`` until it has
    them all: milliseconds from the 202 (None if never), polls, what went wrong."""
    events = [{"message": f"{box}-{m}"} for m in range(batch)]
    response = writer.post("/v1/ingest", params={"key": key},
                           json={"context": {"boxId": box}, "events": events})
    acked = time.perf_counter()
    if response.status_code != 202:
        return None, 0, f"ingest answered {response.status_code} {response.text[:300]}"
    polls = 0
    while (waited := time.perf_counter() - acked) < FRESHNESS_TIMEOUT_S:
        response = reader.get("/v1/projects/fresh/logs",
                              params={"since": "1h", "boxId": box, "limit": 1000})
        polls += 1
        if response.status_code != 200:
            return None, polls, f"search answered {response.status_code} {response.text[:300]}"
        if len(response.json()["rows"]) >= batch:
            return (time.perf_counter() - acked) * 1000, polls, None
    return None, polls, f"not all there after {waited:.1f} s"


def measure_freshness(dep: Deployment, params: Params, problems: list[str]) -> dict[str, Any]:
    """A batch acked by node i, polled for (by its box id) on node j != i until all of it
    is there; every 4th time also on node i itself, the reference (one query's latency)."""
    n = len(dep.nodes)
    clients = [dep.client(i) for i in range(n)]
    waits: dict[str, list[float]] = {"cross_node": [], "same_node": []}
    polls = dict.fromkeys(waits, 0)
    failures: dict[str, list[str]] = {name: [] for name in waits}
    deadline = time.monotonic() + params.freshness_seconds
    try:
        for k in range(params.freshness_samples):
            if time.monotonic() > deadline:
                break
            i = k % n
            j = (i + 1 + (k // n) % (n - 1)) % n  # every ordered pair in turn
            for name, reader in (("cross_node", j), ("same_node", i))[: 1 + (k % 4 == 0)]:
                waited, polled, failure = visible_after(
                    clients[i], clients[reader], dep.keys["fresh"], f"f{k}{name[0]}",
                    params.freshness_batch)
                polls[name] += polled
                if failure:
                    failures[name].append(f"node {i + 1} -> node {reader + 1}: {failure}")
                else:
                    assert waited is not None
                    waits[name].append(waited)
    finally:
        for client in clients:
            client.close()
    for name, failed in failures.items():
        if failed:
            problems.append(f"{dep.kind}: {len(failed)} {name} freshness samples failed, "
                            f"e.g. {failed[0]}")
    return {name: {"samples": len(values), "failures": len(failures[name]),
                   "polls_per_sample": round(polls[name] / max(1, len(values)), 1),
                   "ms_from_ack": latency_ms(values)}
            for name, values in waits.items()} | {"events_per_batch": params.freshness_batch}


COLD_WAIT_S = 0.5  # > two heartbeats: the bare batch has reached the reader


def measure_cold_reads(dep: Deployment, params: Params, problems: list[str]) -> dict[str, Any]:
    """What a read pays the first time its project is read: node i acks a batch of a
    project nobody has read, so it goes out bare; COLD_WAIT_S later node j searches it
    (it asks node i for the rows and waits for the answer), then again (the rows are
    there). Each read must have the whole batch."""
    n = len(dep.nodes)
    clients = [dep.client(i) for i in range(n)]
    first: list[float] = []
    second: list[float] = []
    try:
        for k in range(params.cold_reads):
            response = clients[0].post("/v1/projects", json={"name": f"cold{k}"})
            if response.status_code != 201:
                problems.append(f"{dep.kind}: POST /v1/projects answered "
                                f"{response.status_code} {response.text[:300]}")
                break
            key = str(response.json()["ingestKey"])
            writer, reader = clients[k % n], clients[(k + 1) % n]
            events = [{"message": f"cold-{m}"} for m in range(params.freshness_batch)]
            response = writer.post("/v1/ingest", params={"key": key},
                                   json={"context": {"boxId": "cold"}, "events": events})
            if response.status_code != 202:
                problems.append(f"{dep.kind}: cold ingest answered {response.status_code}")
                continue
            time.sleep(COLD_WAIT_S)
            for samples in (first, second):
                started = time.perf_counter()
                response = reader.get(f"/v1/projects/cold{k}/logs",
                                      params={"since": "1h", "limit": 1000})
                elapsed = (time.perf_counter() - started) * 1000
                rows = len(response.json().get("rows", [])) \
                    if response.status_code == 200 else 0
                if rows != params.freshness_batch:
                    problems.append(f"{dep.kind}: a cold read on node {(k + 1) % n + 1} "
                                    f"answered {response.status_code} with {rows} of "
                                    f"{params.freshness_batch} rows")
                    break
                samples.append(elapsed)
    finally:
        for client in clients:
            client.close()
    return {"after_ack_s": COLD_WAIT_S, "first_read_ms": latency_ms(first),
            "second_read_ms": latency_ms(second)}


# --- The run -----------------------------------------------------------------------------


@contextlib.contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        timings[name] = round(time.monotonic() - started, 1)


def run_kind(kind: str, round_: int, root: Path, backing: Services | None, bodies_file: Path,
             params: Params, part: dict[str, Any], problems: list[str]) -> None:
    timings: dict[str, float] = part.setdefault("timings_s", {})
    with timed(timings, f"round {round_ + 1}"), \
            deployment(kind, root / f"{kind}-r{round_ + 1}", backing, problems) as dep:
        with timed(timings, f"round {round_ + 1} ingest"):
            part.setdefault("rounds", []).append(
                measure_ingest(dep, bodies_file, params, problems))
        if round_ == 0 and kind != SOLO:  # one of its nodes searches as ``sqlite`` does
            log(f"{kind}: search latency")
            with timed(timings, "search"):
                part["search"] = measure_search(dep, params, problems)
            if len(dep.nodes) > 1:
                log(f"{kind}: cross-node freshness")
                with timed(timings, "freshness"):
                    part["freshness"] = measure_freshness(dep, params, problems)
                log(f"{kind}: first reads of cold projects")
                with timed(timings, "cold_reads"):
                    part["cold_reads"] = measure_cold_reads(dep, params, problems)
            part["node_metrics"] = node_metrics(dep)
        for i, node in enumerate(dep.nodes):
            assert node.proc is not None
            if node.proc.poll() is not None:
                raise BenchError(f"{kind} node {i + 1} exited with {node.proc.returncode}: "
                                 + "".join(node.output[-20:]))


def boxtrail_rate(run: dict[str, Any], key: str = "events_per_cpu_s") -> float:
    return float(run[key]["boxtrail"] or 0.0)


def section(part: dict[str, Any]) -> dict[str, Any]:
    """The median round (by events per boxtrail CPU-second), each round's figure, the rest."""
    out = {k: v for k, v in part.items() if k != "rounds"}
    runs = part.get("rounds", [])
    if runs:
        out["ingest"] = sorted(runs, key=boxtrail_rate)[(len(runs) - 1) // 2]
        if len(runs) > 1:
            out["rounds_events_per_boxtrail_cpu_s"] = [boxtrail_rate(r) for r in runs]
    return out


def ratio(parts: dict[str, dict[str, Any]], top: str, key: str = "events_per_cpu_s",
          group: str = "boxtrail", base: str = "sqlite") -> float | None:
    """Median over rounds of ``top``'s events per CPU-second of ``group`` over one SQLite
    node's (or ``base``'s; boxtrail alone: SQLite has no services): a round's parts saw
    about the same noise."""
    pairs = zip(parts[top].get("rounds", []), parts[base].get("rounds", []), strict=False)
    values = [float(t[key][group]) / float(s[key]["boxtrail"]) for t, s in pairs
              if t[key].get(group) and s[key]["boxtrail"]]
    return round(statistics.median(values), 3) if values else None


def search_ratio(parts: dict[str, dict[str, Any]], top: str) -> float | None:
    mine = parts[top].get("search", {}).get("latency_ms", {}).get("p50")
    base = parts["sqlite"].get("search", {}).get("latency_ms", {}).get("p50")
    return round(mine / base, 3) if mine and base else None


def versions(backing: Services | None) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in EXTRA_PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    if backing is not None:
        for name, argv in (("postgres", [str(backing.pg.bin / "postgres"), "--version"]),
                           ("redis-server", ["redis-server", "--version"]),
                           ("weed", [weed_binary(), "version"])):
            with contextlib.suppress(OSError, subprocess.SubprocessError, IndexError):
                found[name] = subprocess.run(argv, capture_output=True, text=True, timeout=10
                                             ).stdout.splitlines()[0].strip()
    return found


def parse_args(argv: list[str] | None) -> Params:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=10.0, help="counted load per part")
    parser.add_argument("--warmup", type=float, default=2.0, help="uncounted load before it")
    parser.add_argument("--connections", type=int, default=32, help="in all, split by node")
    parser.add_argument("--batch", type=int, default=100, help="events per request")
    parser.add_argument("--bodies", type=int, default=64, help="distinct bodies, sent in turn")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1, help="alternate the parts N times")
    parser.add_argument("--settle", type=float, default=6.0,
                        help="idle seconds that mean the servers are done (> the 5 s flush)")
    parser.add_argument("--search-bodies", type=int, default=100,
                        help="requests of --batch events in the searched project")
    parser.add_argument("--search-requests", type=int, default=200)
    parser.add_argument("--search-seconds", type=float, default=15.0,
                        help="stop the searches after this long, whatever their number")
    parser.add_argument("--freshness-samples", type=int, default=100)
    parser.add_argument("--freshness-seconds", type=float, default=40.0,
                        help="stop the freshness samples after this long")
    parser.add_argument("--freshness-batch", type=int, default=10, help="events per batch")
    parser.add_argument("--cold-reads", type=int, default=12,
                        help="first reads of a project nobody has read yet")
    parser.add_argument("--timeout", type=float, default=30.0, help="per request, seconds")
    return Params(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    params = parse_args(argv)
    facts = machine()
    # Timestamps near now: searches read the last hour.
    bodies = make_bodies(params.seed, params.bodies, params.batch, ts_ms=int(time.time() * 1000))
    parts: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}
    problems: list[str] = []
    report: dict[str, Any] = {"bench": "cluster"}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-cluster-", ignore_cleanup_errors=True) as tmp, \
            contextlib.ExitStack() as stack:
        bodies_file = Path(tmp, "bodies.ndjson")
        bodies_file.write_bytes(b"\n".join(bodies) + b"\n")
        backing: Services | None = None
        try:
            backing = stack.enter_context(services())
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            report["services_error"] = str(exc)
            log(f"PostgreSQL, Redis or S3 FAILED to start: {exc}")
        facts["packages"] |= versions(backing)
        for round_ in range(params.rounds):
            for kind in KINDS:
                if "error" in parts[kind]:
                    continue
                try:
                    run_kind(kind, round_, Path(tmp), backing, bodies_file, params,
                             parts[kind], problems)
                except (BenchError, httpx.HTTPError) as exc:
                    log(f"{kind} FAILED: {exc}")
                    parts[kind]["error"] = f"{type(exc).__name__}: {exc}"
    report |= {
        "params": asdict(params) | {"settings": SETTINGS,
                                    "body_bytes_mean": round(sum(map(len, bodies)) / len(bodies))},
        **{kind: section(parts[kind]) for kind in KINDS},
        "ratios": {
            "pg_3node_to_sqlite_events_per_boxtrail_cpu_s": ratio(parts, "pg_3node"),
            "pg_3node_to_sqlite_events_per_cpu_s_incl_postgres_redis":
                ratio(parts, "pg_3node", group="boxtrail_postgres_redis"),
            "pg_3node_to_sqlite_events_per_cpu_s_incl_postgres_redis_s3":
                ratio(parts, "pg_3node", group="boxtrail_postgres_redis_s3"),
            "pg_3node_to_sqlite_events_per_boxtrail_cpu_s_incl_after":
                ratio(parts, "pg_3node", key="events_per_cpu_s_incl_after"),
            "pg_1node_to_sqlite_events_per_boxtrail_cpu_s": ratio(parts, "pg_1node"),
            # Three processes with nothing shared: the part of pg_3node's ratio that is
            # this 2-core machine, not the cluster; and pg_3node over it, the cluster's own.
            "sqlite_3solo_to_sqlite_events_per_boxtrail_cpu_s": ratio(parts, SOLO),
            "pg_3node_to_sqlite_3solo_events_per_boxtrail_cpu_s":
                ratio(parts, "pg_3node", base=SOLO),
            "pg_1node_to_sqlite_events_per_cpu_s_incl_postgres_redis":
                ratio(parts, "pg_1node", group="boxtrail_postgres_redis"),
            "search_p50_pg_1node_to_sqlite": search_ratio(parts, "pg_1node"),
            "search_p50_pg_3node_to_sqlite": search_ratio(parts, "pg_3node"),
        },
    }
    top = report["ratios"]["pg_3node_to_sqlite_events_per_boxtrail_cpu_s"]
    report["target"] = {"pg_3node_to_sqlite_events_per_boxtrail_cpu_s": TARGET_RATIO,
                        "met": None if top is None else top >= TARGET_RATIO}
    report["problems"] = problems
    report["machine"] = facts | {"loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
                                 "run_s": round(time.monotonic() - started, 1)}
    print(json.dumps(report, indent=2))
    failed = [kind for kind in KINDS if "error" in parts[kind]]
    if failed or problems:
        log(f"FAILED: {', '.join(failed) or 'none'}; {len(problems)} problem(s)")
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
