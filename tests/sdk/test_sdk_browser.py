"""The browser SDK in a real Chromium, against the real server.

Pages live at ``http://<box>.box.test:<port>/`` (Chromium maps ``*.box.test`` to
127.0.0.1) and are served by a small HTTP server in this module, from
``tests/sdk_pages`` with ``{{endpoint}}`` and ``{{key}}`` filled in. The boxtrail server
runs with ``BOXTRAIL_BOX_HOST_PATTERN={box}.box.test``, so it reads the box id from each
request's ``Origin``. Every wait is bounded; nothing here asserts speed beyond generous
responsiveness bounds.
"""

from __future__ import annotations

import collections
import gzip
import http.client
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.support.server import Server, create_project, search_all

PAGES = Path(__file__).resolve().parents[1] / "sdk_pages"
BOX_PATTERN = "{box}.box.test"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--host-resolver-rules=MAP *.box.test 127.0.0.1",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
WAIT_S = 30.0

Row = dict[str, Any]


# --- Pages, and a proxy that refuses or holds requests ----------------------------------


class _Quiet(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class Site:
    """Serves the SDK bundle and ``sdk_pages/*.html`` with ``values`` filled in."""

    def __init__(self, bundle: Path) -> None:
        self.bundle = bundle
        self.values: dict[str, str] = {}
        site = self

        class Handler(_Quiet):
            def do_GET(self) -> None:
                path = urlsplit(self.path).path.lstrip("/")
                if path == "boxtrail.js":
                    body, kind = site.bundle.read_bytes(), "text/javascript"
                elif path.endswith(".html") and (PAGES / path).is_file():
                    text = (PAGES / path).read_text()
                    for name, value in site.values.items():
                        text = text.replace("{{" + name + "}}", value)
                    body, kind = text.encode(), "text/html; charset=utf-8"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, box: str, page: str) -> str:
        return f"http://{box}.box.test:{self.port}/{page}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


class Proxy:
    """Forwards everything to ``upstream``, except that the first ``refuse`` ingest POSTs
    get a 429 with ``Retry-After`` (and the CORS headers the real server sends). While
    ``held``, POSTs wait (at most ``WAIT_S``) before they are forwarded: a slow server."""

    def __init__(self, upstream: str, refuse: int = 0, retry_after: int = 1) -> None:
        target = urlsplit(upstream)
        host, port = target.hostname or "127.0.0.1", target.port
        self.posts: list[tuple[float, int, str | None]] = []  # (arrival, status, encoding)
        self.preflights = 0
        self.held: list[bytes] = []  # bodies (inflated) of the POSTs that arrived while held
        self.released = threading.Event()
        self.released.set()
        proxy = self

        class Handler(_Quiet):
            def do_OPTIONS(self) -> None:
                proxy.preflights += 1
                self.forward(self.read_body())

            def do_POST(self) -> None:
                body = self.read_body()
                arrived = time.monotonic()
                if not proxy.released.is_set():
                    gzipped = self.headers.get("Content-Encoding") == "gzip"
                    proxy.held.append(gzip.decompress(body) if gzipped else body)
                    proxy.released.wait(WAIT_S)
                if len(proxy.posts) < refuse:
                    proxy.posts.append((arrived, 429, self.headers.get("Content-Encoding")))
                    payload = b'{"error":{"code":"rate_limited","message":"test proxy"}}'
                    self.send_response(429)
                    self.send_header("Retry-After", str(retry_after))
                    self.send_header("Access-Control-Allow-Origin", self.headers["Origin"] or "*")
                    self.send_header("Access-Control-Expose-Headers", "Retry-After")
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                status = self.forward(body)
                proxy.posts.append((arrived, status, self.headers.get("Content-Encoding")))

            def read_body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def forward(self, body: bytes) -> int:
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "connection", "content-length")}
                conn = http.client.HTTPConnection(host, port, timeout=10)
                try:
                    conn.request(self.command, self.path, body, headers)
                    response = conn.getresponse()
                    payload = response.read()
                    self.send_response(response.status)
                    for name, value in response.getheaders():
                        if name.lower() not in ("connection", "transfer-encoding",
                                                "content-length", "date", "server"):
                            self.send_header(name, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return response.status
                finally:
                    conn.close()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def hold(self) -> None:
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


# --- Fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(sdk_bundle: Path) -> Iterator[Site]:
    pages = Site(sdk_bundle)
    yield pages
    pages.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Debian's chromium is not installed: run `make system-deps`")
    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS,
                                     timeout=60_000)
        yield instance
        instance.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    tab = context.new_page()
    tab.set_default_timeout(20_000)
    yield tab
    context.close()


