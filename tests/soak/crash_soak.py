"""Crash soak: hundreds of SIGKILLs under load, then every acknowledged event exactly once.

    python -m tests.soak.crash_soak [--kills 200] [--storage local|s3|both] [--seed 7]

The same check as tests/ingest/test_crash.py (20 kills), run long enough to hit the rare
moments: mid-fsync, mid-flush, mid-compaction, mid-replay. S3 mode starts its own
`weed mini` on 127.0.0.1. Prints one JSON object per storage mode; exits 1 on a loss.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from tests.support import crashload
from tests.support.s3server import S3Server


def soak(storage: str, kills: int, seed: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="boxtrail-soak-") as tmp:
        started = time.monotonic()
        if storage == "s3":
            with S3Server() as s3:
                env = {**s3.env(), "BOXTRAIL_S3_BUCKET": s3.new_bucket(),
                       "BOXTRAIL_S3_PREFIX": "soak"}
                ledger, rows = crashload.run(Path(tmp) / "data", env, kills, seed)
        else:
            ledger, rows = crashload.run(Path(tmp) / "data", {}, kills, seed)
        stats = crashload.check(ledger, rows)
        return {"storage": storage, "kills": kills, "seed": seed,
                "seconds": round(time.monotonic() - started, 1), **stats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--storage", choices=("local", "s3", "both"), default="both")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    modes = ("local", "s3") if args.storage == "both" else (args.storage,)
    failed = False
    for mode in modes:
        try:
            print(json.dumps(soak(mode, args.kills, args.seed)), flush=True)
        except AssertionError as exc:
            failed = True
            print(json.dumps({"storage": mode, "kills": args.kills, "error": str(exc)}),
                  flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
