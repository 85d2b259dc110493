"""The image, built from this tree by ``deploy/image.py`` (what ``make image`` runs) and
checked from outside: what it holds, and that it serves.

How it runs here, and what that leaves out (docs/image.md says the same):

- The base ``python:3.11-slim`` cannot be pulled where no image registry is reachable;
  ``deploy/image.py`` then builds on its stand-in (Debian bookworm by debootstrap, python3,
  venv and the Python headers), made once and cached.
- Where a container runtime can start the image, the image runs as a container. Where it
  cannot (the sandbox this was written in refuses ``setrlimit``, which every OCI runtime
  calls), the image's own root is started the way a runtime would: a private mount
  namespace with ``/dev`` and ``/proc``, ``chroot`` into the container's root, the image's
  user, working directory, environment and command, read from the image's config. The test
  prints which path ran.
- Either way the container's writable layer is compared with the image afterwards
  (``podman diff``): only ``/data`` may have changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from setuptools import find_packages

from deploy import image as builder
from tests.fixtures.sourcemaps.handmade import JS, dumps, mappings, source_map

REPO = Path(__file__).resolve().parents[2]
TAG = "localhost/boxtrail:test"
LISTENING = re.compile(r"boxtrail listening on (http://\S+)")
# What may be found on PATH in no image: the build stage's business, if anyone's.
COMPILERS = ("gcc", "cc", "g++", "c++", "clang", "ld", "make")
USER = "10001:10001"


# --- what the project ships, and what an image holds ---------------------------------


def project_packages(tree: Path) -> set[str]:
    """Top-level packages that ``tree``'s pyproject.toml ships (its find rule)."""
    rule = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]
    found = find_packages(str(tree), include=rule.get("include", ["*"]),
                          exclude=rule.get("exclude", []))
    return {name.split(".")[0] for name in found}


def site_packages(root: Path) -> Path:
    [site] = root.glob("opt/boxtrail/lib/python3*/site-packages")
    return site


def shipped_packages(root: Path) -> set[str]:
    """Top-level packages the image's boxtrail distribution installed (its RECORD)."""
    site = site_packages(root)
    [record] = site.glob("boxtrail-*.dist-info/RECORD")
    out = set()
    for line in record.read_text().splitlines():
        path = line.split(",")[0]
        parts = path.split("/")
        if len(parts) == 2 and parts[1] == "__init__.py" and (site / path).exists():
            out.add(parts[0])
    return out


def unshipped(tree: Path, root: Path) -> set[str]:
    """The packages of ``tree`` an image's root does not hold."""
    return project_packages(tree) - shipped_packages(root)


def distributions(root: Path) -> dict[str, list[str]]:
    """The image's installed distributions (canonical name -> its Requires-Dist)."""
    out = {}
    for info in site_packages(root).glob("*.dist-info"):
        meta = (info / "METADATA").read_text(errors="replace")
        if match := re.search(r"^Name:\s*(\S+)", meta, re.M):
            out[canonicalize_name(match.group(1))] = re.findall(r"^Requires-Dist:\s*(.+)$",
                                                                meta, re.M)
    return out


def requirement_closure(requirements: list[str], installed: dict[str, list[str]],
                        python: str) -> set[str]:
    """What these requirements pull in on Python ``python`` (x.y.z), by the metadata of
    the distributions ``installed``."""
    where = {"python_full_version": python, "python_version": python.rsplit(".", 1)[0]}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        for text in installed.get(key[0], []):
            dep = Requirement(text)
            if dep.marker is None or any(dep.marker.evaluate({**where, "extra": extra})
                                         for extra in ("", *req.extras)):
                todo.append(dep)
    return {name for name, _ in seen}


def repository_files(*folders: str) -> dict[tuple[int, str], str]:
    """(size, sha256) -> path of each tracked file under ``folders`` of 64 bytes or more."""
    listed = subprocess.run(["git", "ls-files", "-z", *folders], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    out = {}
    for name in filter(None, listed):
        data = (REPO / name).read_bytes()
        if len(data) >= 64:
            out[(len(data), hashlib.sha256(data).hexdigest())] = name
    return out


# --- the image, built once for the module ---------------------------------------------


@dataclass
class Built:
    tool: str
    base: str  # present | pulled | stand-in
    build_s: float
    size: int
    config: dict[str, object]
    container: str
    root: Path


def podman(*args: str, timeout: float = 300) -> str:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=True,
                          timeout=timeout).stdout.strip()


