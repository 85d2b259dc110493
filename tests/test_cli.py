"""The `boxtrail` command line: clear failures, keys."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BOXTRAIL_")}
    return subprocess.run([sys.executable, "-m", "boxtrail", *args], env={**clean, **env},
                          capture_output=True, text=True, timeout=60)


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(["serve"], {"BOXTRAIL_PORT": str(port), "BOXTRAIL_DATA_DIR": str(tmp_path)})
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_setting_is_a_clear_error(tmp_path: Path) -> None:
    result = run(["serve"], {"BOXTRAIL_PORTT": "1", "BOXTRAIL_DATA_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert "unknown setting BOXTRAIL_PORTT" in result.stderr
    assert "Traceback" not in result.stderr


def test_keys_create_prints_a_new_key_once(tmp_path: Path) -> None:
    env = {"BOXTRAIL_DATA_DIR": str(tmp_path)}
    first = run(["keys", "create", "--tenant", "acme"], env)
    second = run(["keys", "create", "--tenant", "acme"], env)
    assert first.returncode == second.returncode == 0
    key1, key2 = first.stdout.strip(), second.stdout.strip()
    assert key1.startswith("btk_") and key2.startswith("btk_") and key1 != key2
    assert "shown only once" in first.stderr
    # Only hashes are stored.
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("meta.sqlite*"))
    assert b"acme" in stored  # the files are readable as such...
    assert key1.encode() not in stored and key2.encode() not in stored  # ...keys are not


def test_a_second_server_on_one_data_dir_is_a_clear_error(tmp_path: Path) -> None:
    from tests.server import Server

    server = Server(tmp_path / "data").start()
    try:
        second = run(["serve"], {"BOXTRAIL_DATA_DIR": str(tmp_path / "data"),
                                 "BOXTRAIL_PORT": "0"})
        assert second.returncode == 1
        assert "another process is using" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        server.stop()
    # Once the first has stopped, the directory is free again.
    Server(tmp_path / "data").start().stop()
