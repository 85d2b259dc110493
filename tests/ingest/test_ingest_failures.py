"""The ingest service when a piece under it fails: a put among several, one partition's
compaction, the code after decoding. Each failure stays contained and leaves no trace."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.config import load
from core.metrics import Registry
from core.schema import RowBatch
from core.storage.local import LocalStorage
from ingest import buffer as buffer_module
from ingest.routes import IngestEndpoint
from ingest.service import IngestService
from metadata.catalog import Catalog
from metadata.sqlite import open_db
from tenancy.tenants import Tenancy

NOW_MS = int(time.time() * 1000)


def rows(box: str, n: int) -> RowBatch:
    return RowBatch(project_id="p", box=box, session_id=None, release=None, user_agent=None,
                    sdk=None, debug_ids=None, received=NOW_MS, id_start=0,
                    ts=[NOW_MS] * n, level=["info"] * n, message=["m"] * n, url=[None] * n,
                    attrs=[None] * n, error_type=[None] * n, error_message=[None] * n,
                    error_stack=[None] * n, truncated=[None] * n)


class FlakyStorage(LocalStorage):
    """Local storage whose puts of keys containing ``fail_on`` fail at once, while the
    others take ``slow_s``: a failure is seen while the other puts are still writing."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.fail_on: str | None = None
        self.slow_s = 0.0

    def put(self, key: str, data: bytes) -> None:
        if self.fail_on and self.fail_on in key:
            raise OSError("disk says no")
        time.sleep(self.slow_s)
        super().put(key, data)


def service(tmp_path: Path, **env: str) -> tuple[IngestService, FlakyStorage, Catalog]:
    config = load({"BOXTRAIL_DATA_DIR": str(tmp_path / "data"), **env})
    (tmp_path / "data").mkdir()
    catalog = Catalog(open_db(tmp_path / "data" / "meta.sqlite"))
    storage = FlakyStorage(str(tmp_path / "objects"))
    return IngestService(config, catalog, storage, Registry()), storage, catalog


def stored_keys(storage: LocalStorage) -> set[str]:
    return {info.key for info in storage.list("logs/")}


def test_a_failed_put_among_several_leaves_no_orphan_object(tmp_path: Path) -> None:
    async def main() -> None:
        svc, storage, catalog = service(tmp_path)
        await svc.start()
        for box in ("a", "b", "c"):
            await svc.accept(rows(box, 10))
        storage.fail_on, storage.slow_s = "box=a/", 0.3
        with pytest.raises(OSError):
            await svc.flush()
        await asyncio.sleep(0.5)  # any put still running has finished by now
        # The slow puts of b and c had not finished when a failed; the clean-up waited for
        # them, so nothing is left in storage that the catalog does not know.
        assert stored_keys(storage) == set()
        assert catalog.files_in_state("pending") == []
        storage.fail_on, storage.slow_s = None, 0.0
        assert await svc.flush() == 30
        assert len(stored_keys(storage)) == 3
        await svc.stop()

    asyncio.run(main())


def test_one_partition_failing_to_compact_leaves_the_others_to_go_on(tmp_path: Path) -> None:
    async def main() -> None:
        svc, storage, catalog = service(tmp_path, BOXTRAIL_COMPACT_MIN_FILES="2")
        await svc.start()
        for _ in range(2):
            for box in ("a", "b"):
                await svc.accept(rows(box, 5))
            await svc.flush()
        assert len(stored_keys(storage)) == 4
        storage.fail_on = "box=a/"  # box a's merged file cannot be written
        assert await svc.compact() == 1
        live = [key for key in stored_keys(storage) if key not in catalog.files_in_state(
            "retired")]
        assert sorted(key.split("/")[2] for key in live) == ["box=a", "box=a", "box=b"]
        await svc.stop()

    asyncio.run(main())


