"""@sentry/browser 11.12.0 (npm, bundled by esbuild, debug ids injected and uploaded by
sentry-cli 3.8.0, as CI does) in headless Chromium at a box origin, sending to the real
server by its DSN.

The page (``tests/fixtures/sentry/app``) throws from a timer, leaves a promise rejected,
calls ``captureMessage`` and ``Sentry.logger.*``. Everything arrives: the error and the
rejection as errors whose every in-app frame is restored to its original function, file,
line and column through the debug ids, the message and the log lines as log rows with
their attributes, all of them live on an SSE tail and on the MCP ``logs_tail`` while they
arrive, and through ``logs_search`` and ``logs_errors``. Then the SDK's own rate-limit
handling against a 429: it stops sending for the time it was told, and delivers again
afterwards.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.query.test_mcp import call, payload, run
from tests.sdk.test_sdk_browser import BOX_PATTERN, CHROMIUM_ARGS
from tests.support.server import Server, create_project
from tests.support.sse import Tail

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sentry"
SENTRY_CLI = FIXTURE / "node_modules" / ".bin" / "sentry-cli"
RELEASE = "shop@2.0.0"
WAIT_S = 30.0


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The app bundled, then processed by ``sentry-cli sourcemaps inject`` as CI would."""
    if not SENTRY_CLI.exists():
        pytest.fail("tests/fixtures/sentry has no node_modules: run `make sentry-fixtures`")
    out = tmp_path_factory.mktemp("sentry-app")
    subprocess.run(["node", str(FIXTURE / "build.mjs"), str(out)], check=True, timeout=120)
    subprocess.run([str(SENTRY_CLI), "sourcemaps", "inject", str(out)], check=True,
                   timeout=120, capture_output=True, env={"PATH": "/usr/bin:/bin",
                                                         "SENTRY_LOG_LEVEL": "warn"})
    assert "//# debugId=" in (out / "main.js").read_text()
    return out


@pytest.fixture(scope="module")
def site(built: Path) -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(built)))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("Debian chromium is not installed: run `make system-deps`")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _open(browser: Browser, site: int, project: dict[str, Any], box: str) -> Page:
    page = browser.new_page()
    query = urlencode({"dsn": project["dsn"], "release": RELEASE})
    page.goto(f"http://{box}.box.test:{site}/index.html?{query}")
    page.wait_for_function("typeof window.flush === 'function'", timeout=WAIT_S * 1000)
    return page


