"""The web console's live tail under load, in headless Chromium, beside a naive tail page.

    python benchmarks/bench_console.py [--rates 2000,5000] [--seconds 60] [--queries 15]

For each rate, this process posts 100-event bodies at that many events/s (paced on the
clock) for ``--seconds`` while a signed-in Chromium page follows the project's tail:

- ``console``: the console's tail view (``console/static/views/tail.js``: a bounded ring,
  a virtual list, one draw per animation frame);
- ``naive``: the peer, the page one would write first: the same EventSource, one ``<li>``
  appended per row, nothing dropped, not even scrolled (scrolling to the bottom on every
  row froze the page for good at 2,000 rows/s); served at the console's origin by the
  browser's router, so it reads the tail with the same cookie.

Measured in the page while rows arrive: the longest main-thread task and the count over
50 ms (a ``longtask`` PerformanceObserver, reset once the tail is open so the page's boot
is left out), the share of the time the main thread was busy and its layout, style and
script time (DevTools ``Performance.getMetrics``), the DOM nodes, the JS heap every 2 s
(DevTools ``Runtime.getHeapUsage``, max, and after a forced GC at the end), the elements
in the page, the rows it received,
and how long after the feeder stopped the page had shown the last row. Then the same
window is searched: ``/histogram`` p50 beside the first ``/logs`` page's p50.

Prints one JSON object on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Page, sync_playwright

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))  # run as a script, import the package beside it

from benchmarks.bench_ingest import BenchError, Target, machine, start_boxtrail  # noqa: E402

PROJECT = "bench"  # made by start_boxtrail
BATCH = 100
OBSERVER = """
window.__longest = 0; window.__longTasks = 0;
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) {
    window.__longTasks += 1;
    window.__longest = Math.max(window.__longest, entry.duration);
  }
}).observe({type: 'longtask', buffered: true});
"""
NAIVE = """<!doctype html><html lang="en"><head><title>naive tail</title></head><body>
<p id="count">0</p><ul id="rows"></ul><script>
let n = 0;
const rows = document.getElementById("rows"), count = document.getElementById("count");
const source = new EventSource("/v1/projects/PROJECT/tail");
source.addEventListener("log", (e) => {
  const row = JSON.parse(e.data);
  const li = document.createElement("li");
  li.textContent = row.ts + " " + row.level + " " + row.message;
  rows.append(li);
  n += 1; count.textContent = String(n);
});
</script></body></html>""".replace("PROJECT", PROJECT)


def log(message: str) -> None:
    print(f"bench_console: {message}", file=sys.stderr, flush=True)


def feed(target: Target, rate: int, seconds: float, sent: list[int]) -> None:
    """``rate`` events/s in bodies of ``BATCH``, paced on the clock, for ``seconds``."""
    start = time.monotonic()
    with httpx.Client(base_url=target.base_url, timeout=30) as client:
        while time.monotonic() - start < seconds:
            n = sent[0]
            events = [{"level": ("info", "warn", "debug", "error")[i % 4],
                       "message": f"bench row {n + i} " + "x" * 60, "attrs": {"n": n + i}}
                      for i in range(BATCH)]
            r = client.post(target.path, json={"context": {"boxId": f"b{n // BATCH % 7}"},
                                               "events": events})
            if r.status_code != 202:
                raise BenchError(f"ingest answered {r.status_code}: {r.text[:200]}")
            sent[0] = n + BATCH
            wait = start + sent[0] / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)


def received(page: Page, kind: str) -> int:
    if kind == "naive":
        return int(page.text_content("#count") or 0)
    text = page.text_content("#tail-count") or "0"
    return int(text.split()[0].replace(",", ""))


def run(page: Page, target: Target, kind: str, rate: int, seconds: float) -> dict[str, Any]:
    cdp = page.context.new_cdp_session(page)
    if kind == "naive":
        page.goto(f"{target.base_url}/naive.html")
    else:
        page.goto(f"{target.base_url}/#/p/{PROJECT}/tail")
        page.wait_for_function("() => document.querySelector('#tail-status')?.textContent "
                               "=== 'live'", timeout=30_000)
    time.sleep(1)  # the tail is open (the naive page has no status to wait for)
    page.evaluate("() => { window.__longest = 0; window.__longTasks = 0; }")  # not the boot
    cdp.send("Performance.enable")
    before = metrics(cdp)
    start_count = received(page, kind)
    sent = [0]
    feeder = threading.Thread(target=feed, args=(target, rate, seconds, sent))
    started = time.monotonic()
    feeder.start()
    heap: list[float] = []
    while feeder.is_alive():
        feeder.join(2)
        heap.append(cdp.send("Runtime.getHeapUsage")["usedSize"] / 2**20)
    stopped = time.monotonic()
    busy = metrics(cdp)
    caught_up_s: float | None = None
    while time.monotonic() - stopped < 60:
        if received(page, kind) - start_count >= sent[0]:
            caught_up_s = time.monotonic() - stopped
            break
        time.sleep(0.1)
    cdp.send("HeapProfiler.collectGarbage")
    after_gc = cdp.send("Runtime.getHeapUsage")["usedSize"] / 2**20
    result = {
        "rows_sent": sent[0], "rows_received": received(page, kind) - start_count,
        "caught_up_s": None if caught_up_s is None else round(caught_up_s, 2),
        "longest_task_ms": page.evaluate("window.__longest"),
        "long_tasks": page.evaluate("window.__longTasks"),
        "heap_mb_max": round(max(heap), 1), "heap_mb_after_gc": round(after_gc, 1),
        "elements": page.evaluate("document.getElementsByTagName('*').length"),
        "dom_nodes": busy["Nodes"],
        # Share of the wall time the page's main thread was busy while rows arrived.
        "main_thread_busy": round((busy["TaskDuration"] - before["TaskDuration"])
                                  / (stopped - started), 3),
        "layout_ms": round((busy["LayoutDuration"] - before["LayoutDuration"]) * 1000),
        "style_ms": round((busy["RecalcStyleDuration"] - before["RecalcStyleDuration"]) * 1000),
        "script_ms": round((busy["ScriptDuration"] - before["ScriptDuration"]) * 1000),
    }
    cdp.detach()
    return result


def metrics(cdp: Any) -> dict[str, float]:
    """Chromium's counters of the page (``Performance.getMetrics``): seconds and counts."""
    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}


