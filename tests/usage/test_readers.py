"""The readers' usage and the storage snapshot: each search, histogram, errors read and MCP
tool call is a query, with the Parquet bytes its plan read; a live tail counts its seconds;
an errors read counts the frames its source maps rewrote; stored bytes are sampled once an
hour, in byte-hours. One sink sender per cluster: two nodes' sinks on one catalog never both
send."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.config import Config
from core.metrics import Registry
from core.usage import Meter
from metadata.catalog import Catalog, FileEntry
from metadata.connect import open_database
from tests.erasure.test_deletions import catalog
from tests.query.test_mcp import MINIFIED, MINIFIED_STACK, call, payload, run, source_map
from tests.support.server import Server, create_project
from usage.sink import Sink
from usage.store import UsageStore


def usage(server: Server, kinds: str, group_by: str) -> Counter[tuple[str, str]]:
    with server.client() as api:
        r = api.get("/v1/usage", params={"since": "1h", "interval": "day", "kind": kinds,
                                         "groupBy": group_by})
    assert r.status_code == 200, r.text
    out: Counter[tuple[str, str]] = Counter()
    for row in r.json()["rows"]:
        out[(row["kind"], row[group_by] or "")] += row["quantity"]
    return out


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    # A tail whose client left ends at its next write: a heartbeat each half second.
    srv = Server(tmp_path / "data", {"BOXTRAIL_TAIL_HEARTBEAT_S": "0.5"}).start()
    yield srv
    srv.stop()


def test_every_read_is_metered(server: Server) -> None:
    with server.client() as api:
        project = create_project(api, "reads")
        uploaded = api.post("/v1/projects/reads/sourcemaps", files=[
            ("file", ("assets/app.min.js", MINIFIED.encode(), "application/javascript")),
            ("file", ("assets/app.min.js.map", source_map(), "application/json"))])
        assert uploaded.status_code == 201, uploaded.text
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": project["ingestKey"]}, timeout=10,
                   json={"context": {"boxId": "b1"}, "events": [
                       {"level": "error", "message": "render failed",
                        "error": {"type": "TypeError", "message": "x",
                                  "stack": MINIFIED_STACK}},
                       *({"message": f"row {i}"} for i in range(5))]})
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 20  # flushed: the reads below scan a Parquet file
    while not usage(server, "ingest.events", "project") and time.monotonic() < deadline:
        time.sleep(0.1)
    [(stored,)] = catalog(server, "SELECT sum(bytes) FROM files WHERE state = 'live' AND "
                                  "project_id = ?", (project["id"],))
    assert stored > 0
    with server.client() as api:
        for path, params in (("logs", {"since": "1d"}), ("histogram", {"since": "1d"}),
                             ("errors", {"since": "1d"})):
            assert api.get(f"/v1/projects/reads/{path}", params=params).status_code == 200
        opened = time.monotonic()
        with api.stream("GET", "/v1/projects/reads/tail") as tail:
            for _ in tail.iter_bytes():  # a heartbeat each half second
                if time.monotonic() - opened > 1.6:
                    break
    assert payload(run(call(server, "auto", "logs_search", {"project": "reads"})))["rows"]
    want = Counter({("query.requests", s): 1 for s in ("search", "histogram", "errors", "mcp")}
                   | {("query.scanned_bytes", s): stored
                      for s in ("search", "histogram", "errors", "mcp")}
                   | {("symbolicate.frames", "errors"): 2})
    deadline = time.monotonic() + 20  # written each second
    kinds = "query.requests,query.scanned_bytes,symbolicate.frames"
    while (got := usage(server, kinds, "source")) != want and time.monotonic() < deadline:
        time.sleep(0.2)
    assert got == want
    deadline = time.monotonic() + 10
    while not (seconds := usage(server, "tail.seconds", "project")) and (
            time.monotonic() < deadline):
        time.sleep(0.2)
    assert 1 <= seconds[("tail.seconds", project["id"])] <= 3


class _Gone(Exception):
    pass


def test_one_sink_sends_for_the_cluster(tmp_path: Path) -> None:
    """Two nodes' sinks on one catalog: the lease lets one of them close minutes and send;
    the other sends nothing while it is held."""
    db = open_database("sqlite:", tmp_path)
    config = Config(data_dir=str(tmp_path), usage_sink_url="http://127.0.0.1:9/hook",
                    usage_sink_secret="whsec_" + "A" * 32)
    sent: list[tuple[str, str]] = []

    def handler(node: str) -> httpx.MockTransport:
        def answer(request: httpx.Request) -> httpx.Response:
            sent.append((node, request.headers["webhook-id"]))
            return httpx.Response(204)
        return httpx.MockTransport(answer)

    db.execute("INSERT INTO tenants VALUES ('ten_1', 'acme', '2026-01-01T00:00:00Z')")
    minute = int(time.time()) // 60 * 60 - 600
    for box in range(20):
        db.execute("INSERT INTO usage_minutes (tenant_id, minute, project_id, box, kind, "
                   "source, reason, quantity) VALUES ('ten_1', ?, 'prj_1', ?, "
                   "'ingest.events', 'ingest', '', 5)", (minute, f"b{box}"))
    sinks = [Sink(config, db, Catalog(db, node), Registry()) for node in ("n1", "n2")]

    async def rounds() -> None:
        clients = [httpx.AsyncClient(transport=handler(n)) for n in ("n1", "n2")]
        for _ in range(3):
            for sink, client in zip(sinks, clients, strict=True):
                await sink.round(client)
        for client in clients:
            await client.aclose()

    run(rounds())
    assert len(sent) == 20 and len({i for _, i in sent}) == 20
    assert {node for node, _ in sent} == {"n1"}
    assert db.execute("SELECT count(*) FROM usage_outbox").fetchone()[0] == 0
    assert db.execute("SELECT sum(quantity - sent) FROM usage_minutes").fetchone()[0] == 0
    db.close()


def test_stored_bytes_are_counted_once_an_hour_in_byte_hours(tmp_path: Path) -> None:
    db = open_database("sqlite:", tmp_path)
    catalog_ = Catalog(db, "n1")
    store = UsageStore(db, catalog_, Meter())
    db.execute("INSERT INTO tenants VALUES ('ten_1', 'acme', '2026-01-01T00:00:00Z')")
    db.execute("INSERT INTO projects (id, tenant_id, name, ingest_key, allowed_origins, "
               "created_at) VALUES ('prj_1', 'ten_1', 'shop', 'k', '[]', 'x')")
    entries = [FileEntry(key=f"f{i}", project_id="prj_1", box="b1", date="2026-12-06",
                         min_ts=0, max_ts=1, min_id=0, max_id=1, rows=1, bytes=1000 + i)
               for i in range(3)]
    catalog_.add_pending(entries)
    catalog_.publish(["f0", "f1"])  # f2 stays pending: not stored yet
    hour = 1_796_558_400
    assert store.snapshot(hour + 120)
    assert not store.snapshot(hour + 1800)  # once an hour, whoever asks
    catalog_.publish(["f2"])
    assert store.snapshot(hour + 3600 + 5)
    rows = db.execute("SELECT tenant_id, minute, kind, quantity FROM usage_minutes "
                      "ORDER BY minute").fetchall()
    assert rows == [("ten_1", hour, "storage.parquet", 2001),
                    ("ten_1", hour + 3600, "storage.parquet", 3003)]
    db.close()
