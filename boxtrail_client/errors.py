"""What a call can fail with: the server's answer in its one error shape, or no answer."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec


class ClientError(Exception):
    """The call did not get an answer it can use (server unreachable, a bad argument)."""


class ApiError(ClientError):
    """The server's refusal: its status and ``{"error": {code, message, detail}}``."""

    def __init__(self, status: int, code: str, message: str,
                 detail: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message
        self.detail = detail or {}


class _Body(msgspec.Struct):
    code: str = "http_error"
    message: str = ""
    detail: dict[str, Any] = {}


class _Envelope(msgspec.Struct):
    error: _Body


def raise_for(response: httpx.Response) -> None:
    """An :class:`ApiError` for an answer that is not a 2xx."""
    if response.is_success:
        return
    try:
        body = msgspec.json.decode(response.read(), type=_Envelope).error
    except (msgspec.DecodeError, msgspec.ValidationError):
        text = response.text[:300]
        raise ApiError(response.status_code, "http_error", text) from None
    raise ApiError(response.status_code, body.code, body.message, body.detail)
