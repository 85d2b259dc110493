"""A TCP proxy on 127.0.0.1 that injects partial failures between one node and one engine.

A full outage (the engine stopped) is what tests/cluster/test_cluster_outage.py covers; what it
cannot show is a link that fails while the engine, and every other node, are fine. One
proxy sits on each node x engine link, and the test switches its mode:

- ``heal()``: bytes pass both ways.
- ``reset()``: every open connection gets an RST (SO_LINGER 0, on both of its sides), and
  each new one is accepted and reset at once, as a peer that restarted or a firewall
  rejecting would.
- ``blackhole()``: nothing passes either way and nothing is closed; new connections are
  accepted and held. The proxy stops reading, so the bytes wait in the kernel's buffers and
  arrive after the heal, as TCP retransmission delivers them across a cut that heals. This
  is the case TCP keepalives do not catch when a proxy or NAT box is in the middle: its
  kernel still answers them.
- ``flap(period_s)``: reset and heal alternately, each for ``period_s``, starting with a
  reset, until another mode is set.
- ``delay(seconds)``: each chunk is forwarded ``seconds`` after it was read, both ways,
  without lowering throughput (the reader keeps reading; a writer waits for each due time).

It runs an asyncio loop on its own daemon thread; a mode switch returns once the loop has
applied it, so a test that calls ``blackhole()`` knows no byte passes afterwards.
``stop()`` closes everything and joins the thread within a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from typing import Any

# A mode switch or a stop waits this long for the proxy's loop before failing the test.
CONTROL_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5.0
CHUNK = 65536
_LINGER_ZERO = struct.pack("ii", 1, 0)


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with an RST rather than a FIN: SO_LINGER 0, then close."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
    writer.transport.abort()


class _Link:
    """One client connection and, once it passes, its upstream connection."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None

    def reset(self) -> None:
        if self.task is not None:
            self.task.cancel()
        _rst(self.client)
        if self.upstream is not None:
            _rst(self.upstream)


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.port = 0
        self.mode = "heal"
        # How many connections were accepted and how many were reset: tests can check that
        # a mode really met the traffic it was meant for.
        self.accepted = 0
        self.resets = 0
        self._delay_s = 0.0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=f"faultproxy-{upstream_port}",
                                        daemon=True)
        self._passing: asyncio.Event | None = None
        self._links: set[_Link] = set()
        self._server: asyncio.base_events.Server | None = None
        self._flapper: asyncio.Task[None] | None = None

    # -- control, from the test's thread -------------------------------------------------

    def start(self) -> FaultProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self.port = int(listener.getsockname()[1])
        self._thread.start()
        self._call(self._serve(listener))
        return self

    def heal(self) -> None:
        self._call(self._set("heal"))

    def reset(self) -> None:
        self._call(self._set("reset"))

    def blackhole(self) -> None:
        self._call(self._set("blackhole"))

    def flap(self, period_s: float = 2.0) -> None:
        self._call(self._set("flap", period_s=period_s))

    def delay(self, seconds: float) -> None:
        self._call(self._set("delay", delay_s=seconds))

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(TimeoutError, RuntimeError):
            self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CONTROL_TIMEOUT_S)
        if self._thread.is_alive():
            raise RuntimeError(f"fault proxy to port {self.upstream_port} did not stop")
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(CONTROL_TIMEOUT_S)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    # -- the loop's side -----------------------------------------------------------------

    async def _serve(self, listener: socket.socket) -> None:
        self._passing = asyncio.Event()
        self._passing.set()
        self._server = await asyncio.start_server(self._accept, sock=listener)

    async def _close(self) -> None:
        self._cancel_flapper()
        if self._server is not None:
            self._server.close()
        tasks = [link.task for link in self._links if link.task is not None]
        for link in list(self._links):
            link.reset()
        self._links.clear()
        if tasks:
            # Let the cancelled relays unwind, so none is left pending when the loop closes.
            await asyncio.wait(tasks, timeout=CONTROL_TIMEOUT_S / 2)

    def _cancel_flapper(self) -> None:
        if self._flapper is not None and self._flapper is not asyncio.current_task():
            self._flapper.cancel()
        self._flapper = None

    async def _set(self, mode: str, period_s: float = 0.0, delay_s: float = 0.0) -> None:
        self._cancel_flapper()
        self.mode = mode
        self._delay_s = delay_s
        if mode == "flap":
            self._apply("reset")
            self._flapper = asyncio.create_task(self._flap(period_s))
        else:
            self._apply(mode)

    def _apply(self, state: str) -> None:
        """``state`` is one of heal, delay, reset, blackhole: what the links do right now."""
        assert self._passing is not None
        if state in ("heal", "delay"):
            self._passing.set()
            return
        self._passing.clear()
        if state == "reset":
            self.resets += len(self._links)
            for link in list(self._links):
                link.reset()
            self._links.clear()

    async def _flap(self, period_s: float) -> None:
        cut = True
        while True:
            await asyncio.sleep(period_s)
            cut = not cut
            self._apply("reset" if cut else "heal")

    def _cutting(self) -> bool:
        """Whether a reset is in force now (a flap is in its reset half)."""
        assert self._passing is not None
        return self.mode in ("reset", "flap") and not self._passing.is_set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._cutting():
            self.resets += 1
            _rst(writer)
            return
        link = _Link(writer)
        link.task = asyncio.current_task()
        self._links.add(link)
        try:
            await self._relay(link, reader)
        except (asyncio.CancelledError, OSError, TimeoutError):
            pass
        finally:
            self._links.discard(link)
            if not writer.transport.is_closing():
                writer.transport.abort()
            if link.upstream is not None and not link.upstream.transport.is_closing():
                link.upstream.transport.abort()

    async def _relay(self, link: _Link, client: asyncio.StreamReader) -> None:
        assert self._passing is not None
        # A new connection in a blackhole is held: its upstream is dialled only at the heal.
        await self._passing.wait()
        up_reader, upstream = await asyncio.wait_for(
            asyncio.open_connection(self.upstream_host, self.upstream_port), CONNECT_TIMEOUT_S)
        link.upstream = upstream
        await asyncio.gather(self._pump(link, client, upstream),
                             self._pump(link, up_reader, link.client))

    async def _pump(self, link: _Link, source: asyncio.StreamReader,
                    sink: asyncio.StreamWriter) -> None:
        """One direction: a reader that stops at a cut, and a writer that waits for each
        chunk's due time and for the link to pass. ``None`` in the queue: the source broke."""
        assert self._passing is not None
        passing = self._passing
        chunks: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()

        async def read() -> None:
            while True:
                await passing.wait()
                try:
                    data: bytes | None = await source.read(CHUNK)
                except OSError:
                    data = None
                await chunks.put((time.monotonic() + self._delay_s, data))
                if not data:
                    return

        reading = asyncio.create_task(read())
        try:
            while True:
                due, data = await chunks.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                await passing.wait()
                if data is None:
                    # One side went away abruptly: so does the other, as a real path shows it.
                    link.reset()
                    return
                if not data:
                    if sink.can_write_eof():
                        sink.write_eof()
                    return
                sink.write(data)
                await sink.drain()
        except OSError:
            link.reset()
        finally:
            reading.cancel()
