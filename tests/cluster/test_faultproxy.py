"""The fault-injection proxy does what each mode says, against a loopback echo server."""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.faultproxy import FaultProxy


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def echo(conn: socket.socket) -> None:
        # The proxy resets its upstream side too: an RST here is expected.
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(65536):
                conn.sendall(data)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    with FaultProxy("127.0.0.1", listener.getsockname()[1]) as running:
        yield running
    stop.set()
    listener.close()


def dial(proxy: FaultProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=1)


def round_trip(conn: socket.socket, data: bytes = b"ping") -> bytes:
    conn.sendall(data)
    return conn.recv(64)


def test_heal_passes_and_delay_holds_each_chunk_both_ways(proxy: FaultProxy) -> None:
    with dial(proxy) as conn:
        assert round_trip(conn) == b"ping"
        proxy.delay(0.2)
        started = time.monotonic()
        assert round_trip(conn) == b"ping"
        # 0.2 s out and 0.2 s back; the upper bound only rules out a stuck proxy.
        assert 0.4 <= time.monotonic() - started < 0.9


def test_reset_sends_rst_to_open_and_new_connections(proxy: FaultProxy) -> None:
    with dial(proxy) as conn:
        assert round_trip(conn) == b"ping"
        proxy.reset()
        with pytest.raises(ConnectionResetError):
            round_trip(conn)
    # The RST can beat the client's connect() back (loopback), or meet its first send.
    with pytest.raises(ConnectionResetError), dial(proxy) as conn:
        round_trip(conn)
    proxy.heal()
    with dial(proxy) as conn:
        assert round_trip(conn) == b"ping"


def test_blackhole_holds_open_and_new_connections_and_delivers_at_the_heal(
        proxy: FaultProxy) -> None:
    with dial(proxy) as held:
        assert round_trip(held) == b"ping"
        proxy.blackhole()
        held.sendall(b"old")
        with dial(proxy) as new:
            new.sendall(b"new")
            for conn in (held, new):
                with pytest.raises(TimeoutError):
                    conn.recv(64)
            proxy.heal()
            assert held.recv(64) == b"old"
            assert new.recv(64) == b"new"


def test_flap_alternates_reset_and_heal_until_healed(proxy: FaultProxy) -> None:
    proxy.flap(0.3)
    outcomes: list[bool] = []
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        try:
            with dial(proxy) as conn:
                outcomes.append(round_trip(conn) == b"ping")
        except OSError:
            outcomes.append(False)
        time.sleep(0.05)
    assert outcomes[0] is False and True in outcomes
    # At least two switches from cut to passing or back in 1.5 s at a 0.3 s period.
    assert sum(a != b for a, b in itertools.pairwise(outcomes)) >= 2
    proxy.heal()
    with dial(proxy) as conn:
        assert round_trip(conn) == b"ping"
