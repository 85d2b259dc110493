"""Acknowledged events survive SIGKILL at random moments, exactly once (local and S3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import crashload
from tests.support.s3server import S3Server

KILLS = 20


@pytest.mark.slow
def test_crash_local(tmp_path: Path) -> None:
    ledger, rows = crashload.run(tmp_path / "data", {}, KILLS, seed=1)
    stats = crashload.check(ledger, rows)
    assert stats["acked"] > 1000, stats  # the load really ran between kills


@pytest.mark.slow
@pytest.mark.s3
def test_crash_s3(tmp_path: Path, s3_server: S3Server, s3_bucket: str) -> None:
    env = {**s3_server.env(), "BOXTRAIL_STORAGE": "s3", "BOXTRAIL_S3_BUCKET": s3_bucket,
           "BOXTRAIL_S3_PREFIX": "crash"}
    ledger, rows = crashload.run(tmp_path / "data", env, KILLS, seed=2)
    stats = crashload.check(ledger, rows)
    assert stats["acked"] > 1000, stats
