"""The WAL on its own: group commit, replay, torn tails, retiring segments."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from core.schema import RowBatch
from ingest.wal import Place, Wal, WalError, encode_record, read_record, read_segment


def batch(n: int, project: str = "p") -> RowBatch:
    return RowBatch(project_id=project, box=None, session_id=None, release=None,
                    user_agent=None, sdk=None, debug_ids=None, received=1, id_start=n,
                    ts=[n], level=["info"], message=[f"m{n}"], url=[None], attrs=[None],
                    error_type=[None], error_message=[None], error_stack=[None],
                    truncated=[None])


async def write(directory: Path, numbers: range, segment_bytes: int = 1 << 20,
                flushed: int = 0) -> tuple[list[RowBatch], list[RowBatch], Wal]:
    durable: list[RowBatch] = []
    wal = Wal(directory, segment_bytes, lambda b, *_: durable.append(b))
    replayed = wal.replay(flushed)
    await wal.start()
    await asyncio.gather(*(wal.append(batch(n)) for n in numbers))
    await wal.close()
    return durable, replayed, wal


def test_appends_are_durable_in_order_and_replayed(tmp_path: Path) -> None:
    durable, _, _wal = asyncio.run(write(tmp_path, range(100)))
    assert [b.lsn for b in durable] == list(range(1, 101))
    assert [b.message[0] for b in durable] == [f"m{n}" for n in range(100)]
    _, replayed, _ = asyncio.run(write(tmp_path, range(0)))
    assert [b.message[0] for b in replayed] == [f"m{n}" for n in range(100)]
    # Records the catalog has flushed are not replayed; new records continue the LSNs.
    durable, replayed, _ = asyncio.run(write(tmp_path, range(100, 101), flushed=60))
    assert [b.lsn for b in replayed] == list(range(61, 101))
    assert durable[0].lsn == 101


def test_group_commit_takes_one_write_for_many_appends(tmp_path: Path) -> None:
    writes = 0

    async def main() -> None:
        nonlocal writes
        wal = Wal(tmp_path, 1 << 20, lambda *_: None)
        wal.replay(0)
        original = wal._write

        def counting(first_lsn: int, payloads: list[tuple[int, bytes]]) -> int:
            nonlocal writes
            writes += 1
            return original(first_lsn, payloads)

        wal._write = counting  # type: ignore[method-assign]
        await wal.start()
        await asyncio.gather(*(wal.append(batch(n)) for n in range(500)))
        await wal.close()

    asyncio.run(main())
    assert 1 <= writes <= 3


def test_torn_tail_is_dropped_and_cut(tmp_path: Path) -> None:
    asyncio.run(write(tmp_path, range(10)))
    [segment] = list(tmp_path.glob("*.wal"))
    size = segment.stat().st_size
    with segment.open("r+b") as f:  # a crash in the middle of the last record
        f.truncate(size - 7)
    batches, valid, torn = read_segment(segment)
    assert torn and len(batches) == 9
    _durable, replayed, wal = asyncio.run(write(tmp_path, range(10, 12)))
    assert wal.torn_records == 1
    assert len(replayed) == 9 and segment.stat().st_size == valid  # the torn bytes are cut
    assert len(list(tmp_path.glob("*.wal"))) == 2  # new records went to a new segment
    _, replayed, _ = asyncio.run(write(tmp_path, range(0)))
    assert [b.message[0] for b in replayed] == [f"m{n}" for n in (*range(9), 10, 11)]


def test_corrupt_byte_stops_replay_at_that_record(tmp_path: Path) -> None:
    asyncio.run(write(tmp_path, range(10)))
    [segment] = list(tmp_path.glob("*.wal"))
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    batches, _, torn = read_segment(segment)
    assert torn and 0 < len(batches) < 10
    assert [b.lsn for b in batches] == list(range(1, len(batches) + 1))


def test_a_whole_record_another_version_wrote_stops_the_start_and_is_not_cut(
        tmp_path: Path) -> None:
    """A record whose checksum holds but that does not decode (here a field of another
    type than this code knows: a new field at the end would decode) is no torn tail:
    cutting it would drop acknowledged events. The start refuses, saying which record, and
    the segment stays as it was."""
    asyncio.run(write(tmp_path, range(3)))
    [segment] = list(tmp_path.glob("*.wal"))
    fields = msgspec.to_builtins(batch(3))
    fields[RowBatch.__struct_fields__.index("received")] = {"ms": 1}  # was an int
    newer = msgspec.msgpack.encode(fields)
    with segment.open("ab") as f:
        f.write(encode_record(4, newer))
    before = segment.read_bytes()
    for read in (lambda: read_segment(segment),
                 lambda: Wal(tmp_path, 1 << 20, lambda *_: None).replay(0)):
        with pytest.raises(WalError, match=r"record 4 .* cannot read it"):
            read()
    assert segment.read_bytes() == before


def test_segments_rotate_and_retire(tmp_path: Path) -> None:
    async def main() -> int:
        wal = Wal(tmp_path, 1, lambda *_: None)  # tiny segments: one per record
        wal.replay(0)
        await wal.start()
        for n in range(6):
            await wal.append(batch(n))
        segments = sorted(tmp_path.glob("*.wal"))
        assert [int(p.name.split(".")[0]) for p in segments] == [1, 2, 3, 4, 5, 6]
        retired = await wal.retire(3)
        await wal.close()
        return retired

    assert asyncio.run(main()) == 3
    left = sorted(tmp_path.glob("*.wal"))
    assert [int(p.name.split(".")[0]) for p in left] == [4, 5, 6]
    # Whatever is left still replays everything after LSN 3.
    fresh = Wal(tmp_path, 1, lambda *_: None)
    assert [b.lsn for b in fresh.replay(3)] == [4, 5, 6]


def test_a_failed_rotation_keeps_no_closed_descriptor(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """When opening the next segment fails, the old segment's closed descriptor is not
    kept: its number is soon another file's, which a later rotation would close or write."""
    import os

    real_open = os.open
    fail = {"next": False}

    def flaky_open(path, flags, mode=0o777):  # type: ignore[no-untyped-def]
        if fail["next"] and str(path).endswith(".wal"):
            fail["next"] = False
            raise OSError(24, "Too many open files")
        return real_open(path, flags, mode)

    async def main() -> None:
        wal = Wal(tmp_path / "wal", 1, lambda *_: None)  # every group rotates
        wal.replay(0)
        await wal.start()
        await wal.append(batch(1))
        monkeypatch.setattr(os, "open", flaky_open)
        fail["next"] = True
        try:
            await wal.append(batch(2))
        except Exception as exc:
            assert "Too many open files" in str(exc)
        else:
            raise AssertionError("the append should have failed")
        # The freed number goes to somebody else's file...
        other_path = tmp_path / "other"
        other = real_open(other_path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            await wal.append(batch(3))  # ...which this rotation must neither close nor write
            os.write(other, b"mine")
            assert other_path.read_bytes() == b"mine"
        finally:
            os.close(other)
        await wal.close()

    asyncio.run(main())
    replayed = Wal(tmp_path / "wal", 1 << 20, lambda *_: None).replay(0)
    assert [b.message[0] for b in replayed] == ["m1", "m3"]


def test_a_batch_that_cannot_be_applied_does_not_stop_the_wal(tmp_path: Path) -> None:
    applied: list[int] = []

    def apply(b: RowBatch, *_: object) -> None:
        if b.message[0] == "m2":
            raise MemoryError("no room")
        applied.append(b.lsn)

    async def main() -> None:
        wal = Wal(tmp_path, 1 << 20, apply)
        wal.replay(0)
        await wal.start()
        # All three are durable, so all three are acknowledged; later appends still are.
        await asyncio.wait_for(asyncio.gather(*(wal.append(batch(n)) for n in (1, 2, 3))), 5)
        await asyncio.wait_for(wal.append(batch(4)), 5)
        await wal.close()

    asyncio.run(main())
    assert applied == [1, 3, 4]
    assert [b.message[0] for b in Wal(tmp_path, 1 << 20, lambda *_: None).replay(0)] == [
        "m1", "m2", "m3", "m4"]


def test_one_process_per_wal_directory(tmp_path: Path) -> None:
    from ingest.wal import WalError

    async def main() -> None:
        first = Wal(tmp_path, 1 << 20, lambda *_: None)
        first.replay(0)
        await first.start()
        second = Wal(tmp_path, 1 << 20, lambda *_: None)
        try:
            second.replay(0)
        except WalError as exc:
            assert "another process" in str(exc)
        else:
            raise AssertionError("a second WAL on the same directory was allowed")
        await first.close()
        third = Wal(tmp_path, 1 << 20, lambda *_: None)  # free again once closed
        third.replay(0)
        await third.start()
        await third.close()

    asyncio.run(main())


def test_a_segment_that_cannot_be_deleted_is_retired_later(tmp_path: Path,
                                                           monkeypatch) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        wal = Wal(tmp_path, 1, lambda *_: None)  # one segment per group
        wal.replay(0)
        await wal.start()
        for n in range(1, 4):
            await wal.append(batch(n))
        real_unlink = Path.unlink

        def refusing(self: Path, missing_ok: bool = False) -> None:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(Path, "unlink", refusing)
        assert await wal.retire(3) == 0  # no error for the flush that asked
        monkeypatch.setattr(Path, "unlink", real_unlink)
        assert await wal.retire(3) == 2
        assert len(list(tmp_path.glob("*.wal"))) == 1
        await wal.close()

    asyncio.run(main())


def test_a_record_is_read_back_where_the_wal_said_it_is(tmp_path: Path) -> None:
    """What the bus reads back when another node asks for a batch it sent bare: the
    payload at the place the commit gave, over segment rotations; nothing (not garbage)
    for a wrong LSN, a damaged record or a segment that is gone."""
    handed: list[tuple[int, bytes, Place]] = []

    async def main() -> None:
        # Small segments: records span several.
        wal = Wal(tmp_path, 1024, lambda b, payload, place: handed.append((b.lsn, payload, place)))
        wal.replay(0)
        await wal.start()
        for group in range(20):  # groups of several records, each group one write
            await asyncio.gather(*(wal.append(batch(group * 10 + n)) for n in range(7)))
        await wal.close()

    asyncio.run(main())
    assert len({place[0] for _, _, place in handed}) > 3
    for lsn, payload, (segment, offset) in handed:
        assert read_record(segment, offset, lsn) == payload
        assert msgspec.msgpack.decode(payload, type=RowBatch).lsn == lsn
    lsn, payload, (segment, offset) = handed[30]
    assert read_record(segment, offset, lsn + 1) is None
    data = bytearray(segment.read_bytes())
    data[offset + 20] ^= 0xFF
    segment.write_bytes(bytes(data))
    assert read_record(segment, offset, lsn) is None
    segment.unlink()
    assert read_record(segment, offset, lsn) is None


def test_a_commit_loop_that_dies_acknowledges_only_what_it_handed_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit loop dies in the middle of a group (its handler of a failed apply
    raises: nobody listed that): the batch it had handed on is acknowledged, the one it
    died on and the rest are refused, as are appends until it runs again; it is restarted
    and counted, and every batch is in the WAL once."""
    from core.metrics import Registry
    from core.supervisor import Supervisor
    from ingest import wal as wal_module
    from ingest.wal import WalError

    applied: list[int] = []

    def apply(b: RowBatch, *_: object) -> None:
        if b.message[0] == "m2":
            raise ValueError("cannot apply")
        applied.append(b.lsn)

    def broken_handler(*_: object, **__: object) -> None:
        raise RuntimeError("the handler fails too")

    registry = Registry()

    async def main() -> None:
        wal = Wal(tmp_path, 1 << 20, apply, supervisor=Supervisor(registry))
        wal.replay(0)
        await wal.start()
        with monkeypatch.context() as patched:
            patched.setattr(wal_module.log, "exception", broken_handler)
            results = await asyncio.wait_for(asyncio.gather(
                *(wal.append(batch(n)) for n in (1, 2, 3)), return_exceptions=True), 5)
        assert results[0] is None
        assert [type(r) for r in results[1:]] == [WalError, WalError]
        with pytest.raises(WalError, match="restarting"):  # down until it runs again
            wal.append(batch(9))
        deadline = asyncio.get_running_loop().time() + 5
        while True:
            try:
                await asyncio.wait_for(wal.append(batch(4)), 5)
                break
            except WalError:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
        await wal.close()

    asyncio.run(main())
    assert applied == [1, 4]  # the refused append took no LSN
    text = registry.render()
    assert 'boxtrail_task_deaths_total{task="wal-commit"} 1' in text
    assert 'boxtrail_task_restarts_total{task="wal-commit"} 1' in text
    # 2 and 3 were durable when the loop died, unacknowledged: a crash then would have
    # replayed them too (a retry may store them again, never an acknowledged row twice).
    assert [b.message[0] for b in Wal(tmp_path, 1 << 20, lambda *_: None).replay(0)] == [
        "m1", "m2", "m3", "m4"]
