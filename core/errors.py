"""The one error shape: ``{"error": {"code", "message", "detail"}}``.

Every package has one error root deriving from :class:`ApiError`; a leaf error is a
class with a ``status_code`` and a snake_case ``code``. One exception handler in
``boxtrail.app`` renders them all.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    code: str
    message: str
    detail: dict[str, object] = {}


class ErrorEnvelope(msgspec.Struct, frozen=True):
    error: ErrorBody


class ApiError(Exception):
    """Root of every error that becomes an HTTP answer."""

    status_code: ClassVar[int] = 400
    code: ClassVar[str] = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        detail: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or {}
        self.headers = headers or {}

    def envelope(self) -> ErrorEnvelope:
        return ErrorEnvelope(ErrorBody(code=self.code, message=self.message, detail=self.detail))


class Unauthorized(ApiError):
    """Missing or unknown API key."""

    status_code = 401
    code = "unauthorized"


class CsrfFailed(ApiError):
    """A console request (by session cookie) without its CSRF token, or from another
    origin."""

    status_code = 403
    code = "csrf_failed"


class InsufficientScope(ApiError):
    """An API key used beyond its scopes."""

    status_code = 403
    code = "insufficient_scope"


class NotFound(ApiError):
    """The resource does not exist, or belongs to another tenant."""

    status_code = 404
    code = "not_found"


class Conflict(ApiError):
    """The resource exists already."""

    status_code = 409
    code = "conflict"


class InvalidParameter(ApiError):
    """A query parameter or body field is malformed."""

    status_code = 400
    code = "invalid_parameter"


class ServiceUnavailable(ApiError):
    """Storage is unreachable or the service is overloaded; retry later."""

    status_code = 503
    code = "unavailable"
