"""Usage is exact: a known load over two tenants, three boxes and both intakes
(``/v1/ingest``, Sentry's store and envelope), with refusals of several kinds (rate limit,
invalid events, a foreign origin, an oversize body, too many events), the SDKs' drop
reports (ours, and Sentry's client reports) and a SIGKILL in the middle, on local disk and
on S3. ``/v1/usage`` reports, per project, box, source and reason, exactly what the clients
were answered, the stored rows per box equal the accepted events, and neither tenant sees
the other's."""

from __future__ import annotations

import gzip
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.s3server import S3Server
from tests.support.server import Server, create_project, search_all

INGEST_KINDS = ("ingest.requests", "ingest.events", "ingest.bytes", "ingest.inflated_bytes",
                "refused.requests", "refused.events", "client_discard.events")
MAX_BODY = 64 << 10
MAX_EVENTS = 200
# Rate limit per project: a burst of 300 events, 100/s after it.
ENV = {"BOXTRAIL_FLUSH_INTERVAL_S": "3600", "BOXTRAIL_RATE_LIMIT_EVENTS": "100",
       "BOXTRAIL_RATE_LIMIT_BURST": "300", "BOXTRAIL_MAX_BODY_BYTES": str(MAX_BODY),
       "BOXTRAIL_MAX_EVENTS_PER_REQUEST": str(MAX_EVENTS), "BOXTRAIL_WORKER_PROCESSES": "0"}

Key = tuple[str, str, str, str, str]  # project, box, kind, source, reason


class Ledger:
    """What the clients were answered, as usage should count it."""

    def __init__(self) -> None:
        self.counts: dict[str, Counter[Key]] = {}  # tenant -> counts

    def add(self, tenant: str, key: Key, quantity: int) -> None:
        if quantity:
            self.counts.setdefault(tenant, Counter())[key] += quantity


