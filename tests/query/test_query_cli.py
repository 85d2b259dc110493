"""`boxtrail search` and `boxtrail tail` against the real server."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.support.server import Server, create_project


def cli_env(server: Server) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOXTRAIL_")}
    return {**env, "BOXTRAIL_URL": server.url, "BOXTRAIL_API_KEY": server.api_key}


def send(server: Server, key: str, messages: list[str], level: str = "info") -> None:
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key},
                   json={"context": {"boxId": "b"},
                         "events": [{"level": level, "message": m} for m in messages]})
    assert r.status_code == 202


def test_search_prints_oldest_first(server: Server, api: httpx.Client) -> None:
    key = str(create_project(api, "s")["ingestKey"])
    send(server, key, ["first", "second"])
    send(server, key, ["boom"], level="error")
    env = cli_env(server)
    out = subprocess.run([sys.executable, "-m", "boxtrail", "search", "-p", "s"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == [
        "INFO  [b] first", "INFO  [b] second", "ERROR [b] boom"]
    out = subprocess.run([sys.executable, "-m", "boxtrail", "search", "level:error", "-p", "s",
                          "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert [json.loads(line)["message"] for line in out.stdout.splitlines()] == ["boom"]
    missing = subprocess.run([sys.executable, "-m", "boxtrail", "search", "-p", "nope"],
                             env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "404: no project 'nope'" in missing.stderr
    bad = subprocess.run([sys.executable, "-m", "boxtrail", "search", "((", "-p", "s"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "400:" in bad.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_tail_follows_and_resumes_after_a_restart(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", {"BOXTRAIL_PORT": str(free_port()),
                                        "BOXTRAIL_TAIL_HEARTBEAT_S": "0.5"}).start()
    proc = None
    try:
        with server.client() as api:
            key = str(create_project(api, "t")["ingestKey"])
        proc = subprocess.Popen([sys.executable, "-m", "boxtrail", "tail", "-p", "t", "--json"],
                                env=cli_env(server), stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        lines: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout],  # type: ignore[union-attr]
                         daemon=True).start()

        def read(n: int) -> list[str]:
            got = []
            deadline = time.monotonic() + 30
            while len(got) < n:
                got.append(json.loads(lines.get(timeout=max(0.1, deadline - time.monotonic())))
                           ["message"])
            return got

        time.sleep(1.0)  # the tail connects and starts from "now"
        send(server, key, ["a1", "a2"])
        assert read(2) == ["a1", "a2"]
        server.kill()
        server.start()  # same port; the CLI reconnects with Last-Event-ID
        send(server, key, ["b1", "b2", "b3"])
        assert read(3) == ["b1", "b2", "b3"]
        time.sleep(1.0)
        assert lines.empty()  # nothing repeated
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
            if proc.stdout:
                proc.stdout.close()
        server.stop()
