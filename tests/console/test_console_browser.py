"""The web console in real headless Chromium, against the real server.

A box page (``http://<box>.box.test``, served by Playwright's router: no network) runs
the SDK and an esbuild bundle whose map CI uploaded; the console, at the server's own
origin, is driven as an engineer would: sign in, create a project, tail, search, open an
error at its original line, manage source maps, sign out. Every view is checked with
axe-core, and a screenshot of each is written (to ``$BOXTRAIL_CONSOLE_SHOTS`` when set:
``docs/console`` holds the committed ones). Security and load have their own tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from playwright.sync_api import Browser, Page, sync_playwright

from tests.fixtures.sourcemaps.bundles import build_esbuild
from tests.support import hostile
from tests.support.server import Server, create_project
from tests.symbolicate.test_symbolicate_e2e import cli_upload

AXE = Path(__file__).resolve().parents[1] / "fixtures" / "console" / "node_modules" / "axe-core" \
    / "axe.min.js"
CHROMIUM_ARGS = ["--no-sandbox", "--host-resolver-rules=MAP *.box.test 127.0.0.1",
                 "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]
WAIT_MS = 20_000


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(tmp_path_factory.mktemp("console") / "data",
                    {"BOXTRAIL_BOX_HOST_PATTERN": "{box}.box.test"}).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Debian chromium is missing: run `make system-deps`")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def shots(tmp_path: Path) -> Callable[[Page, str], None]:
    root = Path(os.environ.get("BOXTRAIL_CONSOLE_SHOTS") or tmp_path / "shots")
    root.mkdir(parents=True, exist_ok=True)

    def shot(page: Page, name: str) -> None:
        page.screenshot(path=str(root / f"{name}.jpg"), type="jpeg", quality=70)

    return shot


def watch(page: Page) -> list[str]:
    """Uncaught errors of ``page``: a view that throws fails the test."""
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return errors


def sign_in(page: Page, srv: Server, key: str) -> None:
    page.goto(f"{srv.url}/")
    page.fill("#api-key", key)
    page.click("form.signin button[type=submit]")
    page.wait_for_selector("header.top", timeout=WAIT_MS)


def wait_live(page: Page) -> None:
    """Until the tail view says its stream is open."""
    page.wait_for_function("() => document.querySelector('#tail-status')?.textContent "
                           "=== 'live'", timeout=WAIT_MS)


def wait_text(page: Page, selector: str, text: str) -> None:
    """Until the element at ``selector`` holds ``text``."""
    page.wait_for_function("([s, t]) => document.querySelector(s)?.textContent.includes(t)",
                           arg=[selector, text], timeout=WAIT_MS)


def axe_check(page: Page, view: str) -> None:
    """axe-core over the page as it is: no serious or critical violation. Evaluated over
    the DevTools protocol, which the page's Content-Security-Policy does not apply to."""
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: run `make console-fixtures` (npm ci)")
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.evaluate(AXE.read_text() + "\n;0")
    result = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    bad = [(v["id"], v["impact"], [n["target"] for n in v["nodes"]][:3])
           for v in result["violations"] if v["impact"] in ("serious", "critical")]
    assert not bad, f"{view}: accessibility violations {bad}"


def box_files(srv: Server, sdk: Path, dist: Path, ingest_key: str, script: str
              ) -> dict[str, tuple[bytes, str]]:
    """A box page: the SDK, the bundle, and ``script`` run after both loaded."""
    html = (f'<!doctype html><html lang="en"><head><title>box</title>'
            f'<script src="/boxtrail.js" data-ingest-key="{ingest_key}" '
            f'data-endpoint="{srv.url}" data-release="1.0.0" data-flush-interval="100">'
            f'</script><script src="/assets/main.js"></script></head><body>'
            f'<script>{script}</script></body></html>')
    files = {"/index.html": (html.encode(), "text/html"),
             "/boxtrail.js": (sdk.read_bytes(), "text/javascript")}
    files.update({"/" + p.relative_to(dist).as_posix(): (p.read_bytes(), "text/javascript")
                  for p in dist.rglob("*.js")})
    return files


class Site:
    """Pages of another origin: a real HTTP server on loopback, reached as
    ``<host>.box.test`` (the browser maps that name to 127.0.0.1), so the page and
    boxtrail share an address space as a box and its log service would (Chromium refuses
    a public page's requests to loopback)."""

    def __init__(self, files: dict[str, tuple[bytes, str]], host: str = "b1") -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body, kind = files.get(self.path.split("?", 1)[0], (b"", "text/plain"))
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://{host}.box.test:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# The box page: two log lines, then the bundle's error, thrown where its map can place it.
BOX_SCRIPT = """
console.info("console-walk hello", {cart: 3});
boxtrail.log.warn("console-walk slow render", {ms: 870});
const r = globalThis.runScenario("renderWithoutOwner");
const err = new Error(r.message); err.name = r.type; err.stack = r.stack;
console.error("console-walk checkout failed", err);
"""


def test_a_walk_through_the_console(srv: Server, browser: Browser, sdk_bundle: Path,
                                    tmp_path: Path, shots: Callable[[Page, str], None]
                                    ) -> None:
    dist = build_esbuild(tmp_path / "build")
    context = browser.new_context(viewport={"width": 1200, "height": 760})
    requested: list[str] = []
    context.on("request", lambda r: requested.append(r.url))
    page = context.new_page()
    errors = watch(page)

    # Sign in, and the key is gone from the page: only an HttpOnly cookie remains.
    sign_in(page, srv, srv.api_key)
    axe_check(page, "projects")
    shots(page, "projects")
    [cookie] = [c for c in context.cookies() if c["name"] == "boxtrail_session"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    stored = page.evaluate("JSON.stringify([localStorage, sessionStorage, document.cookie])")
    assert srv.api_key not in stored and "btc_" not in stored

    # A project, made in the console; its setup view has the key, snippet and CI command.
    page.fill("#new-project-name", "web")
    page.click("form.panel button[type=submit]")
    page.wait_for_selector("#ingest-key", timeout=WAIT_MS)
    ingest_key = page.text_content("#ingest-key") or ""
    assert ingest_key.startswith("bti_")
    text = page.text_content("#view") or ""
    assert f'data-ingest-key="{ingest_key}"' in text
    assert "boxtrail sourcemaps upload dist --project web" in text
    axe_check(page, "setup")
    shots(page, "setup")

    # CI uploads the bundle's maps (what the Setup view says to run).
    upload = cli_upload(srv, dist, "--project", "web", "--release", "1.0.0", "--url-prefix", "~/")
    assert upload.returncode == 0, upload.stderr
    upload = cli_upload(srv, dist, "--project", "web", "--url-prefix", "~/static/")
    assert upload.returncode == 0, upload.stderr

    # The live tail: the box page's rows appear within 2 s of the page running.
    page.goto(f"{srv.url}/#/p/web/tail")
    wait_live(page)
    site = Site(box_files(srv, sdk_bundle, dist, ingest_key, BOX_SCRIPT))
    box_page = context.new_page()
    started = time.monotonic()
    box_page.goto(f"{site.url}/index.html")
    wait_text(page, "#tail-list", "console-walk hello")
    seen_after = time.monotonic() - started
    print(f"tail: a row of the box page shown {seen_after:.2f} s after the page loaded")
    assert seen_after <= 2.0, f"the row took {seen_after:.2f} s to reach the tail"
    wait_text(page, "#tail-list", "console-walk checkout")
    page.click("#tail-list .tail-row >> text=console-walk slow render")
    assert '"ms": 870' in (page.text_content(".tail-detail") or "")
    page.focus("#tail-list")  # by keyboard: the arrows move the selection
    page.keyboard.press("ArrowUp")
    assert "console-walk hello" in (page.text_content(".tail-detail") or "")
    axe_check(page, "tail")
    shots(page, "tail")
    box_page.close()
    site.close()

    # Search: the rows, a histogram over the window, a row's attributes; the query state
    # is in the URL; a bad query shows the server's error at its position.
    page.goto(f"{srv.url}/#/p/web/search?since=15m&q=console-walk")
    page.wait_for_selector("#search-results li", timeout=WAIT_MS)
    page.wait_for_selector("#histogram svg rect", timeout=WAIT_MS)
    assert page.locator("#search-results li").count() == 3
    page.click("#search-results .result-line >> text=console-walk slow render")
    assert '"ms": 870' in (page.text_content("#search-results") or "")
    assert "3 rows" in (page.text_content("#histogram figcaption") or "")
    axe_check(page, "search")
    shots(page, "search")
    window = {"since": _iso(-600), "until": _iso(60), "q": "console-walk"}
    page.goto(f"{srv.url}/#/p/web/search?{urlencode(window)}")
    # This view (a custom range) with its rows, not the one before it.
    page.wait_for_function("() => document.querySelector('#search-since')?.value === 'custom'"
                           " && document.querySelector('#search-summary').textContent"
                           ".startsWith('3 rows shown')", timeout=WAIT_MS)
    assert page.locator("#search-results li").count() == 3
    page.fill("#search-query", "level:error (checkout")
    page.click("form[role=search] button[type=submit]")
    page.wait_for_selector("#query-error", timeout=WAIT_MS)
    assert "q=level%3Aerror" in page.url
    problem = page.text_content("#query-error") or ""
    assert "level:error (checkout" in problem and "^" in problem, problem

    # Errors: the group, then its sample at the original line of source.
    page.goto(f"{srv.url}/#/p/web/errors")
    page.wait_for_selector("#error-groups .group-link", timeout=WAIT_MS)
    assert "Cannot read properties of null" in (page.text_content("#error-groups") or "")
    axe_check(page, "errors")
    shots(page, "errors")
    page.click("#error-groups .group-link")
    page.wait_for_selector("#frames .frame", timeout=WAIT_MS)
    first = page.locator("#frames .frame").first
    assert "src/render.js" in (first.text_content() or "")
    assert "renderCart" in (first.locator(".fn").text_content() or "")
    assert "cart.owner.name" in (first.locator(".src-line.hit").text_content() or "")
    # The page's own inline script has no map: that frame says so, and what to do.
    last = page.locator("#frames .frame").last
    assert "missing_sourcemap" in (last.locator(".problem").text_content() or "")
    assert "Upload this build" in (last.locator(".problem").text_content() or "")
    first.locator("button", has_text="Minified frame").click()
    assert "/assets/main.js" in (first.locator(".minified").text_content() or "")
    axe_check(page, "error")
    shots(page, "error")

    # Source maps: the release, its file and debug id; then delete the release.
    page.goto(f"{srv.url}/#/p/web/sourcemaps")
    page.wait_for_selector(".release", timeout=WAIT_MS)
    listing = page.text_content("#view") or ""
    assert "Release 1.0.0" in listing and "~/assets/main.js" in listing
    axe_check(page, "sourcemaps")
    shots(page, "sourcemaps")
    assert "Without a release" in listing and "~/static/assets/main.js" in listing
    for release in ("Release 1.0.0", "Without a release"):
        section = page.locator(".release", has_text=release)
        section.locator("button", has_text="Delete release").click()
        section.locator("button", has_text="Really delete").click()
        wait_text(page, "#sourcemaps-status", f"Deleted 1 files of {release.lower()}")
    with srv.client() as api:
        assert api.get("/v1/projects/web/sourcemaps").json() == {"files": []}

    # Signed out: the page asks for a key again, and the cookie opens nothing any more.
    page.click("#sign-out")
    page.wait_for_selector("#api-key", timeout=WAIT_MS)
    jar = {"boxtrail_session": cookie["value"]}
    with httpx.Client(base_url=srv.url, cookies=jar, timeout=10) as stale:
        assert stale.get("/v1/session").status_code == 401
        assert stale.get("/v1/projects").status_code == 401
    page.reload()
    page.wait_for_selector("#api-key", timeout=WAIT_MS)

    # The key never travelled in a URL, and nothing in the console threw.
    assert not [u for u in requested if srv.api_key in u or "btk_" in u]
    # (The first start prints the dev key once, as `make run` does; nothing after it.)
    assert srv.api_key not in "".join(line for line in srv.output if "created tenant" not in line)
    assert not errors, errors
    context.close()


HOSTILE = '<img src=x onerror="window.__pwned=1">'


def test_hostile_rows_are_shown_as_text(srv: Server, browser: Browser) -> None:
    """Markup in every field a view shows stays text, with the page's CSP switched off:
    the views never build markup from data, so nothing depends on the policy."""
    with srv.client() as api:
        project = create_project(api, "xss")
    context = browser.new_context(bypass_csp=True)
    page = context.new_page()
    errors = watch(page)
    sign_in(page, srv, srv.api_key)
    page.goto(f"{srv.url}/#/p/xss/tail")
    wait_live(page)
    stack = (f"TypeError: {HOSTILE}\n    at <svg onload=window.__pwned=2> "
             f"(https://b1.box.test/<script>window.__pwned=3</script>.js:1:1)")
    events = [{"level": "error", "message": HOSTILE,
               "attrs": {"html": "<script>window.__pwned=4</script>"},
               "error": {"type": "<b>Type</b>", "message": HOSTILE, "stack": stack}}]
    r = httpx.post(f"{srv.url}/v1/ingest", params={"key": project["ingestKey"]},
                   json={"context": {"boxId": "b1", "release": "<i>1</i>\u202egpj.exe"},
                         "events": events})
    assert r.status_code == 202, r.text

    def shown(selector: str) -> None:
        page.wait_for_function(
            f"() => (document.querySelector({json.dumps(selector)}) || {{}}).textContent"
            f"?.includes({json.dumps(HOSTILE)})", timeout=WAIT_MS)

    shown("#tail-list")
    page.click("#tail-list .tail-row")
    assert "<script>window.__pwned=4</script>" in (page.text_content(".tail-detail") or "")
    page.goto(f"{srv.url}/#/p/xss/search?since=15m")
    shown("#search-results")
    page.click("#search-results .result-line")
    page.goto(f"{srv.url}/#/p/xss/errors")
    shown("#error-groups")
    page.click("#error-groups .group-link")
    page.wait_for_selector("#frames .frame", timeout=WAIT_MS)
    page.click("text=Stack as sent")
    shown("#raw-stack")
    assert "<svg onload=window.__pwned=2>" in (page.text_content("#frames") or "")
    # A character that would reorder the text around it is shown, not obeyed.
    assert "<i>1</i><U+202E>gpj.exe" in (page.text_content("#view") or "")
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#view img, #view script, #view svg[onload]").count() == 0
    assert not errors, errors
    context.close()


def test_csrf_tenancy_and_headers(srv: Server, browser: Browser) -> None:
    with srv.client() as api:
        create_project(api, "ours")
    with httpx.Client(base_url=srv.url, timeout=10,
                      headers={"Authorization": f"Bearer {srv.create_key('other')}"}) as other:
        theirs = create_project(other, "theirs")

    # Every console answer carries a policy that runs only this server's scripts.
    index = httpx.get(f"{srv.url}/")
    assert "script-src 'self'" in index.headers["content-security-policy"]
    assert index.headers["x-frame-options"] == "DENY"

    context = browser.new_context()
    page = context.new_page()
    sign_in(page, srv, srv.api_key)

    # Another tenant's project is not found, by name and by id, in the views and the API.
    for ref in (str(theirs["name"]), str(theirs["id"])):
        page.goto(f"{srv.url}/#/p/{ref}/tail")
        page.wait_for_selector("text=Not found", timeout=WAIT_MS)
        status = page.evaluate("r => fetch('/v1/projects/' + r).then(x => x.status)", ref)
        assert status == 404

    # A state-changing request with the cookie but without the CSRF token is refused.
    answer = page.evaluate("""() => fetch('/v1/projects', {method: 'POST',
        headers: {'Content-Type': 'application/json'}, body: JSON.stringify({name: 'csrf1'})})
        .then(async r => [r.status, await r.json()])""")
    assert answer[0] == 403 and answer[1]["error"]["code"] == "csrf_failed", answer

    # A page of another site posting to boxtrail (a form, and fetch) changes nothing.
    html = (f'<!doctype html><form id="f" method="POST" enctype="text/plain" '
            f'action="{srv.url}/v1/projects"><input name=\'{{"name":"csrf2","x":"\' '
            f'value=\'"}}\'></form><script>fetch("{srv.url}/v1/session", {{method: "DELETE", '
            f'credentials: "include", mode: "no-cors"}}); fetch("{srv.url}/v1/projects", '
            f'{{method: "POST", credentials: "include", mode: "no-cors", '
            f'body: JSON.stringify({{name: "csrf3"}})}}); '
            f'setTimeout(() => document.getElementById("f").submit(), 300);</script>')
    evil = Site({"/": (html.encode(), "text/html")}, host="evil")
    attacker = context.new_page()
    attacker.goto(f"{evil.url}/")
    attacker.wait_for_url(f"{srv.url}/v1/projects", timeout=WAIT_MS)
    with srv.client() as api:
        names = {p["name"] for p in api.get("/v1/projects").json()}
    evil.close()
    assert not names & {"csrf1", "csrf2", "csrf3"}, names
    # ... and the session the attacker tried to end is still there.
    assert page.evaluate("fetch('/v1/session').then(r => r.status)") == 200
    context.close()


def _ingest_paced(url: str, key: str, per_second: int, seconds: float, stop: threading.Event,
                  sent: list[int]) -> None:
    """``per_second`` rows a second in batches of 100, paced on the clock, for ``seconds``."""
    batch = 100
    start = time.monotonic()
    n = 0
    with httpx.Client(timeout=10) as client:
        while not stop.is_set() and time.monotonic() - start < seconds:
            events = [{"level": ("info", "warn", "debug", "error")[i % 4],
                       "message": f"load row {n + i} " + "x" * 60, "attrs": {"n": n + i}}
                      for i in range(batch)]
            r = client.post(f"{url}/v1/ingest", params={"key": key},
                            json={"context": {"boxId": f"b{n // batch % 7}"}, "events": events})
            if r.status_code == 202:
                n += batch
                sent[0] = n
            wait = start + (n / per_second) - time.monotonic()
            if wait > 0:
                time.sleep(wait)


LONG_TASKS = """
window.__longest = 0; window.__longTasks = 0;
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) {
    window.__longTasks += 1;
    window.__longest = Math.max(window.__longest, entry.duration);
  }
}).observe({type: 'longtask', buffered: true});
"""
HEAP_BOUND_MB = 32
RATE = 2000
LOAD_S = 60.0


@pytest.mark.serial  # a bound on the page's longest task: run alone (make test)
def test_tail_keeps_up_with_2000_rows_a_second(srv: Server, browser: Browser) -> None:
    with srv.client() as api:
        project = create_project(api, "load")
    context = browser.new_context(viewport={"width": 1200, "height": 760})
    page = context.new_page()
    errors = watch(page)
    page.add_init_script(LONG_TASKS)
    sign_in(page, srv, srv.api_key)
    page.goto(f"{srv.url}/#/p/load/tail")
    wait_live(page)
    cdp = context.new_cdp_session(page)

    stop = threading.Event()
    sent = [0]
    feeder = threading.Thread(target=_ingest_paced,
                              args=(srv.url, project["ingestKey"], RATE, LOAD_S, stop, sent))
    feeder.start()
    heap: list[float] = []
    try:
        deadline = time.monotonic() + LOAD_S
        paused_at = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(2)
            heap.append(cdp.send("Runtime.getHeapUsage")["usedSize"] / 2**20)
            if paused_at and time.monotonic() > paused_at:
                # Paused for 5 s under load: the rows queue (the count shows), none is lost.
                page.click("#tail-pause")
                time.sleep(5)
                label = page.text_content("#tail-pause") or ""
                assert label.startswith("Resume (") and not label.startswith("Resume (0 "), label
                page.click("#tail-pause")
                paused_at = 0
                # Scrolled up, the reader keeps the rows in view until they jump back.
                page.eval_on_selector("#tail-list", "el => { el.scrollTop = 2400; }")
                # The view takes the scroll in its handler and draws on the next frame:
                # read the rows in view once it has (reading before raced the redraw).
                page.wait_for_selector("#tail-jump", state="visible", timeout=WAIT_MS)
                page.evaluate("() => new Promise(r => requestAnimationFrame("
                              "() => requestAnimationFrame(r)))")
                reading = _rows_in_view(page)
                time.sleep(3)
                assert _rows_in_view(page) == reading
                jump = page.text_content("#tail-jump") or ""
                assert jump.startswith("Jump to newest (") and page.is_visible("#tail-jump")
                page.click("#tail-jump")
                assert page.is_hidden("#tail-jump")
    finally:
        stop.set()
        feeder.join(30)
    total = sent[0]
    assert total >= RATE * LOAD_S * 0.9, f"the feeder sent only {total} rows"
    page.wait_for_function(f"() => document.querySelector('#tail-count')?.textContent === "
                           f"'{total:,} rows'", timeout=WAIT_MS)
    cdp.send("HeapProfiler.collectGarbage")
    settled = cdp.send("Runtime.getHeapUsage")["usedSize"] / 2**20
    longest = page.evaluate("window.__longest")
    tasks = page.evaluate("window.__longTasks")
    in_dom = page.evaluate("document.querySelectorAll('#tail-list *').length")
    newest = page.evaluate("document.querySelector('#tail-list')?.textContent")
    print(json.dumps({"rows": total, "longest_task_ms": longest, "long_tasks": tasks,
                      "heap_mb_max": round(max(heap), 1), "heap_mb_after_gc": round(settled, 1),
                      "elements_in_list": in_dom}))
    assert longest < 200, f"the main thread was blocked for {longest} ms"
    assert max(heap) < HEAP_BOUND_MB and settled < HEAP_BOUND_MB, heap
    assert in_dom < 2000, in_dom  # virtualised: the rows in view, not the rows received
    assert f"load row {total - 1} " in newest  # following the bottom: the newest is in view
    assert "skipped" not in newest  # it kept up: no dropped notice
    assert not errors, errors
    context.close()


def _iso(offset_s: float) -> str:
    return datetime.fromtimestamp(time.time() + offset_s, UTC).isoformat()


def _rows_in_view(page: Page) -> list[str]:
    return page.eval_on_selector_all("#tail-list .msg", "els => els.map(e => e.textContent)")


def test_tail_resumes_after_a_restart_with_nothing_lost_or_repeated(
        tmp_path: Path, browser: Browser) -> None:
    server = Server(tmp_path / "data", {"BOXTRAIL_PORT": str(free_port())}).start()
    try:
        with server.client() as api:
            project = create_project(api, "resume")
        context = browser.new_context()
        page = context.new_page()
        sign_in(page, server, server.api_key)
        page.goto(f"{server.url}/#/p/resume/tail")
        wait_live(page)

        def ingest(prefix: str) -> None:
            events = [{"level": "info", "message": f"{prefix}-{i}"} for i in range(5)]
            r = httpx.post(f"{server.url}/v1/ingest", params={"key": project["ingestKey"]},
                           json={"events": events}, timeout=10)
            assert r.status_code == 202, r.text

        ingest("before")
        wait_text(page, "#tail-list", "before-4")
        server.stop()  # the tail's stream ends; the page shows it and reconnects
        wait_text(page, "#tail-status", "reconnecting")
        server.start()
        ingest("during")  # before the page is back: read from its Last-Event-ID
        wait_live(page)
        ingest("after")
        wait_text(page, "#tail-list", "after-4")
        rows = _rows_in_view(page)
        expected = [f"{p}-{i}" for p in ("before", "during", "after") for i in range(5)]
        assert rows == expected, rows

        context.close()
    finally:
        server.stop()


def test_tail_shows_what_the_server_skipped(srv: Server, browser: Browser) -> None:
    """``event: dropped`` (a reader too far behind: the server's side is in test_tail.py)
    becomes a notice between the rows, with the count. The stream is the server's format,
    answered by the browser's router so the drop happens on cue."""
    with srv.client() as api:
        create_project(api, "dropped")
    row = {"id": "0000000000000001", "ts": "2026-01-01T00:00:00.000Z", "level": "info",
           "message": "before the gap", "boxId": "b1", "url": None, "sessionId": None,
           "release": None, "attrs": {}}
    body = (f"retry: 60000\n\nid: {row['id']}\nevent: log\ndata: {json.dumps(row)}\n\n"
            'id: 00000000000004d3\nevent: dropped\ndata: {"count":1234}\n\n')
    context = browser.new_context()
    context.route("**/v1/projects/dropped/tail*", lambda route: route.fulfill(
        status=200, headers={"Content-Type": "text/event-stream"}, body=body))
    page = context.new_page()
    sign_in(page, srv, srv.api_key)
    page.goto(f"{srv.url}/#/p/dropped/tail")
    wait_text(page, "#tail-list", "rows skipped")
    assert _rows_in_view(page) == ["before the gap"]
    notice = page.text_content("#tail-list .notice") or ""
    assert notice.startswith("1,234 rows skipped"), notice
    context.close()


# How a view shows a message on one line (console/static/format.js oneLine, dom.js reveal):
# JavaScript's whitespace runs as one space, cut at 400 code points, bidi controls as marks.
_JS_SPACE = re.compile("[\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f"
                       "\u3000\ufeff]+")
_BIDI = re.compile("[\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def one_line(text: str, limit: int = 400) -> str:
    line = _JS_SPACE.sub(" ", text)
    if len(line) > limit:
        line = line[:limit] + "\u2026"
    return _BIDI.sub(lambda m: f"<U+{ord(m.group()):X}>", line)


def test_generated_hostile_rows_read_back_in_the_search_view(srv: Server,
                                                            browser: Browser) -> None:
    """Bodies drawn by Hypothesis (``tests/support/hostile.py``: any Unicode, every number form,
    odd box ids, hostile stacks), posted to ingest; every accepted row is in the search
    view with its level, box and message as sent (on one line), and no view throws."""
    with srv.client() as api:
        project = create_project(api, "generated")
    context = browser.new_context(viewport={"width": 1200, "height": 1400})
    page = context.new_page()
    errors = watch(page)
    sign_in(page, srv, srv.api_key)

    @settings(max_examples=25, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.data())
    def check(data: st.DataObject) -> None:
        session = uuid.uuid4().hex
        body = data.draw(hostile.bodies(session))
        r = httpx.post(f"{srv.url}/v1/ingest", params={"key": project["ingestKey"]},
                       content=body.text(), headers={"Content-Type": "application/json"},
                       timeout=10)
        if body.refused():
            assert r.status_code == 400, r.text
            return
        assert r.status_code == 202, r.text
        rows = [sent.row for sent in body.accepted() if sent.row is not None]
        query = f"session:{session}"
        page.goto(f"{srv.url}/#/p/generated/search?since=31d&q={query}")
        summary = f"{len(rows)} rows shown, newest first" if rows else "No rows match."
        # This search's view (its query in the box), not the last one, done searching; a
        # wrong count or an error then fails here with what the page says, not a timeout.
        page.wait_for_function("(q) => document.querySelector('#search-query')?.value === q"
                               " && document.querySelector('#search-summary')?.textContent"
                               " !== 'Searching…'", arg=query, timeout=WAIT_MS)
        shown = page.text_content("#search-summary")
        assert shown == summary, (shown, page.text_content("main"))
        cells = page.eval_on_selector_all("#search-results .result-line", """els => els.map(
            e => [e.querySelector('.level').textContent, e.querySelector('.box').textContent,
                  e.querySelector('.msg .text').textContent])""")
        want = [[str(row["level"]), one_line(str(row["boxId"])), one_line(str(row["message"]))]
                for row in rows]
        assert sorted(cells) == sorted(want)

    check()
    assert not errors, errors
    context.close()


def free_port() -> int:
    """A free loopback port (closed again before the server binds it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_api_keys_and_ingest_keys_in_the_console(srv: Server, browser: Browser,
                                                 shots: Callable[[Page, str], None]) -> None:
    with srv.client() as api:
        project = create_project(api, "keyed")
    context = browser.new_context(viewport={"width": 1200, "height": 760})
    page = context.new_page()
    errors = watch(page)
    sign_in(page, srv, srv.api_key)

    # An API key made in the Keys page: shown once, listed by its prefix, then revoked.
    page.click("#keys-link")
    page.wait_for_selector("#new-key-name", timeout=WAIT_MS)
    page.fill("#new-key-name", "ci-from-console")
    page.check("#scope-sourcemaps\\:write")
    page.click("form.panel button[type=submit]")
    page.wait_for_selector("#new-key", timeout=WAIT_MS)
    secret = page.text_content("#new-key") or ""
    assert secret.startswith("btk_")
    wait_text(page, "#view table", "ci-from-console")
    with httpx.Client(base_url=srv.url, timeout=10,
                      headers={"Authorization": f"Bearer {secret}"}) as ci:
        assert ci.get("/v1/projects/keyed/sourcemaps").status_code == 200
        assert ci.get("/v1/projects/keyed/logs").status_code == 403
        axe_check(page, "keys")
        shots(page, "keys")
        row = page.locator("tr", has_text="ci-from-console")
        row.locator("button").click()
        row.locator("button", has_text="Really revoke?").click()
        wait_text(page, "#keys-status", "Revoked ci-from-console")
        assert ci.get("/v1/projects/keyed/sourcemaps").status_code == 401

    # The project's ingest keys on its setup page: add one, disable the first.
    page.goto(f"{srv.url}/#/p/keyed/setup")
    page.wait_for_selector("#ingest-keys li", timeout=WAIT_MS)
    page.click("#add-ingest-key")
    page.wait_for_function("() => document.querySelectorAll('#ingest-keys li').length === 2",
                           timeout=WAIT_MS)
    first = page.locator("#ingest-keys li", has_text=str(project["ingestKey"]))
    first.locator("button", has_text="Disable").click()
    wait_text(page, "#ingest-keys", "(disabled)")
    sent = httpx.post(f"{srv.url}/v1/ingest", params={"key": str(project["ingestKey"])},
                      json={"events": [{"message": "x"}]})
    assert sent.status_code == 401, sent.text
    axe_check(page, "setup with ingest keys")

    # A session of a key without admin shows no Keys link (and the API would refuse it).
    reader = context.new_page()
    with srv.client() as api:
        key = api.post("/v1/keys", json={"name": "viewer", "scopes": ["read"]}).json()["key"]
    context.clear_cookies()
    sign_in(reader, srv, key)
    assert reader.locator("#keys-link").count() == 0
    assert not errors


def test_a_project_deleted_from_its_setup_page(srv: Server, browser: Browser,
                                               shots: Callable[[Page, str], None]) -> None:
    """The typed name arms the button; the page then names the job; the jobs are listed."""
    with srv.client() as api:
        project = create_project(api, "leaving")
        assert api.post("/v1/projects/leaving/deletions",
                        json={"box": "b1"}).status_code == 202
    sent = httpx.post(f"{srv.url}/v1/ingest", params={"key": str(project["ingestKey"])},
                      json={"events": [{"message": "x"}]})
    assert sent.status_code == 202
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    errors = watch(page)
    sign_in(page, srv, srv.api_key)
    page.goto(f"{srv.url}/#/p/leaving/setup")
    wait_text(page, "#deletion-jobs", '{"box":"b1"}')
    assert page.is_disabled("#delete-project")
    page.fill("#confirm-delete", "leavin")
    assert page.is_disabled("#delete-project")
    page.fill("#confirm-delete", "leaving")
    axe_check(page, "setup with its deletion")
    shots(page, "delete-project")
    page.click("#delete-project")
    wait_text(page, "#deletion-job", "del_")
    job = (page.text_content("#deletion-job code") or "").strip()
    with srv.client() as api:
        assert api.get("/v1/projects/leaving").status_code == 404
        assert api.get(f"/v1/deletions/{job}").json()["selects"] == {"project": True}
    gone = httpx.post(f"{srv.url}/v1/ingest", params={"key": str(project["ingestKey"])},
                      json={"events": [{"message": "x"}]})
    assert gone.status_code == 401
    assert not errors


def test_usage_of_a_project_and_of_the_tenant(srv: Server, browser: Browser,
                                              shots: Callable[[Page, str], None]) -> None:
    """The Usage page: a chart per kind with data, for a project (with what became of its
    events: accepted, refused by reason) and for the tenant; the window picks the interval;
    a key that may not read usage gets a message, not a broken page."""
    with srv.client() as api:
        project = create_project(api, "metered")
        reader = api.post("/v1/keys", json={"name": "no-usage", "scopes": ["read"]}).json()["key"]
    events: list[object] = [{"level": "info", "message": f"metered {i}"} for i in range(5)]
    events += [{"level": "loud", "message": "rejected alone"}] * 2  # invalid_level
    sent = httpx.post(f"{srv.url}/v1/ingest", params={"key": str(project["ingestKey"])},
                      json={"context": {"boxId": "b1"}, "events": events}, timeout=10)
    assert sent.status_code == 202 and sent.json()["accepted"] == 5, sent.text
    # Counted when the flush makes the rows durable (every 0.5 s here).
    deadline = time.monotonic() + WAIT_MS / 1000
    with srv.client() as api:
        while True:
            rows = api.get("/v1/usage", params={"project": "metered", "since": "1h",
                                                "groupBy": "reason", "limit": 10_000}).json()
            counts = {(r["kind"], r["reason"]): r["quantity"] for r in rows["rows"]}
            if counts.get(("refused.events", "invalid_level")) == 2:
                break
            assert time.monotonic() < deadline, counts
            time.sleep(0.2)

    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    errors = watch(page)
    sign_in(page, srv, srv.api_key)

    def charts(interval: str) -> dict[str, str]:
        """Each chart's kind and caption, once the view of this interval has drawn them (the
        view before it stays on the page while the next one waits on the network)."""
        # Drawn, not visible: the first bar is 0 high when the first bucket is empty.
        page.wait_for_selector(f"#usage-charts svg[aria-label$='per {interval}'] rect",
                               state="attached", timeout=WAIT_MS)
        return dict(page.eval_on_selector_all("#usage-charts figure", """els => els.map(
            e => [e.dataset.kind, e.querySelector('figcaption').textContent])"""))

    # The project, over the last hour (a bar a minute); its tab is in the header.
    page.goto(f"{srv.url}/#/p/metered/setup")
    page.click("nav a >> text=Usage")
    page.wait_for_selector("#usage-charts figure", timeout=WAIT_MS)
    page.select_option("#usage-since", "1h")
    page.wait_for_url("**/#/p/metered/usage?since=1h", timeout=WAIT_MS)
    shown = charts("minute")
    assert {"ingest.requests", "ingest.events", "ingest.bytes", "ingest.inflated_bytes",
            "refused.events"} <= set(shown), shown
    assert shown["ingest.events"] == "ingest.events5 events"
    assert shown["refused.events"] == "refused.events2 events"
    assert shown["ingest.requests"] == "ingest.requests1 requests"
    assert page.get_attribute("#usage-charts svg", "aria-label") == "ingest.bytes per minute"
    wait_text(page, "#usage-outcomes", "invalid_level")
    table = page.eval_on_selector_all("#usage-outcomes tbody tr", """rows => rows.map(
        r => [...r.cells].map(c => c.textContent))""")
    assert table == [["accepted", "total", "5", ""], ["refused", "total", "2", ""],
                     ["refused", "invalid_level", "2", "0"],  # rejected alone, not whole
                     ["client_discard", "total", "0", ""]], table
    axe_check(page, "usage")
    shots(page, "usage")

    # Seven days: a bar a day, the same totals.
    page.select_option("#usage-since", "7d")
    assert charts("day")["ingest.events"] == "ingest.events5 events"

    # The tenant's: every project's usage (other tests' too), from the header's link.
    page.click("#usage-link")
    page.wait_for_url("**/#/usage", timeout=WAIT_MS)
    wait_text(page, "#view h1", f"Usage of {page.text_content('.who')}")
    shown = charts("hour")
    assert {"ingest.events", "refused.events"} <= set(shown), shown
    assert page.locator("#usage-outcomes *").count() == 0  # outcomes are a project's
    axe_check(page, "tenant usage")

    # A key without usage:read: no link; the project's outcomes, and a message for the rest.
    context.clear_cookies()
    sign_in(page, srv, reader)
    assert page.locator("#usage-link").count() == 0
    page.goto(f"{srv.url}/#/p/metered/usage")
    wait_text(page, "#usage-status", "may not read usage")
    wait_text(page, "#usage-outcomes", "invalid_level")
    assert page.locator("#usage-charts figure").count() == 0
    page.goto(f"{srv.url}/#/usage")
    wait_text(page, "#usage-status", "usage:read or admin scope")
    assert not errors, errors
    context.close()