def _tool(server: Server, tool: str, arguments: dict[str, object]) -> dict[str, Any]:
    """An MCP tool call, on a thread of its own: Playwright's sync API holds this one's
    event loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: payload(run(call(server, "auto", tool, arguments)))).result()


def _wait(check: Any, what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.2)
    pytest.fail(f"not within {WAIT_S:.0f} s: {what}")


def test_a_sentry_instrumented_page_sends_everything(tmp_path: Path, built: Path, site: int,
                                                     browser: Browser) -> None:
    server = Server(tmp_path / "data", {"BOXTRAIL_BOX_HOST_PATTERN": BOX_PATTERN}).start()
    try:
        with server.client() as api:
            project = create_project(api, "shop", [f"http://*.box.test:{site}"])
            upload = subprocess.run(
                [str(SENTRY_CLI), "--url", server.url, "--auth-token", server.api_key,
                 "sourcemaps", "upload", "--org", "any", "--project", "shop", "--release",
                 RELEASE, str(built)], env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                            "SENTRY_DISABLE_UPDATE_CHECK": "1"},
                capture_output=True, text=True, timeout=120)
            assert upload.returncode == 0, upload.stdout + upload.stderr
            [stored] = api.get("/v1/projects/shop/sourcemaps").json()["files"]
            assert stored["debugId"] and stored["release"] == RELEASE
            tail = Tail(api, "/v1/projects/shop/tail", {"boxId": "b1"})
            mcp = ThreadPoolExecutor(1)  # the MCP tail runs while the page sends
            mcp_tail = mcp.submit(lambda: payload(run(call(
                server, "auto", "logs_tail", {"project": "shop", "boxId": "b1", "seconds": 12}))))
            time.sleep(1.0)  # both tails are open before the page sends
            try:
                page = _open(browser, site, project, "b1")
                for name in ("throwError", "rejectPromise", "captureMessage", "logLines"):
                    page.evaluate(f"window.{name}()")
                    page.wait_for_timeout(100)  # the timer and the rejection run first
                assert page.evaluate("window.flush()") is True
                wanted = {"TypeError: no price for mug", "Error: out of stock: mug",
                          "cart viewed", "cart loaded", "slow price lookup", "checkout failed"}
                live = _wait(lambda: wanted <= {row["message"] for row in tail.logs()}
                             and tail.logs(), "every row on the live tail")
            finally:
                tail.close()
            assert all(row["boxId"] == "b1" and row["release"] == RELEASE for row in live)
            tailed = mcp_tail.result(timeout=WAIT_S)
            mcp.shutdown()
            assert wanted <= {row["message"] for row in tailed["rows"]}
            rows = {row["message"]: row for row in api.get(
                "/v1/projects/shop/logs", params={"since": "1h"}).json()["rows"]}
            assert set(rows) == wanted
            assert rows["cart viewed"]["level"] == "info" and rows["cart viewed"]["error"] is None
            assert rows["slow price lookup"]["attrs"]["ms"] == 812
            assert rows["slow price lookup"]["attrs"]["cached"] is False

            errors = api.get("/v1/projects/shop/errors", params={"since": "1h"}).json()["rows"]
            by_message = {e["error"]["message"]: e for e in errors if e["error"]["type"]}
            # Every in-app frame as the unbundled source would name and place it (V8's
            # names: a method as Class.method, an arrow callback anonymous).
            thrown = [f for f in by_message["no price for mug"]["error"]["frames"]
                      if f["file"] and f["file"].startswith("app/")]
            assert [(f["function"], f["file"], f["line"], f["column"]) for f in thrown] == [
                ("priceOf", "app/src/cart.js", 5, 11),
                ("<anonymous>", "app/src/cart.js", 16, 51),
                ("Cart.total", "app/src/cart.js", 16, 23),
                ("checkout", "app/src/main.js", 15, 79)], thrown
            assert all(f["symbolicated"] and f["contextLine"] for f in thrown)
            rejected = by_message["out of stock: mug"]["error"]["frames"]
            assert [(f["function"], f["file"], f["line"], f["column"]) for f in rejected] == [
                ("reserve", "app/src/stock.js", 10, 11)]

        found = _tool(server, "logs_search", {"project": "shop", "since": "1h",
                                              "query": "checkout"})
        [line] = [r for r in found["rows"] if r["message"] == "checkout failed"]
        assert line["level"] == "error"
        assert {k: line["attrs"][k] for k in ("step", "attempt", "amount", "retry")} == {
            "step": "pay", "attempt": 3, "amount": 12.75, "retry": True}
        errors_tool = _tool(server, "logs_errors", {"project": "shop", "since": "1h"})
        assert any(f.get("file") == "app/src/cart.js" for row in errors_tool["rows"]
                   for f in row["error"].get("frames", []))
    finally:
        server.stop()


def test_the_sdk_backs_off_on_a_429_and_delivers_after(tmp_path: Path, site: int,
                                                       browser: Browser) -> None:
    # One event a second, a burst of one: the second error in a row is refused.
    server = Server(tmp_path / "data", {"BOXTRAIL_BOX_HOST_PATTERN": BOX_PATTERN,
                                        "BOXTRAIL_RATE_LIMIT_EVENTS": "0.5",
                                        "BOXTRAIL_RATE_LIMIT_BURST": "1"}).start()
    try:
        with server.client() as api:
            project = create_project(api, "slow")

            def refused() -> int:
                text = api.get("/metrics").text
                for line in text.splitlines():
                    if line.startswith('boxtrail_ingest_requests_rejected_total{reason="rate_'):
                        return int(float(line.split()[-1]))
                return 0

            def messages() -> set[str]:
                return {r["message"] for r in api.get("/v1/projects/slow/logs",
                                                      params={"since": "1h"}).json()["rows"]}

            page = _open(browser, site, project, "b2")
            page.evaluate("window.captureMessage()")
            _wait(lambda: "cart viewed" in messages(), "the first message")
            page.evaluate("window.throwError()")  # no token left: 429, Retry-After: 2
            _wait(lambda: refused() == 1, "the 429")
            # Within the 2 s the SDK was told, it sends nothing (it drops what it would send).
            page.evaluate("window.rejectPromise()")
            page.wait_for_timeout(800)
            assert refused() == 1 and messages() == {"cart viewed"}
            page.wait_for_timeout(2500)  # past Retry-After, and the bucket has a token
            page.evaluate("window.logLines()")
            assert page.evaluate("window.flush()") is True
            _wait(lambda: "cart loaded" in messages(), "a log line after the back-off")
            assert refused() == 1
    finally:
        server.stop()
