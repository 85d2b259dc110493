"""Stopping the server while tails are open: they end, and the server does not wait out its
grace period for them."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx

from tests.support.server import Server, create_project

GRACE_S = 10  # uvicorn's timeout_graceful_shutdown in boxtrail serve


def test_open_tails_end_when_the_server_stops(tmp_path: Path) -> None:
    server = Server(tmp_path / "data").start()
    ended: list[str] = []
    with server.client() as api:
        create_project(api, "shop")

        def follow() -> None:
            with httpx.Client(base_url=server.url, timeout=httpx.Timeout(30, read=30),
                              headers={"Authorization": f"Bearer {server.api_key}"}) as http:
                try:
                    with http.stream("GET", "/v1/projects/shop/tail") as response:
                        assert response.status_code == 200
                        for _ in response.iter_bytes():
                            pass
                    ended.append("closed")
                except httpx.HTTPError as exc:
                    ended.append(type(exc).__name__)

        readers = [threading.Thread(target=follow) for _ in range(3)]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + 10
        while "boxtrail_tail_subscribers 3" not in api.get("/metrics").text:
            assert time.monotonic() < deadline, "the tails did not open"
            time.sleep(0.05)
    assert server.proc is not None
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(GRACE_S + 10)
    took = time.monotonic() - started
    for reader in readers:
        reader.join(10)
    assert ended == ["closed"] * 3  # each stream ended as a stream does, not cut off
    assert took < GRACE_S, f"the server waited {took:.1f} s for its tails"
    assert "timeout graceful shutdown exceeded" not in "".join(server.output)
    assert server.proc.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal
