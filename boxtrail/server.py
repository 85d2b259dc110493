"""The HTTP/1.1 connection: uvicorn's httptools protocol, with boxtrail's own refusals.

uvicorn answers a request it cannot parse in plain text, reads a URL or headers of any
size, and keeps no clock on a request's head, so a client that sends its headers slowly
holds a connection for ever. :class:`EdgeProtocol` refuses those before the app sees
them, in the one error shape, with ``Connection: close``:

- not HTTP (request line, header bytes, framing): 400 ``invalid_http``
- a URL over ``max_url_bytes``: 414 ``uri_too_long``
- headers over ``max_header_bytes`` or ``max_headers``: 431 ``headers_too_large``
- request line and headers not complete ``header_timeout_s`` after the request's first
  byte (for a connection's first request: after it opened): 408 ``request_timeout``;
  a connection that sent nothing at all is closed without an answer.

A refusal echoes the request's ``Origin`` in ``Access-Control-Allow-Origin`` when the
headers got as far as one (and it is a well-formed origin), as ingest does on its own
refusals: the browser SDK can then read the status instead of a network error, and the
answer carries nothing but the refusal (no credentials are ever allowed). Headers after
an over-long URL are still read, up to a cap, so that answer has its Origin too.

This leans on uvicorn's internals (pinned in pyproject.toml); tests/e2e/test_server_edge.py
drives every path through the real server.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import httptools
import msgspec
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from core.config import Config
from core.errors import ApiError
from core.origins import parse_origin

log = logging.getLogger("boxtrail.server")

# Past the URL limit the rest of the URL is read and dropped so the headers (the Origin)
# can be read; past this the request is refused at once. Chromium sends no longer URL.
URL_READ_LIMIT = 2 << 20
# After a refusal, what the client still sends is read and dropped for this long: closing
# with unread bytes makes the kernel send a reset, which can destroy the answer in flight.
LINGER_S = 2.0
_REQUEST_LINE_SLACK = 64  # method, spaces and version around the URL


class InvalidHttp(ApiError):
    """The bytes are not an HTTP/1.1 request."""

    status_code = 400
    code = "invalid_http"


class HeadTimeout(ApiError):
    """The request line and headers did not arrive in time."""

    status_code = 408
    code = "request_timeout"


class UriTooLong(ApiError):
    """The request URL is over the limit."""

    status_code = 414
    code = "uri_too_long"


class HeadersTooLarge(ApiError):
    """The request headers are over the limit, in bytes or in number."""

    status_code = 431
    code = "headers_too_large"


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    header_timeout_s: float
    max_url_bytes: int
    max_header_bytes: int
    max_headers: int

    @classmethod
    def from_config(cls, config: Config) -> Limits:
        return cls(header_timeout_s=config.header_timeout_s,
                   max_url_bytes=config.max_url_bytes,
                   max_header_bytes=config.max_header_bytes, max_headers=config.max_headers)


_encode = msgspec.json.Encoder().encode


def protocol_class(config: Config) -> type[EdgeProtocol]:
    """The protocol class to hand ``uvicorn.Config(http=...)``, with these limits."""

    class Configured(EdgeProtocol):
        limits = Limits.from_config(config)

    return Configured


class EdgeProtocol(HttpToolsProtocol):
    limits: ClassVar[Limits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # One clock per connection, re-armed when it fires, not one per request: the
        # ingest path sends many requests on one connection.
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_since: float | None = None  # loop time the current head began
        self._linger_timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._received = False  # any byte on this connection
        self._in_head = True  # the next bytes are (or start) a request line and headers
        self._moved = False  # the chunk being parsed began, ended a head or ended a request
        self._head_bytes = 0  # bytes of later chunks that all belonged to the head
        self._url_bytes = 0
        self._pending: ApiError | None = None  # a refusal that waits for the headers

    # The connection.

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_since = self.loop.time()
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._linger_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering: read and dropped
        self._received = True
        self._unset_keepalive_if_required()
        self._moved = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            self._refuse(_refusal(exc))
            return
        if self._in_head and not self._moved:
            # The whole chunk was head: what the head holds so far is bounded here, as it
            # arrives (httptools keeps an unfinished header's bytes itself), and exactly
            # once it is complete (on_headers_complete).
            self._head_bytes += len(data)
            limit = self.limits.max_header_bytes + _REQUEST_LINE_SLACK
            if self._head_bytes - self._url_bytes > limit:
                self._refuse(self._too_large("bytes"))
            elif self.headers and len(self.headers) > self.limits.max_headers:
                self._refuse(self._too_large("headers"))

    # Parser callbacks.

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._moved = True
        self._head_bytes = self._url_bytes = 0
        self._pending = None
        self._head_since = self.loop.time()
        if self._head_timer is None:
            self._arm(self.limits.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        self._url_bytes += len(url)
        limit = self.limits.max_url_bytes
        if self._url_bytes <= limit:
            self.url += url
            return
        self._pending = UriTooLong(
            f"the URL is longer than {limit} bytes, this server's limit "
            "(BOXTRAIL_MAX_URL_BYTES); every search the query language accepts fits in it",
            detail={"limit": limit})
        if self._url_bytes > URL_READ_LIMIT:
            raise self._pending

    def on_headers_complete(self) -> None:
        self._head_since = None
        self._in_head = False
        self._moved = True
        if self._pending is not None:
            raise self._pending
        headers = self.headers
        if len(headers) > self.limits.max_headers:
            raise self._too_large("headers")
        if sum(len(name) + len(value) + 4 for name, value in headers) > (
                self.limits.max_header_bytes):
            raise self._too_large("bytes")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True
        self._moved = True

    # Refusals.

    def _too_large(self, unit: str) -> HeadersTooLarge:
        if unit == "headers":
            limit = self.limits.max_headers
            message = f"more than {limit} request headers"
        else:
            limit = self.limits.max_header_bytes
            message = f"the request headers are larger than {limit} bytes"
        return HeadersTooLarge(message, detail={"limit": limit, "unit": unit})

    def _arm(self, delay: float) -> None:
        self._head_timer = self.loop.call_later(delay, self._head_clock)

    def _head_clock(self) -> None:
        self._head_timer = None
        since = self._head_since
        if since is None or self.transport.is_closing():
            return  # between heads: the next one arms the clock again
        left = since + self.limits.header_timeout_s - self.loop.time()
        if left > 0:  # a later head than the one the clock was armed for
            self._arm(left)
        elif not self._received:
            self.transport.close()  # nothing was sent: nobody to answer
        else:
            seconds = self.limits.header_timeout_s
            self._refuse(self._pending or HeadTimeout(
                f"the request line and headers did not arrive within {seconds:g} s",
                detail={"limit": seconds}))

    def _refuse(self, error: ApiError) -> None:
        if self._refused:
            return
        self._refused = True
        self._head_since = None
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # A request of this connection is being served: its app sees a disconnect.
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started or self.pipeline:
                self.transport.close()  # an answer is under way: no place for another
                return
        self.transport.write(self._render(error))
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._linger_timer = self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()

    def _render(self, error: ApiError) -> bytes:
        body = _encode(error.envelope())
        lines = [STATUS_LINE[error.status_code]]
        for name, value in self.server_state.default_headers:
            lines += [name, b": ", value, b"\r\n"]
        lines += [b"content-type: application/json\r\n",
                  b"content-length: %d\r\n" % len(body), b"connection: close\r\n"]
        origin = next((value for name, value in self.headers or () if name == b"origin"), None)
        if origin is not None and origin.isascii() and parse_origin(origin.decode()):
            lines += [b"access-control-allow-origin: ", origin, b"\r\n", b"vary: Origin\r\n"]
        lines += [b"\r\n", body]
        return b"".join(lines)


def _refusal(exc: httptools.HttpParserError) -> ApiError:
    cause = exc.__context__
    if isinstance(cause, ApiError):  # raised by a callback above
        return cause
    if isinstance(cause, httptools.HttpParserInvalidURLError | UnicodeDecodeError):
        reason = "invalid URL"
    elif cause is not None:
        log.warning("unexpected error while parsing a request", exc_info=cause)
        reason = "unreadable request"
    else:
        reason = str(exc) or "invalid request"
    return InvalidHttp(f"the request is not valid HTTP/1.1 ({reason}); check the request "
                       "line and headers", detail={"reason": reason})
