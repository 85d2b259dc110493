"""``POST /v1/ingest``: the thin HTTP edge of the ingest service.

Order of checks: key -> origin -> media type and encoding -> size -> decode ->
event count -> rate limit -> per-event validation -> WAL (durable) -> 202.
Every refusal carries CORS headers, so a browser SDK can read the status and
``Retry-After``; every refused or rejected event is counted by reason.

``POST /v1/ingest`` is the one hot path, so it is served as plain ASGI in front of
Litestar (:meth:`IngestEndpoint.asgi_first`): the framework's request object, parameter
parsing and response machinery cost more per request than everything after decoding
(docs/benchmarks.md). The Litestar route below stays for the OpenAPI
schema and runs the very same :meth:`IngestEndpoint.process`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl

import msgspec
from litestar import Request, Response, Router, post, route
from litestar.datastructures import State
from litestar.enums import HttpMethod
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIType, Schema
from litestar.params import FromPath, FromQuery

from core.config import Config
from core.errors import ApiError, ErrorBody, ErrorEnvelope
from core.metrics import Registry
from core.openapi import error_responses, schema_of, with_body
from ingest.body import (
    check_media_type,
    inflate,
)
from ingest.errors import (
    InvalidBody,
    UnknownIngestKey,
)
from ingest.events import BatchBuilder, Limits, Rejection
from ingest.intake import Intake, Seen, cors, preflight_headers
from ingest.origin import BOX_ID
from ingest.ratelimit import TokenBuckets
from ingest.sentry import PATH as SENTRY_PATH
from ingest.sentry import Answer, SentryEndpoint
from ingest.service import IngestService
from ingest.surrogates import repair as repair_surrogates
from ingest.wire import (
    Body,
    Columns,
    Context,
    LooseBody,
    body_decoder,
    decode_columns,
    loose_decoder,
)
from tenancy.guard import PUBLIC
from tenancy.tenants import Tenancy

log = logging.getLogger("boxtrail.ingest")

# Plain ASGI, as uvicorn speaks it.
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Accepted(msgspec.Struct, frozen=True):
    accepted: int
    rejected: list[Rejection]


_encode = msgspec.json.Encoder().encode


class ClientGone(Exception):
    """The client closed the connection before its body arrived: nobody to answer."""


EXPOSE_HEADERS = "Retry-After"
ALLOW_HEADERS = "Content-Type, Content-Encoding"
# The encodings /v1/ingest takes: the SDK gzips with CompressionStream where it can.
_INFLATERS = {"identity": None, "": None, "gzip": inflate, "x-gzip": inflate}


def _unknown_key() -> UnknownIngestKey:
    return UnknownIngestKey("unknown ingest key; pass the project's ingestKey as ?key=")


class IngestEndpoint:
    def __init__(self, config: Config, tenancy: Tenancy, service: IngestService,
                 metrics: Registry, buckets: TokenBuckets | None = None) -> None:
        self.config = config
        self.tenancy = tenancy
        self.intake = Intake(config, service, metrics, buckets)
        self.sentry = SentryEndpoint(self.intake, tenancy, metrics)

    def router(self) -> Router:
        # What the ASGI path (_serve) answers; 500 only for a bug, in the same shape.
        @post("/v1/ingest", status_code=202, summary="Send a batch of log events",
              description="Body: {context, events}. 202 once the accepted events are durable.",
              operation_class=with_body(
                  {"application/json": self._body_schema()},
                  "{context, events} as JSON, also as text/plain (sendBeacon) and gzipped. "
                  "Each event is {ts, level, message, url, attrs, error} (docs/api.md); one that "
                  "is not is rejected alone, in the 202's `rejected`."),
              responses={202: ResponseSpec(Accepted, generate_examples=False,
                                           description="Accepted events are durable; each "
                                                       "rejected one says why"),
                         **error_responses(400, 403, 413, 415, 429, 503, described={
                             401: "No project has this ingest key: pass it as ?key="})})
        async def ingest(request: Request[object, object, State], key: FromQuery[str] = ""
                         ) -> Response[bytes]:
            # Served by asgi_first in the running service; kept for the schema and for an
            # app mounted without it.
            status, body, headers = await self.process(key, request.headers, request.stream())
            return Response(body, status_code=status, media_type="application/json",
                            headers=headers)

        @route("/v1/ingest", http_method=HttpMethod.OPTIONS, include_in_schema=False)
        async def preflight(request: Request[object, object, State],
                            key: FromQuery[str] = ""
                            ) -> Response[bytes]:
            origin = request.headers.get("origin")
            try:
                self.intake.admit(self.tenancy.project_by_ingest_key(key), origin, _unknown_key)
            except ApiError as refusal:
                return Response(_encode(refusal.envelope()), status_code=refusal.status_code,
                                media_type="application/json")
            return Response(b"", status_code=204,
                            headers=preflight_headers(origin, EXPOSE_HEADERS, ALLOW_HEADERS))

        sentry_responses = {200: ResponseSpec(Answer, generate_examples=False,
                                              description="Stored rows are durable")}
        sentry_errors = error_responses(400, 403, 404, 413, 415, 429, 503, described={
            401: "No project has this Sentry key: use the project's DSN"})

        @post("/api/{project:str}/envelope/", status_code=200,
              summary="Sentry SDKs: an envelope (events, logs; other items are counted)",
              operation_class=with_body(
                  {"text/plain": Schema(type=OpenAPIType.STRING)},
                  "A Sentry envelope: a JSON header line, then items, each a JSON header "
                  "line and its payload (also sent as application/x-sentry-envelope)."),
              description="The DSN is the project's `dsn`; the key as ?sentry_key= or in "
                          "X-Sentry-Auth. 200 {id} once the stored rows are durable.",
              responses=sentry_responses | sentry_errors)
        async def envelope(request: Request[object, object, State], project: FromPath[str],
                           sentry_key: FromQuery[str] = "") -> Response[bytes]:
            return await self._litestar_sentry(request, project, "envelope")

        @post("/api/{project:str}/store/", status_code=200,
              summary="Sentry SDKs, legacy: one event as JSON",
              operation_class=with_body({"application/json": Schema(type=OpenAPIType.OBJECT)},
                                        "One Sentry event, a JSON object."),
              responses=sentry_responses | sentry_errors)
        async def store(request: Request[object, object, State], project: FromPath[str],
                        sentry_key: FromQuery[str] = "") -> Response[bytes]:
            return await self._litestar_sentry(request, project, "store")

        # The preflight first: Litestar 2 adds its own OPTIONS handler for a path whose first
        # handler is not one. Public: the ingest key is no API key (tenancy.guard).
        return Router("", route_handlers=[preflight, ingest, envelope, store], opt=PUBLIC)

    def _body_schema(self) -> Schema:
        """What :meth:`process` takes whole; what it then judges event by event (any
        JSON value may stand in ``events``: a bad one is rejected alone) is not refused."""
        context = schema_of(Context)
        assert context.properties is not None
        # Unless the Origin names the box (then this is ignored), as process checks it.
        context.properties["boxId"] = Schema(any_of=[
            Schema(type=OpenAPIType.STRING, pattern=f"^{BOX_ID.pattern}$"),
            Schema(type=OpenAPIType.NULL)])
        events = Schema(type=OpenAPIType.ARRAY, items=Schema(),
                        max_items=self.config.max_events_per_request)
        return Schema(type=OpenAPIType.OBJECT, required=["events"],
                      properties={"context": context, "events": events})

    async def _litestar_sentry(self, request: Request[object, object, State], project_id: str,
                               kind: str) -> Response[bytes]:
        # Served by asgi_first in the running service, as /v1/ingest is.
        status, body, headers = await self.sentry.process(
            project_id, kind, request.scope["query_string"].decode("latin-1"), request.headers,
            request.stream())
        return Response(body, status_code=status, media_type="application/json",
                        headers=headers)

    def asgi_first(self, app: Any) -> ASGIApp:
        """``app`` with ``POST /v1/ingest`` answered before it, as plain ASGI."""

        async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                path, method = scope["path"], scope["method"]
                if path in _INGEST_PATHS and method == "POST":
                    await self._serve(scope, receive, send, self._ingest)
                    return
                if (path.startswith("/api/") and method in ("POST", "OPTIONS")
                        and (match := SENTRY_PATH.fullmatch(path))):
                    project_ref, kind = match.groups()
                    if method == "OPTIONS":
                        await self._serve(scope, receive, send, lambda query, headers, _:
                                          self._preflight(project_ref, query, headers))
                    else:
                        await self._serve(scope, receive, send, lambda query, headers, body:
                                          self.sentry.process(project_ref, kind, query,
                                                              headers, body))
                    return
            await app(scope, receive, send)

        return asgi

    async def _ingest(self, query: str, headers: Mapping[str, str],
                      chunks: AsyncIterator[bytes]) -> tuple[int, bytes, dict[str, str]]:
        key = dict(parse_qsl(query)).get("key", "") if query else ""
        return await self.process(key, headers, chunks)

    async def _preflight(self, project_ref: str, query: str, headers: Mapping[str, str]
                         ) -> tuple[int, bytes, dict[str, str]]:
        return self.sentry.preflight(project_ref, query, headers)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, answer: Answering
                     ) -> None:
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            # The first of repeated headers, as Litestar's ``headers.get`` (the preflight
            # and the OpenAPI route) reads them: one request, one answer on every path.
            if name in _WANTED:
                headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
        try:
            status, body, extra = await answer(scope["query_string"].decode("latin-1"),
                                               headers, _body(receive))
        except ClientGone:
            return
        except Exception:
            log.exception("internal error in %s %s", scope["method"], scope["path"])
            self.intake.m_requests_rejected.inc(1, "internal_error")
            status, extra = 500, cors(headers.get("origin"), EXPOSE_HEADERS)
            body = _encode(ErrorEnvelope(ErrorBody(
                code="internal_error", message="internal error; see the server log")))
        raw_headers = [(b"content-type", b"application/json"),
                       (b"content-length", b"%d" % len(body))]
        raw_headers += [(k.lower().encode("latin-1"), v.encode("latin-1"))
                        for k, v in extra.items()]
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": body})

    async def process(self, key: str, headers: Mapping[str, str],
                      chunks: AsyncIterator[bytes]) -> tuple[int, bytes, dict[str, str]]:
        """One ingest request: its status, JSON body and headers (errors included). The
        steps are the intake's (``ingest.intake``); the wire format is this endpoint's."""
        intake = self.intake
        origin = headers.get("origin")
        events = 0
        seen = Seen("ingest")
        try:
            project = intake.admit(self.tenancy.project_by_ingest_key(key), origin,
                                   _unknown_key, seen)
            check_media_type(headers.get("content-type"))
            raw = await intake.read(headers, chunks, _INFLATERS, seen)
            body = parse(raw, intake.limits)
            events = body.events if isinstance(body, Columns) else len(body.events)

            def fill(builder: BatchBuilder) -> None:
                add(builder, body, raw)

            intake.count(events, "events")
            box = intake.box(origin, body.context.box_id, seen, strict=True)
            rate = self.tenancy.rate_limit_of(key)
            batch, builder = await intake.store(project, events, box, body.context, fill, seen,
                                                key_limit=None if rate is None else (key, rate))
        except ApiError as exc:
            return await intake.refused(exc, events, cors(origin, EXPOSE_HEADERS), seen)
        intake.counted(batch, builder)
        return 202, _encode(Accepted(len(batch), builder.rejected)), cors(origin,
                                                                            EXPOSE_HEADERS)


def parse(raw: bytes, limits: Limits, *, compiled: bool = True) -> Columns | Body | LooseBody:
    """The body read by the compiled core (``ingest/_core.c``) if it takes it whole, else
    by the Python path (``compiled=False``: always), the reference for every rule."""
    if compiled and (columns := decode_columns(raw, limits.message, limits.stack,
                                               limits.attrs, limits.attr)) is not None:
        return columns
    return _decode(raw)


def add(builder: BatchBuilder, body: Columns | Body | LooseBody, raw: bytes) -> None:
    """``body``'s events (``raw``: its text) added to the batch."""
    if isinstance(body, Columns):
        if builder.add_columns(body):
            return
        body = _decode(raw)  # a ts out of range: the Python path judges it
    if isinstance(body, Body):
        builder.add_all(body.events)
    else:
        for index, event in enumerate(body.events):
            builder.add(index, event)


