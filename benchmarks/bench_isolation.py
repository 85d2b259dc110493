"""Heavy reads and uploads beside ingest: does a 202 wait behind them? And deep pages.

    python benchmarks/bench_isolation.py [--seconds 8] [--rounds 3] [--rate 5000]
        [--map-mb 50] [--errors 10000] [--history-rows 200000] [--worker-processes N]

- Ingest probe: this process posts 100-event bodies at ``--rate`` events/s over one
  keep-alive connection (closed loop, paced) and times each 202.
- Beside it, in a subprocess of its own (so it does not share this process's GIL), one of:
  ``none``; ``upload``: a ``--map-mb`` MB source map (with its JS) uploaded again and again;
  ``groupby``: ``GET /errors?groupBy=fingerprint`` over ``--errors`` error rows with
  distinct stacks at a URL with an uploaded map, again and again. The modes alternate
  within each round (none, upload, none, groupby), so the machine's noise hits all alike;
  the figure is the median over rounds of p99(mode) / p99(none) of the same round.
- Deep pages: ``--history-rows`` rows spread over 7 days, flushed to Parquet; then
  ``GET /logs?since=7d&limit=100`` page 1 and, following ``nextCursor``, page 20, timed
  over many walks; the figure is median(page 20) / median(page 1).

Targets (issue "every page holds the ingest key"): both p99 ratios within 1.5x; page 20
within 1.5x of page 1. Prints one JSON object on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))  # run as a script, import the package beside it

from benchmarks.bench_ingest import (  # noqa: E402
    BenchError,
    Target,
    http_json,
    machine,
    start_boxtrail,
)

APP_JS_URL = "https://cdn.bench/app.min.js"
MODES = ("none", "upload", "none", "groupby")


def log(message: str) -> None:
    print(f"bench_isolation: {message}", file=sys.stderr, flush=True)


def connect(base_url: str) -> http.client.HTTPConnection:
    parts = urlsplit(base_url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=120)


def post(conn: http.client.HTTPConnection, path: str, body: bytes,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})
    response = conn.getresponse()
    return response.status, response.read()


def get(conn: http.client.HTTPConnection, path: str, api_key: str) -> tuple[int, bytes]:
    conn.request("GET", path, headers={"Authorization": f"Bearer {api_key}"})
    response = conn.getresponse()
    return response.status, response.read()


def multipart(files: dict[str, bytes]) -> tuple[bytes, str]:
    boundary = "benchboundary7d1f"
    parts = [b"--%s\r\nContent-Disposition: form-data; name=\"urlPrefix\"\r\n\r\n~/\r\n"
             % boundary.encode()]
    for name, data in files.items():
        parts.append(b"--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"%s\""
                     b"\r\nContent-Type: application/octet-stream\r\n\r\n%s\r\n"
                     % (boundary.encode(), name.encode(), data))
    parts.append(b"--%s--\r\n" % boundary.encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def big_map(megabytes: int) -> dict[str, bytes]:
    """A minified file of ``megabytes`` MB (many one-line functions) and its map, with a
    segment per function and the sources in sourcesContent."""
    functions = max(1, megabytes * 1_000_000 // 60)
    js = "".join(f"function f{i}(a){{return a+{i}}}\n" for i in range(functions))
    source = "".join(f"export function original{i}(a) {{ return a + {i} }}\n"
                     for i in range(functions))
    mappings = "AAAA" + ";AACA" * (functions - 1)
    source_map = json.dumps({"version": 3, "file": "app.min.js", "sources": ["src/app.js"],
                             "sourcesContent": [source], "names": [], "mappings": mappings})
    return {"app.min.js": js.encode() + b"//# sourceMappingURL=app.min.js.map\n",
            "app.min.js.map": source_map.encode()}


def driver(mode: str, base_url: str, api_key: str, upload_file: str) -> None:
    """The load beside the probe: runs until killed, one line on stdout per request (its
    status and milliseconds)."""
    conn = connect(base_url)
    auth = {"Authorization": f"Bearer {api_key}"}
    body = Path(upload_file).read_bytes() if mode == "upload" else b""
    content_type = Path(upload_file + ".type").read_text() if mode == "upload" else ""
    while True:
        started = time.monotonic()
        if mode == "upload":
            status, _ = post(conn, "/v1/projects/bench/sourcemaps", body,
                             {**auth, "Content-Type": content_type})
        else:
            status, _ = get(conn, "/v1/projects/bench/errors?since=1h&groupBy=fingerprint",
                            api_key)
        print(status, f"{(time.monotonic() - started) * 1000:.1f}", flush=True)


def seed_errors(target: Target, count: int) -> None:
    conn = connect(target.base_url)
    for start in range(0, count, 100):
        events = [{"level": "error", "message": f"failed {n % 7}",
                   "error": {"type": "TypeError", "message": f"x is undefined {n % 7}",
                             "stack": f"TypeError: x is undefined\n"
                                      f"    at f{n} ({APP_JS_URL}:{n % 5000 + 1}:10)\n"
                                      f"    at g ({APP_JS_URL}:{n % 3000 + 1}:20)"}}
                  for n in range(start, min(start + 100, count))]
        status, body = post(conn, target.path, json.dumps({"events": events}).encode())
        if status != 202:
            raise BenchError(f"seeding errors: {status} {body[:200]!r}")


def probe(target: Target, seconds: float, rate: float) -> list[float]:
    """Latencies (ms) of 202s for ``seconds`` at ``rate`` events/s."""
    conn = connect(target.base_url)
    body = json.dumps({"context": {"boxId": "probe"}, "events": [
        {"level": "info", "message": f"probe event {i}", "attrs": {"i": i}}
        for i in range(100)]}).encode()
    interval = 100 / rate
    latencies: list[float] = []
    start = next_send = time.monotonic()
    while (now := time.monotonic()) - start < seconds:
        if now < next_send:
            time.sleep(next_send - now)
        sent = time.monotonic()
        status, answer = post(conn, target.path, body)
        if status != 202:
            raise BenchError(f"probe ingest answered {status} {answer[:200]!r}")
        latencies.append((time.monotonic() - sent) * 1000)
        next_send += interval
    return latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_mode(target: Target, mode: str, seconds: float, rate: float, upload_file: str
             ) -> dict[str, Any]:
    proc = None
    done: list[str] = []
    if mode != "none":
        proc = subprocess.Popen(
            [sys.executable, __file__, "--driver", mode, target.base_url, target.api_key,
             upload_file], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        reader = threading.Thread(target=lambda: done.extend(proc.stdout), daemon=True)  # type: ignore[union-attr, arg-type]
        reader.start()
        time.sleep(1.0)  # the load is under way before the probe starts
    try:
        latencies = probe(target, seconds, rate)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(10)
    failed = [line.strip() for line in done if not line.startswith("20")]
    if failed:
        raise BenchError(f"{mode} driver got {failed[:3]}")
    took = [float(line.split()[1]) for line in done]
    return {"mode": mode, "requests": len(latencies), "p50_ms": pct(latencies, 0.5),
            "p99_ms": pct(latencies, 0.99), "max_ms": max(latencies),
            "load_requests": len(done),
            "load_median_ms": statistics.median(took) if took else None}


def seed_history(target: Target, rows: int) -> None:
    """``rows`` rows over the last 7 days in a project of their own, then flushed."""
    status, body = http_json("POST", f"{target.base_url}/v1/projects", target.api_key,
                             {"name": "history"})
    if status != 201:
        raise BenchError(f"creating project history: {status} {body}")
    path = "/v1/ingest?key=" + quote(body["ingestKey"], safe="")
    conn = connect(target.base_url)
    now = int(time.time() * 1000)
    step = 7 * 86_400_000 // rows
    for start in range(0, rows, 1000):
        events = [{"ts": now - (n + 1) * step, "level": "info",
                   "message": f"history row {n} checkout"} for n in range(start, start + 1000)]
        status, answer = post(conn, path, json.dumps({"context": {"boxId": "h"},
                                                      "events": events}).encode())
        if status != 202:
            raise BenchError(f"seeding history: {status} {answer[:200]!r}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # flushed: the buffer is empty
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        if "\nboxtrail_buffer_rows 0" in text:
            return
        time.sleep(0.5)
    raise BenchError("the history was not flushed within 60 s")


def deep_pages(target: Target, walks: int, depth: int) -> dict[str, Any]:
    conn = connect(target.base_url)
    first: list[float] = []
    last: list[float] = []
    scanned: list[tuple[str, str]] = []
    for _ in range(walks):
        cursor = None
        for page in range(1, depth + 1):
            params = {"since": "7d", "limit": "100", **({"cursor": cursor} if cursor else {})}
            started = time.monotonic()
            conn.request("GET", f"/v1/projects/history/logs?{urlencode(params)}",
                         headers={"Authorization": f"Bearer {target.api_key}"})
            response = conn.getresponse()
            data = response.read()
            took = (time.monotonic() - started) * 1000
            if response.status != 200:
                raise BenchError(f"page {page}: {response.status} {data[:200]!r}")
            if page == 1:
                first.append(took)
            if page == depth:
                last.append(took)
                scanned.append((response.getheader("x-boxtrail-files-scanned") or "?",
                                response.getheader("x-boxtrail-files-total") or "?"))
            cursor = json.loads(data)["nextCursor"]
    return {"walks": walks, "page": depth, "page1_median_ms": statistics.median(first),
            f"page{depth}_median_ms": statistics.median(last),
            "ratio": statistics.median(last) / statistics.median(first),
            "files_scanned_of_total_at_last_page": scanned[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=5000.0)
    parser.add_argument("--map-mb", type=int, default=50)
    parser.add_argument("--errors", type=int, default=10_000)
    parser.add_argument("--history-rows", type=int, default=200_000)
    parser.add_argument("--walks", type=int, default=15)
    parser.add_argument("--worker-processes", type=int, default=None,
                        help="BOXTRAIL_WORKER_PROCESSES for the server (default: its own)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="the round's modes, in order (none first)")
    parser.add_argument("--driver", nargs=4, metavar=("MODE", "URL", "KEY", "FILE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.driver:
        driver(*args.driver)
        return 0
    out: dict[str, Any] = {"bench": "isolation", "machine": machine(),
                           "params": {k: v for k, v in vars(args).items() if k != "driver"}}
    with tempfile.TemporaryDirectory(prefix="boxtrail-bench-isolation-") as tmp:
        settings = ({} if args.worker_processes is None
                    else {"BOXTRAIL_WORKER_PROCESSES": str(args.worker_processes)})
        target = start_boxtrail(None, Path(tmp), settings)  # type: ignore[arg-type]
        try:
            log(f"building a {args.map_mb} MB map")
            files = big_map(args.map_mb)
            body, content_type = multipart(files)
            upload_file = str(Path(tmp) / "upload.bin")
            Path(upload_file).write_bytes(body)
            Path(upload_file + ".type").write_text(content_type)
            out["upload_bytes"] = len(body)
            small, small_type = multipart({"app.min.js": b"function f(){}\n",
                                           "app.min.js.map": json.dumps({
                                               "version": 3, "sources": ["src/app.js"],
                                               "names": [], "mappings": "AAAA",
                                               "sourcesContent": ["f()\n"]}).encode()})
            status, answer = post(connect(target.base_url), "/v1/projects/bench/sourcemaps",
                                  small, {"Authorization": f"Bearer {target.api_key}",
                                          "Content-Type": small_type})
            if status != 201:
                raise BenchError(f"uploading the small map: {status} {answer[:300]!r}")
            log(f"seeding {args.errors} errors")
            seed_errors(target, args.errors)
            rounds = []
            for r in range(args.rounds):
                results = []
                for mode in args.modes.split(","):
                    log(f"round {r + 1}: {mode}")
                    results.append(run_mode(target, mode, args.seconds, args.rate, upload_file))
                base = statistics.median(x["p99_ms"] for x in results if x["mode"] == "none")
                rounds.append({"modes": results} | {
                    f"{x['mode']}_p99_ratio": x["p99_ms"] / base for x in results
                    if x["mode"] != "none"})
            out["ingest_beside_heavy_work"] = {"rounds": rounds, "target": "<= 1.5"} | {
                f"{mode}_p99_ratio_median": statistics.median(x[f"{mode}_p99_ratio"]
                                                              for x in rounds)
                for mode in set(args.modes.split(",")) - {"none"}}
            if args.history_rows:
                log(f"seeding {args.history_rows} rows of history")
                seed_history(target, args.history_rows)
                out["deep_pages"] = deep_pages(target, args.walks, 20) | {"target": "<= 1.5"}
        finally:
            target.server.stop(30)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
