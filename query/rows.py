"""A log row as the API returns it, and the opaque pagination cursor."""

from __future__ import annotations

import base64
import binascii
import functools
import re
from datetime import UTC, datetime

import msgspec

from core.attrs import AttrsError
from core.attrs import decode as decode_attrs
from core.errors import InvalidParameter
from core.schema import READ, format_id

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
    # A stored value no reader can decode (rows stored before ingest refused it): the row
    # still comes back, with what failed named here and the stored text kept raw.
    problem: str | None = None
    raw_attrs: str | None = None


class Page(msgspec.Struct, frozen=True, rename="camel"):
    rows: list[Row]
    next_cursor: str | None


# The stored columns a row is built from, in this order (core.schema.READ: the columns the
# API row shows); and how they are selected (ts as epoch milliseconds). A tail builds the
# same tuples from a RowBatch by these names (query.frames.batch_rows).
COLUMNS = READ
SELECT = tuple("epoch_ms(ts) AS ts_ms" if c == "ts" else c for c in COLUMNS)



def iso_ms(ms: int) -> str:
    second, milli = divmod(ms, 1000)
    return f"{_iso_second(second)}{milli:03d}Z"


@functools.lru_cache(maxsize=4096)  # rows of a page or a tail share their seconds
def _iso_second(second: int) -> str:
    """``strftime`` is most of a row's encoding time; once per second is enough."""
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")


def to_row(r: tuple[object, ...]) -> Row:
    """A row of ``SELECT``'s columns as the API returns it; never raises for what is stored
    (a value that cannot be read comes back raw, and ``problem`` says so)."""
    (id_, ts, level, message, box, url, session, release, attrs, etype, emsg, stack,
     truncated) = r
    error = None
    if etype is not None or emsg is not None or stack is not None:
        error = ErrorOut(type=etype, message=emsg, stack=stack)  # type: ignore[arg-type]
    problem = raw_attrs = None
    try:
        decoded = decode_attrs(attrs) if attrs else {}  # type: ignore[arg-type]
    except (msgspec.DecodeError, AttrsError) as exc:
        decoded, raw_attrs, problem = {}, str(attrs), f"unreadable_attrs: {exc}"
    return Row(
        id=format_id(id_),  # type: ignore[arg-type]
        ts=iso_ms(ts),  # type: ignore[arg-type]
        level=level, message=message, box_id=box, url=url,  # type: ignore[arg-type]
        session_id=session, release=release,  # type: ignore[arg-type]
        attrs=decoded,
        error=error,
        truncated=split_truncated(truncated) if truncated else None,  # type: ignore[arg-type]
        problem=problem, raw_attrs=raw_attrs,
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


MAX_ID = (1 << 63) - 1  # ids are BIGINT
MAX_TS_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, as query.since


def decode_cursor(text: str) -> Cursor:
    try:
        if len(text) > 64:
            raise ValueError
        cursor = _cursor_decoder.decode(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        if not (0 <= cursor.ts <= MAX_TS_MS and 0 <= cursor.id <= MAX_ID):
            raise ValueError
        return cursor
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise InvalidParameter("cursor is not one this server returned as nextCursor",
                               detail={"parameter": "cursor"}) from None


_EVENT_ID = re.compile(r"[0-9a-fA-F]{1,16}")


def parse_event_id(text: str, parameter: str) -> int:
    """An id as rows carry it (``Last-Event-ID``, the tails' cursor)."""
    if _EVENT_ID.fullmatch(text) and (value := int(text, 16)) <= MAX_ID:
        return value
    raise InvalidParameter(f"{parameter} {text[:40]!r} is not an id this server sent",
                           detail={"parameter": parameter})
