"""What installing takes: the client alone (``pip install ./client``, what CI and agents
need) beside the server package (``pip install -c constraints.txt .``), each into a fresh
virtualenv from this machine's package index: seconds, the site-packages' size, and the
distributions pulled. pip's own cache is used alike for both (warm after the first run:
that is what a CI runner with a cache sees; pass ``--no-cache`` for the cold figure).
Prints JSON."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def install(name: str, target: list[str], no_cache: bool) -> dict[str, float | str]:
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        base = size(venv)
        started = time.monotonic()
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet",
                        *(["--no-cache-dir"] if no_cache else []), *target],
                       check=True, cwd=REPO)
        seconds = time.monotonic() - started
        listed = subprocess.run([str(venv / "bin" / "pip"), "list", "--format=freeze"],
                                capture_output=True, text=True, check=True).stdout
        return {"what": name, "install_s": round(seconds, 1),
                "added_mb": round((size(venv) - base) / 1e6, 1),
                "distributions": float(len(listed.splitlines()))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-cache", action="store_true")
    args = parser.parse_args()
    client = install("client", ["./client"], args.no_cache)
    server = install("server", ["-c", "constraints.txt", "."], args.no_cache)
    ratio = float(client["install_s"]) / float(server["install_s"])
    print(json.dumps({"client": client, "server": server,
                      "client_over_server_s": round(ratio, 3)}, indent=2))


if __name__ == "__main__":
    main()
