"""Symbolication: cold (first error after an upload) and warm latency per 20-frame error.

A large real bundle (date-fns, lodash-es, react, react-dom, three; esbuild, minified: ~1.1 MB
of JS, ~5.9 MB of map) and the small app bundle of the tests. Frames are valid minified
positions drawn from the map with a fixed seed. Each variant runs in its own subprocess and
prints JSON; side by side in the same run:

- ``boxtrail``: ``symbolicate.lookup.Symbolicator`` over a real ``ArtifactStore`` (SQLite +
  local storage): the upload; the first error read right after it (the upload started
  building the lookups in the background: the read waits for that build), after that build
  finished, and after a restart (``cold``: empty caches, the whole build on the read, with
  the function tables the upload stored beside the map: names come from the original
  sources, ``named_from_source_of_first``); warm
  (a new stack on a built artifact) and repeat (the same stack again: the stack cache);
- ``symbolic``: ``SourceMapCache`` used directly, with the whole map and 5 context lines a
  frame: the same answers boxtrail gives (the ceiling);
- ``symbolic-bare``: ``SourceMapCache`` on the map without sourcesContent, no context lines
  (the floor of any ``symbolic``-based service: positions and function names only);
- ``sourcemap``: PyPI ``sourcemap`` 0.2.1 (the library DESIGN.md rejected);
- ``trace-mapping``: node ``@jridgewell/trace-mapping``.

    .venv/bin/python benchmarks/bench_symbolicate.py [--stacks 200] [--rounds 5]

Run it under ``flock /tmp/boxtrail-bench.lock`` when other benchmarks share the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

HERE = Path(__file__).resolve().parent / "symbolicate"
APP = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "sourcemaps" / "app"
URL = "https://shop.box.parallelsandbox.com/assets/{name}.js"
FRAMES = 20


def build(out: Path) -> dict[str, Path]:
    esbuild = HERE / "node_modules" / ".bin" / "esbuild"
    if not esbuild.exists():
        sys.exit(f"{esbuild} is missing: run `make bench` (npm ci in benchmarks/symbolicate)")
    common = ["--bundle", "--minify", "--sourcemap", "--log-level=warning"]
    subprocess.run([str(esbuild), "entry.js", *common, f"--outfile={out}/big.js"], cwd=HERE,
                   check=True, timeout=120)
    subprocess.run([str(esbuild), "src/main.js", *common, f"--outfile={out}/small.js"],
                   cwd=APP, check=True, timeout=120)
    return {"big": out / "big.js", "small": out / "small.js"}


def positions(map_path: Path, count: int, seed: int) -> list[tuple[int, int]]:
    from symbolic.sourcemap import SourceMapView

    view = SourceMapView.from_json_bytes(map_path.read_bytes())
    rng = random.Random(seed)
    tokens = [view[rng.randrange(len(view))] for _ in range(count)]
    return [(t.dst_line + 1, t.dst_col + 1) for t in tokens]


def stack_text(name: str, frames: list[tuple[int, int]]) -> str:
    url = URL.format(name=name)
    return "Error: bench\n" + "\n".join(f"    at f{i} ({url}:{line}:{col})"
                                        for i, (line, col) in enumerate(frames))


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


# --- variants (each in its own process) -------------------------------------------------------


def run_boxtrail(js: Path, stacks: list[list[tuple[int, int]]], name: str) -> dict[str, object]:
    from core.metrics import Registry
    from core.storage import LocalStorage
    from metadata.sqlite import open_db
    from symbolicate.artifacts import ArtifactStore
    from symbolicate.built import FROM_SOURCE
    from symbolicate.lookup import StackInput, Symbolicator
    from symbolicate.sourcemaps import UploadedFile, plan_upload

    async def main(tmp: Path) -> dict[str, object]:
        # Uploads build their lookups before they answer, as the server's do (in a worker
        # there): by the symbolicator made for the first read below.
        store = ArtifactStore(open_db(tmp / "meta.sqlite"), LocalStorage(str(tmp / "objects")),
                              lambda project_id, rows: symbolicator.prebuild(project_id, rows))
        files = [UploadedFile(f"assets/{name}.js", js.read_bytes()),
                 UploadedFile(f"assets/{name}.js.map", Path(f"{js}.map").read_bytes())]

        def item(frames: list[tuple[int, int]]) -> StackInput:
            return StackInput(release="1.0", debug_ids={}, stack=stack_text(name, frames),
                              header=None)

        async def first_error(symbolicator: Symbolicator) -> tuple[float, int]:
            started = time.perf_counter()
            [first] = await symbolicator.symbolicate("prj_bench", [item(stacks[0])])
            elapsed = time.perf_counter() - started
            named_from_source.append(sum(f.function_source in FROM_SOURCE for f in first.frames))
            return elapsed, sum(f.symbolicated for f in first.frames)

        named_from_source: list[int] = []  # frames named by the original sources' scopes

        # 1. The first error read right after the upload (which answered once it had built
        # the artifact's lookups: upload_ms includes that build).
        symbolicator = Symbolicator(store, Registry())
        started = time.perf_counter()
        await store.upload("prj_bench", "1.0", plan_upload(files, "~/"))
        upload_s = time.perf_counter() - started
        right_after_s, symbolicated = await first_error(symbolicator)
        warm = []
        for frames in stacks[1:]:
            started = time.perf_counter()
            await symbolicator.symbolicate("prj_bench", [item(frames)])
            warm.append(time.perf_counter() - started)
        repeat = []
        for frames in stacks[1:]:
            started = time.perf_counter()
            await symbolicator.symbolicate("prj_bench", [item(frames)])
            repeat.append(time.perf_counter() - started)
        # 2. After a restart: empty caches, nothing built (the cold path); the original
        # sources' function tables are read from storage, where the upload put them.
        cold_s, _ = await first_error(Symbolicator(store, Registry()))
        return {"upload_ms": _ms(upload_s), "cold_ms": _ms(cold_s),
                "first_after_upload_ms": _ms(right_after_s),
                "warm_ms_p50": _ms(statistics.median(warm)),
                "warm_ms_mean": _ms(statistics.fmean(warm)),
                "repeat_ms_p50": _ms(statistics.median(repeat)),
                "frames_per_s": round(FRAMES / statistics.fmean(warm)),
                "symbolicated_frames_of_first": symbolicated,
                "named_from_source_of_first": min(named_from_source)}

    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(main(Path(tmp)))


def run_symbolic(js: Path, stacks: list[list[tuple[int, int]]]) -> dict[str, object]:
    """``SourceMapCache`` as its docs show it: the whole map, 5 context lines a frame (the
    function names and context boxtrail returns)."""
    cold_s, warm = _time_symbolic(js.read_bytes(), Path(f"{js}.map").read_bytes(), stacks, 5)
    return {"cold_ms": _ms(cold_s), "warm_ms_p50": _ms(statistics.median(warm)),
            "warm_ms_mean": _ms(statistics.fmean(warm)),
            "frames_per_s": round(FRAMES / statistics.fmean(warm))}


def _time_symbolic(source: bytes, source_map: bytes, stacks: list[list[tuple[int, int]]],
                   context: int) -> tuple[float, list[float]]:
    """Seconds to build the cache and look up the first stack; seconds of each other one."""
    from symbolic.sourcemapcache import SourceMapCache

    started = time.perf_counter()
    cache = SourceMapCache.from_bytes(source, source_map)
    for line, col in stacks[0]:
        cache.lookup(line, col, context)
    cold_s = time.perf_counter() - started
    warm = []
    for frames in stacks[1:]:
        started = time.perf_counter()
        for line, col in frames:
            cache.lookup(line, col, context)
        warm.append(time.perf_counter() - started)
    return cold_s, warm


def run_symbolic_bare(js: Path, stacks: list[list[tuple[int, int]]]) -> dict[str, object]:
    """The floor: ``SourceMapCache`` on the map without sourcesContent, no context lines
    (positions and function names only; the map is stripped before the clock starts)."""
    source = js.read_bytes()
    stripped = json.loads(Path(f"{js}.map").read_bytes())
    stripped.pop("sourcesContent", None)
    cold_s, warm = _time_symbolic(source, json.dumps(stripped).encode(), stacks, 0)
    return {"cold_ms": _ms(cold_s), "warm_ms_p50": _ms(statistics.median(warm)),
            "frames_per_s": round(FRAMES / statistics.fmean(warm)), "context_lines": False}


def run_sourcemap(js: Path, stacks: list[list[tuple[int, int]]]) -> dict[str, object]:
    import sourcemap  # type: ignore[import-untyped]

    text = Path(f"{js}.map").read_text()
    started = time.perf_counter()
    index = sourcemap.loads(text)
    parse_s = time.perf_counter() - started
    warm, failed = [], 0
    for frames in stacks[1:]:
        started = time.perf_counter()
        for line, col in frames:
            try:
                index.lookup(line - 1, col - 1)
            except IndexError:
                failed += 1
        warm.append(time.perf_counter() - started)
    return {"cold_ms": _ms(parse_s + warm[0]), "warm_ms_p50": _ms(statistics.median(warm)),
            "frames_per_s": round(FRAMES / statistics.fmean(warm)), "lookup_errors": failed,
            "function_names": False}


def run_trace_mapping(js: Path, stacks: list[list[tuple[int, int]]]) -> dict[str, object]:
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump([p for frames in stacks for p in frames], f)
        f.flush()
        out = subprocess.run(["node", "trace_mapping.mjs", f"{js}.map", f.name, "20"],
                             cwd=HERE, check=True, capture_output=True, text=True, timeout=300)
    result = json.loads(out.stdout)
    return {"cold_ms": round(result["parse_ms"], 3),  # parse + the first lookup
            "warm_ms_p50": _ms(FRAMES / result["lookups_per_s"]),  # mean of 20 rounds
            "frames_per_s": round(result["lookups_per_s"]),
            "function_names": False}


def variant(args: argparse.Namespace) -> None:
    js = Path(args.js)
    stacks = json.loads(Path(args.stacks_file).read_text())
    runners = {"boxtrail": lambda: run_boxtrail(js, stacks, args.name),
               "symbolic": lambda: run_symbolic(js, stacks),
               "symbolic-bare": lambda: run_symbolic_bare(js, stacks),
               "sourcemap": lambda: run_sourcemap(js, stacks),
               "trace-mapping": lambda: run_trace_mapping(js, stacks)}
    print(json.dumps(runners[args.variant]()))


VARIANTS = ("boxtrail", "symbolic", "symbolic-bare", "sourcemap", "trace-mapping")


def _median_of(rounds: list[dict[str, object]]) -> dict[str, object]:
    """Each numeric figure's median over the rounds (all rounds kept under ``rounds``)."""
    out: dict[str, object] = {}
    for key, value in rounds[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = round(statistics.median(float(r[key]) for r in rounds  # type: ignore[arg-type]
                                               ), 3)
        else:
            out[key] = value
    out["rounds"] = rounds
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stacks", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5,
                        help="each variant runs this many times, alternating; medians reported")
    parser.add_argument("--variant")
    parser.add_argument("--js")
    parser.add_argument("--name")
    parser.add_argument("--stacks-file")
    args = parser.parse_args()
    if args.variant:
        variant(args)
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-symbolicate-"))
    try:
        bundles = build(tmp)
        report: dict[str, object] = {"frames_per_stack": FRAMES, "stacks": args.stacks,
                                     "rounds": args.rounds}
        for name, js in bundles.items():
            frames = positions(Path(f"{js}.map"), args.stacks * FRAMES, seed=42)
            stacks = [frames[i: i + FRAMES] for i in range(0, len(frames), FRAMES)]
            stacks_file = tmp / f"{name}-stacks.json"
            stacks_file.write_text(json.dumps(stacks))
            rounds: dict[str, list[dict[str, object]]] = {v: [] for v in VARIANTS}
            for _ in range(args.rounds):
                for name_ in VARIANTS:
                    out = subprocess.run(
                        [sys.executable, __file__, "--variant", name_, "--js", str(js),
                         "--name", name, "--stacks-file", str(stacks_file)],
                        check=True, capture_output=True, text=True, timeout=600)
                    rounds[name_].append(json.loads(out.stdout))
            results: dict[str, object] = {"js_bytes": js.stat().st_size,
                                          "map_bytes": Path(f"{js}.map").stat().st_size}
            results.update({v: _median_of(r) for v, r in rounds.items()})
            # Ratios within each round (both ran back to back), then their median.
            for figure in ("warm_ms_p50", "cold_ms"):
                results[f"boxtrail_{figure}_vs_symbolic"] = round(statistics.median(
                    float(b[figure]) / float(c[figure])  # type: ignore[arg-type]
                    for b, c in zip(rounds["boxtrail"], rounds["symbolic"], strict=True)), 2)
            report[name] = results
        print(json.dumps(report, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
