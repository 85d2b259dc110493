"""The `boxtrail` command line: clear failures, keys."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server import Server


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


# A data directory that cannot be used: one line naming the path and what to do, no
# traceback. The tests run as root, which chmod does not stop, so each case fails for
# root too: a path through a regular file (ENOTDIR), a regular file where the directory
# should be, and a read-only mount made in a private mount namespace (EROFS).


def assert_one_line_about(result: subprocess.CompletedProcess[str], path: Path,
                          reason: str) -> None:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("boxtrail: ") and str(path) in lines[0], lines[0]
    assert reason in lines[0] and "BOXTRAIL_DATA_DIR" in lines[0], lines[0]


def test_a_data_dir_below_a_regular_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    data = tmp_path / "file" / "data"
    for args in (["serve"], ["keys", "create", "--tenant", "acme"]):
        result = run(args, {"BOXTRAIL_DATA_DIR": str(data), "BOXTRAIL_PORT": "0"})
        assert_one_line_about(result, data, "Not a directory")


@pytest.mark.parametrize(("file", "reason"), [
    ("data", "Not a directory"),
    ("data/objects", "File exists"),  # where local storage keeps its Parquet files
])
def test_a_regular_file_where_a_directory_belongs_is_one_line(
        tmp_path: Path, file: str, reason: str) -> None:
    data = tmp_path / "data"
    (tmp_path / file).parent.mkdir(exist_ok=True)
    (tmp_path / file).write_text("")
    result = run(["serve"], {"BOXTRAIL_DATA_DIR": str(data), "BOXTRAIL_PORT": "0"})
    assert_one_line_about(result, data, reason)


def test_a_read_only_data_dir_is_one_line(tmp_path: Path) -> None:
    # A real read-only mount, in a mount namespace of the test's own (root ignores chmod).
    # util-linux's unshare is on every machine of this kind; not a skip if it is not.
    unshare = shutil.which("unshare")
    assert unshare is not None, "unshare (util-linux) is needed for a read-only mount"
    probe = subprocess.run([unshare, "-rm", "true"], capture_output=True, text=True)
    assert probe.returncode == 0, f"unshare -rm refused: {probe.stderr}"
    data = tmp_path / "data"
    Server(data).start().stop()  # a used data directory, then made read-only
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BOXTRAIL_")}
    script = ('mount --bind "$D" "$D" && mount -o remount,bind,ro "$D" && '
              'exec "$PY" -m boxtrail serve')
    result = subprocess.run(
        [unshare, "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=60,
        env={**clean, "D": str(data), "PY": sys.executable, "BOXTRAIL_DATA_DIR": str(data),
             "BOXTRAIL_PORT": "0"})
    assert_one_line_about(result, data, "Read-only file system")