@pytest.fixture(scope="module")
def built() -> Iterator[Built]:
    tool = builder.engine()
    assert tool == "podman", "the image test drives podman (make test installs it)"
    base = builder.ensure_base(tool)
    started = time.monotonic()
    result = builder.build(tool, TAG)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    build_s = time.monotonic() - started
    [info] = json.loads(podman("image", "inspect", TAG))
    container = podman("create", TAG)
    try:
        root = Path(podman("mount", container))
        yield Built(tool, base, build_s, int(info["Size"]), info["Config"], container, root)
    finally:
        subprocess.run(["podman", "umount", container], capture_output=True, timeout=60)
        subprocess.run(["podman", "rm", "-f", container], capture_output=True, timeout=60)


# --- starting it -----------------------------------------------------------------------


def container_runtime_refusal(built: Built) -> str | None:
    """Why no container of the image can start here, or None if one can."""
    probe = subprocess.run(["podman", "run", "--rm", "--network", "host", TAG, "true"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode == 0:
        return None
    errors = [line for line in probe.stderr.splitlines() if line.startswith("Error")]
    return (errors or probe.stderr.splitlines() or [f"exit {probe.returncode}"])[-1]


class Chrooted:
    """The image's command as its user, in its working directory, with its environment,
    from the container's root: what a runtime would start, where none can."""

    path = "chroot from the image's root"

    def __init__(self, built: Built, env: dict[str, str]) -> None:
        self.root = built.root
        self.container = built.container
        config = built.config
        self.user = str(config.get("User") or "0:0")
        uid, gid = self.user.split(":")
        passwd = (built.root / "etc/passwd").read_text().splitlines()
        home = next((line.split(":")[5] for line in passwd if line.split(":")[2] == uid), "/")
        image_env = dict(item.split("=", 1) for item in config.get("Env") or [])  # type: ignore[union-attr]
        merged = {**image_env, "HOME": home, **env}
        command = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]  # type: ignore[misc]
        workdir = str(config.get("WorkingDir") or "/")
        root = str(built.root)
        script = (f'mount --rbind /dev "{root}/dev" && mount -t proc proc "{root}/proc" && '
                  f'exec chroot --userspec={uid}:{gid} "{root}" /usr/bin/env -i -C "{workdir}" '
                  '"$@"')
        args = [f"{k}={v}" for k, v in merged.items()] + command
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output: list[str] = []
        self.url = ""
        lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        self.pump = threading.Thread(target=self._pump, args=(self.proc.stdout, lines),
                                     daemon=True)
        self.pump.start()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not self.url:
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if match := LISTENING.search(line):
                self.url = match.group(1)
        if not self.url:
            self.stop()
            raise AssertionError("the image did not start:\n" + "".join(self.output[-40:]))

    def _pump(self, stream: IO[str], lines: queue.Queue[str]) -> None:
        with stream:
            for line in stream:
                self.output.append(line)
                lines.put(line)

    def uid(self) -> int:
        return uid_of(self.proc.pid)

    def read(self, path: str) -> str:
        return (self.root / path.lstrip("/")).read_text()

    def parquet_files(self) -> int:
        return len(list((self.root / "data/objects").rglob("*.parquet")))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.pump.join(10)
        return self.proc.returncode


class Contained:
    """The image run as a container, where a runtime can start one: its /data a volume."""

    path = "a container (podman run)"

    def __init__(self, built: Built, env: dict[str, str]) -> None:
        self.user = str(built.config.get("User"))
        flags = [f"--env={k}={v}" for k, v in env.items()]
        self.container = podman("run", "-d", "--network", "host", *flags, TAG)
        self.output: list[str] = []
        self.url = ""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not self.url:
            self.output = podman("logs", self.container).splitlines(keepends=True)
            self.url = next((m.group(1) for line in self.output
                             if (m := LISTENING.search(line))), "")
            time.sleep(0.2)
        if not self.url:
            self.stop()
            raise AssertionError("the image did not start:\n" + "".join(self.output[-40:]))

    def uid(self) -> int:
        return uid_of(int(podman("inspect", "--format", "{{.State.Pid}}", self.container)))

    def read(self, path: str) -> str:
        return podman("exec", self.container, "cat", path)

    def parquet_files(self) -> int:
        found = podman("exec", self.container, "python", "-c",
                       "import pathlib; print(len(list(pathlib.Path('/data/objects')"
                       ".rglob('*.parquet'))))")
        return int(found)

    def stop(self) -> int:
        podman("stop", "--time", "30", self.container, timeout=60)
        return int(podman("inspect", "--format", "{{.State.ExitCode}}", self.container))


def uid_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]