def test_a_round_of_compaction_goes_live_in_one_publish_and_a_stale_partition_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Three partitions compacted in one round go live in one publish (with Iceberg tables,
    one replace commit). When a file of one of them was retired behind the compactor's
    back, that publish is refused; the other two still go live, each alone, and the stale
    one's merged file is removed."""

    async def main() -> None:
        svc, storage, catalog = service(tmp_path, BOXTRAIL_COMPACT_MIN_FILES="2")
        await svc.start()
        for _ in range(2):
            for box in ("a", "b", "c"):
                await svc.accept(rows(box, 5))
            await svc.flush()
        publishes: list[tuple[list[str], list[str]]] = []
        publish = catalog.publish

        def counted(keys: Any, *, retire: Any = (), **kw: Any) -> None:
            publishes.append((list(keys), list(retire)))
            publish(keys, retire=retire, **kw)

        monkeypatch.setattr(catalog, "publish", counted)
        assert await svc.compact() == 3
        assert len(publishes) == 1 and len(publishes[0][0]) == 3  # one publish, 3 merges
        assert len(publishes[0][1]) == 6

        for _ in range(2):  # again two small files per partition (next to the merged one)
            for box in ("a", "b", "c"):
                await svc.accept(rows(box, 5))
            await svc.flush()
        merge = svc._merge

        def merge_then_retire_one(files: list[Any]) -> Any:
            out = merge(files)
            if "box=b/" in files[0].key:  # retired meanwhile, as a deletion would
                publish([], retire=[files[0].key])
            return out

        monkeypatch.setattr(svc, "_merge", merge_then_retire_one)
        publishes.clear()
        caplog.set_level("INFO", logger="boxtrail.ingest")
        assert await svc.compact() == 2
        assert len(publishes) == 4  # the round's, refused; then each alone
        assert [r for r in caplog.records if "lost to another" in r.getMessage()
                and "/b/" in r.getMessage()]
        live = catalog.live_files("p", 0, 1 << 62)
        assert sorted(f.box for f in live) == ["a", "b", "b", "c"]  # b's two, not merged
        assert catalog.files_in_state("pending") == []
        assert {f.key for f in live} | set(catalog.files_in_state("retired")) \
            >= stored_keys(storage)  # the stale merge's file is gone
        await svc.stop()

    asyncio.run(main())


def test_a_round_whose_publishes_fail_leaves_no_pending_file_nor_lease(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The round's publish refused, the first partition alone refused too, the second's
    publish failing outright: the round fails, and every merged file it wrote is removed
    and every lease released, the lost partition's as well."""
    from metadata.catalog import StaleFiles

    async def main() -> None:
        svc, storage, catalog = service(tmp_path, BOXTRAIL_COMPACT_MIN_FILES="2")
        await svc.start()
        for _ in range(2):
            for box in ("a", "b", "c"):
                await svc.accept(rows(box, 5))
            await svc.flush()
        before = stored_keys(storage)
        answers: list[type[Exception]] = [StaleFiles, StaleFiles, RuntimeError]

        def publish(keys: Any, *, retire: Any = (), **kw: Any) -> None:
            raise answers.pop(0)("no")

        monkeypatch.setattr(catalog, "publish", publish)
        with pytest.raises(RuntimeError):
            await svc.compact()
        assert catalog.files_in_state("pending") == []
        assert stored_keys(storage) == before
        held = catalog.db.execute(
            "SELECT count(*) FROM leases WHERE name LIKE 'compact:%'").fetchone()[0]
        assert held == 0
        await svc.stop()

    asyncio.run(main())


def test_an_internal_error_keeps_cors_and_is_counted(tmp_path: Path) -> None:
    config = load({"BOXTRAIL_DATA_DIR": str(tmp_path)})
    tenancy = Tenancy(open_db(tmp_path / "meta.sqlite"))
    key = tenancy.create_project(tenancy.ensure_tenant("t"), "p", []).ingest_key

    class Broken:
        buffer: Any = None

        async def accept(self, batch: RowBatch) -> None:
            raise RuntimeError("a bug after decoding")

    metrics = Registry()
    endpoint = IngestEndpoint(config, tenancy, Broken(), metrics)  # type: ignore[arg-type]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b'{"events": [{"message": "x"}]}',
                "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/ingest",
             "query_string": f"key={key}".encode(),
             "headers": [(b"origin", b"https://box1.example.com"),
                         (b"content-type", b"application/json")]}
    asyncio.run(endpoint.asgi_first(None)(scope, receive, send))  # the served ASGI path
    start = sent[0]
    assert start["status"] == 500
    headers = dict(start["headers"])
    assert headers[b"access-control-allow-origin"] == b"https://box1.example.com"
    assert b'"code":"internal_error"' in sent[1]["body"]
    assert ('boxtrail_ingest_requests_rejected_total{reason="internal_error"} 1'
            in metrics.render())


