"""``boxtrail sourcemaps upload`` fails clearly, with a non-zero exit, before and without a
server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def upload(directory: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BOXTRAIL_")}
    return subprocess.run([sys.executable, "-m", "boxtrail", "sourcemaps", "upload",
                           str(directory), "--project", "p"], env={**clean, **env},
                          capture_output=True, text=True, timeout=60)


def test_failures_are_one_line_and_exit_1(tmp_path: Path) -> None:
    (tmp_path / "app.js").write_text("a()\n")
    (tmp_path / "app.js.map").write_text('{"version":3,"sources":[],"mappings":""}')
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    cases = [
        (tmp_path, {}, "set BOXTRAIL_API_KEY"),
        (tmp_path / "nope", {"BOXTRAIL_API_KEY": "k"}, "is not a directory"),
        (tmp_path, {"BOXTRAIL_API_KEY": "k", "BOXTRAIL_URL": f"http://127.0.0.1:{closed}"},
         f"cannot reach http://127.0.0.1:{closed}"),
        (tmp_path, {"BOXTRAIL_API_KEY": "k", "BOXTRAIL_URL": "ftp://x"}, "not an http(s)"),
    ]
    (tmp_path / "empty").mkdir()
    cases.append((tmp_path / "empty", {"BOXTRAIL_API_KEY": "k"}, "no .js or .map files"))
    for directory, env, text in cases:
        result = upload(directory, env)
        assert result.returncode == 1, (env, result.stderr)
        assert text in result.stderr and "Traceback" not in result.stderr, result.stderr
