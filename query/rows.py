"""A log row as the API returns it, and the opaque pagination cursor."""

from __future__ import annotations

import base64
import binascii
import functools
import re
from datetime import UTC, datetime

import msgspec

from boxtrail.errors import InvalidParameter
from boxtrail.schema import format_id

Scalar = str | int | float | bool | None


class ErrorOut(msgspec.Struct, frozen=True):
    type: str | None
    message: str | None
    stack: str | None


class Row(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    id: str
    ts: str
    level: str
    message: str
    box_id: str | None
    url: str | None
    session_id: str | None
    release: str | None
    attrs: dict[str, Scalar]
    error: ErrorOut | None = None
    truncated: list[str] | None = None


class Page(msgspec.Struct, frozen=True, rename="camel"):
    rows: list[Row]
    next_cursor: str | None


# The columns a row is built from, in this order.
SELECT = ("id", "epoch_ms(ts) AS ts_ms", "level", "message", "box", "url", "session_id",
          "release", "attrs", "error_type", "error_message", "error_stack", "truncated")

_attrs = msgspec.json.Decoder(dict[str, Scalar])


def iso_ms(ms: int) -> str:
    second, milli = divmod(ms, 1000)
    return f"{_iso_second(second)}{milli:03d}Z"


@functools.lru_cache(maxsize=4096)  # rows of a page or a tail share their seconds
def _iso_second(second: int) -> str:
    """``strftime`` is most of a row's encoding time; once per second is enough."""
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")


def to_row(r: tuple[object, ...]) -> Row:
    (id_, ts, level, message, box, url, session, release, attrs, etype, emsg, stack,
     truncated) = r
    error = None
    if etype is not None or emsg is not None or stack is not None:
        error = ErrorOut(type=etype, message=emsg, stack=stack)  # type: ignore[arg-type]
    return Row(
        id=format_id(id_),  # type: ignore[arg-type]
        ts=iso_ms(ts),  # type: ignore[arg-type]
        level=level, message=message, box_id=box, url=url,  # type: ignore[arg-type]
        session_id=session, release=release,  # type: ignore[arg-type]
        attrs=_attrs.decode(attrs) if attrs else {},  # type: ignore[arg-type]
        error=error,
        truncated=split_truncated(truncated) if truncated else None,  # type: ignore[arg-type]
    )


_ESCAPED = re.compile(r"%(25|2C)")


def split_truncated(text: str) -> list[str]:
    """The names in a row's ``truncated`` column (comma-separated; an attribute key's own
    ``%`` and ``,`` are stored as ``%25`` and ``%2C``, see ``ingest.events.mark_attr``)."""
    names = text.split(",")
    if "%" not in text:
        return names
    return [_ESCAPED.sub(lambda m: "%" if m.group(1) == "25" else ",", n) for n in names]


class Cursor(msgspec.Struct, array_like=True, frozen=True):
    ts: int
    id: int


_cursor_decoder = msgspec.msgpack.Decoder(Cursor)


def encode_cursor(cursor: Cursor) -> str:
    return base64.urlsafe_b64encode(msgspec.msgpack.encode(cursor)).decode().rstrip("=")


def decode_cursor(text: str) -> Cursor:
    try:
        return _cursor_decoder.decode(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise InvalidParameter("cursor is not one this server returned as nextCursor",
                               detail={"parameter": "cursor"}) from None
