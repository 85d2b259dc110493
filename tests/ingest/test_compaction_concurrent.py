"""Two nodes compacting the same partitions at once never duplicate or lose a row.

Two ``IngestService``s (two nodes: each its own catalog connection and node id) share one
metadata database, SQLite or PostgreSQL, and one object store. Rounds of small files land
in a few partitions; both compact at the same time, with their leases (the normal case)
and with the lease bypassed so that both really merge the same files and race to publish.
After every round each id is in exactly one live file.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.config import Config
from core.metrics import Registry
from core.schema import RowBatch, to_table
from core.storage.local import LocalStorage
from ingest.flusher import encode_parquet, partitions
from ingest.service import IngestService
from metadata.catalog import Catalog
from metadata.connect import open_database
from metadata.db import Database

DAY_MS = 86_400_000
BOXES = ("b1", "b2", "b3")


@pytest.fixture(params=["sqlite", "postgresql"])
def databases(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[Database]]:
    url = "sqlite:" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    dbs = [open_database(url, tmp_path / "meta") for _ in range(2)]
    yield dbs
    for db in dbs:
        db.close()


def rows(ids: range, box: str) -> pa.Table:
    n = len(ids)
    batch = RowBatch(project_id="p", box=box, session_id=None, release=None, user_agent=None,
                     sdk=None, debug_ids=None, received=1, id_start=ids.start,
                     ts=[20 * DAY_MS + i for i in ids], level=["info"] * n,
                     message=[f"m{i}" for i in ids], url=[None] * n, attrs=[None] * n,
                     error_type=[None] * n, error_message=[None] * n, error_stack=[None] * n,
                     truncated=[None] * n)
    return to_table([batch])


def live_ids(catalog: Catalog, storage: LocalStorage) -> list[int]:
    found: list[int] = []
    for f in catalog.live_files("p", 0, 10**15):
        found += pq.read_table(pa.BufferReader(storage.get(f.key)))["id"].to_pylist()
    return found


@pytest.mark.parametrize("bypass_lease", [False, True], ids=["leased", "racing"])
def test_two_nodes_compact_the_same_partitions(databases: list[Database], tmp_path: Path,
                                               bypass_lease: bool,
                                               monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    storage = LocalStorage(str(tmp_path / "objects"))
    nodes = []
    for n, db in enumerate(databases):
        config = Config(data_dir=str(tmp_path / f"node{n}"), compact_min_files=2)
        nodes.append(IngestService(config, Catalog(db, f"node{n}"), storage, Registry()))
    if bypass_lease:
        # Both nodes take every partition, and neither merges before the other has read
        # the same files: every merge races, and exactly one of each pair may publish.
        meet = threading.Barrier(len(nodes), timeout=30)
        for node in nodes:
            monkeypatch.setattr(node.catalog, "try_lease", lambda name, ttl: True)
            merge = node._merge

            def merge_together(files: list, merge=merge):  # type: ignore[no-untyped-def]
                meet.wait()
                return merge(files)

            monkeypatch.setattr(node, "_merge", merge_together)
    writer = nodes[0].catalog
    next_id = itertools.count(1)
    written: list[int] = []
    compacted = 0

    async def rounds() -> None:
        nonlocal compacted
        for _ in range(6):
            for box in BOXES:
                for _ in range(3):  # three small files per partition and round
                    first = next(next_id) * 10
                    ids = range(first, first + 7)
                    written.extend(ids)
                    [(entry, part)] = partitions("p", rows(ids, box))
                    data = encode_parquet(part)
                    entry = msgspec.structs.replace(entry, bytes=len(data))
                    writer.add_pending([entry])
                    storage.put(entry.key, data)
                    writer.publish([entry.key])
            done = await asyncio.gather(*(node.compact() for node in nodes))
            compacted += sum(done)
            found = live_ids(writer, storage)
            assert sorted(found) == sorted(written), "a row lost or live twice"
        assert len(writer.live_files("p", 0, 10**15)) == len(BOXES)

    caplog.set_level("INFO", logger="boxtrail.ingest")
    asyncio.run(rounds())
    assert compacted == 6 * len(BOXES)  # every round merged every partition, once
    lost = [r for r in caplog.records if "lost to another" in r.getMessage()]
    if bypass_lease:  # both merged the same files: the later publish lost every time
        assert len(lost) == 6 * len(BOXES)
    else:  # the lease kept the second node away
        assert lost == []
