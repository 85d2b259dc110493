"""The usage sink, against a webhook receiver started here: every usage event arrives,
each id once after dedup, across an outage of the receiver of 30 s or more (until the
server has failed to deliver) and a SIGKILL and restart of the server during it; every
signature verifies with the Standard Webhooks library's verifier; a 410 stops the sending,
and it says so (log, /metrics), restart or not.

Both servers run side by side: a minute must close before its events are sent (up to
66 s), and one wait serves the two, and the outage."""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from tests.support.pgserver import free_port
from tests.support.server import Server, create_project
from usage.sink import PARALLEL

OUTAGE_S = 30.0
SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


class Receiver:
    """A webhook receiver on a fixed port: it records each delivery, and answers by its
    mode: ``ok`` (204), ``gone`` (410); while it is not up, connections are refused."""

    def __init__(self) -> None:
        self.port = free_port()
        self.deliveries: list[tuple[dict[str, str], bytes]] = []
        self.mode = "ok"
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def up(self, mode: str = "ok") -> None:
        self.mode = mode
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.deliveries.append(({k.lower(): v for k, v in self.headers.items()},
                                            body))
                self.send_response(410 if receiver.mode == "gone" else 204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def events(self) -> dict[str, dict[str, Any]]:
        """Each id once (a retry may have come twice), checked: its signature, and the
        same body every time it came."""
        verifier = Webhook(SECRET)
        seen: dict[str, dict[str, Any]] = {}
        for headers, body in list(self.deliveries):
            payload = verifier.verify(body, headers)
            assert payload["type"] == "usage.recorded"
            event = payload["data"]
            assert headers["webhook-id"] == event["id"]
            assert seen.setdefault(event["id"], event) == event
        return seen


@pytest.fixture
def receivers() -> Iterator[tuple[Receiver, Receiver]]:
    flaky, gone = Receiver(), Receiver()
    yield flaky, gone
    flaky.down()
    gone.down()


def env(receiver: Receiver) -> dict[str, str]:
    return {"BOXTRAIL_USAGE_SINK_URL": receiver.url, "BOXTRAIL_USAGE_SINK_SECRET": SECRET,
            "BOXTRAIL_USAGE_SINK_MAX_BACKOFF_S": "4", "BOXTRAIL_WORKER_PROCESSES": "0",
            "BOXTRAIL_USAGE_PRICES": json.dumps({"ingest.events": 0.001})}


def load(server: Server, name: str) -> dict[str, Any]:
    with server.client() as api:
        project = create_project(api, name)
    for box in ("b1", "b2", "b1"):
        answer = httpx.post(f"{server.url}/v1/ingest", params={"key": project["ingestKey"]},
                            json={"context": {"boxId": box},
                                  "events": [{"message": f"{box} {i}"} for i in range(5)]
                                  + [{"level": "loud", "message": "rejected"}]}, timeout=10)
        assert answer.status_code == 202, answer.text
    return project


def table(server: Server) -> Counter[tuple[str, ...]]:
    """The server's usage, every dimension, per minute: what the sink must have had."""
    with server.client() as api:
        answer = api.get("/v1/usage", params={"since": "1h", "limit": 10_000})
    assert answer.status_code == 200, answer.text
    assert answer.json()["nextCursor"] is None
    return Counter({(r["project"], r["box"], r["kind"], r["source"], r["reason"], r["at"]):
                    r["quantity"] for r in answer.json()["rows"]
                    if r["kind"].startswith(("ingest.", "refused."))})


def received(events: dict[str, dict[str, Any]]) -> Counter[tuple[str, ...]]:
    out: Counter[tuple[str, ...]] = Counter()
    for e in events.values():
        if e["kind"].startswith(("ingest.", "refused.")):
            out[(e["project"], e["box"], e["kind"], e["source"], e["reason"], e["at"])] += \
                e["quantity"]
    return out


def metric(server: Server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


def test_every_event_arrives_once_across_an_outage_and_a_kill_and_410_stops_it(
        tmp_path: Path, receivers: tuple[Receiver, Receiver]) -> None:
    flaky, gone = receivers
    gone.up("gone")
    a = Server(tmp_path / "a", env(flaky)).start()
    b = Server(tmp_path / "b", env(gone)).start()
    try:
        load(a, "shop")
        load(b, "blog")
        # The flaky receiver is down from now, for OUTAGE_S and until its server has
        # failed to deliver at least once (a minute closes up to 66 s after its load);
        # half-way, its server is killed and started again.
        down_since = time.monotonic()
        failed, restarted = False, False
        while not (failed and time.monotonic() - down_since >= OUTAGE_S):
            assert time.monotonic() - down_since < 120, "no delivery was tried"
            failed = failed or metric(a, "boxtrail_usage_sink_failed_total") >= 1
            if not restarted and time.monotonic() - down_since >= OUTAGE_S / 2:
                a.kill()
                a.start()
                restarted = True
            time.sleep(0.5)
        flaky.up()
        deadline = time.monotonic() + 120
        want = table(a)
        assert want, "the load left no usage"
        while received(flaky.events()) != want and time.monotonic() < deadline:
            time.sleep(0.5)
            want = table(a)
        events = flaky.events()
        assert received(events) == want
        # Each usage row became events whose quantities add up to it; the platform's
        # shape with its price.
        sample = next(e for e in events.values() if e["kind"] == "ingest.events")
        assert set(sample) == {"id", "tenant", "project", "box", "kind", "quantity", "unit",
                               "cost_usd", "credits", "at", "source", "reason"}
        assert sample["tenant"] == "dev" and sample["unit"] == "events"
        assert sample["cost_usd"] == pytest.approx(sample["quantity"] * 0.001)
        assert sample["credits"] == pytest.approx(sample["cost_usd"] * 100)
        assert any(e["kind"] == "refused.events" and e["reason"] == "invalid_level"
                   for e in events.values())
        assert metric(a, "boxtrail_usage_sink_sent_total") >= 1
        assert metric(a, "boxtrail_usage_sink_retried_total") >= 1
        # The 410 side: the deliveries in flight when Gone came (up to PARALLEL), then
        # nothing more, before or after a restart.
        deadline = time.monotonic() + 30
        while not gone.deliveries and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)
        stopped_at = len(gone.deliveries)
        assert 1 <= stopped_at <= PARALLEL, stopped_at
        assert metric(b, "boxtrail_usage_sink_stopped") == 1
        assert any("410 Gone" in line for line in b.output)
        b.stop()
        b.start()
        time.sleep(3)
        assert len(gone.deliveries) == stopped_at
        assert metric(b, "boxtrail_usage_sink_stopped") == 1
    finally:
        a.stop()
        b.stop()
