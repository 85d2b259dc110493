"""A catalog commit that waits for the disk holds neither the event loop nor a query's view.

A flush's catalog commit waits for an fsync (SQLite ``synchronous=FULL``), and a disk busy
with other writes held one for 1.8 s in a run here, with the whole event loop: every
``/healthz``, every 202 waited (CI saw 0.22 s during a source map upload). The flusher now
commits from a thread. Here the commit is held, as such a disk would hold it, until the
test lets it go: the loop must be free to let it go, the catalog must answer reads
meanwhile, a search must wait at the buffer's gate and then find every row once, and a
stop that lands meanwhile must not write the rows a second time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from core.config import load
from core.metrics import Registry
from core.schema import RowBatch, parse_id
from core.storage.local import LocalStorage
from ingest.service import IngestService
from metadata.catalog import Catalog
from metadata.sqlite import Sqlite, open_db
from query.engine import QueryEngine

NOW_MS = int(time.time() * 1000)
HOLD_S = 20.0  # how long a held commit waits for the test before giving up on it


def rows(n: int) -> RowBatch:
    return RowBatch(project_id="p", box="b", session_id=None, release=None, user_agent=None,
                    sdk=None, debug_ids=None, received=NOW_MS, id_start=0,
                    ts=[NOW_MS] * n, level=["info"] * n, message=[f"m{i}" for i in range(n)],
                    url=[None] * n, attrs=[None] * n, error_type=[None] * n,
                    error_message=[None] * n, error_stack=[None] * n, truncated=[None] * n)


class HeldCommits:
    """The writer connection of ``db``, whose commit of a publish (files made live) waits,
    the write lock held as in a slow fsync, while :attr:`armed`, until :attr:`go` is set or
    ``HOLD_S`` passes."""

    def __init__(self, db: Sqlite) -> None:
        self.con = db.con
        self.armed = False
        self.publishing = False
        self.entered = threading.Event()
        self.go = threading.Event()
        self.gave_up = False
        db.con = self  # type: ignore[assignment]

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith("UPDATE files SET state = 'live'"):
            self.publishing = True
        elif sql == "COMMIT" and self.armed and self.publishing:
            self.entered.set()
            self.gave_up = not self.go.wait(HOLD_S)
        if sql in ("COMMIT", "ROLLBACK"):
            self.publishing = False
        return self.con.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.con, name)


def setup(tmp_path: Path) -> tuple[IngestService, QueryEngine, HeldCommits, LocalStorage]:
    # No flush of its own: the test says when.
    config = load({"BOXTRAIL_DATA_DIR": str(tmp_path / "data"),
                   "BOXTRAIL_FLUSH_INTERVAL_S": "86400"})
    (tmp_path / "data").mkdir()
    db = open_db(tmp_path / "data" / "meta.sqlite")
    catalog = Catalog(db)
    storage = LocalStorage(str(tmp_path / "objects"))
    svc = IngestService(config, catalog, storage, Registry())
    engine = QueryEngine(catalog, svc.buffer, storage, Registry(), 1)
    return svc, engine, HeldCommits(db), storage


async def entered(held: HeldCommits) -> None:
    deadline = time.monotonic() + HOLD_S
    while not held.entered.is_set():
        assert time.monotonic() < deadline, "the flush never reached its commit"
        await asyncio.sleep(0.01)


def in_a_thread(call: Any) -> list[Any]:
    """``call()``'s result, if it returns while a commit is held (a read that queued
    behind the writer would not)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(HOLD_S / 2)
    return out


def live_ids(catalog: Catalog, storage: LocalStorage) -> list[int]:
    found: list[int] = []
    for f in catalog.live_files("p", 0, 10**15):
        found += pq.read_table(pa.BufferReader(storage.get(f.key)))["id"].to_pylist()
    return found


