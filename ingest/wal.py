"""Write-ahead log: accepted batches are durable here before the client hears 202.

Segments are files ``<first lsn>.wal`` of records ``[len u32][crc32 u32][lsn u64]
payload``; the CRC covers the LSN and the payload, so a torn tail (a crash in
mid-write) is recognised and dropped at replay. Appends made while a write+fsync
is in flight are gathered and committed together by one fsync (group commit),
on one thread so the event loop never blocks on the disk. A segment is deleted
once the catalog says every record in it is in Parquet.

The commit loop runs under the node's supervisor (``core.supervisor``). If it dies of
something it does not expect, nothing it held is acknowledged: the batches of the group it
was committing that it had not handed on, and the appends waiting behind it, fail with
:class:`WalError` (a 503 with ``Retry-After``, which the SDKs retry), and appends are
refused the same way until it runs again. Some of those batches may be durable already:
like batches made durable just before a crash, they were never acknowledged, and a retry
may store them a second time. An acknowledged batch is one the loop finished handing on,
so none is lost or answered twice. A loop that keeps dying is what ``/readyz`` reports;
a write that fails (the disk) fails its group alone, as before, and the next group tries.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import struct
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec

from core.metrics import Registry, Summary
from core.schema import RowBatch
from core.supervisor import MAX_BACKOFF_S, Supervisor

log = logging.getLogger("boxtrail.wal")

_HEADER = struct.Struct("<IIQ")
_LSN = struct.Struct("<Q")
_MAX_RECORD = 256 << 20
# close() waits this long for a commit loop that keeps dying to see it (two restarts).
_CLOSE_S = 2 * MAX_BACKOFF_S + 1
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RowBatch)


class WalError(Exception):
    """The WAL could not be written (nothing in the failed group was acknowledged), or at
    start read."""


def encode_record(lsn: int, payload: bytes) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(_LSN.pack(lsn)))
    return _HEADER.pack(len(payload), crc, lsn) + payload


def read_segment(path: Path) -> tuple[list[RowBatch], int, bool]:
    """Records of one segment: (batches, bytes of valid prefix, whether a bad tail was cut).
    A whole record this code cannot decode is a :class:`WalError`, never a tail to cut."""
    data = path.read_bytes()
    batches: list[RowBatch] = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, crc, lsn = _HEADER.unpack_from(data, offset)
        end = offset + _HEADER.size + length
        if length > _MAX_RECORD or end > len(data):
            break
        payload = data[offset + _HEADER.size : end]
        if zlib.crc32(payload, zlib.crc32(_LSN.pack(lsn))) != crc:
            break
        try:
            batch = _decoder.decode(payload)
        except msgspec.DecodeError as exc:
            # Whole (its checksum holds) yet unreadable: written by another version of
            # boxtrail, not torn. Cutting it would drop acknowledged events.
            raise WalError(
                f"WAL record {lsn} in {path} is whole but this version of boxtrail cannot "
                f"read it ({exc}): another version wrote it. Start that version to flush "
                "it; nothing was cut") from None
        batch.lsn = lsn
        batches.append(batch)
        offset = end
    return batches, offset, offset != len(data)


def read_record(path: Path, offset: int, lsn: int) -> bytes | None:
    """The payload of record ``lsn`` at ``offset`` of a segment, checked by its CRC; None
    if the segment is gone (every record in it was flushed) or the record is not there."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("wal: cannot read back record %d from %s: %s", lsn, path.name, exc)
        return None
    try:
        header = os.pread(fd, _HEADER.size, offset)
        length, crc, found = _HEADER.unpack(header) if len(header) == _HEADER.size else (0, 0, -1)
        payload = os.pread(fd, length, offset + _HEADER.size) if (
            found == lsn and length <= _MAX_RECORD) else b""
    except OSError as exc:
        log.warning("wal: cannot read back record %d from %s: %s", lsn, path.name, exc)
        return None
    finally:
        os.close(fd)
    if (found != lsn or len(payload) != length
            or zlib.crc32(payload, zlib.crc32(_LSN.pack(lsn))) != crc):
        log.warning("wal: record %d is not where %s said it was", lsn, path.name)
        return None
    return payload