def _stored_messages(storage: LocalStorage) -> list[tuple[str, int]]:
    out = []
    for key in stored_keys(storage):
        table = pq.read_table(pa.BufferReader(storage.get(key)))
        out += [(key.split("/")[1], m) for m in table["id"].to_pylist()]
    return out


def test_an_acked_batch_the_buffer_cannot_take_is_never_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: the buffer's conversion to Arrow fails for one acknowledged batch.
    Its project's flush waits, the WAL keeps it, the other projects flush, and the next start
    replays it, without storing the others twice."""
    real = buffer_module.to_table

    def to_table(batches: list[RowBatch]) -> pa.Table:
        if any("poison" in b.message for b in batches):
            raise ValueError("injected: this batch cannot become Arrow")
        return real(batches)

    def batch(project: str, box: str, n: int, message: str = "m") -> RowBatch:
        b = rows(box, n)
        b.project_id, b.message = project, [message] * n
        return b

    async def first_life() -> list[int]:
        monkeypatch.setattr(buffer_module, "to_table", to_table)
        svc, storage, _ = service(tmp_path, BOXTRAIL_FLUSH_INTERVAL_S="1000")
        await svc.start()
        acked = []
        for b in (batch("p", "a", 5), batch("q", "a", 5), batch("p", "a", 3, "poison"),
                  batch("q", "b", 4), batch("p", "b", 2)):
            await svc.accept(b)  # the 202: every one of these was acknowledged
            acked += b.ids()
        # Searches of p still answer, without the batch that cannot be converted.
        visible = sum(t.num_rows for t in svc.buffer.snapshot("p"))
        assert visible == 7
        assert await svc.flush() == 9  # q's rows; p's wait in the WAL
        assert svc.buffer.seal_failures > 0
        await svc.stop()  # the final flush cannot write p either
        assert sorted(project for project, _ in _stored_messages(storage)) == ["project=q"] * 9
        return acked

    acked = asyncio.run(first_life())
    monkeypatch.setattr(buffer_module, "to_table", real)  # the bug is fixed; restart

    async def second_life() -> None:
        svc, storage, _ = service_again(tmp_path)
        await svc.start()
        await svc.flush()
        await svc.stop()
        stored = [event_id for _, event_id in _stored_messages(storage)]
        assert sorted(stored) == sorted(acked)  # every acked row once: none lost, none twice

    asyncio.run(second_life())


def service_again(tmp_path: Path) -> tuple[IngestService, FlakyStorage, Catalog]:
    """The service of :func:`service` on the directory it left (a restart)."""
    config = load({"BOXTRAIL_DATA_DIR": str(tmp_path / "data")})
    catalog = Catalog(open_db(tmp_path / "data" / "meta.sqlite"))
    storage = FlakyStorage(str(tmp_path / "objects"))
    return IngestService(config, catalog, storage, Registry()), storage, catalog


def test_a_seal_only_the_whole_of_which_fails_is_sealed_batch_by_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: converting a project's batches together fails (as a column past
    Arrow's 2 GiB did), each alone does not: the seal is made of the pieces, no failure is
    counted, and the flush stores every acked row."""
    real = buffer_module.to_table

    def to_table(batches: list[RowBatch]) -> pa.Table:
        if len(batches) > 1:
            raise pa.ArrowInvalid("injected: offset overflow while concatenating arrays")
        return real(batches)

    async def run() -> None:
        monkeypatch.setattr(buffer_module, "to_table", to_table)
        svc, storage, _ = service(tmp_path, BOXTRAIL_FLUSH_INTERVAL_S="1000")
        await svc.start()
        acked = []
        for box, n in (("a", 5), ("b", 3), ("a", 2)):
            b = rows(box, n)
            await svc.accept(b)
            acked += b.ids()
        svc.buffer.seal()
        assert svc.buffer.seal_failures == 0
        assert await svc.flush() == 10
        await svc.stop()
        assert sorted(event_id for _, event_id in _stored_messages(storage)) == sorted(acked)

    asyncio.run(run())
