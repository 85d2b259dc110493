"""The code as it is against the code of another commit, in the same run: each benchmark
alternates between the two trees, round after round, and the figure to read is the median
of the per-round ratios (this tree's over the other's), which saw about the same noise.

The other commit is checked out in a temporary git worktree; each benchmark runs from its
own tree (it serves the code beside it: ``bench_ingest.py`` and ``bench_query.py`` start
``python -m boxtrail serve`` with their tree first on ``PYTHONPATH``). Figures:

- ``ingest``: events per server CPU-second, and per second (``bench_ingest.py --only
  boxtrail``);
- ``logs``: ``/logs`` p50 of ``since=10m`` over 365 days (``bench_query.py --only queries``);
- ``tail``: live tails' p99 from the 202 (``bench_query.py --only tail``);
- ``symbolicate``: a new 20-frame stack warm, and the first one after a restart (cold)
  (``bench_symbolicate.py``).

Both trees of ``logs`` and ``tail`` read the same data: ``bench_query.py`` caches its
history under a name made from its sources, so each tree would otherwise make its own, at
another moment, and two histories made a minute apart read 5-10% apart whatever the code
(seen: each server on each cache, 2 x 2). This tree's cache name is made a link to the
base tree's cache, made by the base tree (its metadata schema may be older: the newer code
migrates a copy of it, the older refuses a newer one).

    python benchmarks/bench_ab.py --base 6912d7f --rounds 3

Prints one JSON object on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

Figure = Callable[[dict[str, Any]], float | None]


def _get(data: dict[str, Any], *path: str) -> float | None:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return float(data) if isinstance(data, int | float) else None


def _symbolicated(data: dict[str, Any], figure: str) -> float | None:
    """``bench_symbolicate.py`` reports per bundle: the first bundle's boxtrail figure."""
    for value in data.values():
        if isinstance(value, dict) and isinstance(value.get("boxtrail"), dict):
            return _get(value, "boxtrail", figure)
    return None


# name -> (script, arguments, {figure: (how to read it, higher is better)})
BENCHES: dict[str, tuple[str, list[str], dict[str, tuple[Figure, bool]]]] = {
    "ingest": ("bench_ingest.py", ["--only", "boxtrail", "--seconds", "8", "--warmup", "2"], {
        "events_per_server_cpu_s": (lambda r: _get(r, "boxtrail", "events_per_server_cpu_s"),
                                    True),
        "events_per_s": (lambda r: _get(r, "boxtrail", "events_per_s"), True)}),
    "logs": ("bench_query.py", ["--only", "queries", "--rows", "2000000", "--requests", "100"], {
        "logs_10m_365d_p50_ms": (lambda r: _get(r, "queries", "logs_10m_365d", "server",
                                                "p50_ms"), False)}),
    "tail": ("bench_query.py", ["--only", "tail", "--rows", "2000000"], {
        "tail_p99_ms": (lambda r: _get(r, "figures", "tail_p99_ms"), False)}),
    "symbolicate": ("bench_symbolicate.py", [], {
        "warm_ms_p50": (lambda r: _symbolicated(r, "warm_ms_p50"), False),
        "cold_ms": (lambda r: _symbolicated(r, "cold_ms"), False)}),
}


def run(tree: Path, script: str, args: list[str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(tree / "benchmarks" / script), *args],
                          cwd=tree, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "PYTHONPATH": str(tree)})
    try:
        result: dict[str, Any] = json.loads(proc.stdout)
        return result
    except json.JSONDecodeError:
        print(proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{script} in {tree} printed no JSON (exit {proc.returncode})") from None


def cache_of(tree: Path, args: list[str]) -> Path | None:
    """Where ``bench_query.py`` in ``tree`` keeps its history for these arguments."""
    code = ("import sys; from benchmarks import bench_query as b; "
            "print(b.cache_dir(b.parse_args(sys.argv[1:])[0]))")
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=tree, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(tree)})
    return Path(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else None


def _schema(cache: Path) -> int:
    """The metadata schema version of a history cache's database (0 if it has none)."""
    path = cache / "data" / "meta.sqlite"
    if not path.exists():
        return 0
    con = sqlite3.connect(path)
    try:
        return int(con.execute("PRAGMA user_version").fetchone()[0])
    finally:
        con.close()


def _known(tree: Path) -> int:
    """The metadata schema version the code in ``tree`` knows."""
    found = re.search(r"^SCHEMA_VERSION = (\d+)", (tree / "metadata" / "ddl.py").read_text(),
                      re.MULTILINE)
    return int(found.group(1)) if found else 0


def share_history(base: Path, args: list[str]) -> None:
    """This tree's history cache made a link to the base tree's, made first by the base
    tree if need be: the base's metadata schema is the older one, which the newer code
    reads (it migrates its working copy), where the older refuses a newer schema."""
    mine, theirs = cache_of(REPO, args), cache_of(base, args)
    if mine is None or theirs is None:
        return
    if theirs.is_symlink():
        theirs.unlink()  # a link an earlier run made: the base makes its own
    elif theirs.exists() and _schema(theirs) > _known(base):
        shutil.rmtree(theirs)  # made by a newer tree (the two name it alike): made again
    if mine == theirs:
        return
    if not (theirs / "manifest.json").exists():
        print("making the base tree's history first", file=sys.stderr)
        run(base, "bench_query.py", [*args, "--requests", "1"])
    if mine.is_symlink() or mine.exists():
        if mine.is_symlink():
            mine.unlink()
        else:
            shutil.rmtree(mine)
    mine.symlink_to(theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=",".join(BENCHES),
                        help=f"comma-separated, of: {', '.join(BENCHES)}")
    args = parser.parse_args()
    wanted = [name for name in args.only.split(",") if name]
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=REPO,
                       check=True, capture_output=True)
        try:
            # What the benchmarks need beside them that git does not hold.
            for modules in ("sdk-js/node_modules", "benchmarks/symbolicate/node_modules"):
                if (REPO / modules).exists() and not (base / modules).exists():
                    (base / modules).symlink_to(REPO / modules)
            report: dict[str, Any] = {"base": args.base, "rounds": args.rounds, "benches": {}}
            for name in wanted:
                print(json.dumps(report), file=sys.stderr)  # so far, should a later one fail
                script, bench_args, figures = BENCHES[name]
                if script == "bench_query.py":
                    share_history(base, bench_args)
                seen: dict[str, dict[str, list[float | None]]] = {
                    f: {"head": [], "base": []} for f in figures}
                for round_ in range(args.rounds):
                    order = (("base", base), ("head", REPO))
                    for side, tree in order if round_ % 2 == 0 else order[::-1]:
                        print(f"{name}: round {round_ + 1}, {side}", file=sys.stderr)
                        result = run(tree, script, bench_args)
                        for figure, (read, _) in figures.items():
                            seen[figure][side].append(read(result))
                out: dict[str, Any] = {}
                for figure, (_, higher_is_better) in figures.items():
                    head, old = seen[figure]["head"], seen[figure]["base"]
                    ratios = [h / b for h, b in zip(head, old, strict=True) if h and b]
                    out[figure] = {"head": head, "base": old,
                                   "head_over_base_median": round(statistics.median(ratios), 3)
                                   if ratios else None, "higher_is_better": higher_is_better}
                report["benches"][name] = out
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO,
                           capture_output=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
