"""A real PostgreSQL server for tests: Debian's ``postgresql`` binaries, an ``initdb``'d
cluster in a temp dir, ``pg_ctl`` on a free loopback port (no Unix socket outside it).

As root (CI here runs as root, and ``initdb`` refuses root) the cluster belongs to the
``postgres`` user the Debian package creates, and the binaries run as it.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: `make system-deps` installs Debian's "
                           "postgresql package")
    return Path(found[-1]).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    def __init__(self) -> None:
        self.bin = _bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="boxtrail-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._user: list[str] = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self._user = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str, timeout: float = 60) -> None:
        subprocess.run([*self._user, *args], check=True, timeout=timeout,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start(self) -> PgServer:
        if not self.data.exists():
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                      "-A", "trust", "-E", "UTF8", "--no-instructions")
        options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                   f"-c unix_socket_directories={self.root} -c fsync=off "
                   "-c max_connections=200 -c shared_buffers=32MB")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options,
                  "-l", str(self.root / "log"), "-w", "-t", "30", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w",
                      "stop", timeout=60)

    def close(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh empty database's URL: each test gets its own catalog."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        for attempt in range(50):
            try:
                with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as con:
                    con.execute(f'CREATE DATABASE "{name}"')
                return self.url(name)
            except psycopg.OperationalError:
                if attempt == 49:
                    raise
                time.sleep(0.1)
        raise AssertionError("unreachable")

    def __enter__(self) -> PgServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

