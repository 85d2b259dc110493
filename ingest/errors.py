"""Why an ingest request is refused. Each leaf is one documented reason, counted in /metrics."""

from __future__ import annotations

from core.errors import ApiError


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
