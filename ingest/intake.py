"""The one intake pipeline: what ``POST /v1/ingest`` (``routes``) and Sentry's endpoints
(``sentry``) both do around parsing their own wire format, in this order:

1. :meth:`Intake.admit`: the project the key names, and an ``Origin`` it allows: the one
   ingest-key + origin check, which the CORS preflights make too.
2. :meth:`Intake.read`: the body within ``max_body_bytes`` as sent, inflated within
   ``max_inflated_bytes`` by an encoding the endpoint takes (``body``).
3. The endpoint parses the body into rows and a context (``wire``; ``envelope``).
4. :meth:`Intake.count`, :meth:`Intake.box`, :meth:`Intake.store`: the row count, the
   box, the rate limit, per-row validation (``events.BatchBuilder``), and the WAL
   (``IngestService.accept``), whose 202 comes once the rows are durable; tokens taken for
   rows the WAL refused are given back.
5. :meth:`Intake.refused` and :meth:`Intake.counted`: every refused request and every
   rejected, truncated or accepted row counted by reason (``errors``), and every answer,
   refusals included, with the CORS headers a browser needs to read it.

What a request used (:class:`Seen`: its project, box, source and bytes) goes with its batch
into the WAL, and a refused request of a known project leaves a record there of its own
before its answer (``IngestService.note``): usage counts both once they are durable
(``core.usage``). A request whose project is not known (an unknown key), or whose record
the WAL could not take (``storage_unavailable``), is counted in ``/metrics`` only.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import get_args

import msgspec

from core.config import Config
from core.errors import ApiError
from core.metrics import Registry
from core.schema import RowBatch
from ingest.body import Inflate, content_length, encoding_of, read_limited
from ingest.errors import (
    REASONS,
    EventReason,
    InvalidBody,
    OriginNotAllowed,
    RateLimited,
    StorageUnavailable,
    TooManyEvents,
)
from ingest.events import BatchBuilder, Limits
from ingest.origin import BOX_ID, box_from_origin, box_pattern, origin_allowed
from ingest.ratelimit import TokenBuckets
from ingest.service import IngestService
from ingest.wire import Context
from tenancy.tenants import Project

# An answer: status, JSON body, headers.
Answer = tuple[int, bytes, dict[str, str]]
_encode = msgspec.json.Encoder().encode


def cors(origin: str | None, expose: str) -> dict[str, str]:
    """What lets the page at ``origin`` read an answer, and the headers named in ``expose``."""
    if not origin:
        return {}
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
            "Access-Control-Expose-Headers": expose}


def preflight_headers(origin: str | None, expose: str, allow_headers: str) -> dict[str, str]:
    """A preflight's answer for an admitted request (:meth:`Intake.admit`)."""
    return cors(origin, expose) | {"Access-Control-Allow-Methods": "POST, OPTIONS",
                                   "Access-Control-Allow-Headers": allow_headers,
                                   "Access-Control-Max-Age": "86400"}


def retry_after(seconds: int) -> dict[str, str]:
    return {"Retry-After": str(seconds)}


@dataclass
class Seen:
    """What one request used, as far as it got: filled in by the intake's steps."""

    source: str  # the intake: ingest, envelope, store
    project_id: str = ""
    box: str | None = None
    wire_bytes: int = 0
    body_bytes: int = 0
    discarded: dict[str, int] | None = None  # what the client dropped (Sentry's reports)


# Refusals without a project to count them against, or that the WAL itself refused.
_UNRECORDED = frozenset(("unknown_ingest_key", "project_mismatch", "storage_unavailable",
                         "catalog_unavailable", "internal_error"))


