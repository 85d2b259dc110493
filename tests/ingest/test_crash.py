"""Acknowledged events survive SIGKILL at random moments, exactly once (local and S3).

The two modes run at the same time, each against its own server, data and ledger: a run
mostly waits (for its uptime before a kill, for its server to start again), so the pair
takes about as long as the S3 run alone (~75 s) instead of the two one after the other
(~115 s). Each test still asks its own run for its own check."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.support import crashload
from tests.support.s3server import S3Server

KILLS = 20
Run = tuple[crashload.Ledger, list[dict[str, object]]]


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[Run]]]:
    """The run of each mode whose test is selected, started together on first use."""
    selected = {item.name.removeprefix("test_crash_") for item in request.session.items
                if item.path == request.path}
    with ThreadPoolExecutor(2) as pool:
        started: dict[str, Future[Run]] = {}
        if "local" in selected:
            started["local"] = pool.submit(crashload.run,
                                           tmp_path_factory.mktemp("local") / "data", {},
                                           KILLS, seed=1)
        if "s3" in selected:
            s3: S3Server = request.getfixturevalue("s3_server")
            env = {**s3.env(), "BOXTRAIL_STORAGE": "s3", "BOXTRAIL_S3_BUCKET": s3.new_bucket(),
                   "BOXTRAIL_S3_PREFIX": "crash"}
            started["s3"] = pool.submit(crashload.run, tmp_path_factory.mktemp("s3") / "data",
                                        env, KILLS, seed=2)
        yield started


@pytest.mark.slow
def test_crash_local(runs: dict[str, Future[Run]]) -> None:
    stats = crashload.check(*runs["local"].result())
    assert stats["acked"] > 1000, stats  # the load really ran between kills


@pytest.mark.slow
@pytest.mark.s3
def test_crash_s3(runs: dict[str, Future[Run]]) -> None:
    stats = crashload.check(*runs["s3"].result())
    assert stats["acked"] > 1000, stats
