"""A closed-loop HTTP/1.1 load generator, run in its own process beside the server.

Each connection keeps exactly one POST in flight on a keep-alive socket, so the rate is
what the server sustains, not what we push. Requests are pre-built bytes and responses
are parsed by hand on uvloop streams: httpx or aiohttp would spend more CPU per request
than the server does, and on a 2-core machine the client shares the box with the server.

    python benchmarks/loadgen.py --url http://127.0.0.1:8780 --path '/v1/ingest?key=K' \\
        --bodies bodies.ndjson [--header 'Content-Type: application/json'] \\
        [--connections 32] [--warmup 2] [--seconds 10] [--max-requests N]

Stdout is JSON lines: ``{"phase": "measure"}`` when the counted window opens,
``{"phase": "done"}`` when it closes (so a parent can sample the server's CPU at
both edges), then ``{"phase": "result", ...}``. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec


class ProtocolError(Exception):
    """The server's response is not HTTP/1.1 we can parse."""


class Ack(msgspec.Struct):
    accepted: int
    rejected: list[msgspec.Raw] = []


ACK_DECODER = msgspec.json.Decoder(Ack)


@dataclass
class Stats:
    """What completed requests started inside the measured window yielded."""

    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    samples: dict[str, str] = field(default_factory=dict)
    accepted: int = 0
    rejected: int = 0
    events_per_200: int = 0

    def record(self, status: int, body: bytes, elapsed_s: float) -> None:
        self.latencies_ms.append(elapsed_s * 1000.0)
        self.statuses[str(status)] += 1
        if status == 200 and self.events_per_200:
            self.accepted += self.events_per_200
        elif status == 202:
            try:
                ack = ACK_DECODER.decode(body)
            except msgspec.DecodeError:
                self.error("bad_ack_body", body.decode(errors="replace"))
                return
            self.accepted += ack.accepted
            self.rejected += len(ack.rejected)
            if ack.rejected:
                self.samples.setdefault("rejected", body[:500].decode(errors="replace"))
        else:
            self.error(f"status_{status}", body.decode(errors="replace"))

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        # One sample per kind is enough to diagnose, and keeps the output small.
        self.samples.setdefault(kind, detail[:500])


@dataclass
class Window:
    """The shared clock: warm-up, then the counted window, bounded in time and count."""

    budget: int
    measuring: bool = False
    stopped: bool = False
    measure_started: float = 0.0

    def take(self) -> bool:
        if self.stopped or self.budget <= 0:
            return False
        self.budget -= 1
        return True


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    timeout_s: float


def build_requests(
    target: Target, path: str, headers: list[str], bodies: list[bytes]
) -> list[bytes]:
    """Whole request messages, built once so the hot loop only writes bytes."""
    lines = [f"Host: {target.host}:{target.port}", *headers]
    if not any(h.lower().startswith("content-type:") for h in headers):
        lines.append("Content-Type: application/json")
    fixed = "".join(f"{line}\r\n" for line in lines)
    return [
        f"POST {path} HTTP/1.1\r\n{fixed}Content-Length: {len(body)}\r\n\r\n".encode() + body
        for body in bodies
    ]


async def read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers expected: the blank line
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """Status, body and whether the connection may be reused."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head[:-4].split(b"\r\n")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ProtocolError(f"bad status line {status_line[:100]!r}")
    status = int(parts[1])
    length: int | None = None
    chunked = False
    keep_alive = parts[0] == b"HTTP/1.1"
    for line in header_lines:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            keep_alive = value.strip().lower() != b"close"
    if chunked:
        return status, await read_chunked(reader), keep_alive
    if length is None:  # delimited by close
        return status, await reader.read(), False
    return status, await reader.readexactly(length), keep_alive


def error_kind(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, asyncio.IncompleteReadError | ConnectionResetError | BrokenPipeError):
        return "closed"
    if isinstance(exc, ProtocolError | ValueError | asyncio.LimitOverrunError):
        return "protocol"
    return "os_error"


async def run_connection(
    target: Target, requests: list[bytes], offset: int, window: Window, stats: Stats
) -> None:
    """One closed loop: send, wait for the whole response, repeat; reconnect when closed."""
    writer: asyncio.StreamWriter | None = None
    reader: asyncio.StreamReader | None = None
    index = offset
    try:
        while window.take():
            if writer is None or reader is None:
                try:
                    async with asyncio.timeout(target.timeout_s):
                        reader, writer = await asyncio.open_connection(target.host, target.port)
                except (OSError, TimeoutError) as exc:
                    stats.error("connect", repr(exc))
                    await asyncio.sleep(0.05)  # a dead server must not become a hot loop
                    continue
            request = requests[index % len(requests)]
            index += 1
            counted = window.measuring
            started = time.perf_counter()
            try:
                async with asyncio.timeout(target.timeout_s):
                    writer.write(request)
                    await writer.drain()
                    status, body, keep_alive = await read_response(reader)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ProtocolError,
                    ValueError, asyncio.LimitOverrunError) as exc:
                if counted:
                    stats.error(error_kind(exc), repr(exc))
                writer.close()
                writer = reader = None
                continue
            if counted:
                stats.record(status, body, time.perf_counter() - started)
            if not keep_alive:
                writer.close()
                writer = reader = None
    finally:
        if writer is not None:
            writer.close()


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty ascending list."""
    rank = math.ceil(q / 100 * len(sorted_values))
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]


