"""The metrics registry under the threads that share it (event loop, WAL, queries)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from core.metrics import Registry

THREADS = 8
INCREMENTS = 20_000


@pytest.fixture
def eager_switches() -> Iterator[None]:
    """Thread switches as often as the interpreter allows: a lost update shows up."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_increments_from_many_threads_are_all_counted(eager_switches: None) -> None:
    registry = Registry()
    plain = registry.counter("plain_total", "no labels")
    labelled = registry.counter("labelled_total", "labels", ("reason",))
    summary = registry.summary("seconds", "observations")
    scrapes: list[str] = []

    def bump(n: int) -> None:
        for i in range(INCREMENTS):
            plain.inc()
            labelled.inc(1, f"r{(n * INCREMENTS + i) % 500}")  # new label values as it goes
            summary.observe(1.0)
            if i % 2000 == 0:
                scrapes.append(registry.render())  # a scrape while keys are being added

    threads = [threading.Thread(target=bump, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert plain.get() == THREADS * INCREMENTS
    assert sum(labelled.values.values()) == THREADS * INCREMENTS
    assert summary.count == THREADS * INCREMENTS
    assert len(scrapes) == THREADS * (INCREMENTS // 2000)