class Load:
    def __init__(self, server: Server, ledger: Ledger, seed: int) -> None:
        self.server = server
        self.ledger = ledger
        self.rng = random.Random(seed)
        self.n = 0

    def events(self, box: str, count: int, bad: int = 0) -> list[Any]:
        out: list[Any] = []
        for _ in range(count):
            self.n += 1
            out.append({"level": self.rng.choice(["info", "warn", "error"]),
                        "message": f"box={box} n={self.n}", "attrs": {"n": self.n}})
        for i in range(bad):  # each rejected alone, with its reason
            out.append([{"level": "loud", "message": "x"}, {"ts": "yesterday", "message": "x"},
                        "not an event"][i % 3])
        return out

    def ingest(self, tenant: str, project: dict[str, Any], box: str, events: list[Any],
               origin: str | None = None, gzipped: bool = False) -> httpx.Response:
        raw = json.dumps({"context": {"boxId": box}, "events": events}).encode()
        body = gzip.compress(raw) if gzipped else raw
        headers = {"Content-Type": "application/json"}
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        if origin:
            headers["Origin"] = origin
        answer = httpx.post(f"{self.server.url}/v1/ingest",
                            params={"key": project["ingestKey"]}, content=body,
                            headers=headers, timeout=10)
        p = str(project["id"])
        if answer.status_code == 202:
            got = answer.json()
            self.ledger.add(tenant, (p, box, "ingest.requests", "ingest", ""), 1)
            self.ledger.add(tenant, (p, box, "ingest.events", "ingest", ""), got["accepted"])
            self.ledger.add(tenant, (p, box, "ingest.bytes", "ingest", ""), len(body))
            self.ledger.add(tenant, (p, box, "ingest.inflated_bytes", "ingest", ""), len(raw))
            for code, n in Counter(r["code"] for r in got["rejected"]).items():
                self.ledger.add(tenant, (p, box, "refused.events", "ingest", code), n)
            for event in events:
                if isinstance(event, dict) and str(event.get("message", "")).startswith(
                        "boxtrail: dropped"):
                    for reason, n in event["attrs"].items():
                        if reason != "dropped":
                            self.ledger.add(tenant, (p, box, "client_discard.events", "sdk",
                                                     reason), n)
        else:
            code = answer.json()["error"]["code"]
            # The events of a refused request count as far as the server read them: a
            # body refused for its origin or its size before it was read holds none.
            read = code not in ("origin_not_allowed", "body_too_large")
            # Refused before its box was read (too many events is seen first): the box the
            # Origin names, none here.
            at = box if read and code != "too_many_events" else ""
            self.ledger.add(tenant, (p, at, "refused.requests", "ingest", code), 1)
            self.ledger.add(tenant, (p, at, "refused.events", "ingest", code),
                            len(events) if read else 0)
        return answer

    def sentry(self, tenant: str, project: dict[str, Any], kind: str) -> httpx.Response:
        self.n += 1
        event = json.dumps({"event_id": f"{self.n:032x}", "level": "error",
                            "message": f"sentry n={self.n}"}).encode()
        if kind == "store":
            body = event
        else:  # with the client report @sentry/browser sends (its drops by category)
            report = json.dumps({"discarded_events": [
                {"reason": "ratelimit_backoff", "category": "error", "quantity": 2},
                {"reason": "sample_rate", "category": "transaction", "quantity": 9}]}).encode()
            body = b"\n".join([json.dumps({"event_id": f"{self.n:032x}"}).encode(),
                               json.dumps({"type": "event", "length": len(event)}).encode(),
                               event, b'{"type":"client_report"}', report]) + b"\n"
            self.ledger.add(tenant, (str(project["id"]), "", "client_discard.events",
                                     "envelope", "ratelimit_backoff"), 2)
        answer = httpx.post(f"{self.server.url}/api/{project['sentryId']}/{kind}/",
                            params={"sentry_key": project["ingestKey"]}, content=body,
                            headers={"Content-Type": "application/json"}, timeout=10)
        assert answer.status_code == 200, answer.text
        p = str(project["id"])
        for key, n in (("ingest.requests", 1), ("ingest.events", 1),
                       ("ingest.bytes", len(body)), ("ingest.inflated_bytes", len(body))):
            self.ledger.add(tenant, (p, "", key, kind, ""), n)
        return answer

    def round(self, a: dict[str, Any], b: dict[str, Any]) -> None:
        """One round of every kind of request."""
        for tenant, project, box in (("A", a, "b1"), ("A", a, "b2"), ("B", b, "b3"),
                                     ("B", b, "b1")):
            assert self.ingest(tenant, project, box, self.events(box, 20, bad=3)).status_code \
                == 202
            self.ingest(tenant, project, box, self.events(box, 15), gzipped=True)
        # The SDK's drop report rides at the head of a batch.
        report = {"level": "warn", "message": 'boxtrail: dropped 7 events '
                  '{"queue_full":5,"rate_limit":2}',
                  "attrs": {"dropped": 7, "queue_full": 5, "rate_limit": 2}}
        self.ingest("A", a, "b2", [report, *self.events("b2", 3)])
        # Refusals: a foreign origin (A allows one origin), an oversize body, too many
        # events in one request, and the rate limit (bursts until refused).
        assert self.ingest("A", a, "b1", self.events("b1", 2),
                           origin="https://evil.example").status_code == 403
        big = [{"message": "x" * 1000} for _ in range(MAX_BODY // 1000 + 5)]
        assert self.ingest("B", b, "b3", big[:MAX_EVENTS]).status_code == 413
        assert self.ingest("A", a, "b2", self.events("b2", MAX_EVENTS + 1)).status_code == 413
        for kind in ("store", "envelope"):
            self.sentry("A", a, kind)
            self.sentry("B", b, kind)
        limited = 0  # last: B's bucket is empty after it (a restart fills it again)
        while limited < 2:
            limited += self.ingest("B", b, "b3", self.events("b3", 150)).status_code == 429


@pytest.fixture(params=["local", "s3"])
def env(request: pytest.FixtureRequest) -> dict[str, str]:
    if request.param == "local":
        return dict(ENV)
    s3: S3Server = request.getfixturevalue("s3_server")
    return {**ENV, **s3.env(s3.new_bucket())}


@pytest.fixture
def server(tmp_path: Path, env: dict[str, str]) -> Iterator[Server]:
    srv = Server(tmp_path / "data", env).start()
    yield srv
    srv.stop()


def usage(server: Server, key: str, **params: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cursor = ""
    while True:
        answer = httpx.get(f"{server.url}/v1/usage", timeout=10,
                           headers={"Authorization": f"Bearer {key}"},
                           params={**params, "cursor": cursor, "limit": "1000"})
        assert answer.status_code == 200, answer.text
        page = answer.json()
        rows += page["rows"]
        if page["nextCursor"] is None:
            return rows
        cursor = page["nextCursor"]


def counted(rows: list[dict[str, Any]]) -> Counter[Key]:
    out: Counter[Key] = Counter()
    for row in rows:
        if row["kind"] in INGEST_KINDS:
            out[(row["project"], row["box"], row["kind"], row["source"], row["reason"])] += \
                row["quantity"]
    return out


def test_usage_equals_what_the_clients_were_answered_across_a_kill(server: Server) -> None:
    keys = {"A": server.api_key, "B": server.create_key("other")}
    with server.client() as api:
        a = create_project(api, "shop", ["https://good.example"])
    with httpx.Client(base_url=server.url, timeout=10,
                      headers={"Authorization": f"Bearer {keys['B']}"}) as api_b:
        b = create_project(api_b, "blog")
    ledger = Ledger()
    load = Load(server, ledger, seed=7)
    load.round(a, b)
    # Everything so far is in the WAL only (no flush for an hour): killed, then replayed.
    server.kill()
    server.start()
    load.round(a, b)
    server.stop()  # the last rows and records flushed on the way out
    server.start()
    deadline = time.monotonic() + 30
    for tenant, key in keys.items():
        while True:
            rows = usage(server, key, since="2h", interval="day")
            got = counted(rows)
            if got == ledger.counts[tenant] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert got == ledger.counts[tenant], (tenant, got - ledger.counts[tenant],
                                              ledger.counts[tenant] - got)
        # Nothing of the other tenant's.
        assert {r["tenant"] for r in rows} == {"dev" if tenant == "A" else "other"}
        mine = {str((a if tenant == "A" else b)["id"])}
        assert {r["project"] for r in rows} == mine
    assert any(k[2] == "refused.requests" and k[4] == "rate_limited"
               for k in ledger.counts["B"])
    # The stored rows, per box, are the accepted events.
    for tenant, project in (("A", a), ("B", b)):
        with httpx.Client(base_url=server.url, timeout=10,
                          headers={"Authorization": f"Bearer {keys[tenant]}"}) as api:
            stored = Counter(r["boxId"] or "" for r in search_all(api, str(project["name"]),
                                                                   since="1d"))
        accepted: Counter[str] = Counter()
        for (_, box, kind, _, _), n in ledger.counts[tenant].items():
            if kind == "ingest.events":
                accepted[box] += n
        assert stored == accepted
    # The outcomes view of the same: accepted and refused events per reason.
    with server.client() as api:
        outcomes = api.get(f"/v1/projects/{a['id']}/outcomes",
                           params={"since": "2h", "interval": "day"}).json()
    refused: Counter[str] = Counter()
    for k, n in ledger.counts["A"].items():
        if k[2] == "refused.events":
            refused[k[4]] += n
    assert outcomes["totals"]["accepted"] == sum(
        n for k, n in ledger.counts["A"].items() if k[2] == "ingest.events")
    assert outcomes["totals"]["refused"] == sum(refused.values())
    by_reason: Counter[str] = Counter()
    for row in outcomes["rows"]:
        if row["outcome"] == "refused":
            by_reason[row["reason"]] += row["events"]
    assert by_reason == refused
    assert outcomes["totals"]["client_discard"] == (7 + 2) * 2
