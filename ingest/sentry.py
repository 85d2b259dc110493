"""``POST /api/{id}/envelope/`` and ``/api/{id}/store/``: Sentry's SDKs sending to boxtrail.

A project's DSN is ``http(s)://<sentryKey>@<host>/<sentryId>`` (``tenancy.tenants``; the
project JSON carries it). The key comes from ``?sentry_key=`` (what the browser SDK sends)
or the ``X-Sentry-Auth`` / ``Authorization: Sentry sentry_key=...`` header; the path's
project (the DSN's id, or the project's id or name) must be that key's. Then the same
checks as ``POST /v1/ingest``, in the same order and with the same error shape and CORS
headers: origin, encoding (gzip, deflate, br), size,
rows per request, box id from ``Origin``, rate limit, per-row validation, and the answer
only once the rows are durable in the WAL: ``200 {"id": "<event id>"}``, as Sentry answers.
A 429 carries ``Retry-After`` and ``X-Sentry-Rate-Limits``, which the SDKs obey.

What an envelope's items become is ``ingest.envelope``'s business; every item is counted
by type and outcome in ``boxtrail_sentry_items_total``.
"""

from __future__ import annotations

import math
import re
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

import brotli  # type: ignore[import-untyped]
import msgspec

from core.errors import ApiError
from core.metrics import Registry
from ingest.body import content_length, inflate, read_limited
from ingest.envelope import BrokenItem, Converted, add_event, read_object, split, to_events
from ingest.errors import (
    BodyTooLarge,
    InvalidBody,
    OriginNotAllowed,
    RateLimited,
    TooManyEvents,
    UnknownIngestKey,
    UnsupportedEncoding,
)
from ingest.events import BatchBuilder
from ingest.origin import BOX_ID, box_from_origin, origin_allowed
from tenancy.tenants import Project, Tenancy

if TYPE_CHECKING:
    from ingest.routes import IngestEndpoint

PATH = re.compile(r"/api/([^/]{1,64})/(envelope|store)/?")
ALLOW_HEADERS = ("Content-Type, Content-Encoding, X-Sentry-Auth, Authorization, "
                 "sentry-trace, baggage")
EXPOSE_HEADERS = "X-Sentry-Rate-Limits, X-Sentry-Error, Retry-After"
_AUTH_PAIR = re.compile(r"(\w+)\s*=\s*([^,\s]*)")


class Answer(msgspec.Struct, frozen=True):
    id: str


class ProjectMismatch(UnknownIngestKey):
    """The DSN's key belongs to another project than the path's id."""

    code = "project_mismatch"


_encode = msgspec.json.Encoder().encode


def cors(origin: str | None) -> dict[str, str]:
    if not origin:
        return {}
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
            "Access-Control-Expose-Headers": EXPOSE_HEADERS}


def sentry_key(query: str, headers: Mapping[str, str]) -> str:
    """The DSN's public key: ``?sentry_key=``, else the auth header's ``sentry_key``."""
    if query:
        for name, value in parse_qsl(query):
            if name == "sentry_key":
                return value
    for header in ("x-sentry-auth", "authorization"):
        text = headers.get(header, "")
        if text[:7].lower() == "sentry ":
            for name, value in _AUTH_PAIR.findall(text[7:]):
                if name == "sentry_key":
                    return str(value)
    return ""