class Intake:
    def __init__(self, config: Config, service: IngestService, metrics: Registry,
                 buckets: TokenBuckets | None = None) -> None:
        self.config = config
        self.service = service
        self.limits = Limits.from_config(config)
        self.box_pattern = box_pattern(config.box_host_pattern)
        # The node's (shared with the cluster through the bus: boxtrail.app), or its own.
        self.buckets = buckets or TokenBuckets(config.rate_limit_events, config.rate_limit_burst)
        self.m_accepted = metrics.counter("boxtrail_events_accepted_total",
                                          "Events acknowledged durable")
        self.m_rejected = metrics.counter("boxtrail_events_rejected_total",
                                          "Events not stored, by reason", ("reason",), REASONS)
        self.m_requests_rejected = metrics.counter(
            "boxtrail_ingest_requests_rejected_total", "Ingest requests refused whole, by reason",
            ("reason",), [r for r in REASONS if r not in get_args(EventReason)])
        self.m_truncated = metrics.counter("boxtrail_events_truncated_total",
                                           "Event fields cut to their size limit", ("field",))
        self.m_bytes = metrics.counter("boxtrail_ingest_bytes_total",
                                       "Ingest body bytes received (before inflating)")

    def admit(self, project: Project | None, origin: str | None,
              unknown: Callable[[], ApiError], seen: Seen | None = None) -> Project:
        """``project``, the one the request's key names (None: no project has it, and
        ``unknown()`` says so), if it allows ``origin``."""
        if project is None:
            raise unknown()
        if seen is not None:
            seen.project_id = project.id
            seen.box = box_from_origin(origin, self.box_pattern)
        if not origin_allowed(origin, project.allowed_origins):
            raise OriginNotAllowed(f"origin {origin} is not in this project's allowedOrigins",
                                   detail={"origin": origin})
        return project

    async def read(self, headers: Mapping[str, str], chunks: AsyncIterator[bytes],
                   inflaters: Mapping[str, Inflate | None], seen: Seen) -> bytes:
        """The body, inflated by its ``Content-Encoding`` (one of ``inflaters``: None for
        none), within the size limits."""
        inflater = inflaters[encoding_of(headers.get("content-encoding"), inflaters)]
        raw = await read_limited(chunks, content_length(headers.get("content-length")),
                                 self.config.max_body_bytes)
        self.m_bytes.inc(len(raw))
        seen.wire_bytes = len(raw)
        body = raw if inflater is None else inflater(raw, self.config.max_inflated_bytes)
        seen.body_bytes = len(body)
        return body

    def count(self, rows: int, noun: str) -> None:
        """``rows`` rows (``noun``, as the endpoint's users call them) are no more than a
        request may hold."""
        limit = self.config.max_events_per_request
        if rows > limit:
            raise TooManyEvents(f"{rows} {noun} in one request; send at most {limit}",
                                detail={"limit": limit, "events": rows})

    def box(self, origin: str | None, sent: str | None, seen: Seen, *, strict: bool
            ) -> str | None:
        """The box: named by the ``Origin``'s host, else the one the body sent. A sent one
        that is no box id is refused (``strict``) or ignored."""
        box = box_from_origin(origin, self.box_pattern)
        if box is not None or sent is None:
            return box
        if BOX_ID.fullmatch(sent):
            seen.box = sent
            return sent
        if strict:
            raise InvalidBody(f"context.boxId {sent[:80]!r} must match {BOX_ID.pattern}",
                              detail={"field": "context.boxId"})
        return None

    async def store(self, project: Project, rows: int, box: str | None, context: Context,
                    fill: Callable[[BatchBuilder], None], seen: Seen,
                    rate_limited: Callable[[int], dict[str, str]] = retry_after,
                    key_limit: tuple[str, float] | None = None
                    ) -> tuple[RowBatch, BatchBuilder]:
        """``rows`` rows of ``project`` (:meth:`count`ed), which ``fill`` adds to the batch,
        stored; ``rate_limited(seconds)``: the headers of a refusal for the rate;
        ``key_limit``: the ingest key and its own limit (events/s), if it has one."""
        # Last check before the WAL, so a request refused for anything else costs no
        # tokens. A request without rows takes none.
        if rows and key_limit is not None:
            bucket, rate = "ingest-key:" + key_limit[0], key_limit[1]
            if (wait := self.buckets.take(bucket, rows, rate=rate)) is not None:
                raise RateLimited(f"this ingest key of project {project.name} is over its "
                                  f"limit of {rate:g} events/s",
                                  headers=rate_limited(max(1, math.ceil(wait))))
        if rows and (wait := self.buckets.take(project.id, rows)) is not None:
            if key_limit is not None:
                self.buckets.give_back("ingest-key:" + key_limit[0], rows)
            raise RateLimited(f"project {project.name} is over its limit of "
                              f"{self.config.rate_limit_events:g} events/s",
                              headers=rate_limited(max(1, math.ceil(wait))))
        builder = BatchBuilder(project.id, box, context, int(time.time() * 1000), self.limits)
        fill(builder)
        batch = builder.batch
        batch.source, batch.wire_bytes, batch.body_bytes = (seen.source, seen.wire_bytes,
                                                            seen.body_bytes)
        if seen.discarded:
            batch.discarded = seen.discarded
        for rejection in builder.rejected:
            batch.rejected[rejection.code] = batch.rejected.get(rejection.code, 0) + 1
        if not len(batch):  # nothing to store: the request's record alone
            await self.service.note(batch)
            return batch, builder
        try:
            await self.service.accept(batch)
        except ApiError:
            self.buckets.give_back(project.id, rows)
            if key_limit is not None:
                self.buckets.give_back("ingest-key:" + key_limit[0], rows)
            raise
        return batch, builder

    async def refused(self, exc: ApiError, rows: int, headers: dict[str, str], seen: Seen
                      ) -> Answer:
        """A refused request, counted: itself, and its rows (as many as were read); in
        usage too, once its record is durable."""
        self.m_requests_rejected.inc(1, exc.code)
        if rows:
            self.m_rejected.inc(rows, exc.code)
        if seen.project_id and exc.code not in _UNRECORDED:
            record = RowBatch(
                project_id=seen.project_id, box=seen.box, session_id=None, release=None,
                user_agent=None, sdk=None, debug_ids=None, received=int(time.time() * 1000),
                id_start=0, ts=[], level=[], message=[], url=[], attrs=[], error_type=[],
                error_message=[], error_stack=[], truncated=[], source=seen.source,
                refused=exc.code, refused_events=rows)
            with contextlib.suppress(StorageUnavailable):  # the WAL is failing: /metrics alone
                await self.service.note(record)
        return exc.status_code, _encode(exc.envelope()), exc.headers | headers

    def counted(self, batch: RowBatch, builder: BatchBuilder) -> None:
        """A stored request's rows counted: accepted, rejected and truncated."""
        for rejection in builder.rejected:
            self.m_rejected.inc(1, rejection.code)
        for field, count in builder.truncations.items():
            self.m_truncated.inc(count, field)
        self.m_accepted.inc(len(batch))