@pytest.fixture(scope="module")
def box_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("sdk") / "data",
                 {"BOXTRAIL_BOX_HOST_PATTERN": BOX_PATTERN}).start()
    yield srv
    srv.stop()


@pytest.fixture
def box_api(box_server: Server) -> Iterator[httpx.Client]:
    with box_server.client() as client:
        yield client


_names = iter(range(1_000_000))


def new_project(client: httpx.Client, site: Site) -> dict[str, Any]:
    """A project that allows only this site's box pages, as a real deployment would."""
    return create_project(client, f"sdk-{next(_names)}", [f"http://*.box.test:{site.port}"])


def wait_for_rows(client: httpx.Client, project: str, count: int, settle_s: float = 0.0,
                  timeout: float = WAIT_S) -> list[Row]:
    """The project's rows, oldest first, once there are ``count`` (then ``settle_s`` more
    seconds for any extra row to show up), or whatever is there at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        rows = search_all(client, project, "1h")
        if len(rows) >= count or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if settle_s:
        time.sleep(settle_s)
        rows = search_all(client, project, "1h")
    return sorted(rows, key=lambda r: (r["ts"], r["id"]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_options(endpoint: str, project: dict[str, Any], **extra: object) -> dict[str, object]:
    return {"endpoint": endpoint, "ingestKey": project["ingestKey"], **extra}


# --- Capture -------------------------------------------------------------------------------


def test_console_levels_errors_and_rejections_arrive_with_box_and_level(
        page: Page, site: Site, box_server: Server, box_api: httpx.Client) -> None:
    project = new_project(box_api, site)
    site.values = {"endpoint": box_server.url, "key": project["ingestKey"]}
    printed: list[tuple[str, str]] = []
    page.on("console", lambda message: printed.append((message.type, message.text)))
    url = site.url("b1", "levels.html")
    page.goto(url)

    rows = wait_for_rows(box_api, project["id"], 10, settle_s=1.0)
    by_message = {row["message"]: row for row in rows}
    assert sorted(by_message) == sorted([
        "console debug line", 'console log line {"cart":3}', "console info line",
        "console warn line", "console error line TypeError: bad cart", "explicit info",
        "after setContext", "Uncaught Error: thrown on purpose",
        "Unhandled rejection: RangeError: rejected on purpose", "Unhandled rejection: plain reason",
    ]), rows
    assert len(rows) == 10
    levels = {message: row["level"] for message, row in by_message.items()}
    assert levels["console debug line"] == "debug"
    assert levels['console log line {"cart":3}'] == "info"
    assert levels["console info line"] == "info"
    assert levels["console warn line"] == "warn"
    assert levels["console error line TypeError: bad cart"] == "error"
    assert all(row["level"] == "error" for row in rows if row["message"].startswith("Un"))

    # Every row: the box from the page's host, the script tag's release, one session.
    assert {row["boxId"] for row in rows} == {"b1"}
    assert {row["release"] for row in rows} == {"e2e-1"}
    assert len({row["sessionId"] for row in rows}) == 1
    assert {row["url"] for row in rows} == {url}

    thrown = by_message["Uncaught Error: thrown on purpose"]
    assert thrown["error"]["type"] == "Error"
    assert "throwOnPurpose" in thrown["error"]["stack"]
    assert "levels.html" in thrown["error"]["stack"]
    # setContext() ran before the throw: its attribute is on this row too.
    assert thrown["attrs"] == {"mechanism": "onerror", "user": "u-42"}
    rejected = by_message["Unhandled rejection: RangeError: rejected on purpose"]
    assert rejected["error"]["type"] == "RangeError"
    assert rejected["attrs"] == {"mechanism": "unhandledrejection", "user": "u-42"}
    plain = by_message["Unhandled rejection: plain reason"]
    assert plain["error"]["type"] == "UnhandledRejection"
    assert plain["error"]["message"] == "plain reason"
    assert by_message["console error line TypeError: bad cart"]["error"]["type"] == "TypeError"
    assert by_message["explicit info"]["attrs"] == {"step": "checkout", "n": 2}
    assert by_message["after setContext"]["attrs"] == {"user": "u-42"}

    # The original console still printed every call.
    assert ("debug", "console debug line") in printed
    assert ("warning", "console warn line") in printed
    assert any(kind == "error" and text.startswith("console error line") for kind, text in printed)


def test_logs_written_just_before_navigating_away_arrive(
        page: Page, site: Site, box_server: Server, box_api: httpx.Client) -> None:
    project = new_project(box_api, site)
    site.values = {"endpoint": box_server.url, "key": project["ingestKey"]}
    # The page's flush interval (10 min) and batch size (1000) keep all 21 lines queued until
    # the page goes: only the pagehide path (sendBeacon) can deliver them.
    page.goto(site.url("b2", "leave.html"))
    page.click("#go")  # logs 21 lines, then the link navigates
    page.wait_for_url("**/next.html")

    rows = wait_for_rows(box_api, project["id"], 21, settle_s=1.0)
    assert [row["message"] for row in rows] == (
        [f"before leaving {i}" for i in range(20)] + ["last words"])
    assert {row["boxId"] for row in rows} == {"b2"}
    assert [row["level"] for row in rows] == ["info"] * 20 + ["warn"]


def test_events_keep_the_release_in_force_when_they_were_captured(
        page: Page, site: Site, box_server: Server, box_api: httpx.Client) -> None:
    project = new_project(box_api, site)
    page.goto(site.url("b8", "blank.html"))
    flushed = page.evaluate("""async (options) => {
      boxtrail.init(options);
      boxtrail.log.info('captured under 1.0');
      boxtrail.setContext({ release: '2.0' });
      boxtrail.log.info('captured under 2.0');
      return await boxtrail.flush();
    }""", init_options(box_server.url, project, release="1.0"))

    assert flushed is True
    rows = wait_for_rows(box_api, project["id"], 2, settle_s=0.5)
    assert {row["message"]: row["release"] for row in rows} == {
        "captured under 1.0": "1.0", "captured under 2.0": "2.0"}

# --- Delivery ------------------------------------------------------------------------------

LOG_BURSTS = """async ({ options, prefix, bursts, size, pauseMs }) => {
  if (options) boxtrail.init(options);
  for (let b = 0; b < bursts; b++) {
    for (let i = 0; i < size; i++) {
      boxtrail.log.info(prefix + ' ' + (b * size + i) + ' ' + 'x'.repeat(40), { b });
    }
    await new Promise((r) => setTimeout(r, pauseMs));
  }
}"""


def test_server_answering_429_then_recovering_loses_nothing(
        page: Page, site: Site, box_server: Server, box_api: httpx.Client) -> None:
    project = new_project(box_api, site)
    proxy = Proxy(box_server.url, refuse=3, retry_after=1)
    try:
        page.goto(site.url("b3", "blank.html"))
        page.evaluate(LOG_BURSTS, {"options": init_options(proxy.url, project, flushInterval=100),
                                   "prefix": "limited", "bursts": 4, "size": 50, "pauseMs": 300})
        rows = wait_for_rows(box_api, project["id"], 200, settle_s=1.5)
    finally:
        proxy.close()

    messages = collections.Counter(row["message"].split(" x")[0] for row in rows)
    assert messages == collections.Counter(f"limited {i}" for i in range(200)), "each exactly once"
    assert {row["boxId"] for row in rows} == {"b3"}
    statuses = [status for _, status, _ in proxy.posts]
    assert statuses[:3] == [429, 429, 429] and set(statuses[3:]) == {202}, statuses
    for (at, status, _), (next_at, _, _) in zip(proxy.posts, proxy.posts[1:], strict=False):
        if status == 429:
            assert next_at - at >= 0.9, "the retry waited for Retry-After: 1"
    assert any(encoding == "gzip" for _, _, encoding in proxy.posts), "bodies over 1 KB are gzipped"


def test_server_down_for_a_few_seconds_loses_nothing_that_fits_the_queue(
        page: Page, site: Site, tmp_path: Path) -> None:
    env = {"BOXTRAIL_BOX_HOST_PATTERN": BOX_PATTERN, "BOXTRAIL_PORT": str(free_port())}
    server = Server(tmp_path / "data", env).start()
    try:
        with server.client() as client:
            project = new_project(client, site)
            page.goto(site.url("b4", "blank.html"))
            page.evaluate(LOG_BURSTS, {"options": init_options(server.url, project),
                                       "prefix": "before", "bursts": 1, "size": 50, "pauseMs": 0})
            assert len(wait_for_rows(client, project["id"], 50)) == 50

        server.kill()
        down_at = time.monotonic()
        page.evaluate(LOG_BURSTS, {"options": None, "prefix": "during", "bursts": 6, "size": 50,
                                   "pauseMs": 250})
        time.sleep(max(0.0, 3.0 - (time.monotonic() - down_at)))
        server.start()  # same data directory, same port

        with server.client() as client:
            rows = wait_for_rows(client, project["id"], 350, settle_s=1.5)
    finally:
        server.stop()

    messages = collections.Counter(row["message"].split(" x")[0] for row in rows)
    expected = [f"before {i}" for i in range(50)] + [f"during {i}" for i in range(300)]
    assert messages == collections.Counter(expected), "each exactly once"
    assert {row["boxId"] for row in rows} == {"b4"}


NAVIGATION_TRIALS = 20


def test_leaving_while_a_request_is_out_stores_every_line_once(
        browser: Browser, site: Site, box_server: Server, box_api: httpx.Client) -> None:
    """Each trial flushes 10 lines, queues 10 more and navigates away while the server holds
    the first request: Chromium lets that keepalive request outlive the page (and rejects its
    fetch as the page goes), and the other 10 go by beacon. Each line must be stored once."""
    project = new_project(box_api, site)
    proxy = Proxy(box_server.url)
    site.values = {"endpoint": proxy.url, "key": project["ingestKey"]}
    context = browser.new_context()
    try:
        for trial in range(NAVIGATION_TRIALS):
            tab = context.new_page()  # a fresh page for each trial
            tab.set_default_timeout(20_000)
            tab.goto(site.url("b6", f"navigate.html?trial={trial}"))
            proxy.hold()  # the server answers only once the page has gone
            tab.click("#go")
            tab.wait_for_url("**/next.html")
            # The race under test: the first request reached the server before the page left,
            # and is answered after.
            flushed = f"trial {trial} in flight 0".encode()
            deadline = time.monotonic() + WAIT_S
            while not any(flushed in body for body in proxy.held) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert any(flushed in body for body in proxy.held), f"trial {trial}: no request out"
            proxy.release()
            tab.close()
        expected = [f"trial {t} {kind} {i}" for t in range(NAVIGATION_TRIALS)
                    for kind in ("in flight", "queued") for i in range(10)]
        rows = wait_for_rows(box_api, project["id"], len(expected), settle_s=1.5)
    finally:
        context.close()
        proxy.close()

    stored = collections.Counter(row["message"] for row in rows)
    twice = sorted({" ".join(message.split()[:2]) for message, n in stored.items() if n > 1})
    assert not twice, f"lines stored twice in {len(twice)} of {NAVIGATION_TRIALS} trials: {twice}"
    assert stored == collections.Counter(expected), "each line exactly once"



# --- A page the server refuses -------------------------------------------------------------

REFUSED_PAGE = """async ({ options, prefix, lines, size }) => {
  if (options) boxtrail.init(options);
  for (let i = 0; i < lines; i++) boxtrail.log.info(prefix + ' ' + i + ' ' + 'x'.repeat(size));
  // Bounded: a flush() that never settles answers 'pending'.
  return await Promise.race([boxtrail.flush(),
                             new Promise((r) => setTimeout(() => r('pending'), 10000))]);
}"""


@pytest.mark.parametrize("size", [40, 400], ids=["plain", "gzip-sized"])
@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_page_settles_stops_and_says_why_once(
        page: Page, site: Site, box_server: Server, box_api: httpx.Client, status: int,
        size: int) -> None:
    """A mistyped key (401) or an origin the project does not allow (403): flush() resolves
    false at the answer, the console says why once, and the page sends nothing more: one
    request in all. Bodies over 1 KB would be gzipped, and a gzipped body needs a CORS
    preflight, which the server refuses without a status the page can read."""
    if status == 401:
        key, said = "bti_mistyped", "unknown ingest key; pass the project's ingestKey as ?key="
    else:
        elsewhere = create_project(box_api, f"sdk-{next(_names)}", ["https://elsewhere.example"])
        key = str(elsewhere["ingestKey"])
        said = f"origin http://b7.box.test:{site.port} is not in this project's allowedOrigins"
    proxy = Proxy(box_server.url)
    printed: list[str] = []
    page.on("console", lambda message: printed.append(message.text))
    try:
        page.goto(site.url("b7", "blank.html"))
        options = {"endpoint": proxy.url, "ingestKey": key, "flushInterval": 200}
        first = page.evaluate(REFUSED_PAGE, {"options": options, "prefix": "refused",
                                             "lines": 5, "size": size})
        # More lines, time for a few flush intervals and retries, another flush(), then the
        # page goes (pagehide).
        time.sleep(2.0)
        later = page.evaluate(REFUSED_PAGE, {"options": None, "prefix": "later", "lines": 5,
                                             "size": size})
        page.goto(site.url("b7", "next.html"))
        time.sleep(1.0)
    finally:
        proxy.close()

    assert first is False, "flush() resolves false at the refusal"
    assert later is False, "and at once after it"
    assert [post_status for _, post_status, _ in proxy.posts] == [status], "one request in all"
    assert proxy.preflights == 0, "the first body goes plain: no preflight"
    told = [text for text in printed if text.startswith("boxtrail:")]
    assert told == [f"boxtrail: HTTP {status} {said} (this page sends no more logs)"]

# --- The page stays responsive ------------------------------------------------------------

FLOOD = """(options) => {
  // The same console.log without the SDK, for the cost the SDK adds: under Playwright a bare
  // console.log is itself slow (every call goes out over the DevTools protocol). The two are
  // timed in alternating rounds, so a machine that slows down meanwhile slows both.
  const bare = console.log;
  boxtrail.init(options);
  const rounds = { bare: [], captured: [] };
  let line = 0;
  for (let r = 0; r < 10; r++) {
    let start = performance.now();
    for (let i = 0; i < 1000; i++) bare.call(console, 'bare line ' + i, { i });
    rounds.bare.push((performance.now() - start) / 1000);
    start = performance.now();
    for (let i = 0; i < 1000; i++, line++) console.log('flood line ' + line, { i: line });
    rounds.captured.push((performance.now() - start) / 1000);
  }
  const median = (xs) => xs.sort((a, b) => a - b)[xs.length >> 1];
  return { bare: median(rounds.bare), captured: median(rounds.captured) };
}"""

TIMER_GAPS = """(ms) => new Promise((done) => {
  let last = performance.now();
  let worst = 0;
  let ticks = 0;
  const end = last + ms;
  (function tick() {
    const now = performance.now();
    worst = Math.max(worst, now - last);
    last = now;
    ticks++;
    if (now < end) setTimeout(tick, 0); else done({ worst, ticks });
  })();
})"""


def test_page_logging_10000_lines_in_a_loop_stays_responsive(
        page: Page, site: Site, box_server: Server, box_api: httpx.Client) -> None:
    project = new_project(box_api, site)
    page.goto(site.url("b5", "blank.html"))
    per_call = page.evaluate(FLOOD, init_options(box_server.url, project))

    # Right after the loop the SDK drains its queue; the page answers a click meanwhile...
    clicked = time.monotonic()
    page.click("#button")
    click_s = time.monotonic() - clicked
    assert page.evaluate("typeof window.clickedAt") == "number"
    # ...and its timers keep running.
    gaps = page.evaluate(TIMER_GAPS, 1500)

    added_ms = per_call["captured"] - per_call["bare"]
    assert added_ms < 0.25, f"the SDK added {added_ms * 1000:.0f} µs to each console.log"
    assert click_s < 5.0, f"a click took {click_s:.2f} s to be handled"
    assert gaps["worst"] < 500, f"a timer waited {gaps['worst']:.0f} ms"

    # Every line is accounted for: 3000 pass the per-minute cap, the queue keeps the newest
    # 2000 of them, and one warn row says how many were dropped and why.
    rows = wait_for_rows(box_api, project["id"], 2001, settle_s=1.0)
    lines = [row for row in rows if row["message"].startswith("flood line ")]
    reports = [row for row in rows if row["message"].startswith("boxtrail: dropped")]
    assert [row["message"].split(" {")[0] for row in lines] == [
        f"flood line {i}" for i in range(1000, 3000)]
    assert len(reports) == 1
    assert reports[0]["level"] == "warn"
    assert reports[0]["attrs"] == {"dropped": 8000, "queue_full": 1000, "rate_limit": 7000}
    assert len(lines) + reports[0]["attrs"]["dropped"] == 10_000
