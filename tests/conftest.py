from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.pgserver import PgServer
from tests.support.redisserver import RedisServer
from tests.support.s3server import S3Server
from tests.support.server import Server

# --- Real S3-compatible server (weed mini), shared by the whole session ---------------


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with S3Server() as server, pytest.MonkeyPatch.context() as env:
        # boto3's default chain in this process (as in the app) finds the server's keys.
        for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN"):
            env.delenv(name, raising=False)
        for name, value in server.env().items():
            if name.startswith("AWS_"):
                env.setenv(name, value)
        yield server


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    return s3_server.new_bucket()


# --- Real PostgreSQL (Debian's binaries, initdb'd in a temp dir), shared by the session ----


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    with PgServer() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """A fresh empty database on the shared server."""
    return pg_server.new_database()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The shared Redis server, emptied: each test's cluster starts with an empty bus."""
    import redis

    with redis.Redis.from_url(redis_server.url()) as client:
        client.flushall()
    return redis_server.url()


# --- The real boxtrail server ----------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "data").start()
    yield srv
    srv.stop()


@pytest.fixture
def api(server: Server) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


# --- The browser SDK (sdk-js/), built from its current source -----------------------------

SDK_DIR = Path(__file__).resolve().parent.parent / "sdk-js"


@pytest.fixture(scope="session")
def sdk_bundle() -> Path:
    """``sdk-js/dist/boxtrail.js`` rebuilt from ``src/`` (esbuild, then terser: about a second)."""
    if not all((SDK_DIR / "node_modules" / tool).exists() for tool in ("esbuild", "terser")):
        pytest.fail("sdk-js's node_modules lack esbuild or terser: run `make sdk` (npm ci) first")
    dist = SDK_DIR / "dist"
    dist.mkdir(exist_ok=True)
    # The suite's workers (pytest -n) share dist/: the first builds it for the run, under a
    # lock, and the others read what it built (a rebuild would rewrite it under their reads).
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    stamp = dist / ".built-for-run"
    with open(dist / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if run is None or not stamp.exists() or stamp.read_text() != run:
            subprocess.run(["node", "scripts/build.mjs", "--no-types"], cwd=SDK_DIR,
                           check=True, timeout=120)
            stamp.write_text(run or "")
    return dist / "boxtrail.js"
