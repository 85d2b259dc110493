"""Each closed set is written once and everything else derives from it: the reasons an
ingest request is refused or an event rejected (``ingest.errors.Reason``) and the problems a
frame can carry (``symbolicate.rewrite.Problem``). Here: every refusal class's code is a
reason, every reason is documented in docs/api.md and every problem in docs/sdk.md's table,
and ``/metrics`` lists each from the start (a reason never seen yet reads 0), with the
counters of what the buffer and the bus let go."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import get_args

from core.errors import ApiError
from ingest import errors as ingest_errors
from ingest.errors import REASONS, EventReason
from symbolicate.rewrite import PROBLEMS
from tests.support.server import Server

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_every_refusal_of_ingest_is_a_reason() -> None:
    leaves = [c for _, c in inspect.getmembers(ingest_errors, inspect.isclass)
              if issubclass(c, ApiError) and c.__module__ == ingest_errors.__name__
              and "code" in c.__dict__]
    assert len(leaves) >= 11
    assert {c.code for c in leaves} <= set(REASONS)
    assert set(get_args(EventReason)) <= set(REASONS)


def test_every_reason_and_problem_is_documented() -> None:
    api = (DOCS / "api.md").read_text()
    assert [r for r in REASONS if f"`{r}`" not in api] == []
    sdk = (DOCS / "sdk.md").read_text()
    documented = set(re.findall(r"`([a-z_]+)`", sdk))
    assert [p for p in PROBLEMS if p not in documented] == []


def test_metrics_list_every_reason_from_the_start(server: Server) -> None:
    with server.client() as api:
        text = api.get("/metrics").text
    for reason in REASONS:
        assert f'boxtrail_events_rejected_total{{reason="{reason}"}}' in text, reason
    assert 'boxtrail_ingest_requests_rejected_total{reason="rate_limited"} 0' in text
    assert "boxtrail_buffer_seal_failures 0" in text
