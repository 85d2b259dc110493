"""Every PostgreSQL call has a deadline on the client's side (``metadata.db``): against a
server that never answers and never closes (a blackhole, tests/support/faultproxy.py), a call on
the event loop fails within ``LOOP_DEADLINE_S``, one from a thread within
``REQUEST_DEADLINE_S``, a background writer's (``patiently``) within
``THREAD_DEADLINE_S``, one a thread makes for the loop (``promptly``) on the loop's
terms, the loop's later calls fail at once instead of waiting again, and
after the heal the next calls are answered on a new connection."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from metadata.catalog import Catalog
from metadata.db import MetadataUnavailable
from metadata.postgres import Postgres, patiently, promptly
from tests.support.faultproxy import FaultProxy

# What a deadline may overrun by on a busy 2-core machine (a thread's wake-up, a close).
SLACK_S = 0.5


@pytest.fixture
def proxied(pg_url: str) -> Iterator[tuple[Postgres, FaultProxy]]:
    parts = urlsplit(pg_url)
    assert parts.hostname is not None and parts.port is not None
    with FaultProxy(parts.hostname, parts.port) as proxy:
        db = Postgres(pg_url.replace(f":{parts.port}/", f":{proxy.port}/"))
        try:
            yield db, proxy
        finally:
            proxy.heal()
            db.close()


def timed(call: object) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        call()  # type: ignore[operator]
    except MetadataUnavailable as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def test_a_thread_s_call_to_a_blackholed_catalog_ends_at_its_deadline(
        proxied: tuple[Postgres, FaultProxy]) -> None:
    db, proxy = proxied
    catalog = Catalog(db, "n1")
    assert catalog.flushed_lsn() == 0
    proxy.blackhole()
    took, failed = timed(catalog.flushed_lsn)
    assert failed is not None and "no answer within" in str(failed)
    assert Postgres.REQUEST_DEADLINE_S <= took < Postgres.REQUEST_DEADLINE_S + SLACK_S
    # A background writer's transaction, COMMIT included, is under a writer's deadline
    # (its connect first: the cut left none).
    time.sleep(Postgres.RETRY_AFTER_S)
    assert catalog.db.reader is not catalog.db
    with patiently():
        took, failed = timed(lambda: catalog.publish([], flushed_lsn=5))
    assert failed is not None
    assert took < Postgres.THREAD_DEADLINE_S + SLACK_S
    proxy.heal()
    time.sleep(Postgres.RETRY_AFTER_S)  # a failed connect makes calls fail fast a while
    catalog.publish([], flushed_lsn=5)
    assert catalog.flushed_lsn() == 5


def test_the_loop_waits_one_short_deadline_then_fails_at_once_until_the_heal(
        proxied: tuple[Postgres, FaultProxy]) -> None:
    db, proxy = proxied
    catalog = Catalog(db, "n1")

    async def main() -> None:
        assert catalog.flushed_lsn() == 0
        proxy.blackhole()
        took, failed = timed(catalog.flushed_lsn)
        assert failed is not None
        assert Postgres.LOOP_DEADLINE_S <= took < Postgres.LOOP_DEADLINE_S + SLACK_S
        # No connection now: the loop never connects (a connect waits for its timeout
        # against a hang), it fails at once and a thread connects.
        for _ in range(20):
            took, failed = timed(catalog.flushed_lsn)
            assert failed is not None and took < 0.05
            await asyncio.sleep(0.05)
        # A thread's write hangs until its deadline; the loop does not queue behind it.
        writing = asyncio.ensure_future(asyncio.to_thread(
            lambda: timed(lambda: catalog.publish([], flushed_lsn=7))))
        await asyncio.sleep(0.2)
        took, failed = timed(lambda: catalog.publish([], flushed_lsn=8))
        assert failed is not None and took < Postgres.LOOP_DEADLINE_S + SLACK_S
        assert (await writing)[1] is not None
        proxy.heal()
        deadline = time.monotonic() + Postgres.RETRY_AFTER_S + Postgres.CONNECT_TIMEOUT_S + 5
        while True:
            try:
                assert catalog.flushed_lsn() == 0  # neither write went through
                break
            except MetadataUnavailable:
                assert time.monotonic() < deadline, "the catalog never came back"
                await asyncio.sleep(0.1)

    asyncio.run(main())


def test_a_read_made_promptly_in_a_thread_is_held_to_the_loop_s_terms(
        proxied: tuple[Postgres, FaultProxy]) -> None:
    """A search's plan reads the catalog in a thread: against a blackhole it waits the
    loop's deadline once, then fails at once while a thread connects (a connect there
    would wait ``CONNECT_TIMEOUT_S``), and reads again after the heal."""
    db, proxy = proxied
    catalog = Catalog(db, "n1")

    def prompt_lsn() -> int:
        with promptly():
            return catalog.flushed_lsn()

    assert prompt_lsn() == 0
    proxy.blackhole()
    took, failed = timed(prompt_lsn)
    assert failed is not None
    assert Postgres.LOOP_DEADLINE_S <= took < Postgres.LOOP_DEADLINE_S + SLACK_S
    for _ in range(10):
        took, failed = timed(prompt_lsn)
        assert failed is not None and took < 0.05
        time.sleep(0.05)
    proxy.heal()
    deadline = time.monotonic() + Postgres.RETRY_AFTER_S + Postgres.CONNECT_TIMEOUT_S + 5
    while True:
        try:
            assert prompt_lsn() == 0
            break
        except MetadataUnavailable:
            assert time.monotonic() < deadline, "the catalog never came back"
            time.sleep(0.1)
