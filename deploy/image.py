"""Build the boxtrail image: ``python deploy/image.py [--tag boxtrail:local]`` (``make image``).

Docker builds it where its daemon answers, else podman. The base image is
``python:3.11-slim``; where it is neither present nor pullable (a machine that reaches no
image registry), podman builds on a stand-in made here and imported under the base's name:
Debian bookworm from ``debootstrap --variant=minbase`` with ``python3``, ``python3-venv`` and
``python3-dev`` (the real base has ``Python.h``: the build stage compiles against it),
``python`` on ``PATH`` as in the real base. The stand-in's root is kept as a tarball in the
cache directory, so it is made once per machine. Both the tarball's name and the imported
image's label name the package list: a stand-in made from another list is made and imported
again, not reused.

podman builds with ``--isolation chroot`` (no container runtime needed) and
``--network host``, with this machine's ``/etc/pip.conf`` and CA certificates mounted
read-only into the build's steps, so its ``pip install`` reaches the same package index as
the host's. The image carries no trace of either.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASE = "docker.io/library/python:3.11-slim"
STANDIN_LABEL = "boxtrail.standin"
STANDIN_PACKAGES = ("python3", "python3-venv", "python3-dev")
# What a stand-in was made from: its label's value, and its tarball's name in the cache.
STANDIN = "+".join(("debootstrap-bookworm-minbase", *STANDIN_PACKAGES))
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "boxtrail-image"
# What the build's steps see of this machine: how pip reaches its index, read-only.
HOST_MOUNTS = ("/etc/pip.conf", "/etc/ssl/certs")


def run(*args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=check)


def engine() -> str:
    """``docker`` if its daemon answers, else ``podman``."""
    if shutil.which("docker") and run("docker", "info", timeout=30, check=False).returncode == 0:
        return "docker"
    if shutil.which("podman"):
        return "podman"
    raise SystemExit("neither a Docker daemon nor podman is available")


def has_image(tool: str, ref: str) -> bool:
    return run(tool, "image", "inspect", ref, timeout=60, check=False).returncode == 0


def standin_of(tool: str, ref: str = BASE) -> str | None:
    """What the stand-in ``ref`` was made from (its label), or None if it is no stand-in."""
    labels = run(tool, "image", "inspect", "--format", "{{json .Config.Labels}}", ref,
                 timeout=60, check=False).stdout
    value = (json.loads(labels or "null") or {}).get(STANDIN_LABEL)
    return None if value is None else str(value)


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 or one-line sources)."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        if match := re.search(r"^URIs:\s*(\S+/debian)\s*$", path.read_text(), re.M):
            return match.group(1)
    sources = Path("/etc/apt/sources.list")
    if sources.exists() and (match := re.search(r"^deb\s+(\S+/debian)\s", sources.read_text(),
                                                re.M)):
        return match.group(1)
    return "http://deb.debian.org/debian"


def standin_tarball(cache: Path = CACHE) -> Path:
    """The stand-in's root as a tarball, made by debootstrap if the cache has none made from
    ``STANDIN_PACKAGES``; one made from another list is removed once this one is made."""
    tarball = cache / f"python-3.11-slim-standin+{'+'.join(STANDIN_PACKAGES)}.tar"
    if tarball.exists():
        return tarball
    if not shutil.which("debootstrap"):
        raise SystemExit("the base image cannot be pulled and debootstrap is missing")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="boxtrail-standin-", dir=cache) as tmp:
        root = Path(tmp) / "root"
        run("debootstrap", "--variant=minbase", f"--include={','.join(STANDIN_PACKAGES)}",
            "bookworm", str(root), debian_mirror(), timeout=900)
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (root / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        (root / "usr/local/bin/python").symlink_to("/usr/bin/python3")
        partial = tarball.with_suffix(".partial")
        with tarfile.open(partial, "w") as tar:
            tar.add(root, arcname=".")
        partial.rename(tarball)
    for stale in cache.glob("python-3.11-slim-standin*.tar"):
        if stale != tarball:
            stale.unlink(missing_ok=True)
    return tarball


def ensure_base(tool: str, cache: Path = CACHE) -> str:
    """Makes ``BASE`` available; says how: ``present``, ``pulled`` or ``stand-in``. A
    stand-in made from other packages than ``STANDIN_PACKAGES`` is replaced."""
    if has_image(tool, BASE):
        made_from = standin_of(tool)
        if made_from is None:
            return "present"
        if made_from == STANDIN:
            return "stand-in"
    if run(tool, "pull", BASE, timeout=300, check=False).returncode == 0:
        return "pulled"
    run(tool, "import", "--change", 'CMD ["python3"]',
        "--change", f"LABEL {STANDIN_LABEL}={STANDIN}",
        str(standin_tarball(cache)), BASE, timeout=300)
    return "stand-in"


def build(tool: str, tag: str, context: Path = REPO, dockerfile: Path | None = None,
          target: str | None = None) -> subprocess.CompletedProcess[str]:
    args = [tool, "build", "--network", "host", "-t", tag]
    if dockerfile is not None:
        args += ["-f", str(dockerfile)]
    if target is not None:
        args += ["--target", target]
    if tool == "podman":
        args += ["--isolation", "chroot", "--format", "docker", "--pull=never"]
        args += [f"--volume={p}:{p}:ro" for p in HOST_MOUNTS if Path(p).exists()]
    return run(*args, str(context), timeout=1200, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default="boxtrail:local")
    args = parser.parse_args()
    tool = engine()
    base = ensure_base(tool)
    print(f"building {args.tag} with {tool} on {BASE} ({base})", file=sys.stderr)
    result = build(tool, args.tag)
    sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
