"""Jobs that would hold the GIL for long run in processes of their own.

A Python process has one GIL. Building a ``groupBy`` answer over 10,000 errors (parsing,
symbolicating and fingerprinting every stack: ~0.3 s of Python) or validating a 50 MB
source map, done in the server, made every ingest 202 wait its turn for the GIL
(``benchmarks/bench_isolation.py``: p99 11x and 3.2x the quiet figure). They run here
instead, in worker processes spawned at first use at a lower CPU priority (nice +10), so
on a busy machine ingest goes first. Two lanes of ``BOXTRAIL_WORKER_PROCESSES`` processes
each (default 1): ``reads`` (``/errors``, ``logs_errors``, building an upload's lookups,
where the symbolicator's caches live) and ``uploads`` (validating and storing source maps:
seconds for hundreds of MB), so a read never waits behind an upload. ``0`` runs the same
jobs on a thread of the server per lane (no extra process; ingest shares the GIL with them).

A job is a module-level function ``job(side, *args)`` whose arguments and result pickle.
Bulk data goes by file, not through the pipe: the server writes what a job reads under
``<data_dir>/tmp`` (emptied at start) and deletes it once the job is done. A :class:`Side`
is what jobs read, made once per process from the server's settings; the stage whose jobs
run here subclasses it with what they need (``symbolicate.side``: the storage backend, a
read-only view of the metadata database and a symbolicator with its caches) and hands the
class to :class:`Offload`. The counters a side bumps come back with each result and are
added to the server's registry, so ``/metrics`` counts work done in a worker as if done
in the server. A worker that dies
(killed, out of memory) fails the jobs it held with 503 and is replaced at the next job;
a worker whose server died exits within a second.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Concatenate, Generic, NamedTuple, ParamSpec, TypeVar

from core.config import Config
from core.errors import ServiceUnavailable
from core.metrics import Counter, Registry

log = logging.getLogger("boxtrail.workers")

NICE = 10
PARENT_POLL_S = 1.0

_P = ParamSpec("_P")
_R = TypeVar("_R")


class WorkerLost(ServiceUnavailable):
    """The worker process running the job died; the next job starts a new one."""

    code = "worker_unavailable"


class Side:
    """What jobs read, made once per worker (see the module docstring); a stage subclasses
    it. ``metrics`` counts what its jobs do, reported to the server with each result."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = Registry()
        self._reported: dict[tuple[str, tuple[str, ...]], float] = {}

    @classmethod
    def declare(cls, metrics: Registry, gauge: Callable[[str], float]) -> None:
        """Register, in the server's registry, the counters this side bumps (under the same
        names) and its gauges, read through ``gauge(name)``: the sum over the workers."""

    def report(self) -> Report:
        """Counter increments since the last report, and the gauges now."""
        deltas = []
        gauges = []
        for item in self.metrics.items:
            if isinstance(item, Counter):
                with item.lock:
                    values = list(item.values.items())
                for labels, value in values:
                    key = (item.name, labels)
                    if value != self._reported.get(key, 0.0):
                        deltas.append((item.name, labels, value - self._reported.get(key, 0.0)))
                        self._reported[key] = value
            elif hasattr(item, "read"):
                gauges.append((item.name, float(item.read())))
        return Report(None, deltas, gauges, os.getpid())


class Report(NamedTuple):
    result: Any
    counters: list[tuple[str, tuple[str, ...], float]]
    gauges: list[tuple[str, float]]
    pid: int


_local = threading.local()
_S = TypeVar("_S", bound=Side)


def _start(config: Config, in_process: bool, side: type[Side]) -> None:
    """Initializer of each worker (process or thread)."""
    if not in_process:
        os.nice(NICE)
        logging.basicConfig(level=logging.INFO, format="boxtrail worker: %(message)s")
        parent = os.getppid()
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    _local.side = side(config)


def _watch_parent(parent: int) -> None:
    # The pool's pipes stay open in the worker, so it would not notice its server's end.
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


def _call(job: Callable[..., Any], args: tuple[Any, ...]) -> Report:
    side: Side = _local.side
    result = job(side, *args)
    return side.report()._replace(result=result)


class Offload(Generic[_S]):
    """The server's end: :meth:`run` a job in a worker and get its result. Each worker
    makes one ``side`` for its jobs."""

    def __init__(self, config: Config, metrics: Registry, side: type[_S]) -> None:
        self.config = config
        self.side = side
        self.tmp = Path(config.data_dir) / "tmp"
        shutil.rmtree(self.tmp, ignore_errors=True)  # what a killed server left behind
        self.tmp.mkdir(parents=True, exist_ok=True)
        self._pools: dict[str, Executor] = {}
        self._lock = threading.Lock()
        self._gauges: dict[tuple[str, int], float] = {}
        # The side's counters, under the same names, in the server's registry.
        side.declare(metrics, self._gauge)
        self._counters = {item.name: item for item in metrics.items if isinstance(item, Counter)}

    def _gauge(self, name: str) -> float:
        return sum(v for (n, _), v in self._gauges.items() if n == name)

    def temp_path(self, kind: str) -> Path:
        """A fresh file name under ``<data_dir>/tmp`` for a job's input."""
        return self.tmp / f"{kind}-{uuid.uuid4().hex}"

    def _executor(self, lane: str) -> Executor:
        with self._lock:
            pool = self._pools.get(lane)
            if pool is None:
                processes = self.config.worker_processes
                if processes == 0:
                    pool = ThreadPoolExecutor(
                        1, thread_name_prefix=f"side-{lane}", initializer=_start,
                        initargs=(self.config, True, self.side))
                else:
                    pool = ProcessPoolExecutor(
                        processes, mp_context=multiprocessing.get_context("spawn"),
                        initializer=_start, initargs=(self.config, False, self.side))
                self._pools[lane] = pool
            return pool

    async def run(self, job: Callable[Concatenate[_S, _P], _R], *args: Any,
                  lane: str = "reads") -> _R:
        pool = self._executor(lane)
        try:
            future = pool.submit(_call, job, args)
        except BrokenProcessPool:  # a worker died between jobs: nothing was lost, start anew
            self._discard(lane, pool)
            pool = self._executor(lane)
            future = pool.submit(_call, job, args)
        try:
            report: Report = await asyncio.wrap_future(future)
        except BrokenProcessPool:
            self._discard(lane, pool)
            log.error("a worker process died while running %s; starting another",
                      getattr(job, "__name__", job))
            raise WorkerLost("the worker process for this request died; retry",
                             headers={"Retry-After": "1"}) from None
        for name, labels, amount in report.counters:
            counter = self._counters.get(name)
            if counter is not None:
                counter.inc(amount, *labels)
        for name, value in report.gauges:
            self._gauges[(name, report.pid)] = value
        return report.result  # type: ignore[no-any-return]

    def _discard(self, lane: str, pool: Executor) -> None:
        with self._lock:
            if self._pools.get(lane) is pool:
                del self._pools[lane]
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.tmp, ignore_errors=True)
