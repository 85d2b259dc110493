"""The flush's and the compactor's Parquet encoding run behind ingest for the CPU: on
threads at nice +10 (core.workers.Background), never on the event loop's thread, whose
priority stays as it was."""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from core.workers import NICE, Background
from ingest import service as service_module
from ingest.service import IngestService
from tests.ingest.test_ingest_failures import rows, service


def _priority() -> tuple[int, int]:
    """This thread's id and niceness."""
    me = threading.get_native_id()
    return me, os.getpriority(os.PRIO_PROCESS, me)


def test_flushes_and_merges_encode_on_lowered_threads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, tuple[int, int]] = {}
    encode_all, merge = service_module._encode_all, IngestService._merge

    def encode_spy(*args: Any) -> Any:
        seen["flush"] = _priority()
        return encode_all(*args)

    def merge_spy(self: IngestService, *args: Any) -> Any:
        seen["merge"] = _priority()
        return merge(self, *args)

    monkeypatch.setattr(service_module, "_encode_all", encode_spy)
    monkeypatch.setattr(IngestService, "_merge", merge_spy)

    async def main() -> tuple[int, int]:
        loop_thread = _priority()
        svc, _, _ = service(tmp_path, BOXTRAIL_COMPACT_MIN_FILES="2")
        await svc.start()
        for _ in range(2):
            await svc.accept(rows("a", 5))
            assert await svc.flush() == 5
        assert await svc.compact() == 1
        await svc.stop()
        assert _priority() == loop_thread  # the loop's thread was left as it was
        return loop_thread

    loop_tid, loop_nice = asyncio.run(main())
    for what in ("flush", "merge"):
        tid, nice = seen[what]
        assert tid != loop_tid, what
        assert nice == min(19, loop_nice + NICE), what


def test_a_background_call_sees_the_callers_context_and_its_errors() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    pool = Background("t", 1)

    def boom() -> None:
        raise ValueError("from the thread")

    async def main() -> str:
        var.set("the caller's")
        try:
            with pytest.raises(ValueError, match="from the thread"):
                await pool.run(boom)
            return await pool.run(var.get)
        finally:
            pool.close()

    assert asyncio.run(main()) == "the caller's"
