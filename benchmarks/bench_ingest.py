"""Ingest throughput of boxtrail against its ceiling, in one run, on loopback.

    python benchmarks/bench_ingest.py [--seconds 10] [--connections 32] [--batch 100]

- ceiling: ``ceiling_app.py`` (bare Litestar + msgspec decode, served like boxtrail);
- boxtrail: ``python -m boxtrail serve`` on a fresh data directory, end to end with the
  durable (WAL-fsynced) 202, then a read-back of the logs.
- envelope: the same server code, the same events sent as Sentry's SDKs send logs (an
  envelope with one ``log`` item per request) to ``POST /api/{id}/envelope/``.

Both get the same pre-encoded bodies from ``datagen`` through ``loadgen.py`` in a separate
process, after a warm-up that is not counted. Between loads each server is left to go idle,
so deferred work (Parquet flushes) is charged to the part that caused it, not to the next
one. With ``--rounds N`` the parts alternate N times and the median round is reported: the
machine is noisy and shared with the client, so read the ratio, not the absolutes.
Prints one JSON object on stdout, progress on stderr; exits 1 when a part failed (its
section has an ``error`` saying why).
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import importlib.metadata
import json
import os
import platform
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))  # run as a script, import the package beside it

from benchmarks.datagen import make_bodies, to_envelope  # noqa: E402

# The compiled core's targets (its issue): per server CPU-second, and beside the ceiling.
TARGET_EVENTS_PER_CORE = 200_000
TARGET_RATIO = 0.6
PACKAGES = ("litestar", "msgspec", "uvicorn", "uvloop", "httptools", "granian")
BOXTRAIL_LISTENING = re.compile(r"boxtrail listening on http://(\[[^\]]+\]|[^\s:/]+):(\d+)")
CEILING_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")
# uvicorn re-raises the SIGTERM it handled once shut down, so -15 is a clean exit too.
CLEAN_EXITS = (0, -signal.SIGTERM)


class BenchError(Exception):
    """A part of the benchmark could not run; the message says why and what to check."""


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
    max_requests: int
    timeout: float
    ceiling_server: str


def log(message: str) -> None:
    print(f"bench_ingest: {message}", file=sys.stderr, flush=True)


class ServerProcess:
    """A server subprocess whose merged output is drained (a full pipe would stall it)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,  # its own group: kill it whole
        )
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.tail.append(line)
            self.lines.put(line)
        self.lines.put(None)  # end of output: the process is gone

    def wait_for(self, pattern: re.Pattern[str], timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                self.proc.wait(5)
                raise BenchError(f"{self.name} exited with {self.proc.returncode} before "
                                 f"printing its listening line")
            if match := pattern.search(line):
                return match
        raise BenchError(f"{self.name} printed no line matching {pattern.pattern!r} "
                         f"within {timeout_s:g} s")

    def output(self) -> str:
        return "\n".join(self.tail) or "(nothing)"

    def stop(self, grace_s: float) -> int:
        """SIGTERM, wait for a clean exit, then SIGKILL the process group we started."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                log(f"{self.name} ignored SIGTERM for {grace_s:g} s; killing it")
        with contextlib.suppress(ProcessLookupError):  # the usual case: all gone already
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait(5)
        return self.proc.returncode


def tree_cpu_seconds(root: int) -> float:
    """utime+stime of ``root`` and its descendants (granian serves from a child process)."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # The command name may hold spaces or parentheses: fields start after the last ')'.
        fields = text[text.rindex(")") + 2 :].split()
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        ticks[pid] = int(fields[11]) + int(fields[12])
    tree, frontier = set(), [root]
    while frontier:
        pid = frontier.pop()
        tree.add(pid)
        frontier.extend(child for child, parent in parents.items() if parent == pid)
    return sum(ticks.get(pid, 0) for pid in tree) / os.sysconf("SC_CLK_TCK")


def settle(server: ServerProcess, quiet_s: float, limit_s: float = 60.0) -> float:
    """Wait until the server used <5% of a core for ``quiet_s``; the CPU seconds it used."""
    start = last = tree_cpu_seconds(server.pid)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and server.proc.poll() is None:
        time.sleep(quiet_s)
        now = tree_cpu_seconds(server.pid)
        idle = now - last < 0.05 * quiet_s
        last = now
        if idle:
            break
    return last - start


def run_load(
    base_url: str, path: str, bodies_file: Path, params: Params, server_pid: int,
    envelope: bool = False,
) -> dict[str, Any]:
    """Run loadgen.py against the server; sample the server's CPU at the window's edges."""
    argv = [
        sys.executable, str(HERE / "loadgen.py"), "--url", base_url, "--path", path,
        "--bodies", str(bodies_file), "--header",
        "Content-Type: " + ("text/plain;charset=UTF-8" if envelope else "application/json"),
        *(["--bodies-base64", "--events-per-200", str(params.batch)] if envelope else []),
        "--connections", str(params.connections), "--warmup", str(params.warmup),
        "--seconds", str(params.seconds), "--max-requests", str(params.max_requests),
        "--timeout", str(params.timeout),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    # loadgen bounds itself; this is the backstop should it wedge.
    watchdog = threading.Timer(params.warmup + params.seconds + params.timeout + 30, proc.kill)
    watchdog.start()
    cpu: dict[str, float] = {}
    result: dict[str, Any] | None = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            message = json.loads(line)
            if message["phase"] in ("measure", "done"):
                cpu[message["phase"]] = tree_cpu_seconds(server_pid)
            elif message["phase"] == "result":
                result = message
        proc.wait()
    finally:
        watchdog.cancel()
    if result is None or len(cpu) != 2:
        raise BenchError(f"loadgen exited with {proc.returncode} without a result")
    del result["phase"]
    server_cpu = cpu["done"] - cpu["measure"]
    result["server_cpu_s"] = round(server_cpu, 3)
    result["server_cores_used"] = round(server_cpu / result["duration_s"], 3)
    result["events_per_server_cpu_s"] = (
        round(result["events_accepted"] / server_cpu, 1) if server_cpu else None
    )
    return result


@dataclass
class Target:
    """A started server and what loading it needs."""

    name: str
    server: ServerProcess
    base_url: str
    path: str
    api_key: str = ""
    runs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


@contextlib.contextmanager
def stopped_on_error(server: ServerProcess) -> Iterator[None]:
    """While starting: on failure stop the server and add its output to the error."""
    try:
        yield
    except BenchError as exc:
        server.stop(10)
        raise BenchError(f"{exc}; {server.name} output:\n{server.output()}") from exc
    except BaseException:
        server.stop(10)
        raise


def start_ceiling(params: Params, _: Path) -> Target:
    argv = [sys.executable, str(HERE / "ceiling_app.py"), "--port", "0",
            "--server", params.ceiling_server]
    server = ServerProcess(params.ceiling_server, argv, dict(os.environ), REPO)
    with stopped_on_error(server):
        base_url = server.wait_for(CEILING_LISTENING, 30).group(1)
    return Target("ceiling", server, base_url, "/v1/ingest?key=ceiling")


def boxtrail_env(data_dir: Path, settings: dict[str, str] | None = None) -> dict[str, str]:
    # boxtrail refuses unknown BOXTRAIL_* settings, and the caller's own would skew the run.
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOXTRAIL_")}
    env.update(BOXTRAIL_PORT="0", BOXTRAIL_DATA_DIR=str(data_dir), BOXTRAIL_RATE_LIMIT_EVENTS="0",
               PYTHONUNBUFFERED="1")
    env.update(settings or {})
    # `-m boxtrail` must load this tree, installed or not.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def start_boxtrail(_: Params, tmp: Path, settings: dict[str, str] | None = None) -> Target:
    missing = [p for p in ("boxtrail/cli.py", "boxtrail/app.py") if not (REPO / p).exists()]
    if missing:
        raise BenchError(f"the boxtrail server is not there yet: {', '.join(missing)} missing")
    data_dir = tmp / "boxtrail-data"
    argv = [sys.executable, "-m", "boxtrail", "serve"]
    server = ServerProcess("boxtrail serve", argv, boxtrail_env(data_dir, settings), REPO)
    with stopped_on_error(server):
        match = server.wait_for(BOXTRAIL_LISTENING, 60)
        host = match.group(1).strip("[]")
        host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        base_url = f"http://{host}:{match.group(2)}"
        api_key = read_api_key(data_dir / "dev-api-key")
        ingest_key = create_project(base_url, api_key)
    path = "/v1/ingest?key=" + quote(ingest_key, safe="")
    return Target("boxtrail", server, base_url, path, api_key)


def start_envelope(params: Params, tmp: Path) -> Target:
    """boxtrail again, loaded through its Sentry envelope endpoint."""
    target = start_boxtrail(params, tmp / "envelope")
    status, body = http_json("GET", f"{target.base_url}/v1/projects/bench", target.api_key)
    if status != 200 or not isinstance(body, dict) or "sentryKey" not in body:
        raise BenchError(f"GET /v1/projects/bench answered {status} {str(body)[:300]}")
    target.name = "envelope"
    target.path = (f"/api/{body['sentryId']}/envelope/?sentry_version=7&sentry_key="
                   + quote(body["sentryKey"], safe=""))
    return target


def http_json(
    method: str, url: str, api_key: str, body: dict[str, Any] | None = None
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {api_key}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        try:
            return exc.code, json.loads(text)
        except ValueError:
            return exc.code, text


def read_api_key(path: Path, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and (key := path.read_text().strip()):
            return key
        time.sleep(0.1)
    raise BenchError(f"boxtrail wrote no dev API key to {path} (DESIGN.md 'Tenancy')")


def create_project(base_url: str, api_key: str) -> str:
    status, body = http_json("POST", f"{base_url}/v1/projects", api_key, {"name": "bench"})
    if status != 201 or not isinstance(body, dict) or "ingestKey" not in body:
        raise BenchError(f"POST /v1/projects answered {status} {str(body)[:500]}; want 201 "
                         "with ingestKey")
    return str(body["ingestKey"])


def check_logs(target: Target, timeout_s: float = 5.0) -> dict[str, Any]:
    """Acknowledged events must be searchable (DESIGN.md: within about a second)."""
    url = f"{target.base_url}/v1/projects/bench/logs?since=1h&limit=1"
    deadline = time.monotonic() + timeout_s
    while True:
        status, body = http_json("GET", url, target.api_key)
        rows = body.get("rows") if isinstance(body, dict) else None
        ok = status == 200 and bool(rows)
        if ok or time.monotonic() > deadline:
            return {"ok": ok, "status": status, "rows": len(rows or []),
                    **({} if ok else {"body": str(body)[:500]})}
        time.sleep(0.25)


def server_metrics(target: Target) -> dict[str, float]:
    """The server's own view of the run: WAL fsync and flush latencies (whole run)."""
    wanted = ("boxtrail_wal_fsync_seconds_count", "boxtrail_wal_fsync_seconds_sum",
              "boxtrail_wal_fsync_seconds_max", "boxtrail_flush_seconds_count",
              "boxtrail_flush_seconds_sum", "boxtrail_flush_seconds_max",
              "boxtrail_parquet_files", "boxtrail_events_accepted_total")
    with urllib.request.urlopen(f"{target.base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            values[name.removeprefix("boxtrail_")] = float(value)
    return values


def measure(target: Target, params: Params, bodies_file: Path, round_: int) -> None:
    """One load on an idle server, then the CPU it spends catching up (e.g. Parquet)."""
    if not target.runs:
        settle(target.server, 1.0)  # start-up work; later loads begin where `after` ended
    log(f"round {round_ + 1}/{params.rounds}: {target.name} on {target.base_url}: "
        f"warm-up {params.warmup:g} s, load {params.seconds:g} s")
    if target.name == "envelope":
        bodies_file = bodies_file.with_suffix(".envelopes")
    result = run_load(target.base_url, target.path, bodies_file, params, target.server.pid,
                      envelope=target.name == "envelope")
    after = settle(target.server, params.settle)
    result["after_load_cpu_s"] = round(after, 3)
    cpu = result["server_cpu_s"] + after
    result["events_per_server_cpu_s_incl_after"] = (
        round(result["events_accepted"] / cpu, 1) if cpu else None
    )
    target.runs.append(result)
    if target.server.proc.poll() is not None:
        raise BenchError(f"{target.server.name} exited with {target.server.proc.returncode} "
                         "during or right after the load")


def section(target: Target, extra: dict[str, Any]) -> dict[str, Any]:
    """The median round (by events/s) plus each round's figure, or the error."""
    out: dict[str, Any] = {}
    if target.runs:
        ranked = sorted(target.runs, key=lambda run: float(run["events_per_s"]))
        out |= ranked[(len(ranked) - 1) // 2]
        if len(target.runs) > 1:
            out["rounds_events_per_s"] = [run["events_per_s"] for run in target.runs]
    out |= extra
    if target.error:
        out["error"] = target.error
    return out


def ratio(ceiling: Target | None, real: Target | None) -> float | None:
    """Median of per-round ratios: both parts of a round saw about the same noise."""
    if not ceiling or not real:
        return None
    pairs = list(zip(ceiling.runs, real.runs, strict=False))
    ratios = [r["events_per_s"] / c["events_per_s"] for c, r in pairs if c["events_per_s"]]
    return round(statistics.median(ratios), 3) if ratios else None


def verdict(ratio_: float | None, real: dict[str, Any]) -> dict[str, Any]:
    per_core: float | None = real.get("events_per_server_cpu_s")
    return {
        "ratio_events_per_s": ratio_,
        "targets": {"events_per_server_cpu_s": TARGET_EVENTS_PER_CORE,
                    "ratio_events_per_s": TARGET_RATIO},
        # None: that figure was not measured in this run.
        "meets_targets": {
            "events_per_server_cpu_s": None if per_core is None
            else per_core >= TARGET_EVENTS_PER_CORE,
            "ratio_events_per_s": None if ratio_ is None else ratio_ >= TARGET_RATIO,
        },
    }


def machine() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), None)
    return {
        "nproc": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(), "cpu_model": model,
        "kernel": platform.release(), "python": platform.python_version(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()], "packages": versions,
    }


def parse_args(argv: list[str] | None) -> tuple[Params, str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="counted load per part")
    parser.add_argument("--warmup", type=float, default=2.0, help="uncounted load before it")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--batch", type=int, default=100, help="events per request")
    parser.add_argument("--bodies", type=int, default=64, help="distinct bodies, sent in turn")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1, help="alternate the parts N times")
    parser.add_argument("--settle", type=float, default=6.0,
                        help="idle seconds that mean a server is done (> boxtrail's 5 s flush)")
    parser.add_argument("--max-requests", type=int, default=2_000_000, help="per load, a backstop")
    parser.add_argument("--timeout", type=float, default=30.0, help="per request, seconds")
    parser.add_argument("--ceiling-server", choices=("uvicorn", "granian"), default="uvicorn")
    parser.add_argument("--only", choices=("all", "ceiling", "boxtrail", "envelope"),
                        default="all")
    args = parser.parse_args(argv)
    only = args.only
    del args.only
    return Params(**vars(args)), only


def start_all(params: Params, only: str, tmp: Path, parts: dict[str, Any]) -> list[Target]:
    targets = []
    for name, start in (("ceiling", start_ceiling), ("boxtrail", start_boxtrail),
                        ("envelope", start_envelope)):
        if only not in ("all", name):
            continue
        try:
            targets.append(start(params, tmp))
        except BenchError as exc:
            log(f"{name} FAILED to start: {exc}")
            parts[name] = {"error": str(exc)}
    return targets


def run_rounds(targets: list[Target], params: Params, bodies_file: Path) -> None:
    for round_ in range(params.rounds):
        for target in targets:
            if target.error:
                continue
            try:
                measure(target, params, bodies_file, round_)
            except BenchError as exc:
                log(f"{target.name} FAILED: {exc}; its output:\n{target.server.output()}")
                target.error = str(exc)


def finish(target: Target) -> dict[str, Any]:
    """Read back (boxtrail), stop the server and note how it exited."""
    extra: dict[str, Any] = {}
    if target.name in ("boxtrail", "envelope") and target.runs and \
            target.server.proc.poll() is None:
        extra["logs_check"] = check_logs(target)
        extra["server_metrics"] = server_metrics(target)
        if not extra["logs_check"]["ok"]:
            target.error = target.error or f"GET .../logs found no rows: {extra['logs_check']}"
    code = target.server.stop(30)
    extra["server_exit_code"] = code
    if code not in CLEAN_EXITS:
        log(f"{target.server.name} exited with {code} on SIGTERM; its output:\n"
            f"{target.server.output()}")
    if target.name == "ceiling":
        extra = {"server": target.server.name} | extra
    return section(target, extra)


def main(argv: list[str] | None = None) -> int:
    params, only = parse_args(argv)
    facts = machine()
    # Timestamps near now: the check reads the last hour back from boxtrail.
    bodies = make_bodies(params.seed, params.bodies, params.batch, ts_ms=int(time.time() * 1000))
    mean_body = sum(map(len, bodies)) / len(bodies)
    parts: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ingest-", ignore_cleanup_errors=True) as tmp:
        bodies_file = Path(tmp, "bodies.ndjson")
        bodies_file.write_bytes(b"\n".join(bodies) + b"\n")
        bodies_file.with_suffix(".envelopes").write_bytes(
            b"\n".join(base64.b64encode(to_envelope(b)) for b in bodies) + b"\n")
        targets = start_all(params, only, Path(tmp), parts)
        try:
            run_rounds(targets, params, bodies_file)
        finally:
            for target in targets:
                parts[target.name] = finish(target)
    by_name = {target.name: target for target in targets}
    report: dict[str, Any] = {
        "bench": "ingest",
        "params": asdict(params) | {"body_bytes_mean": round(mean_body),
                                    "event_bytes_mean": round(mean_body / params.batch)},
        **{name: parts[name] for name in ("ceiling", "boxtrail", "envelope") if name in parts},
        **verdict(ratio(by_name.get("ceiling"), by_name.get("boxtrail")),
                  parts.get("boxtrail", {})),
        "envelope_ratio_events_per_s": ratio(by_name.get("ceiling"), by_name.get("envelope")),
        "envelope_to_ingest_ratio_events_per_s": ratio(by_name.get("boxtrail"),
                                                       by_name.get("envelope")),
        "machine": facts | {"loadavg_at_end": [round(x, 2) for x in os.getloadavg()]},
    }
    print(json.dumps(report, indent=2))
    failed = [name for name in ("ceiling", "boxtrail", "envelope")
              if "error" in parts.get(name, {})]
    if failed:
        log(f"FAILED: {', '.join(failed)} (see their 'error')")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
