"""The tables and boxtrail's catalog agree after whatever happened while one was not looking.

- A SIGKILL at either side of the commit (the table's change staged but the transaction not
  committed; the transaction committed, the flush not ended): the next start replays the
  WAL, and every reader returns each row once, as ``/logs`` does. What the staged change
  wrote and no snapshot reads is swept, and nothing a snapshot reads is.
- Tables turned off for a while, then on again: the table lists files boxtrail has retired
  since (compaction ran) and lacks files it wrote since. The start repairs it in both
  directions before it serves; the files written meanwhile, in layout 2 (milliseconds,
  which Spark's Iceberg reader misreads), are rewritten in layout 3, and the table follows.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.config import load
from core.schema import LAYOUT
from core.storage import open_storage
from iceberg.tables import metadata_prefix, open_tables
from iceberg.upkeep import Upkeep
from metadata.catalog import Catalog
from metadata.sqlite import Sqlite
from tests.iceberg.test_tables import agree, files, iceberg_catalog, root_of
from tests.support.server import Server, create_project

ON = {"BOXTRAIL_ICEBERG": "on", "BOXTRAIL_WORKER_PROCESSES": "0",
      "BOXTRAIL_FLUSH_INTERVAL_S": "0.3", "BOXTRAIL_COMPACT_INTERVAL_S": "86400"}
LAUNCHER = Path(__file__).with_name("kill_at.py")


class KilledServer(Server):
    command = (str(LAUNCHER),)


def send(server: Server, key: str, box: str, first: int, n: int) -> None:
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, timeout=10,
                   json={"context": {"boxId": box},
                         "events": [{"message": f"{box} n={i}", "attrs": {"n": i}}
                                    for i in range(first, first + n)]})
    assert r.status_code == 202, r.text


def flushed(server: Server, rows: int) -> None:
    """Every row acked so far is in a live file."""
    con = sqlite3.connect(server.data_dir / "meta.sqlite")
    deadline = time.monotonic() + 30
    try:
        while (con.execute("SELECT coalesce(sum(rows), 0) FROM files WHERE state = 'live'")
               .fetchone()[0] < rows):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        con.close()


@pytest.mark.parametrize("at", ["staged", "committed"])
def test_a_kill_at_either_side_of_the_commit_is_repaired_at_the_next_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str) -> None:
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data"
    doomed = KilledServer(data, {**ON, "KILL_AT": at}).start()
    with doomed.client() as api:
        project = create_project(api, "crashy")
    send(doomed, str(project["ingestKey"]), "b1", 0, 50)  # acked: durable in the WAL
    assert doomed.proc is not None
    assert doomed.proc.wait(30) == -9  # its first flush killed it
    doomed._reap()
    server = Server(data, ON).start()
    try:
        flushed(server, 50)
        rows = agree(server, iceberg_catalog(server), project, root_of(server))
        assert sorted(r["message"] for r in rows.values()) == sorted(
            f"b1 n={i}" for i in range(50))
    finally:
        server.stop()
    # What the killed commit staged is read by no snapshot: swept; the rest stays.
    config = load({**server.env, "BOXTRAIL_DATA_DIR": str(data)})
    db = Sqlite(data / "meta.sqlite")
    try:
        storage = open_storage(config)
        tables = open_tables(config, db)
        upkeep = Upkeep(tables, Catalog(db), storage, 3600)
        before = {i.key for i in storage.list(metadata_prefix(str(project["id"])))}
        swept = upkeep.sweep(str(project["id"]), time.time(), grace_s=0)
        after = {i.key for i in storage.list(metadata_prefix(str(project["id"])))}
        assert swept == len(before - after)
        if at == "staged":
            assert swept > 0  # its manifest, manifest list and metadata.json at least
        table = tables.table(str(project["id"]), create=False)
        assert table is not None
        assert {tables.key(u) for u in tables.metadata_files(table)} <= after
    finally:
        db.close()
    server = Server(data, ON).start()
    try:
        assert agree(server, iceberg_catalog(server), project, root_of(server)) == rows
    finally:
        server.stop()


def test_tables_turned_off_then_on_again_are_repaired_both_ways(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data"
    server = Server(data, ON).start()
    with server.client() as api:
        project = create_project(api, "toggled")
    key = str(project["ingestKey"])
    for round_ in range(3):  # three files of one partition, in the table
        send(server, key, "b1", round_ * 10, 10)
        flushed(server, (round_ + 1) * 10)
    first = agree(server, iceberg_catalog(server), project, root_of(server))
    server.stop()

    # Off: compaction merges the three (the table still lists them), box b2's file is new.
    off = {**ON, "BOXTRAIL_ICEBERG": "off", "BOXTRAIL_COMPACT_INTERVAL_S": "0.3",
           "BOXTRAIL_COMPACT_MIN_FILES": "3"}
    server = Server(data, off).start()
    send(server, key, "b2", 100, 10)
    flushed(server, 40)
    deadline = time.monotonic() + 30
    while len(files(server, "retired")) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    server.stop()
    # Written with the tables off: layout 2, timestamps in milliseconds (9% smaller).
    for key_ in files(server, "live"):
        ts = pq.read_schema(data / "objects" / key_).field("ts").type
        assert ts == pa.timestamp("ms", tz="UTC"), (key_, ts)
    stale = iceberg_catalog(server).load_table(("boxtrail", str(project["id"])))
    assert {p.rsplit("/", 1)[1] for p in stale.inspect.files()["file_path"].to_pylist()} == {
        k.rsplit("/", 1)[1] for k in files(server, "retired")}

    # On again: repaired at start (three dropped, two added), then the old file rewritten.
    server = Server(data, {**ON, "BOXTRAIL_COMPACT_INTERVAL_S": "0.3"}).start()
    try:
        rows = agree(server, iceberg_catalog(server), project, root_of(server))
        assert len(rows) == 40 and {i: r for i, r in rows.items() if r["boxId"] == "b1"} == first
        con = sqlite3.connect(data / "meta.sqlite")
        deadline = time.monotonic() + 30
        while con.execute("SELECT count(*) FROM files WHERE state = 'live' AND layout < ?",
                          (LAYOUT,)).fetchone()[0]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        con.close()
        assert agree(server, iceberg_catalog(server), project, root_of(server)) == rows
        for key_ in files(server, "live"):
            ts = pq.read_schema(data / "objects" / key_).field("ts").type
            assert ts == pa.timestamp("us", tz="UTC"), (key_, ts)
    finally:
        server.stop()
