"""The supervisor: every long-lived background loop runs under it, and none stops silently.

A node's work after the 202 is done by loops that run as long as the node does: the WAL's
commit loop, the flusher and the compactor (``ingest.service``), the bus's publisher
(heartbeats included), reader, trimmer and answerer (``cluster.bus``), the catalog
membership keeper (``boxtrail.app``), and the live tails' hubs (``query.tail``). Each
handles the failures it expects (Redis or the catalog out of reach, a flush that fails)
and retries them itself. What nobody listed used to end the task for good: a reset Redis
connection made uvloop raise ``RuntimeError`` from a write, the bus loops retry only
``RedisError`` and ``OSError``, and the node stopped sharing rows live until it was
restarted, with ``/readyz`` still 200 (issue 35).

Here such a death is one log record (with its traceback the first time it is seen), one
count in ``boxtrail_task_deaths_total{task}``, and a restart after a backoff that doubles
from ``FIRST_BACKOFF_S`` to ``MAX_BACKOFF_S``, counted in ``boxtrail_task_restarts_total``.
A loop that has died ``FAILING_DEATHS`` times in a row, without running ``healthy_s``
between two deaths, is *failing*: ``/readyz`` answers 503 naming it, and
``boxtrail_tasks_failing`` counts it, until it has run that long again. What a loop left
half done when it died is its owner's to set right (``on_death``): the WAL fails the
group it was committing, a hub sends its tails back to their cursors.

Cancellation is how an owner stops its loops, so it is never a death, not even when a
library turns the cancel into another exception (redis-py makes some into a
``ConnectionError``): the task is being cancelled, so it ends. A loop that returns has
ended on purpose (its owner is closing).

Why one object of its own, on the floor beside ``core.metrics``, rather than a retry
helper beside each loop: the loops live in three packages and follow one policy, and
``/readyz`` must ask one place which of them is failing. ``create_app`` makes the one
supervisor and passes it to each owner's constructor; an owner made alone (a test) makes
its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from core.metrics import Registry

log = logging.getLogger("boxtrail.supervisor")

FIRST_BACKOFF_S = 0.1
# A restart waits at most this long: the bus's loops are what shares rows live, and the
# WAL's commit loop refuses appends while it is down.
MAX_BACKOFF_S = 5.0
FAILING_DEATHS = 3
# A loop that runs this long (plus its own period: healthy_s) without dying is well again.
HEALTHY_S = 10.0

Loop = Callable[[], Coroutine[Any, Any, None]]


@dataclass(eq=False)
class _Run:
    """One supervised task's record: its deaths in a row, and since when it has been
    running (None while it waits to be started again)."""

    name: str
    healthy_s: float
    deaths: int = 0
    up_since: float | None = None
    error: str = ""  # the type of the last exception it died of


@dataclass(frozen=True)
class Failing:
    task: str
    deaths: int  # in a row
    error: str  # the exception's type; the server log has the rest

    def describe(self) -> str:
        return f"{self.task} ({self.deaths} deaths in a row, {self.error})"


class Supervisor:
    def __init__(self, metrics: Registry) -> None:
        self._runs: set[_Run] = set()
        self.m_deaths = metrics.counter(
            "boxtrail_task_deaths_total",
            "Background tasks that died of an exception their loop does not handle (each "
            "is restarted)", ("task",))
        self.m_restarts = metrics.counter(
            "boxtrail_task_restarts_total", "Background tasks restarted after dying",
            ("task",))
        metrics.callback("boxtrail_tasks_failing",
                         "Background tasks dying again and again now (/readyz names them)",
                         lambda: len(self.failing()))

    def start(self, name: str, loop: Loop, *, period_s: float = 0.0,
              on_death: Callable[[], None] | None = None) -> asyncio.Task[None]:
        """Run ``loop()`` as task ``name``, started again whenever it dies. ``period_s``:
        how long one round of the loop can take (a flush interval), so a loop that dies
        every round is not taken for a healthy one. ``on_death`` runs after each death,
        before the backoff: what the loop held is set right at once, not after it."""
        run = _Run(name, HEALTHY_S + period_s)
        # Every supervised task has its series from the start, at 0.
        self.m_deaths.inc(0, name)
        self.m_restarts.inc(0, name)
        return asyncio.create_task(self._supervise(run, loop, on_death), name=name)

    def failing(self) -> list[Failing]:
        now = time.monotonic()
        return sorted(
            (Failing(run.name, run.deaths, run.error) for run in self._runs
             if run.deaths >= FAILING_DEATHS
             and (run.up_since is None or now - run.up_since < run.healthy_s)),
            key=lambda failing: failing.task)

    async def _supervise(self, run: _Run, loop: Loop,
                         on_death: Callable[[], None] | None) -> None:
        self._runs.add(run)
        backoff = FIRST_BACKOFF_S
        seen = ""  # where the last death logged with its traceback came from
        try:
            while True:
                run.up_since = time.monotonic()
                try:
                    await loop()
                    return
                except Exception as exc:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise asyncio.CancelledError from exc  # a stop, whatever it became
                    if time.monotonic() - run.up_since >= run.healthy_s:
                        run.deaths, backoff = 0, FIRST_BACKOFF_S
                    run.deaths += 1
                    run.up_since = None
                    run.error = type(exc).__name__
                    self.m_deaths.inc(1, run.name)
                    # The same failure again and again: its traceback once, then one line
                    # per death.
                    again = _where(exc) == seen
                    seen = _where(exc)
                    log.error("task %s died (%d in a row): %r; restarting in %.1f s",
                              run.name, run.deaths, exc, backoff,
                              exc_info=None if again else exc)
                    if on_death is not None:
                        try:
                            on_death()
                        except Exception:
                            log.exception("task %s: setting right what it left failed",
                                          run.name)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                self.m_restarts.inc(1, run.name)
        finally:
            self._runs.discard(run)


def _where(exc: BaseException) -> str:
    """The exception's type and the line it was raised at: the same failure, whatever its
    message says (uvloop's names the transport's address)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    line = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
    return f"{type(exc).__name__} at {line}"
