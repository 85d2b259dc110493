"""A project's Iceberg table reads exactly what boxtrail's ``/logs`` returns, on local disk and
on S3: after ingest and flushes (rows over two days and three boxes), after compaction, and
after a box's deletion. Read by pyiceberg's scan to Arrow and through DuckDB, and by
ClickHouse (chDB), each API row rebuilt from the table's columns by the function the API
itself uses (``query.rows.to_row``).
And the table never lists a file boxtrail has retired; a retired file is deleted only once
no snapshot reads it, and the deletion job expires the snapshots that read the box's rows."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chdb
import httpx
import msgspec
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from query.rows import COLUMNS, to_row
from tests.support.s3server import S3Server
from tests.support.server import Server, create_project, search_all

DAY_MS = 86_400_000
WITHIN_S = 30.0


@pytest.fixture(params=["local", "s3"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    env = {"BOXTRAIL_ICEBERG": "on", "BOXTRAIL_FLUSH_INTERVAL_S": "0.3",
           "BOXTRAIL_COMPACT_INTERVAL_S": "0.5", "BOXTRAIL_COMPACT_MIN_FILES": "3",
           "BOXTRAIL_DELETION_GRACE_S": "0.5", "BOXTRAIL_WORKER_PROCESSES": "0"}
    if request.param == "s3":
        s3: S3Server = request.getfixturevalue("s3_server")
        env |= s3.env(s3.new_bucket())
    srv = Server(tmp_path / "data", env).start()
    yield srv
    srv.stop()


def iceberg_catalog(server: Server) -> SqlCatalog:
    """The tables as an external engine opens them: the same SQL catalog, the storage's
    own credentials (the operator's)."""
    url = server.env.get("BOXTRAIL_CATALOG_URL")
    props = {"uri": "postgresql+psycopg://" + url.split("://", 1)[1] if url
             else f"sqlite:///{server.data_dir / 'meta.sqlite'}"}
    if endpoint := server.env.get("BOXTRAIL_S3_ENDPOINT"):
        props |= {"s3.endpoint": endpoint, "s3.region": "us-east-1",
                  "s3.access-key-id": os.environ["AWS_ACCESS_KEY_ID"],
                  "s3.secret-access-key": os.environ["AWS_SECRET_ACCESS_KEY"]}
    return SqlCatalog("boxtrail", **props)


def api_rows(table: pa.Table) -> dict[str, dict[str, Any]]:
    """The table's rows as the API shows them."""
    table = table.select(list(COLUMNS))
    ts_type = table.schema.field("ts").type
    ts = table["ts"].cast(pa.int64()).to_pylist()
    per_ms = 1000 if pa.types.is_timestamp(ts_type) and ts_type.unit == "us" else 1
    cols = [table[c].to_pylist() for c in COLUMNS]
    out = {}
    for i in range(table.num_rows):
        values = [c[i] for c in cols]
        values[1] = ts[i] // per_ms
        row = msgspec.to_builtins(to_row(tuple(values)))
        out[row["id"]] = {k: v for k, v in row.items() if v is not None}
    return out


def read_all(table: Table) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The current snapshot through pyiceberg's Arrow scan and through DuckDB."""
    scan = table.scan()
    by_arrow = api_rows(scan.to_arrow())
    con = scan.to_duckdb("logs")
    by_duckdb = api_rows(con.sql("SELECT * FROM logs").to_arrow_table())
    return by_arrow, by_duckdb


def read_chdb(server: Server, project_id: str) -> dict[str, dict[str, Any]]:
    """The current snapshot through ClickHouse's Iceberg table functions (chDB, in process):
    ``icebergLocal`` over the project's prefix, ``icebergS3`` on S3."""
    columns = ", ".join("toUnixTimestamp64Milli(ts) AS ts" if c == "ts" else c for c in COLUMNS)
    if bucket := server.env.get("BOXTRAIL_S3_BUCKET"):
        source = (f"icebergS3('{server.env['BOXTRAIL_S3_ENDPOINT']}/{bucket}/logs/"
                  f"project={project_id}/', '{os.environ['AWS_ACCESS_KEY_ID']}', "
                  f"'{os.environ['AWS_SECRET_ACCESS_KEY']}')")
    else:
        # It reads only under its working directory.
        os.chdir(server.data_dir / "objects")
        source = f"icebergLocal('logs/project={project_id}')"
    table = chdb.query(f"SELECT {columns} FROM {source}", "ArrowTable")
    strings = [pc.cast(col, pa.string()) if pa.types.is_binary(col.type)
               or pa.types.is_large_binary(col.type) else col for col in table.columns]
    return api_rows(pa.table(strings, names=table.column_names))


def logs(server: Server, project: str) -> dict[str, dict[str, Any]]:
    with server.client() as api:
        rows = search_all(api, project, since="5000w")  # every row ever sent
    return {str(r["id"]): {k: v for k, v in r.items() if v is not None} for r in rows}


def files(server: Server, state: str) -> set[str]:
    """Keys of boxtrail's files in ``state`` (the node's SQLite, or the cluster's catalog)."""
    if url := server.env.get("BOXTRAIL_CATALOG_URL"):
        with psycopg.connect(url) as pg:
            return {r[0] for r in pg.execute("SELECT key FROM files WHERE state = %s",
                                             (state,))}
    con = sqlite3.connect(server.data_dir / "meta.sqlite")
    try:
        return {r[0] for r in con.execute("SELECT key FROM files WHERE state = ?", (state,))}
    finally:
        con.close()


def root_of(server: Server) -> str:
    """The storage root as the tables name their files."""
    if bucket := server.env.get("BOXTRAIL_S3_BUCKET"):
        return "s3://" + bucket
    return "file://" + str(server.data_dir.resolve() / "objects")


def table_files(table: Table, root: str) -> set[str]:
    paths = {str(p) for p in table.inspect.files()["file_path"].to_pylist()}
    assert all(p.startswith(root + "/") for p in paths), paths
    return {p[len(root) + 1:] for p in paths}


def agree(server: Server, catalog: SqlCatalog, project: dict[str, Any], root: str
          ) -> dict[str, dict[str, Any]]:
    """Every reader returns exactly /logs' rows, and the table lists exactly the live files
    (waiting out the flush of what was just sent)."""
    deadline = time.monotonic() + WITHIN_S
    while True:
        # Boxtrail's catalog read before the table: a file retired by then is in no later
        # snapshot.
        retired, live = files(server, "retired"), files(server, "live")
        expected = logs(server, str(project["name"]))
        table = catalog.load_table(("boxtrail", str(project["id"])))
        listed = table_files(table, root)
        assert not listed & retired
        by_arrow, by_duckdb = read_all(table)
        if by_arrow == expected and not live ^ listed:
            break
        assert time.monotonic() < deadline, (len(by_arrow), len(expected),
                                             sorted(live ^ listed)[:5])
        time.sleep(0.3)
    assert by_duckdb == expected
    assert read_chdb(server, str(project["id"])) == expected
    return expected


def test_every_reader_of_the_table_returns_what_logs_returns(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(server.data_dir)  # restored after: chDB's reads move it
    with server.client() as api:
        project = create_project(api, "lake")
    key = str(project["ingestKey"])
    root = root_of(server)
    catalog = iceberg_catalog(server)
    now = int(time.time() * 1000)
    n = 0
    # Four flushes of three boxes, rows of today and of yesterday: two partitions per box,
    # each with four small files, which compaction merges.
    for _ in range(4):
        for box in ("b1", "b2", "b3"):
            events = []
            for day in (0, 1):
                for _ in range(5):
                    n += 1
                    events.append({"ts": now - day * DAY_MS - n, "message": f"{box} n={n}",
                                   "level": ("info", "error")[n % 2],
                                   "attrs": {"n": n, "box": box, "x": 1.5},
                                   **({"error": {"type": "TypeError", "message": "boom",
                                                 "stack": "at f (a.js:1:2)"}}
                                      if n % 7 == 0 else {})})
            r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, timeout=10,
                           json={"context": {"boxId": box, "release": "r1"},
                                 "events": events})
            assert r.status_code == 202, r.text
        # Each round in its own flush: files to compact.
        deadline = time.monotonic() + WITHIN_S
        while len(logs(server, "lake")) < n or files(server, "pending"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.4)
    first = agree(server, catalog, project, root)
    assert len(first) == n == 120

    # Compaction: the partitions' small files merged; the table follows.
    deadline = time.monotonic() + WITHIN_S
    while not files(server, "retired"):
        assert time.monotonic() < deadline, "no compaction"
        time.sleep(0.2)
    assert agree(server, catalog, project, root) == first
    table = catalog.load_table(("boxtrail", str(project["id"])))
    operations = [s.summary.operation.value for s in table.snapshots()]  # type: ignore[union-attr]
    assert "overwrite" in operations, operations
    # The retired files are still read by older snapshots: they stay.
    retired = files(server, "retired")
    time.sleep(1.0)
    assert retired <= files(server, "retired")

    # A box deleted: the table drops its files, and its history goes with the job.
    with server.client() as api:
        r = api.post("/v1/projects/lake/deletions", json={"box": "b2"})
        assert r.status_code == 202, r.text
        job = r.json()
        deadline = time.monotonic() + WITHIN_S
        while api.get(f"/v1/deletions/{job['id']}").json()["state"] != "done":
            assert time.monotonic() < deadline
            time.sleep(0.2)
    after = agree(server, catalog, project, root)
    assert after == {i: r for i, r in first.items() if r["boxId"] != "b2"}
    table = catalog.load_table(("boxtrail", str(project["id"])))
    assert len(table.snapshots()) == 1  # the older ones read b2's files
    read_by_any = {f for s in table.snapshots() for f in table_files(table, root)}
    assert not any("box=b2/" in f for f in read_by_any)


def test_compactions_beside_busy_flushes_all_commit(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Twenty boxes flushed every 0.3 s while compaction replaces their small files: every
    replace commits. Staged while a flush committed, a replace was built on a table that
    had moved, and failed (pyiceberg retried it, then gave up): a node now stages and
    commits one change at a time."""
    monkeypatch.chdir(tmp_path)
    server = Server(tmp_path / "data", {"BOXTRAIL_ICEBERG": "on",
                                        "BOXTRAIL_FLUSH_INTERVAL_S": "0.3",
                                        "BOXTRAIL_COMPACT_INTERVAL_S": "1"}).start()
    try:
        with server.client() as api:
            project = create_project(api, "busy")
        for round_ in range(10):
            for box in range(20):
                r = httpx.post(f"{server.url}/v1/ingest", params={"key": project["ingestKey"]},
                               json={"context": {"boxId": f"b{box}"},
                                     "events": [{"message": f"r{round_} b{box} {i}"}
                                                for i in range(5)]}, timeout=10)
                assert r.status_code == 202, r.text
            time.sleep(0.35)
        deadline = time.monotonic() + WITHIN_S
        while len(files(server, "retired")) < 100:  # most small files compacted
            assert time.monotonic() < deadline, len(files(server, "retired"))
            time.sleep(0.2)
        rows = agree(server, iceberg_catalog(server), project, root_of(server))
        assert len(rows) == 1000
    finally:
        server.stop()
    failed = [line for line in server.output if "WARNING" in line]
    assert not failed, failed[:5]