def changed_paths(container: str) -> list[str]:
    lines = podman("diff", container).splitlines()
    return [line.split(" ", 1)[1] for line in lines if " " in line]


# --- the tests -------------------------------------------------------------------------


def wait_for_rows(api: httpx.Client, path: str, want: int, timeout_s: float = 15
                  ) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout_s
    while True:
        response = api.get(path, params={"since": "1h"})
        assert response.status_code == 200, response.text
        rows: list[dict[str, object]] = response.json()["rows"]
        if len(rows) >= want or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def test_the_image_serves_as_its_user_on_an_empty_data_and_writes_nowhere_else(
        built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert built.config.get("User") == USER and built.config.get("WorkingDir") == "/data"
    assert not any((built.root / "data").iterdir()), "/data is not empty in the image"
    refusal = container_runtime_refusal(built)
    start = Chrooted if refusal else Contained
    running = start(built, {"BOXTRAIL_HOST": "127.0.0.1", "BOXTRAIL_PORT": "0",
                            "BOXTRAIL_FLUSH_INTERVAL_S": "0.5"})
    try:
        assert running.uid() == 10001
        key = running.read("/data/dev-api-key").strip()
        api = httpx.Client(base_url=running.url, timeout=10,
                           headers={"Authorization": f"Bearer {key}"})
        assert api.get("/healthz").status_code == 200
        assert api.get("/readyz").status_code == 200
        console = httpx.get(f"{running.url}/", timeout=10, follow_redirects=True)
        assert console.status_code == 200 and "<html" in console.text.lower()

        project = api.post("/v1/projects", json={"name": "shop"}).json()
        ingest_key = project["ingestKey"]
        events = [{"level": "info", "message": f"hello {i}"} for i in range(5)]
        r = httpx.post(f"{running.url}/v1/ingest", params={"key": ingest_key}, timeout=10,
                       json={"context": {"boxId": "b1", "release": "1.0"}, "events": events})
        assert r.status_code == 202 and r.json()["accepted"] == 5, r.text
        rows = wait_for_rows(api, "/v1/projects/shop/logs", 5)
        assert sorted(row["message"] for row in rows) == [f"hello {i}" for i in range(5)]

        # A source map uploaded by the CLI as CI would, then an error symbolicated with it.
        dist = tmp_path / "dist"
        dist.mkdir()
        source = "function a() {\n  b();\n    c();\n}\n"
        (dist / "app.js").write_text(JS + "//# sourceMappingURL=app.js.map\n")
        (dist / "app.js.map").write_bytes(dumps(source_map(
            mappings([[(0, 0, 0, 0), (9, 0, 1, 2), (9, 0, 1, 2)]]),
            sources=["src/app.js"], contents=[source])))
        upload = subprocess.run(
            [sys.executable, "-m", "boxtrail", "sourcemaps", "upload", str(dist),
             "--project", "shop", "--release", "1.0", "--url-prefix", "~/"],
            env={**{k: v for k, v in os.environ.items() if not k.startswith("BOXTRAIL_")},
                 "BOXTRAIL_URL": running.url, "BOXTRAIL_API_KEY": key},
            capture_output=True, text=True, timeout=60)
        assert upload.returncode == 0, upload.stdout + upload.stderr
        stack = "Error: boom\n    at https://b1.example/app.js:1:10"
        r = httpx.post(f"{running.url}/v1/ingest", params={"key": ingest_key}, timeout=10,
                       json={"context": {"boxId": "b1", "release": "1.0"}, "events": [
                           {"level": "error", "message": "boom",
                            "error": {"type": "Error", "message": "boom", "stack": stack}}]})
        assert r.status_code == 202 and r.json()["accepted"] == 1, r.text
        [error] = wait_for_rows(api, "/v1/projects/shop/errors", 1)
        [frame] = error["error"]["frames"]  # type: ignore[index]
        assert (frame["file"], frame["line"], frame["column"], frame["symbolicated"]) == (
            "src/app.js", 2, 3, True), frame
        assert frame["contextLine"] == "  b();"

        # After the flush: the rows from Parquet, in /data.
        deadline = time.monotonic() + 15
        while not running.parquet_files():
            assert time.monotonic() < deadline, "no Parquet file after 15 s"
            time.sleep(0.2)
        assert len(wait_for_rows(api, "/v1/projects/shop/logs", 6)) == 6
        api.close()
    finally:
        code = running.stop()
    # uvicorn ends a graceful shutdown by raising the signal again: 143 in a shell.
    assert code in (0, -signal.SIGTERM, 128 + signal.SIGTERM), "".join(running.output[-40:])

    changed = changed_paths(running.container)
    if isinstance(running, Contained):
        subprocess.run(["podman", "rm", "-f", running.container], capture_output=True,
                       timeout=60)
    else:
        assert changed, "podman diff saw nothing of what the server wrote"
    assert all(p == "/data" or p.startswith("/data/") for p in changed), changed
    why = f" (no container runtime starts here: {refusal})" if refusal else ""
    with capsys.disabled():
        print(f"\nimage: built by {built.tool} on {builder.BASE} ({built.base}) in "
              f"{built.build_s:.0f} s, {built.size / 1e6:.0f} MB; ran as {running.user} by "
              f"{running.path}{why}; {len(changed)} paths changed, all under /data")


def test_the_image_holds_the_service_and_nothing_of_the_workbench(built: Built) -> None:
    root = built.root
    assert unshipped(REPO, root) == set()
    assert not (root / "src").exists(), "the build stage's sources are in the runtime image"

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    venv = (root / "opt/boxtrail/pyvenv.cfg").read_text()
    python = re.search(r"^version(?:_info)?\s*=\s*(\S+)", venv, re.M).group(1)  # type: ignore[union-attr]
    installed = distributions(root)
    runtime = requirement_closure(pyproject["dependencies"], installed, python)
    dev = {canonicalize_name(Requirement(r).name)
           for r in pyproject["optional-dependencies"]["dev"]}
    assert set(installed) & dev == set()
    assert set(installed) - runtime - {"boxtrail", "pip", "setuptools"} == set()

    for folder in ("usr/bin", "usr/local/bin", "opt/boxtrail/bin"):
        assert [c for c in COMPILERS if (root / folder / c).exists()] == [], folder

    ours = repository_files("tests", "benchmarks")
    sizes = {size for size, _ in ours}
    found = []
    for path in root.rglob("*"):
        if path.name in (".git", ".venv", "node_modules") and not path.is_symlink():
            found.append(str(path.relative_to(root)))
        elif path.is_file() and not path.is_symlink() and path.stat().st_size in sizes:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            if (path.stat().st_size, digest) in ours:
                found.append(f"{path.relative_to(root)} = {ours[(path.stat().st_size, digest)]}")
    assert found == []


def test_a_new_package_ships_by_itself_and_one_left_out_is_caught(
        built: Built, tmp_path: Path) -> None:
    """The test of the test: a copy of this tree with one more package, built as the
    Dockerfile says (it ships), and built by a Dockerfile that lists the packages it copies
    one by one, as this one once did (the check above names the package it misses). Both
    stop at the build stage, whose virtualenv the runtime stage copies whole."""
    tree = tmp_path / "tree"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file() and not name.startswith(("tests/", "benchmarks/", "docs/",
                                                             "sdk-js/")):
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, tree / name)
    (tree / "zzprobe").mkdir()
    (tree / "zzprobe" / "__init__.py").write_text('"""A package added after the image."""\n')
    assert "zzprobe" in project_packages(tree)

    dockerfile = (tree / "Dockerfile").read_text()
    assert "COPY . ." in dockerfile
    listing = "\n".join(f"COPY {p} ./{p}" for p in sorted(project_packages(REPO)))
    (tree / "Dockerfile.listed").write_text(dockerfile.replace("COPY . .", listing))

    def unshipped_by(dockerfile: str, tag: str) -> set[str]:
        result = builder.build(built.tool, tag, tree, tree / dockerfile, target="build")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        container = podman("create", tag)
        try:
            return unshipped(tree, Path(podman("mount", container)))
        finally:
            subprocess.run(["podman", "umount", container], capture_output=True, timeout=60)
            subprocess.run(["podman", "rm", "-f", container], capture_output=True, timeout=60)
            subprocess.run(["podman", "rmi", "-f", tag], capture_output=True, timeout=120)

    assert unshipped_by("Dockerfile", "localhost/boxtrail:probe-tree") == set()
    assert unshipped_by("Dockerfile.listed", "localhost/boxtrail:probe-listed") == {"zzprobe"}
