"""Reading an ingest body: media type, encoding, and size limits before and after inflating.

The compressed body is read in chunks and refused as soon as it passes the limit;
gzip is inflated with ``max_length`` so a bomb never grows past the limit in memory.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator

from ingest.errors import BodyTooLarge, InvalidBody, UnsupportedEncoding, UnsupportedMediaType

_MEDIA_TYPES = {"application/json", "text/plain", ""}


def check_media_type(content_type: str | None) -> None:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media not in _MEDIA_TYPES:
        raise UnsupportedMediaType(
            f"Content-Type {media!r} is not supported; send application/json, or text/plain "
            "(what navigator.sendBeacon uses)", detail={"contentType": media})


def check_encoding(content_encoding: str | None) -> bool:
    """True when the body is gzip."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding in ("identity", ""):
        return False
    if encoding in ("gzip", "x-gzip"):
        return True
    raise UnsupportedEncoding(
        f"Content-Encoding {encoding!r} is not supported; send gzip or no encoding",
        detail={"contentEncoding": encoding})


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


def inflate(data: bytes, limit: int) -> bytes:
    """``data`` gunzipped, refused past ``limit`` bytes. A gzip stream may hold several
    members (RFC 1952); anything else after one is refused rather than ignored."""
    parts: list[bytes] = []
    size = 0
    while True:
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