def _decode(raw: bytes) -> Body | LooseBody:
    try:
        try:
            return body_decoder.decode(raw)
        except msgspec.ValidationError:
            pass  # some event is malformed: keep events raw and judge each one alone
        try:
            return loose_decoder.decode(raw)
        except msgspec.ValidationError as exc:
            raise InvalidBody(f"body must be {{\"context\": {{...}}, \"events\": [...]}}: "
                              f"{exc}") from None
    except RecursionError:
        raise InvalidBody("body is nested too deeply") from None
    except msgspec.DecodeError as exc:
        # msgspec words a lone surrogate escape in several ways ("unexpected end of
        # escaped utf-16 surrogate pair", "Input data was truncated"), in either pass
        # (the strict one stops at a malformed event before a surrogate further on):
        # try the repair.
        if (repaired := repair_surrogates(raw)) == raw:
            raise InvalidBody(f"body is not valid JSON: {exc}") from None
        return _decode(repaired)


# Litestar would also route a trailing slash here; both get the same code.
_INGEST_PATHS = frozenset(("/v1/ingest", "/v1/ingest/"))
_WANTED = frozenset((b"origin", b"content-type", b"content-encoding", b"content-length",
                     b"x-sentry-auth", b"authorization"))
# What answers a request the ASGI path serves: (query string, headers, body chunks) ->
# (status, JSON body, headers).
Answering = Callable[[str, Mapping[str, str], AsyncIterator[bytes]],
                     Awaitable[tuple[int, bytes, dict[str, str]]]]


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return