def timed(client: httpx.Client, path: str, params: dict[str, Any], count: int) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        r = client.get(path, params=params)
        times.append(time.perf_counter() - started)
        if r.status_code != 200:
            raise BenchError(f"{path} answered {r.status_code}: {r.text[:200]}")
    return round(statistics.median(times) * 1000, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="2000,5000")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--queries", type=int, default=15)
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium")
    if chromium is None:
        raise BenchError("Debian chromium is missing: run `make system-deps`")
    out: dict[str, Any] = {"machine": machine(), "seconds": args.seconds, "tail": {}}
    with tempfile.TemporaryDirectory() as tmp:
        target = start_boxtrail(None, Path(tmp), {"BOXTRAIL_RATE_LIMIT_EVENTS": "0"})  # type: ignore[arg-type]
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, headless=True,
                                            args=["--no-sandbox"])
                context = browser.new_context(viewport={"width": 1200, "height": 760})
                context.add_init_script(OBSERVER)
                context.route(f"{target.base_url}/naive.html", lambda route: route.fulfill(
                    status=200, content_type="text/html", body=NAIVE))
                page = context.new_page()
                page.goto(f"{target.base_url}/")
                page.fill("#api-key", target.api_key)
                page.click("form.signin button[type=submit]")
                page.wait_for_selector("header.top", timeout=30_000)
                for rate in (int(r) for r in args.rates.split(",")):
                    out["tail"][str(rate)] = {}
                    for kind in ("console", "naive"):
                        log(f"{kind} at {rate} rows/s for {args.seconds:.0f} s")
                        tab = context.new_page()
                        out["tail"][str(rate)][kind] = run(tab, target, kind, rate,
                                                           args.seconds)
                        tab.close()
                        log(json.dumps(out["tail"][str(rate)][kind]))
                browser.close()
            with httpx.Client(base_url=target.base_url, timeout=30,
                              headers={"Authorization": f"Bearer {target.api_key}"}) as client:
                window = {"since": "1h"}
                rows = client.get(f"/v1/projects/{PROJECT}/histogram", params=window).json()
                out["search"] = {
                    "rows_in_window": rows["total"],
                    "histogram_p50_ms": timed(client, f"/v1/projects/{PROJECT}/histogram",
                                              {**window, "buckets": 100}, args.queries),
                    "logs_page_p50_ms": timed(client, f"/v1/projects/{PROJECT}/logs",
                                              {**window, "limit": 100}, args.queries),
                }
        finally:
            target.server.stop(10)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench_console: {exc}", file=sys.stderr)
        sys.exit(1)
