"""A tail's rows as Server-Sent Events: each row encoded once per hub wake-up, whatever
the number of tails and filters it goes to, into pages a tail cuts at its cursor."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import repeat

import msgspec

from core.schema import SHARED, RowBatch
from query.rows import COLUMNS, to_row

PAGE = 500
HEARTBEAT = b": heartbeat\n\n"
# The first bytes of every tail, sent at once: the answer's headers go out with them (an
# EventSource is open, a proxy starts streaming), and a browser that loses the stream
# tries again after 2 s (its own default is 3 s), with its Last-Event-ID.
OPENING = b"retry: 2000\n: connected\n\n"

_encode = msgspec.json.Encoder().encode

Row = tuple[object, ...]
# How a tail sends a row: ``frame`` (SSE) or MCP's JSON line.
Encoder = Callable[[Row], bytes]


class Dropped(msgspec.Struct, frozen=True):
    count: int


@dataclass(frozen=True)
class Skipped:
    """Rows a tail skipped, more than ``tail_max_behind`` behind; ``upto`` is its cursor."""

    count: int
    upto: int


@dataclass(frozen=True)
class Closed:
    """The tail was ended for its caller: the key it holds was revoked or expired, or its
    project was deleted."""

    reason: str  # revoked | expired | project_deleted

    def message(self) -> str:
        if self.reason == "project_deleted":
            return "the project of this tail was deleted: the tail is closed"
        ended = "expired" if self.reason == "expired" else f"was {self.reason}"
        return (f"the API key of this tail {ended}: the tail is closed (a new one needs a "
                "live key)")

    def event(self) -> bytes:
        """The SSE tail's last event: the error shape, as the next request would get."""
        code = "not_found" if self.reason == "project_deleted" else "unauthorized"
        error = {"error": {"code": code, "message": self.message(),
                           "detail": {"reason": self.reason}}}
        return b"event: closed\ndata: %s\n\n" % _encode(error)


def frame(r: Row) -> bytes:
    row = to_row(r)
    return b"id: %s\nevent: log\ndata: %s\n\n" % (row.id.encode(), one_line(_encode(row)))


# JSON escapes the control characters, but not NEL, LINE SEPARATOR and PARAGRAPH
# SEPARATOR, which line readers built on str.splitlines (httpx's, for one) split on:
# a message holding one would cut its frame in two for such a client.
_LINE_BREAKS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"),
                (b"\xe2\x80\xa9", b"\\u2029"))


def one_line(data: bytes) -> bytes:
    """``data`` (JSON) with every character a line reader might break on escaped."""
    if b"\xc2\x85" in data or b"\xe2\x80\xa8" in data or b"\xe2\x80\xa9" in data:
        for raw, escaped in _LINE_BREAKS:
            data = data.replace(raw, escaped)
    return data


def batch_rows(batch: RowBatch) -> Iterator[Row]:
    """The batch's rows as the read's ``SELECT`` (query.rows.COLUMNS) returns them from the
    batch's Arrow form, column by column by name (a test holds the two equal)."""
    n = len(batch)
    return zip(*(batch.ids() if name == "id"
                 else repeat(getattr(batch, name), n) if name in SHARED
                 else batch.column(name) for name in COLUMNS), strict=True)


@dataclass(frozen=True, eq=False)
class LivePage:
    """Encoded rows of one hub wake-up for one key, shared by every tail with that key."""

    frames: bytes
    ids: list[int]  # of the rows, ascending
    starts: list[int]  # where each row's frame starts in ``frames``

    def after(self, cursor: int) -> bytes:
        """The frames of the rows above ``cursor`` (a tail that also read them skips)."""
        if self.ids[0] > cursor:
            return self.frames
        i = bisect_right(self.ids, cursor)
        return self.frames[self.starts[i]:] if i < len(self.ids) else b""


def live_page(rows: list[Row], indices: Iterable[int], encode: Encoder,
              frames: dict[int, bytes]) -> LivePage | None:
    """The page of ``rows[i]`` for ``indices``, each row encoded once per wake-up and
    encoder whatever the number of filters it matches (``frames`` caches them by index)."""
    parts: list[bytes] = []
    ids: list[int] = []
    starts: list[int] = []
    size = 0
    for i in indices:
        part = frames.get(i)
        if part is None:
            part = frames[i] = encode(rows[i])
        ids.append(rows[i][0])  # type: ignore[arg-type]
        starts.append(size)
        parts.append(part)
        size += len(part)
    return LivePage(b"".join(parts), ids, starts) if parts else None
