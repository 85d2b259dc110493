"""The real boxtrail server in a subprocess on a random loopback port.

Tests talk to it over HTTP exactly as a client would; a crash is a real SIGKILL.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import httpx

START_TIMEOUT_S = 60.0
_LISTENING = re.compile(r"boxtrail listening on (http://\S+)")

# Fast flushes so tests see Parquet files within a second; no rate limit unless asked.
TEST_ENV = {
    "BOXTRAIL_PORT": "0",
    "BOXTRAIL_FLUSH_INTERVAL_S": "0.5",
    "BOXTRAIL_RATE_LIMIT_EVENTS": "0",
}


class Server:
    # What runs: ``boxtrail serve``, or a test's own launcher of it.
    command = ("-m", "boxtrail", "serve")

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.env = {**TEST_ENV, "BOXTRAIL_DATA_DIR": str(data_dir), **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.output: list[str] = []

    @property
    def api_key(self) -> str:
        return (self.data_dir / "dev-api-key").read_text().strip()

    def start(self) -> Server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BOXTRAIL_")}
        env.update(self.env)
        self.output = []
        self.proc = subprocess.Popen(
            [sys.executable, *self.command], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        self._pump_thread = threading.Thread(target=self._pump, args=(self.proc.stdout, lines),
                                             daemon=True)
        self._pump_thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if match := _LISTENING.search(line):
                self.url = match.group(1)
                return self
        self.kill()
        raise RuntimeError("server did not start:\n" + "".join(self.output[-50:]))

    def _pump(self, stream: IO[str], lines: queue.Queue[str]) -> None:
        with stream:
            for line in stream:
                self.output.append(line)
                lines.put(line)

    def _reap(self) -> None:
        # The pump closes the pipe once the process is gone and it has read to the end.
        self._pump_thread.join(10)

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash or an OOM kill."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self._reap()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
            self._reap()

    def client(self, timeout: float = 10.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout,
                            headers={"Authorization": f"Bearer {self.api_key}"})

    def create_key(self, tenant: str) -> str:
        """A new API key of ``tenant`` (made if new), by the CLI on this server's data."""
        return subprocess.run(
            [sys.executable, "-m", "boxtrail", "keys", "create", "--tenant", tenant],
            env={"BOXTRAIL_DATA_DIR": str(self.data_dir), "PATH": "/usr/bin:/bin",
                 # A cluster's nodes keep their keys in the shared catalog.
                 **{k: v for k, v in self.env.items() if k == "BOXTRAIL_CATALOG_URL"}},
            capture_output=True, text=True, check=True, timeout=60).stdout.strip()

    def rss_kb(self) -> int:
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]


def create_project(client: httpx.Client, name: str, origins: list[str] | None = None
                   ) -> dict[str, object]:
    body: dict[str, object] = {"name": name}
    if origins is not None:
        body["allowedOrigins"] = origins
    response = client.post("/v1/projects", json=body)
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


def search_all(client: httpx.Client, project: str, since: str = "30d",
               box: str | None = None) -> list[dict[str, object]]:
    """Every row, following nextCursor."""
    rows: list[dict[str, object]] = []
    cursor = None
    while True:
        params: dict[str, str | int] = {"since": since, "limit": 1000}
        if cursor:
            params["cursor"] = cursor
        if box:
            params["boxId"] = box
        response = client.get(f"/v1/projects/{project}/logs", params=params)
        assert response.status_code == 200, response.text
        page = response.json()
        rows += page["rows"]
        cursor = page["nextCursor"]
        if not cursor:
            return rows
