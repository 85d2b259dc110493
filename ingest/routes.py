"""``POST /v1/ingest``: the thin HTTP edge of the ingest service.

Order of checks: key -> origin -> media type and encoding -> size -> decode ->
event count -> rate limit -> per-event validation -> WAL (durable) -> 202.
Every refusal carries CORS headers, so a browser SDK can read the status and
``Retry-After``; every refused or rejected event is counted by reason.
"""

from __future__ import annotations

import time

import msgspec
from litestar import Request, Response, Router, post, route
from litestar.datastructures import State
from litestar.enums import HttpMethod

from boxtrail.config import Config
from boxtrail.errors import ApiError
from boxtrail.metrics import Registry
from boxtrail.tenancy import Tenancy
from ingest.body import check_encoding, check_media_type, inflate, read_limited
from ingest.errors import (
    InvalidBody,
    OriginNotAllowed,
    RateLimited,
    TooManyEvents,
    UnknownIngestKey,
)
from ingest.events import BatchBuilder, Limits, Rejection
from ingest.origin import BOX_ID, box_from_origin, box_pattern, origin_allowed
from ingest.ratelimit import TokenBuckets
from ingest.service import IngestService
from ingest.surrogates import repair as repair_surrogates
from ingest.wire import Body, LooseBody, body_decoder, loose_decoder


class Accepted(msgspec.Struct, frozen=True):
    accepted: int
    rejected: list[Rejection]


_encode = msgspec.json.Encoder().encode


def _cors(origin: str | None) -> dict[str, str]:
    if not origin:
        return {}
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
            "Access-Control-Expose-Headers": "Retry-After"}


class IngestEndpoint:
    def __init__(self, config: Config, tenancy: Tenancy, service: IngestService,
                 metrics: Registry) -> None:
        self.config = config
        self.tenancy = tenancy
        self.service = service
        self.limits = Limits.from_config(config)
        self.box_pattern = box_pattern(config.box_host_pattern)
        self.buckets = TokenBuckets(config.rate_limit_events, config.rate_limit_burst)
        self.m_accepted = metrics.counter("boxtrail_events_accepted_total",
                                          "Events acknowledged durable")
        self.m_rejected = metrics.counter("boxtrail_events_rejected_total",
                                          "Events not stored, by reason", ("reason",))
        self.m_requests_rejected = metrics.counter(
            "boxtrail_ingest_requests_rejected_total", "Ingest requests refused whole, by reason",
            ("reason",))
        self.m_truncated = metrics.counter("boxtrail_events_truncated_total",
                                           "Event fields cut to their size limit", ("field",))
        self.m_bytes = metrics.counter("boxtrail_ingest_bytes_total",
                                       "Ingest body bytes received (before inflating)")

    def router(self) -> Router:
        @post("/v1/ingest", status_code=202, summary="Send a batch of log events",
              description="Body: {context, events}. 202 once the accepted events are durable.")
        async def ingest(request: Request[object, object, State], key: str = ""
                         ) -> Response[bytes]:
            return await self.handle(request, key)

        @route("/v1/ingest", http_method=HttpMethod.OPTIONS, include_in_schema=False)
        async def preflight(request: Request[object, object, State], key: str = ""
                            ) -> Response[bytes]:
            origin = request.headers.get("origin")
            project = self.tenancy.project_by_ingest_key(key)
            if project is None or not origin_allowed(origin, project.allowed_origins):
                return Response(b"", status_code=403)
            headers = _cors(origin) | {
                "Access-Control-Allow-Methods": "POST, OPTIONS",
                "Access-Control-Allow-Headers": "Content-Type, Content-Encoding",
                "Access-Control-Max-Age": "86400",
            }
            return Response(b"", status_code=204, headers=headers)

        # The preflight first: Litestar 2 adds its own OPTIONS handler for a path whose first
        # handler is not one.
        return Router("", route_handlers=[preflight, ingest])

    async def handle(self, request: Request[object, object, State], key: str) -> Response[bytes]:
        origin = request.headers.get("origin")
        events = 0
        try:
            project = self.tenancy.project_by_ingest_key(key)
            if project is None:
                raise UnknownIngestKey("unknown ingest key; pass the project's ingestKey as ?key=")
            if not origin_allowed(origin, project.allowed_origins):
                raise OriginNotAllowed(f"origin {origin} is not in this project's allowedOrigins",
                                       detail={"origin": origin})
            headers = request.headers
            check_media_type(headers.get("content-type"))
            gzipped = check_encoding(headers.get("content-encoding"))
            length = headers.get("content-length")
            raw = await read_limited(request.stream(), int(length) if length else None,
                                     self.config.max_body_bytes)
            self.m_bytes.inc(len(raw))
            if gzipped:
                raw = inflate(raw, self.config.max_inflated_bytes)
            body = self._decode(raw)
            events = len(body.events)
            if events > self.config.max_events_per_request:
                raise TooManyEvents(
                    f"{events} events in one request; send at most "
                    f"{self.config.max_events_per_request}",
                    detail={"limit": self.config.max_events_per_request, "events": events})
            if (wait := self.buckets.take(project.id, events)) is not None:
                raise RateLimited(
                    f"project {project.name} is over its limit of "
                    f"{self.config.rate_limit_events:g} events/s",
                    headers={"Retry-After": str(max(1, round(wait + 0.5)))})
            box = box_from_origin(origin, self.box_pattern) or body.context.box_id
            if box is not None and not BOX_ID.fullmatch(box):
                raise InvalidBody(f"context.boxId {box[:80]!r} must match {BOX_ID.pattern}",
                                  detail={"field": "context.boxId"})
            received = int(time.time() * 1000)
            builder = BatchBuilder(project.id, box, body.context, received, self.limits)
            if isinstance(body, Body):
                builder.add_all(body.events)
            else:
                for index, event in enumerate(body.events):
                    builder.add(index, event)
            batch = builder.batch
            if batch.ts:
                await self.service.accept(batch)
        except ApiError as exc:
            self.m_requests_rejected.inc(1, exc.code)
            if events:
                self.m_rejected.inc(events, exc.code)
            exc.headers.update(_cors(origin))
            raise
        for rejection in builder.rejected:
            self.m_rejected.inc(1, rejection.code)
        for field, count in builder.truncations.items():
            self.m_truncated.inc(count, field)
        self.m_accepted.inc(len(batch.ts))
        return Response(_encode(Accepted(len(batch.ts), builder.rejected)), status_code=202,
                        media_type="application/json", headers=_cors(origin))

    @staticmethod
    def _decode(raw: bytes) -> Body | LooseBody:
        try:
            return body_decoder.decode(raw)
        except RecursionError:
            raise InvalidBody("body is nested too deeply") from None
        except msgspec.ValidationError:
            pass  # some event is malformed: keep events raw and judge each one alone
        except msgspec.DecodeError as exc:
            # msgspec words a lone surrogate escape in several ways ("unexpected end of
            # escaped utf-16 surrogate pair", "Input data was truncated"): try the repair.
            if (repaired := repair_surrogates(raw)) == raw:
                raise InvalidBody(f"body is not valid JSON: {exc}") from None
            return IngestEndpoint._decode(repaired)
        try:
            return loose_decoder.decode(raw)
        except RecursionError:
            raise InvalidBody("body is nested too deeply") from None
        except msgspec.DecodeError as exc:
            raise InvalidBody(f"body must be {{\"context\": {{...}}, \"events\": [...]}}: {exc}"
                              ) from None