class SentryEndpoint:
    def __init__(self, ingest: IngestEndpoint, tenancy: Tenancy, metrics: Registry) -> None:
        self.ingest = ingest
        self.tenancy = tenancy
        self.m_items = metrics.counter(
            "boxtrail_sentry_items_total",
            "Sentry envelope items by type and outcome (stored, dropped: accepted, not kept; "
            "invalid: unreadable)", ("type", "outcome"))

    def project(self, project_ref: str, query: str, headers: Mapping[str, str]) -> Project:
        key = sentry_key(query, headers)
        project = (self.tenancy.project_by_sentry_key(key)
                   or self.tenancy.project_by_ingest_key(key)) if key else None
        if project is None:
            raise UnknownIngestKey("unknown Sentry key: use the project's DSN (its `dsn` in "
                                   "GET /v1/projects/{project})")
        # The DSN's numeric id; the project's id or name are taken too (the key decides).
        if project_ref not in (str(project.sentry_id), project.id, project.name):
            raise ProjectMismatch(f"this DSN's key is not for project {project_ref[:64]!r}")
        return project

    def preflight(self, project_ref: str, query: str, headers: Mapping[str, str]
                  ) -> tuple[int, bytes, dict[str, str]]:
        """``OPTIONS``: the browser's CORS preflight (keyed by ``?sentry_key=``, as the SDK's
        URL carries it; an unknown key or origin is refused like the POST would be)."""
        origin = headers.get("origin")
        try:
            project = self.project(project_ref, query, headers)
            if not origin_allowed(origin, project.allowed_origins):
                raise OriginNotAllowed(f"origin {origin} is not in this project's "
                                       "allowedOrigins", detail={"origin": origin})
        except ApiError as exc:
            return exc.status_code, _encode(exc.envelope()), exc.headers | cors(origin)
        return 204, b"", cors(origin) | {"Access-Control-Allow-Methods": "POST, OPTIONS",
                                         "Access-Control-Allow-Headers": ALLOW_HEADERS,
                                         "Access-Control-Max-Age": "86400"}

    async def process(self, project_ref: str, kind: str, query: str,
                      headers: Mapping[str, str], chunks: AsyncIterator[bytes]
                      ) -> tuple[int, bytes, dict[str, str]]:
        """One envelope (``kind`` "envelope") or legacy event ("store"): status, body and
        headers, errors included."""
        ingest = self.ingest
        config = ingest.config
        origin = headers.get("origin")
        rows = 0
        try:
            project = self.project(project_ref, query, headers)
            if not origin_allowed(origin, project.allowed_origins):
                raise OriginNotAllowed(f"origin {origin} is not in this project's allowedOrigins",
                                       detail={"origin": origin})
            encoding = (headers.get("content-encoding") or "identity").strip().lower()
            if encoding not in ("identity", "", "gzip", "x-gzip", "deflate", "br"):
                raise UnsupportedEncoding(
                    f"Content-Encoding {encoding!r} is not supported; send gzip, deflate, br "
                    "or no encoding", detail={"contentEncoding": encoding})
            raw = await read_limited(chunks, content_length(headers.get("content-length")),
                                     config.max_body_bytes)
            ingest.m_bytes.inc(len(raw))
            if encoding in ("gzip", "x-gzip"):
                raw = inflate(raw, config.max_inflated_bytes)
            elif encoding == "deflate":
                raw = _inflate_zlib(raw, config.max_inflated_bytes)
            elif encoding == "br":
                raw = _inflate_brotli(raw, config.max_inflated_bytes)
            converted = self._convert(kind, raw, config.max_events_per_request)
            rows = len(converted.events)
            if rows > config.max_events_per_request:
                raise TooManyEvents(
                    f"{rows} rows in one request; send at most {config.max_events_per_request}",
                    detail={"limit": config.max_events_per_request, "events": rows})
            box = box_from_origin(origin, ingest.box_pattern)
            if box is None and converted.box_id and BOX_ID.fullmatch(converted.box_id):
                box = converted.box_id
            if rows and (wait := ingest.buckets.take(project.id, rows)) is not None:
                seconds = max(1, math.ceil(wait))
                raise RateLimited(
                    f"project {project.name} is over its limit of "
                    f"{config.rate_limit_events:g} events/s",
                    headers={"Retry-After": str(seconds),
                             "X-Sentry-Rate-Limits": f"{seconds}::project"})
            builder = BatchBuilder(project.id, box, converted.context(),
                                   int(time.time() * 1000), ingest.limits)
            if converted.frames:
                for index, event in enumerate(converted.events):
                    builder.add(index, event, converted.frames.get(index))
            else:  # log lines, messages: the column-wise path when every row is valid
                builder.add_all(converted.events)
            batch = builder.batch
            if batch.ts:
                try:
                    await ingest.service.accept(batch)
                except ApiError:
                    ingest.buckets.give_back(project.id, rows)
                    raise
        except ApiError as exc:
            ingest.m_requests_rejected.inc(1, exc.code)
            if rows:
                ingest.m_rejected.inc(rows, exc.code)
            return exc.status_code, _encode(exc.envelope()), exc.headers | cors(origin)
        for rejection in builder.rejected:
            ingest.m_rejected.inc(1, rejection.code)
        for name, count in builder.truncations.items():
            ingest.m_truncated.inc(count, name)
        ingest.m_accepted.inc(len(batch.ts))
        self._count(converted, len(builder.rejected))
        event_id = converted.event_id or uuid.uuid4().hex
        return 200, _encode(Answer(event_id[:64])), cors(origin)

    @staticmethod
    def _convert(kind: str, raw: bytes, max_rows: int) -> Converted:
        if kind == "store":
            converted = Converted()
            try:
                event = read_object(raw)
            except BrokenItem:
                raise InvalidBody("the event is not a JSON object") from None
            add_event(converted, event)
            return converted
        header, items = split(raw)
        return to_events(header, items, max_rows)

    def _count(self, converted: Converted, rejected: int) -> None:
        for kind, count in converted.stored.items():
            self.m_items.inc(count, kind, "stored")
        if rejected:
            self.m_items.inc(rejected, "row", "invalid")
        for kind in converted.dropped:
            if kind.startswith("invalid_"):
                self.m_items.inc(1, kind[len("invalid_"):], "invalid")
            else:
                self.m_items.inc(1, kind[:32] if kind.isidentifier() else "other", "dropped")


def _inflate_brotli(data: bytes, limit: int) -> bytes:
    """``Content-Encoding: br``, refused as soon as the output passes ``limit``."""
    decompressor = brotli.Decompressor()
    try:
        out = decompressor.process(data, output_buffer_limit=limit + 1)
    except brotli.error:
        raise InvalidBody("Content-Encoding is br but the body does not inflate") from None
    if len(out) > limit or not decompressor.can_accept_more_data():
        raise BodyTooLarge(f"body inflates to more than the {limit}-byte limit",
                           detail={"limit": limit, "stage": "inflated"})
    if not decompressor.is_finished():
        raise InvalidBody("Content-Encoding is br but the stream is truncated")
    return bytes(out)


def _inflate_zlib(data: bytes, limit: int) -> bytes:
    """``Content-Encoding: deflate`` (zlib-wrapped, as HTTP means it; raw deflate too)."""
    for wbits in (zlib.MAX_WBITS, -zlib.MAX_WBITS):
        inflater = zlib.decompressobj(wbits=wbits)
        try:
            out = inflater.decompress(data, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit or inflater.unconsumed_tail:
            raise BodyTooLarge(f"body inflates to more than the {limit}-byte limit",
                               detail={"limit": limit, "stage": "inflated"})
        if not inflater.eof:
            raise InvalidBody("Content-Encoding is deflate but the stream is truncated")
        return out
    raise InvalidBody("Content-Encoding is deflate but the body does not inflate")
