"""Reading an ingest body: media type, encoding, and size limits before and after inflating.

The compressed body is read in chunks and refused as soon as it passes the limit; gzip,
deflate and brotli are inflated with an output limit, so a bomb never grows past the limit
in memory.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Callable, Collection

import brotli  # type: ignore[import-untyped]

from ingest.errors import BodyTooLarge, InvalidBody, UnsupportedEncoding, UnsupportedMediaType

_MEDIA_TYPES = {"application/json", "text/plain", ""}
# A body inflater: (bytes as sent, the limit) -> the body, refused past the limit.
Inflate = Callable[[bytes, int], bytes]


def check_media_type(content_type: str | None) -> None:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media not in _MEDIA_TYPES:
        raise UnsupportedMediaType(
            f"Content-Type {media!r} is not supported; send application/json, or text/plain "
            "(what navigator.sendBeacon uses)", detail={"contentType": media})


def encoding_of(content_encoding: str | None, accepted: Collection[str]) -> str:
    """The body's encoding, one of ``accepted`` (``identity`` when none is named)."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding not in accepted:
        names = ", ".join(e for e in accepted if e not in ("identity", "", "x-gzip"))
        raise UnsupportedEncoding(
            f"Content-Encoding {encoding!r} is not supported; send {names} or no encoding",
            detail={"contentEncoding": encoding})
    return encoding


def content_length(header: str | None) -> int | None:
    if header is None:
        return None
    try:
        return int(header)
    except ValueError:
        raise InvalidBody(f"Content-Length {header[:40]!r} is not a number") from None


async def read_limited(chunks: AsyncIterator[bytes], declared: int | None, limit: int) -> bytes:
    if declared is not None and declared > limit:
        raise BodyTooLarge(f"body of {declared} bytes is over the {limit}-byte limit",
                           detail={"limit": limit, "size": declared})
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"body is over the {limit}-byte limit", detail={"limit": limit})
        parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


# Gzip members one body may hold. Each member's end copies what follows it (zlib keeps
# it as unused_data): 52,000 empty members in 1 MiB held the event loop for 4.7 s.
# Clients send one (a browser's CompressionStream, the Sentry SDKs); a few concatenated
# streams are still read.
MAX_GZIP_MEMBERS = 64


def inflate(data: bytes, limit: int) -> bytes:
    """``data`` gunzipped, refused past ``limit`` bytes. A gzip stream may hold several
    members (RFC 1952), up to ``MAX_GZIP_MEMBERS``; anything else after one is refused
    rather than ignored."""
    parts: list[bytes] = []
    size = 0
    while True:
        if len(parts) == MAX_GZIP_MEMBERS:
            raise InvalidBody(f"the gzip stream holds more than {MAX_GZIP_MEMBERS} members; "
                              "send the body compressed as one")
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            out = inflater.decompress(data, limit - size + 1)
        except zlib.error as exc:
            raise InvalidBody(f"Content-Encoding is gzip but the body does not inflate: {exc}"
                              ) from exc
        size += len(out)
        if size > limit or inflater.unconsumed_tail:
            raise BodyTooLarge(f"body inflates to more than the {limit}-byte limit",
                               detail={"limit": limit, "stage": "inflated"})
        if not inflater.eof:
            raise InvalidBody("Content-Encoding is gzip but the gzip stream is truncated")
        parts.append(out)
        data = inflater.unused_data
        if not data:
            return parts[0] if len(parts) == 1 else b"".join(parts)
        if not data.startswith(b"\x1f\x8b"):
            raise InvalidBody(f"{len(data)} bytes follow the gzip stream; send only the "
                              "gzip-compressed body")


def inflate_brotli(data: bytes, limit: int) -> bytes:
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


def inflate_zlib(data: bytes, limit: int) -> bytes:
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
