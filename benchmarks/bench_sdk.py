"""What the browser SDK costs a page: bytes on the wire and main-thread time per call.

    python benchmarks/bench_sdk.py [--calls 20000] [--rounds 9]

- size: boxtrail is the file as shipped (``sdk-js/scripts/build.mjs``: esbuild, then terser),
  measured as ``tests/sdk/test_sdk_size.py`` measures it (which checks docs/sdk.md's row against the
  same build); ``bench_sdk.mjs`` bundles ``@datadog/browser-logs`` and ``@sentry/browser`` in
  this run (esbuild, minify, one IIFE). Minified, gzip -9 and brotli bytes, with each peer's
  gzip as a multiple of ours; ``bench_sdk.mjs``'s own bundle of boxtrail (esbuild alone, as the
  peers) is reported beside them.
- per call: a page in Debian's Chromium (headless, ``--dump-dom``: no DevTools client attached,
  which would make every console call far slower) times, in the same rounds, a bare
  ``console.log``, ``boxtrail.log.info`` and a ``console.log`` captured by the SDK, with the
  same arguments (``'line ' + i, {i}``). The per-minute cap is lifted and the queue cap
  raised to its maximum (20,000), so every call takes the full path: serialize, queue, and
  once the queue is full (nothing is sent during a synchronous loop), drop the oldest.
  Ingest requests go to a local stub that answers 202. Rounds alternate the variants; the
  median round is reported.

Prints one JSON object on stdout (progress on stderr); exits 1 when a part failed.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))  # run as a script: the budget and the measure are the test's

from tests.sdk.test_sdk_size import BUDGET_BYTES, measure  # noqa: E402

SDK = REPO / "sdk-js"
TIMEOUT_S = 300

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><script src="/boxtrail.js"></script></head>
<body><pre id="out"></pre>
<script>
(() => {
  const N = %(calls)d, ROUNDS = %(rounds)d;
  const bare = console.log; // the browser's own, kept before init() wraps it
  boxtrail.init({ ingestKey: 'bench', endpoint: location.origin, maxEventsPerMinute: 1e9,
                  maxQueue: 20000, captureConsole: ['log'] });
  let sink = '';
  const variants = {
    'loop only': (i) => { sink = 'line ' + i; },
    'console.log': (i) => bare.call(console, 'line ' + i, { i }),
    'boxtrail log.info': (i) => boxtrail.log.info('line ' + i, { i }),
    'console.log captured by boxtrail': (i) => console.log('line ' + i, { i }),
  };
  const time = (f, n) => {
    const start = performance.now();
    for (let i = 0; i < n; i++) f(i);
    return (performance.now() - start) * 1000 / n;
  };
  for (const f of Object.values(variants)) time(f, N / 10); // warm-up, not counted
  const rounds = Object.fromEntries(Object.keys(variants).map((k) => [k, []]));
  for (let r = 0; r < ROUNDS; r++) {
    for (const [name, f] of Object.entries(variants)) rounds[name].push(time(f, N));
  }
  document.getElementById('out').textContent = JSON.stringify({ rounds, sink: sink.length });
})();
</script></body></html>
"""


class BenchError(Exception):
    """A part of the benchmark could not run; the message says why."""


def log(message: str) -> None:
    print(f"bench_sdk: {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], cwd: Path = REPO) -> str:
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchError(f"{cmd[0]}: {exc}") from exc
    if done.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def shipped() -> bytes:
    """``dist/boxtrail.js`` built from the current source, as ``make sdk`` builds it."""
    run(["node", "scripts/build.mjs", "--no-types"], cwd=SDK)
    return (SDK / "dist" / "boxtrail.js").read_bytes()


def sizes() -> dict[str, Any]:
    peers: dict[str, Any] = json.loads(run(["node", str(HERE / "bench_sdk.mjs")]))
    like_peers = peers.pop("boxtrail")
    ours = {"version": like_peers["version"], **measure(shipped())}
    return {
        "bytes": {"boxtrail": ours, **peers},
        "gzip_multiple_of_boxtrail": {name: round(m["gzip"] / ours["gzip"], 1)
                                      for name, m in peers.items()},
        "boxtrail_bundled_as_the_peers": like_peers,
        "budget_gzip": BUDGET_BYTES,
        "within_budget": ours["gzip"] <= BUDGET_BYTES,
    }


def serve(bundle: bytes, page: bytes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def reply(self, status: int, body: bytes = b"", kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Access-Control-Allow-Origin", "*")
            self.send_header("Access-Control-Allow-Headers", "Content-Type, Content-Encoding")
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/boxtrail.js":
                self.reply(200, bundle, "text/javascript")
            elif self.path == "/bench.html":
                self.reply(200, page, "text/html; charset=utf-8")
            else:
                self.reply(404)

        def do_OPTIONS(self) -> None:
            self.reply(204)

        def do_POST(self) -> None:  # the ingest stub
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.reply(202, b'{"accepted":0,"rejected":[]}')

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def per_call(calls: int, rounds: int) -> dict[str, Any]:
    chromium = shutil.which("chromium")
    if chromium is None:
        raise BenchError("Debian's chromium is not installed (make system-deps)")
    httpd = serve(shipped(), (PAGE % {"calls": calls, "rounds": rounds}).encode())
    try:
        with tempfile.TemporaryDirectory(prefix="bench-sdk-") as profile:
            dom = run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                       "--disable-background-networking", "--disable-component-update",
                       "--disable-sync", f"--user-data-dir={profile}", "--dump-dom",
                       f"http://127.0.0.1:{httpd.server_address[1]}/bench.html"])
    finally:
        httpd.shutdown()
        httpd.server_close()
    found = re.search(r'<pre id="out">(.*?)</pre>', dom, re.S)
    if not found or not found.group(1):
        raise BenchError(f"the bench page printed no result: {dom[-500:]}")
    result = json.loads(html.unescape(found.group(1)))["rounds"]
    medians = {name: round(statistics.median(values), 3) for name, values in result.items()}
    # console.log itself varies 2-3x between rounds (it talks to the browser process): compare
    # within each round, then take the median.
    bare, captured = result["console.log"], result["console.log captured by boxtrail"]
    return {
        "us_per_call_median": medians,
        "us_per_call_rounds": {name: [round(v, 3) for v in values]
                               for name, values in result.items()},
        "log_info_over_console_log": round(statistics.median(
            [a / b for a, b in zip(result["boxtrail log.info"], bare, strict=True)]), 3),
        "captured_over_bare_console_log": round(statistics.median(
            [a / b for a, b in zip(captured, bare, strict=True)]), 3),
        "calls_per_round": calls,
        "rounds": rounds,
        "chromium": run([chromium, "--version"]).strip(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    report: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "platform": platform.platform()},
        "node": run(["node", "--version"]).strip(),
    }
    failed = False
    for name, part in (("size", sizes), ("per_call", lambda: per_call(args.calls, args.rounds))):
        log(f"measuring {name}")
        try:
            report[name] = part()
        except BenchError as exc:
            report[name] = {"error": str(exc)}
            failed = True
    print(json.dumps(report, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
