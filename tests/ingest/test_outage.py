"""Storage down: acknowledged events are never lost, the service says 503, never 500."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support.s3server import S3Server
from tests.support.server import Server, create_project, search_all


@pytest.mark.s3
def test_s3_outage(tmp_path: Path) -> None:
    s3 = S3Server().start()
    env = {**s3.env(), "BOXTRAIL_S3_BUCKET": s3.new_bucket(), "BOXTRAIL_BUFFER_MAX_ROWS": "300"}
    server = Server(tmp_path / "data", env).start()
    try:
        with server.client() as api:
            key = str(create_project(api, "o")["ingestKey"])
            url = f"{server.url}/v1/ingest"
            first = [{"message": f"a{i}"} for i in range(50)]
            r = httpx.post(url, params={"key": key}, json={"context": {"boxId": "a"},
                                                           "events": first})
            assert r.status_code == 202
            deadline = time.monotonic() + 20
            while api.get("/v1/projects/o/logs").headers["x-boxtrail-files-total"] == "0":
                assert time.monotonic() < deadline, "first batch never reached S3"
                time.sleep(0.1)

            s3.stop()  # the bucket is gone for the rest of the test
            acked: list[str] = []
            refused = None
            for n in range(40):
                events = [{"message": f"b{n}-{i}"} for i in range(50)]
                r = httpx.post(url, params={"key": key},
                               json={"context": {"boxId": "b"}, "events": events}, timeout=30)
                if r.status_code != 202:
                    refused = r
                    break
                acked += [e["message"] for e in events]
                time.sleep(0.1)
            assert refused is not None and refused.status_code == 503, "never pushed back"
            assert refused.json()["error"]["code"] == "overloaded"
            assert int(refused.headers["retry-after"]) >= 1
            assert acked  # some went through on the WAL before the buffer filled

            ready = api.get("/readyz")
            assert ready.status_code == 503 and ready.json()["error"]["code"] == "unavailable"
            # Rows only in Parquet cannot be read now: a clear 503, not a 500.
            r = api.get("/v1/projects/o/logs", params={"boxId": "a"}, timeout=60)
            assert r.status_code == 503, "".join(server.output[-30:])
            assert r.json()["error"]["code"] == "storage_unavailable"
            # Acknowledged rows that are still buffered are all there.
            rows = search_all(api, "o", since="1h", box="b")
            assert sorted(row["message"] for row in rows) == sorted(acked)
            assert "boxtrail_flush_failures_total" in api.get("/metrics").text

        server.kill()  # and a crash on top: the WAL brings them back, S3 still down
        server.start()
        with server.client() as api:
            rows = search_all(api, "o", since="1h", box="b")
            assert sorted(row["message"] for row in rows) == sorted(acked)
    finally:
        server.stop()
        s3.stop()
