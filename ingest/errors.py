"""Why an ingest request is refused, or one of its events rejected: :data:`Reason`, the one
list, each counted in /metrics. Each leaf below is one reason a request is refused whole."""

from __future__ import annotations

from typing import Literal, get_args

from core.errors import ApiError

# Why an event is rejected alone, its neighbours kept (``events``; the 202's
# ``rejected[].code``).
EventReason = Literal["invalid_event", "invalid_level", "invalid_timestamp"]
# Every reason an ingest request (``/v1/ingest``, Sentry's endpoints) is refused or an event
# rejected: the ``code`` of the answer or the rejection, and the ``reason`` label of
# ``boxtrail_ingest_requests_rejected_total`` and ``boxtrail_events_rejected_total``, where
# each is listed from the start. docs/api.md says what each means.
Reason = Literal[
    # Refusals of a whole request: the leaves below.
    "invalid_body", "unknown_ingest_key", "project_mismatch", "origin_not_allowed",
    "body_too_large", "too_many_events", "unsupported_media_type", "unsupported_encoding",
    "rate_limited", "overloaded", "storage_unavailable",
    # A key this node has not seen while the metadata database is out of reach
    # (metadata.db.MetadataUnavailable); a value the database cannot hold or index.
    "catalog_unavailable", "invalid_parameter",
    # A bug, logged; answered 500 in the same shape.
    "internal_error",
    # Events alone.
    "invalid_event", "invalid_level", "invalid_timestamp",
]
REASONS: tuple[str, ...] = get_args(Reason)


class IngestError(ApiError):
    """Root of the ingest package's errors."""


class InvalidBody(IngestError):
    """The body is not the ingest JSON shape (not JSON, bad UTF-8, wrong types at top level)."""

    status_code = 400
    code = "invalid_body"


class UnknownIngestKey(IngestError):
    """The ``key`` query parameter names no project."""

    status_code = 401
    code = "unknown_ingest_key"


class ProjectMismatch(UnknownIngestKey):
    """The DSN's key belongs to another project than the path's id (``sentry``)."""

    code = "project_mismatch"


class OriginNotAllowed(IngestError):
    """The request's Origin is not in the project's allowedOrigins."""

    status_code = 403
    code = "origin_not_allowed"


class BodyTooLarge(IngestError):
    """The body is over the size limit, before or after decompression."""

    status_code = 413
    code = "body_too_large"


class TooManyEvents(IngestError):
    """More events in one request than allowed."""

    status_code = 413
    code = "too_many_events"


class UnsupportedMediaType(IngestError):
    """Content-Type is not application/json or text/plain."""

    status_code = 415
    code = "unsupported_media_type"


class UnsupportedEncoding(IngestError):
    """Content-Encoding is not gzip or identity."""

    status_code = 415
    code = "unsupported_encoding"


class RateLimited(IngestError):
    """The project is sending more events per second than its limit."""

    status_code = 429
    code = "rate_limited"


class Overloaded(IngestError):
    """The live buffer is full (storage behind); retry after the given delay."""

    status_code = 503
    code = "overloaded"


class StorageUnavailable(IngestError):
    """The WAL could not be written; nothing was acknowledged."""

    status_code = 503
    code = "storage_unavailable"
