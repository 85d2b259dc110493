"""What ingest accepts, the tables return intact: Hypothesis draws hostile bodies over the
whole wire format (``tests/support/hostile.py``: control characters, lone surrogates,
duplicate attribute keys, numbers at the edges of float range, huge strings, bad
timestamps...), posts them to a server with the tables on, and once they are in Parquet
every reader of the table (pyiceberg to Arrow and through DuckDB, ClickHouse through chDB)
returns exactly the rows ``/logs`` returns, each rebuilt by the API's own function."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.iceberg.test_tables import agree, iceberg_catalog, logs, root_of
from tests.support import hostile
from tests.support.server import Server, create_project

EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "40"))


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    monkeypatch.chdir(tmp_path)
    srv = Server(tmp_path / "data", {"BOXTRAIL_ICEBERG": "on",
                                     "BOXTRAIL_FLUSH_INTERVAL_S": "0.5"}).start()
    yield srv
    srv.stop()


def test_what_ingest_accepts_the_tables_return_intact(server: Server) -> None:
    with server.client() as api:
        project = create_project(api, "hostile")
    key = str(project["ingestKey"])
    accepted = 0

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def send(data: st.DataObject) -> None:
        nonlocal accepted
        body = data.draw(hostile.bodies(uuid.uuid4().hex))
        r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, content=body.text(),
                       headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code in (202, 400), r.text
        if r.status_code == 202:
            accepted += r.json()["accepted"]

    send()
    assert accepted  # the draws hold refused bodies and rejected events too
    deadline = time.monotonic() + 30
    while len(logs(server, "hostile")) < accepted:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    catalog = iceberg_catalog(server)
    rows = agree(server, catalog, project, root_of(server))
    assert len(rows) == accepted, accepted
    print(f"{accepted} rows")
