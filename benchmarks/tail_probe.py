"""Live-tail latency: SSE subscribers and a paced ingest sender in one asyncio process.

    python benchmarks/tail_probe.py --url http://127.0.0.1:8780 --api-key btk_... \\
        --project tail --ingest-key bti_... [--subscribers 10] [--rate 10000] \\
        [--batch 100] [--seconds 10] [--warmup 2] [--drain 10] [--query checkout]

The subscribers open ``GET /v1/projects/{project}/tail`` and wait for their headers; then
the sender posts one batch every ``batch / rate`` seconds (open loop: a slow answer does
not delay the next send, it takes another connection). Every event's message names its
batch and index, so each delivered row is timed from its batch's send and from its 202
on one clock (``time.monotonic`` in this process). Rows of the first ``warmup`` seconds
are delivered but not counted. Parsing is by hand on raw streams (one regex over the
bytes read), so the client stays cheap beside the server on a small machine.

Stdout is JSON lines: ``{"phase": "measure"}`` when the counted sending starts,
``{"phase": "done"}`` when it ends (a parent samples the server's CPU at both), then
``{"phase": "result", ...}``. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import sys
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, urlsplit

import msgspec
import numpy as np
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

from benchmarks.loadgen import read_response

MARKER = re.compile(rb"tail probe (\d+) (\d+) ")
DROPPED = re.compile(rb"event: ?dropped")
UNSENT = float("nan")
IDLE_REUSE_S = 3.0  # uvicorn closes keep-alive connections idle for 5 s
SLOW_202_S = 0.1


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def log(message: str) -> None:
    print(f"tail_probe: {message}", file=sys.stderr, flush=True)


@dataclass
class Subscriber:
    index: int
    total_events: int
    status: int = 0
    error: str | None = None
    batches: array[int] = field(default_factory=lambda: array("q"))
    times: array[float] = field(default_factory=lambda: array("d"))
    duplicates: int = 0
    dropped_notices: int = 0
    log_events: int = 0  # "event: log" lines
    markers: int = 0  # of which this probe's rows, parsed
    seen: bytearray = field(init=False)

    def __post_init__(self) -> None:
        self.seen = bytearray(self.total_events)

    def record(self, block: bytes, batch_size: int, now: float) -> None:
        self.log_events += block.count(b"event: log")
        for match in MARKER.finditer(block):
            self.markers += 1
            batch, index = int(match.group(1)), int(match.group(2))
            slot = batch * batch_size + index
            if slot >= self.total_events:
                continue
            if self.seen[slot]:
                self.duplicates += 1
                continue
            self.seen[slot] = 1
            self.batches.append(batch)
            self.times.append(now)
        self.dropped_notices += len(DROPPED.findall(block))


class TailStream(asyncio.Protocol):
    """One SSE subscription. A protocol rather than a stream reader: ``data_received``
    does the parsing at once, without a task wake-up per read (about half the CPU here)."""

    def __init__(self, sub: Subscriber, request: bytes, batch_size: int) -> None:
        self.sub = sub
        self.request = request
        self.batch_size = batch_size
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.head = b""
        self.rest = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if not self.opened.done():
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            self.sub.status = int(self.head.split(b" ", 2)[1])
            data, self.head = self.head[end + 4:], b""
            if self.sub.status != 200:
                self.sub.error = f"tail answered {self.sub.status}: {data[:300]!r}"
            self.opened.set_result(None)
        # The body is chunked, one chunk per SSE message (Litestar sends each message as
        # one ASGI body, uvicorn frames each as one chunk), so the chunk-size lines fall
        # between messages and the markers can be searched in the raw bytes, cut at a line
        # end. Were a message ever split, its row would count as unparsed, not pass unseen.
        data = self.rest + data
        cut = data.rfind(b"\n") + 1
        if cut:
            self.sub.record(data[:cut], self.batch_size, now)
        self.rest = data[cut:]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.sub.error is None:
            self.sub.error = f"the server closed the tail ({exc!r})"
        if not self.opened.done():
            self.opened.set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def subscribe(sub: Subscriber, host: str, port: int, path: str, api_key: str,
                    batch_size: int) -> TailStream:
    request = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
               f"Authorization: Bearer {api_key}\r\nAccept: text/event-stream\r\n\r\n").encode()
    stream = TailStream(sub, request, batch_size)
    try:
        await asyncio.get_running_loop().create_connection(lambda: stream, host, port)
        await asyncio.wait_for(stream.opened, 10)
    except (OSError, TimeoutError) as exc:
        sub.error = f"could not open the tail: {exc!r}"
    return stream


@dataclass
class Sender:
    host: str
    port: int
    path: str
    batch: int
    batches: int
    timeout_s: float
    max_connections: int
    send_t: array[float] = field(init=False)
    ack_t: array[float] = field(init=False)
    lag_s: array[float] = field(default_factory=lambda: array("d"))
    statuses: Counter[str] = field(default_factory=Counter)
    samples: dict[str, str] = field(default_factory=dict)
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = field(
        default_factory=list)
    connections: int = 0
    accepted: int = 0
    started: float = 0.0

    def __post_init__(self) -> None:
        self.send_t = array("d", [UNSENT] * self.batches)
        self.ack_t = array("d", [UNSENT] * self.batches)

    def body(self, k: int) -> bytes:
        now_ms = int(time.time() * 1000)
        events = [{"ts": now_ms, "level": "info",
                   "message": f"tail probe {k} {i} checkout step {i % 7} rendered"}
                   for i in range(self.batch)]
        return msgspec.json.encode({"context": {"boxId": "tailprobe"}, "events": events})

    async def connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        while self.idle:
            reader, writer, used = self.idle.pop()
            if time.monotonic() - used < IDLE_REUSE_S:
                return reader, writer
            writer.close()  # the server may be closing it right now
            self.connections -= 1
        if self.connections >= self.max_connections:
            return None
        self.connections += 1
        return await asyncio.open_connection(self.host, self.port)

    async def send(self, k: int) -> None:
        if (conn := await self.connection()) is None:
            self.statuses["not_sent_all_connections_busy"] += 1
            return
        reader, writer = conn
        body = self.body(k)
        request = (f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                   ).encode() + body
        self.send_t[k] = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout_s):
                writer.write(request)
                await writer.drain()
                status, answer, keep_alive = await read_response(reader)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            self.statuses["error"] += 1
            self.samples.setdefault("error", repr(exc))
            writer.close()
            self.connections -= 1
            return
        self.statuses[str(status)] += 1
        if status == 202:
            self.ack_t[k] = time.monotonic()
            self.accepted += int(json.loads(answer)["accepted"])
        else:
            self.samples.setdefault(str(status), answer[:300].decode(errors="replace"))
        if keep_alive:
            self.idle.append((reader, writer, time.monotonic()))
        else:
            writer.close()
            self.connections -= 1

    async def run(self, interval_s: float, warmup_batches: int) -> None:
        tasks = []
        start = self.started = time.monotonic()
        for k in range(self.batches):
            if k == warmup_batches:
                emit({"phase": "measure"})
            due = start + k * interval_s
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            self.lag_s.append(time.monotonic() - due)
            tasks.append(asyncio.create_task(self.send(k)))
            if k and k % max(1, round(1 / interval_s)) == 0:
                log(f"sent {k}/{self.batches} batches")
        await asyncio.gather(*tasks)
        emit({"phase": "done"})

    def close(self) -> None:
        for _, writer, _ in self.idle:
            writer.close()


def pct(values: np.ndarray, q: float) -> float | None:
    """Nearest-rank percentile in ms, None when empty."""
    if not len(values):
        return None
    ordered = np.sort(values)
    rank = min(max(math.ceil(q / 100 * len(ordered)), 1), len(ordered))
    return round(float(ordered[rank - 1]) * 1000, 2)


def latency(values: np.ndarray) -> dict[str, float | None]:
    out = {f"p{q:g}": pct(values, q) for q in (50, 90, 99, 99.9)}
    out["max"] = round(float(values.max()) * 1000, 2) if len(values) else None
    return out


def summarize(args: argparse.Namespace, subs: list[Subscriber], sender: Sender,
              warmup_batches: int, duration_s: float, drain_s: float, cpu_s: float
              ) -> dict[str, Any]:
    send_t = np.frombuffer(sender.send_t, dtype=np.float64)
    ack_t = np.frombuffer(sender.ack_t, dtype=np.float64)
    counted = np.arange(sender.batches) >= warmup_batches
    acked = counted & ~np.isnan(ack_t)
    expected = int(acked.sum()) * args.batch
    from_ack, from_send, per_sub = [], [], []
    for sub in subs:
        batches = np.frombuffer(sub.batches, dtype=np.int64)
        times = np.frombuffer(sub.times, dtype=np.float64)
        keep = acked[batches] if len(batches) else np.zeros(0, dtype=bool)
        from_ack.append(times[keep] - ack_t[batches[keep]])
        from_send.append(times[keep] - send_t[batches[keep]])
        seen = np.frombuffer(bytes(sub.seen), dtype=np.uint8).reshape(-1, args.batch)
        delivered = int(seen[acked].sum())
        per_sub.append({"delivered": delivered, "missing": expected - delivered,
                        "duplicates": sub.duplicates, "dropped_notices": sub.dropped_notices,
                        "unparsed": sub.log_events - sub.markers,
                        "status": sub.status, **({"error": sub.error} if sub.error else {})})
    ack_all = np.concatenate(from_ack) if from_ack else np.zeros(0)
    send_all = np.concatenate(from_send) if from_send else np.zeros(0)
    ingest_ms = (ack_t - send_t)[acked]
    lag = np.frombuffer(sender.lag_s, dtype=np.float64)
    return {
        "subscribers": len(subs),
        "rate_target_events_per_s": args.rate,
        "rate_achieved_events_per_s": round(int(acked.sum()) * args.batch / args.seconds, 1),
        "counted_seconds": args.seconds,
        "expected_rows_per_subscriber": expected,
        "delivered_rows": int(sum(s["delivered"] for s in per_sub)),
        "missing_rows": int(sum(s["missing"] for s in per_sub)),
        "duplicate_rows": int(sum(s["duplicates"] for s in per_sub)),
        "dropped_notices": int(sum(s["dropped_notices"] for s in per_sub)),
        "unparsed_rows": int(sum(s["unparsed"] for s in per_sub)),
        "latency_from_202_ms": latency(ack_all),
        "latency_from_send_ms": latency(send_all),
        # Rows can reach a subscriber before their own 202 reaches the sender.
        "delivered_before_202_share": round(float((ack_all < 0).mean()), 4)
        if len(ack_all) else None,
        "ingest_202_ms": latency(ingest_ms),
        # Seconds into the run of the sends whose 202 took over 100 ms: a period points
        # at a background job (flushes run every BOXTRAIL_FLUSH_INTERVAL_S).
        "slow_202_at_s": sorted({round(float(t - sender.started), 1) for t in
                                 send_t[acked][(ack_t - send_t)[acked] > SLOW_202_S]})[:40],
        "send_lag_ms": latency(lag),
        "ingest_statuses": dict(sender.statuses),
        "ingest_error_samples": sender.samples,
        "sender_connections": sender.connections,
        "per_subscriber": per_sub,
        "duration_s": round(duration_s, 2),
        "drain_s": round(drain_s, 2),
        "client_cpu_s": round(cpu_s, 2),
    }


async def probe(args: argparse.Namespace) -> dict[str, Any]:
    url = urlsplit(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    batches = round((args.warmup + args.seconds) * args.rate / args.batch)
    warmup_batches = round(args.warmup * args.rate / args.batch)
    total_events = batches * args.batch
    subs = [Subscriber(i, total_events) for i in range(args.subscribers)]
    tail_path = f"/v1/projects/{quote(args.project, safe='')}/tail"
    if args.query:  # every row of this probe matches "checkout"
        tail_path += f"?query={quote(args.query, safe='')}"
    streams = await asyncio.gather(*(subscribe(s, host, port, tail_path, args.api_key,
                                               args.batch) for s in subs))
    failed = [s.error for s in subs if s.error]
    if failed:
        for stream in streams:
            stream.close()
        raise SystemExit(f"tail_probe: {len(failed)} tails failed to open: {failed[0]}")
    log(f"{len(subs)} tails open; sending {args.rate:g} events/s in batches of {args.batch} "
        f"for {args.warmup:g} + {args.seconds:g} s")
    sender = Sender(host, port, f"/v1/ingest?key={quote(args.ingest_key, safe='')}",
                    args.batch, batches, args.timeout, args.max_connections)
    cpu0, started = time.process_time(), time.monotonic()
    await sender.run(args.batch / args.rate, warmup_batches)
    sent_done = time.monotonic()
    acked = [k for k in range(batches) if not math.isnan(sender.ack_t[k])]
    last = acked[-1] * args.batch if acked else 0
    deadline = sent_done + args.drain
    while time.monotonic() < deadline:
        if all(s.error or all(s.seen[last:last + args.batch]) for s in subs):
            break
        await asyncio.sleep(0.02)
    drain_s = time.monotonic() - sent_done
    cpu = time.process_time() - cpu0
    errors = [s.error for s in subs]  # before closing: what went wrong while measuring
    for stream in streams:
        stream.close()
    for sub, error in zip(subs, errors, strict=True):
        sub.error = error
    sender.close()
    return summarize(args, subs, sender, warmup_batches, sent_done - started, drain_s, cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--ingest-key", required=True)
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--rate", type=float, default=10_000, help="events per second")
    parser.add_argument("--batch", type=int, default=100, help="events per request")
    parser.add_argument("--seconds", type=float, default=10.0, help="counted sending")
    parser.add_argument("--warmup", type=float, default=2.0, help="uncounted sending first")
    parser.add_argument("--drain", type=float, default=10.0,
                        help="seconds to wait for the last rows after sending")
    parser.add_argument("--timeout", type=float, default=10.0, help="per ingest request")
    parser.add_argument("--max-connections", type=int, default=64)
    parser.add_argument("--query", default="", help="the tails' search query; empty: none")
    args = parser.parse_args(argv)
    emit({"phase": "result", **uvloop.run(probe(args))})  # the server's loop, too
    return 0


if __name__ == "__main__":
    sys.exit(main())