def summarize(stats: Stats, duration_s: float, client_cpu_s: float) -> dict[str, Any]:
    values = sorted(stats.latencies_ms)
    requests = len(values)
    # None, not NaN, when nothing completed: NaN is not JSON.
    latency: dict[str, float | None] = dict.fromkeys(("p50", "p90", "p99", "p99.9", "max", "mean"))
    if values:
        latency = {f"p{q:g}": round(percentile(values, q), 3) for q in (50, 90, 99, 99.9)}
        latency["max"] = round(values[-1], 3)
        latency["mean"] = round(sum(values) / requests, 3)
    return {
        "duration_s": round(duration_s, 3),
        "requests": requests,
        "requests_per_s": round(requests / duration_s, 1) if duration_s else 0.0,
        "events_accepted": stats.accepted,
        "events_rejected": stats.rejected,
        "events_per_s": round(stats.accepted / duration_s, 1) if duration_s else 0.0,
        "latency_ms": latency,
        "status_counts": dict(stats.statuses),
        "errors": dict(stats.errors),
        "error_samples": stats.samples,
        "client_cpu_s": round(client_cpu_s, 3),
    }


async def report_progress(window: Window, stats: Stats) -> None:
    last = 0
    while not window.stopped:
        await asyncio.sleep(1.0)
        done = len(stats.latencies_ms)  # only counted requests are recorded
        if done:
            print(f"loadgen: {done - last} req/s", file=sys.stderr, flush=True)
        last = done


async def drive(
    target: Target, requests: list[bytes], connections: int, warmup_s: float, seconds: float,
    max_requests: int, events_per_200: int = 0,
) -> dict[str, Any]:
    window = Window(budget=max_requests)
    stats = Stats(events_per_200=events_per_200)
    spread = max(1, len(requests) // connections)
    workers = [
        asyncio.create_task(run_connection(target, requests, i * spread, window, stats))
        for i in range(connections)
    ]
    progress = asyncio.create_task(report_progress(window, stats))
    all_done = asyncio.gather(*workers)
    await asyncio.wait([all_done], timeout=warmup_s)
    window.measuring = True
    started = time.perf_counter()
    cpu_started = time.process_time()
    emit({"phase": "measure"})
    await asyncio.wait([all_done], timeout=seconds)
    window.stopped = True
    # In-flight requests finish; the timeout bounds a server that stops answering.
    _, pending = await asyncio.wait([all_done], timeout=target.timeout_s + 1)
    if pending:
        all_done.cancel()
        stats.error("cancelled_at_end", f"{sum(not w.done() for w in workers)} connections hung")
    elif all_done.exception() is not None:
        stats.error("loadgen_crash", repr(all_done.exception()))
    duration = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    emit({"phase": "done"})
    progress.cancel()
    return summarize(stats, duration, cpu) | {"connections": connections, "bodies": len(requests)}


def load_bodies(path: Path, base64_lines: bool = False) -> list[bytes]:
    # NDJSON: encoded JSON never holds a raw newline, so one body per line is unambiguous.
    bodies = [line for line in path.read_bytes().split(b"\n") if line.strip()]
    if base64_lines:  # bodies that hold newlines themselves (Sentry envelopes)
        bodies = [base64.b64decode(line) for line in bodies]
    if not bodies:
        raise SystemExit(f"loadgen: no bodies in {path}")
    return bodies


Runner = Callable[[Coroutine[Any, Any, dict[str, Any]]], dict[str, Any]]


def event_loop_runner() -> tuple[Runner, str]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run, "asyncio"
    return uvloop.run, "uvloop"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="closed-loop HTTP/1.1 POST load generator")
    parser.add_argument("--url", required=True, help="http://HOST:PORT")
    parser.add_argument("--path", required=True, help="path and query, e.g. /v1/ingest?key=K")
    parser.add_argument("--bodies", type=Path, required=True, help="NDJSON file, one body a line")
    parser.add_argument("--bodies-base64", action="store_true",
                        help="each line of --bodies is a body in base64")
    parser.add_argument("--events-per-200", type=int, default=0,
                        help="count a 200 as this many accepted events (Sentry's answer says "
                             "no number)")
    parser.add_argument("--header", action="append", default=[], help="'Name: value', repeatable")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds sent but not counted")
    parser.add_argument("--seconds", type=float, default=10.0, help="counted window")
    parser.add_argument("--max-requests", type=int, default=5_000_000, help="total, warm-up incl.")
    parser.add_argument("--timeout", type=float, default=30.0, help="per request and connect")
    args = parser.parse_args(argv)

    url = urlsplit(args.url)
    if url.scheme != "http" or not url.hostname or not url.port:
        parser.error("--url must be http://HOST:PORT")
    target = Target(url.hostname, url.port, args.timeout)
    requests = build_requests(target, args.path, args.header,
                              load_bodies(args.bodies, args.bodies_base64))
    run, loop_name = event_loop_runner()
    result = run(drive(target, requests, args.connections, args.warmup, args.seconds,
                       args.max_requests, args.events_per_200))
    emit({"phase": "result", "loop": loop_name, **result})


if __name__ == "__main__":
    main()