def test_a_held_commit_leaves_the_loop_free_and_each_row_found_once(tmp_path: Path) -> None:
    svc, engine, held, storage = setup(tmp_path)

    async def main() -> None:
        await svc.start()
        try:
            await svc.accept(rows(10))
            before, _ = await engine.search("p", 0, None, 100, None)
            assert len(before.rows) == 10
            held.armed = True
            flush = asyncio.create_task(svc.flush())
            await entered(held)  # the loop runs while the commit waits
            # Reads of the catalog answer from what was committed last: none live yet.
            assert in_a_thread(lambda: svc.catalog.count_live()) == [0]
            search = asyncio.create_task(engine.search("p", 0, None, 100, None))
            await asyncio.sleep(0.2)
            assert not search.done(), "a search read the buffer and catalog mid-publish"
            held.go.set()
            assert await flush == 10
            page, _ = await search
            ids = sorted(parse_id(r.id) for r in page.rows)
            assert ids == sorted(parse_id(r.id) for r in before.rows)  # each once, none lost
            assert svc.buffer.rows == 0 and sorted(live_ids(svc.catalog, storage)) == ids
        finally:
            held.go.set()
            await svc.stop()

    asyncio.run(main())
    assert not held.gave_up, "the event loop was held while the commit waited"


def test_a_stop_during_a_held_commit_writes_no_row_twice(tmp_path: Path) -> None:
    svc, engine, held, storage = setup(tmp_path)

    async def main() -> list[int]:
        await svc.start()
        await svc.accept(rows(10))
        acked = [parse_id(r.id) for r in (await engine.search("p", 0, None, 100, None))[0].rows]
        held.armed = True
        svc._flush_now.set()  # the flush loop's own flush, the task a stop cancels
        await entered(held)
        stop = asyncio.create_task(svc.stop())
        await asyncio.sleep(0.2)  # the cancel lands while the commit waits
        held.go.set()
        await stop
        return acked

    acked = asyncio.run(main())
    assert not held.gave_up
    assert sorted(live_ids(svc.catalog, storage)) == sorted(acked)


def test_a_plan_held_by_a_remote_catalog_holds_neither_the_loop_nor_a_row_twice(
        tmp_path: Path) -> None:
    """A remote catalog is read for a plan in a thread (``query.engine``): while that read
    hangs, ingest goes on, and a flush that comes meanwhile makes nothing live until the
    plan has left the buffer's reading section, so the plan sees each row once."""
    svc, engine, _, _ = setup(tmp_path)
    svc.catalog.db.remote = True  # read as PostgreSQL is: in a thread, under a gate limit
    reading, release = threading.Event(), threading.Event()
    armed = False
    live_files = svc.catalog.live_files

    def held_live_files(*args: Any, **kwargs: Any) -> Any:
        if armed:
            reading.set()
            assert release.wait(HOLD_S)
        return live_files(*args, **kwargs)

    setattr(svc.catalog, "live_files", held_live_files)  # noqa: B010 (a method replaced)

    async def ids_found() -> list[int]:
        page, _ = await engine.search("p", 0, None, 1000, None)
        return sorted(parse_id(r.id) for r in page.rows)

    async def main() -> None:
        nonlocal armed
        await svc.start()
        try:
            await svc.accept(rows(10))
            assert await svc.flush() == 10
            await svc.accept(rows(10))  # 10 in Parquet, 10 in the buffer
            before = await ids_found()
            assert len(before) == 20
            armed = True
            search = asyncio.create_task(ids_found())
            while not reading.is_set():
                await asyncio.sleep(0.01)
            armed = False
            # The loop is free: ingest acks while the plan's catalog read hangs.
            await asyncio.wait_for(svc.accept(rows(5)), 2)
            flush = asyncio.create_task(svc.flush())
            await asyncio.sleep(0.3)
            assert not flush.done(), "a publish began while a plan was between its reads"
            assert await asyncio.to_thread(svc.catalog.count_live) == 1
            release.set()
            assert await search == before  # each row once: none from the flush, none lost
            assert await flush == 15
            after = await ids_found()
            assert len(after) == 25 and set(before) < set(after)
        finally:
            release.set()
            await svc.stop()

    asyncio.run(main())