# Where a record is: its segment and offset (``read_record``).
Place = tuple[Path, int]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_directory(directory: Path) -> int:
    """An exclusive lock on ``directory`` (its open descriptor), or WalError if another
    process holds it."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / "LOCK", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise WalError(f"another process is using {directory}; run one boxtrail server "
                       "per data directory") from None
    return fd


class Wal:
    def __init__(self, directory: Path, segment_bytes: int,
                 durable: Callable[[RowBatch, bytes, Place], None],
                 fsync_seconds: Summary | None = None, *,
                 supervisor: Supervisor | None = None) -> None:
        self.fsync_seconds = fsync_seconds or Summary("wal_fsync_seconds", "")
        # The node's (boxtrail.app); a WAL made alone (tests) has one of its own.
        self.supervisor = supervisor or Supervisor(Registry())
        self.directory = directory
        self.segment_bytes = segment_bytes
        # Called with each batch once durable, its payload and where its record is, in WAL
        # order, before the batch's append returns (ingest.service: what follows a commit).
        self.durable = durable
        self.next_lsn = 1
        self.torn_records = 0
        self.bytes = 0  # bytes of live segments, for /metrics
        self._fd = -1
        self._segment_size = 0
        self._segments: list[tuple[int, Path]] = []  # (first lsn, path), oldest first
        self._pending: list[tuple[bytes, RowBatch, asyncio.Future[None]]] = []
        # The group being committed, and how many of its batches were handed on and
        # acknowledged: what a commit loop that died leaves to settle (_died).
        self._group: list[tuple[bytes, RowBatch, asyncio.Future[None]]] = []
        self._handed = 0
        self._down = False  # the commit loop died and is not running again yet
        self._wake = asyncio.Event()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="wal")
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._lock_fd = -1
        self.epoch = ""  # set by replay
        self._written_lsn = 0  # the last record written (to the newest segment)

    # Start: replay what the catalog has not seen, then open a fresh segment.

    def replay(self, flushed_lsn: int, lsn_floor: int = 0) -> list[RowBatch]:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock()
        self.epoch = self._epoch()
        for part in self.directory.glob("*.wal.part"):
            part.unlink()
        found = sorted((int(p.name.split(".")[0]), p) for p in self.directory.glob("*.wal"))
        replayed: list[RowBatch] = []
        last_lsn = max(flushed_lsn, lsn_floor)  # new LSNs go above both
        for first, path in found:
            batches, valid, torn = read_segment(path)
            if torn:
                # Cut it so that a segment reopened under the same name (its first
                # record never became durable) does not put new records after garbage.
                self.torn_records += 1
                log.warning("wal: %s ends in a torn or corrupt record; dropped it", path.name)
                with path.open("r+b") as f:
                    f.truncate(valid)
                    os.fsync(f.fileno())
            for batch in batches:
                last_lsn = max(last_lsn, batch.lsn)
                self._written_lsn = max(self._written_lsn, batch.lsn)
                if batch.lsn > flushed_lsn:
                    replayed.append(batch)
            self._segments.append((first, path))
            self.bytes += path.stat().st_size
        self.next_lsn = last_lsn + 1
        replayed.sort(key=lambda b: b.lsn)
        return replayed

    def _epoch(self) -> str:
        """This WAL's identity, made with the directory: a node restarted on its volume
        keeps it; one given an empty volume (its disk lost) gets a new one, and its peers
        then let go of what they held of the old (``cluster.bus``)."""
        path = self.directory / "EPOCH"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            pass
        epoch = os.urandom(8).hex()
        temp = path.with_suffix(".tmp")
        with temp.open("w") as f:
            f.write(epoch + "\n")
            f.flush()
            os.fsync(f.fileno())
        temp.replace(path)
        _fsync_dir(self.directory)
        return epoch

    async def start(self) -> None:
        self._task = self.supervisor.start("wal-commit", self._commit_loop,
                                           on_death=self._died)

    def _lock(self) -> None:
        """Hold the directory for this process: two servers on one data directory would
        hand out the same LSNs and retire each other's segments. The kernel lets go when
        the process ends, however it ends."""
        self._lock_fd = lock_directory(self.directory)

    # Appending.

    def append(self, batch: RowBatch) -> asyncio.Future[None]:
        """Queue a batch; the future resolves once it is fsynced and in the buffer."""
        if self._closing:
            raise WalError("the WAL is closing")
        if self._down:
            raise WalError("the WAL's commit loop failed and is restarting")
        batch.lsn = self.next_lsn
        self.next_lsn += 1
        # Framing and the CRC are done on the WAL thread (zlib releases the GIL there).
        payload = _encoder.encode(batch)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((payload, batch, future))
        self._wake.set()
        return future

    async def _commit_loop(self) -> None:
        loop = asyncio.get_running_loop()
        self._down = False
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._pending:
                if self._closing:
                    return
                continue
            group, self._pending = self._pending, []
            self._group, self._handed = group, 0
            first_lsn = group[0][1].lsn
            payloads = [(batch.lsn, payload) for payload, batch, _ in group]
            try:
                written, segment, offset = await loop.run_in_executor(
                    self._thread, self._write, first_lsn, payloads)
            except Exception as exc:
                log.error("wal: write failed, %d batches not acknowledged: %s", len(group), exc)
                for _, _, future in group:
                    if not future.done():
                        future.set_exception(WalError(str(exc)))
                self._group = []
                continue
            self.bytes += written
            for payload, batch, future in group:
                try:
                    self.durable(batch, payload, (segment, offset))
                except Exception:
                    # The batch is durable and replays at the next start; one failure here
                    # must not end this loop and leave every later append waiting forever.
                    log.exception("wal: batch %d is durable but could not be handed on",
                                  batch.lsn)
                offset += _HEADER.size + len(payload)
                if not future.done():
                    future.set_result(None)
                self._handed += 1
            self._group = []
            if self._pending:
                self._wake.set()

    def _died(self) -> None:
        """The commit loop died (the supervisor restarts it): refuse what it held and
        what waits behind it, and new appends until it runs again. A batch counts as
        acknowledged only once it was handed on (``_handed``): the one it died handing on
        may be in the buffer already, and is refused all the same, as a batch made
        durable just before a crash is (its retry may be stored as well)."""
        self._down = True
        unsettled = self._group[self._handed:] + self._pending
        self._group, self._pending = [], []
        for _, batch, future in unsettled:
            if not future.done():
                future.set_exception(WalError(
                    f"the WAL's commit loop failed; batch {batch.lsn} not acknowledged"))
        if unsettled:
            log.error("wal: the commit loop failed; %d batches not acknowledged",
                      len(unsettled))

    def _write(self, first_lsn: int, payloads: list[tuple[int, bytes]]
               ) -> tuple[int, Path, int]:
        """Write and fsync the records; (bytes written, the segment, where they start)."""
        data = b"".join([encode_record(lsn, payload) for lsn, payload in payloads])
        if self._fd < 0 or self._segment_size >= self.segment_bytes:
            self._open_segment(first_lsn)
        start = self._segment_size
        try:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            started = time.perf_counter()
            os.fdatasync(self._fd)
            self.fsync_seconds.observe(time.perf_counter() - started)
        except OSError:
            # Cut the partial group so later records do not follow garbage; if even
            # that fails, the next group goes to a new segment.
            try:
                os.ftruncate(self._fd, start)
                os.fdatasync(self._fd)
            except OSError:
                os.close(self._fd)
                self._fd = -1
            raise
        self._segment_size = start + len(data)
        self._written_lsn = payloads[-1][0]
        return len(data), self._segments[-1][1], start

    def _open_segment(self, first_lsn: int) -> None:
        if self._fd >= 0:
            # Forget the number before anything can fail: a closed descriptor kept here
            # would be closed (or written) again once the process reuses its number.
            fd, self._fd = self._fd, -1
            os.close(fd)
        path = self.directory / f"{first_lsn:020d}.wal"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            if not self._segments or self._segments[-1][1] != path:
                self._segments.append((first_lsn, path))
            _fsync_dir(self.directory)
            self._segment_size = os.fstat(fd).st_size
        except OSError:
            os.close(fd)
            raise
        self._fd = fd

    # Retiring.

    async def retire(self, flushed_lsn: int, *, current: bool = False) -> int:
        """Delete segments whose every record is at or below ``flushed_lsn``; return how many.
        With ``current``, the segment being written too, if that holds for it (a deletion:
        no record of the rows it erased may stay); the next write opens a new one.

        On the WAL's thread: unlinking a 64 MB file takes ~20 ms, and the segment list
        is shared with segment rotation there.
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._retire, flushed_lsn, current)

    def _retire(self, flushed_lsn: int, current: bool = False) -> int:
        removed = 0
        # A segment ends where the next begins; the newest one is still being written.
        while len(self._segments) > 1 and self._segments[1][0] - 1 <= flushed_lsn:
            path = self._segments[0][1]
            try:
                size = path.stat().st_size
                path.unlink()
                self.bytes -= size
            except FileNotFoundError:
                pass
            except OSError as exc:
                # The flush that called this is published already; the segment stays
                # listed and is retired by the next one (replay skips what it covers).
                log.warning("wal: could not delete %s, will retry: %s", path.name, exc)
                break
            self._segments.pop(0)
            removed += 1
        if (current and len(self._segments) == 1 and self._written_lsn <= flushed_lsn
                and not self._closing):
            if self._fd >= 0:
                fd, self._fd = self._fd, -1
                os.close(fd)
            path = self._segments[0][1]
            with contextlib.suppress(FileNotFoundError):
                self.bytes -= path.stat().st_size
                path.unlink()
                _fsync_dir(self.directory)
            self._segments.pop()
            self._segment_size = 0
            removed += 1
        return removed

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        if self._task is not None:
            # A commit loop that keeps dying would never see the close.
            done, _ = await asyncio.wait({self._task}, timeout=_CLOSE_S)
            if not done:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
                self._died()
        self._thread.shutdown(wait=True)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # lets go of the flock
            self._lock_fd = -1
