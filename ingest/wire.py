"""The ingest body as it arrives: ``{"context": {...}, "events": [...]}``.

Decoders are built once. A body is first decoded whole into typed Structs (the
fast path); if any event is malformed, it is decoded again with events kept raw,
and each event is decoded alone so one bad event is rejected without its neighbours.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from core.schema import Strings
from ingest import _core

Scalar = str | int | float | bool | None


class Sdk(msgspec.Struct, gc=False):
    name: str | None = None
    version: str | None = None


class Context(msgspec.Struct, gc=False, rename="camel"):
    session_id: str | None = None
    release: str | None = None
    url: str | None = None
    user_agent: str | None = None
    box_id: str | None = None
    sdk: Sdk | None = None
    debug_ids: dict[str, str] | None = None


class ErrorInfo(msgspec.Struct, gc=False):
    type: str | None = None
    message: str | None = None
    stack: str | None = None


class Event(msgspec.Struct, gc=False):
    ts: int | float | str | None = None
    level: str = "info"
    message: str | None = None
    url: str | None = None
    # Kept as raw JSON: a valid batch stores it as sent, without building a dict per
    # event and encoding it again; ``ingest.events`` checks it is an object of scalars.
    attrs: msgspec.Raw = msgspec.Raw()
    error: ErrorInfo | None = None


class Body(msgspec.Struct, gc=False):
    events: list[Event]
    context: Context = msgspec.field(default_factory=Context)


class LooseBody(msgspec.Struct, gc=False):
    events: list[msgspec.Raw]
    context: Context = msgspec.field(default_factory=Context)


body_decoder = msgspec.json.Decoder(Body)
loose_decoder = msgspec.json.Decoder(LooseBody)
event_decoder = msgspec.json.Decoder(Event)
_context_decoder = msgspec.json.Decoder(Context)


class Columns(NamedTuple):
    """A body the compiled core (``ingest/_core.c``) read whole: what ``BatchBuilder``'s
    column-wise path would make of it, in Arrow's buffers (``core.schema.Packed``), less
    what needs the time of receipt (the ``ts`` range) and the context's URL (which stands
    in for the ``missing_urls`` nulls of ``url``)."""

    events: int
    context: Context
    ts: bytes  # int64 epoch milliseconds
    ts_min: int
    ts_max: int
    level: Strings
    message: Strings
    url: Strings
    missing_urls: int
    attrs: Strings
    error_type: Strings | None  # None: no event has an error
    error_message: Strings | None
    error_stack: Strings | None


def decode_columns(raw: bytes, message: int, stack: int, attrs: int, attr: int
                   ) -> Columns | None:
    """The body's columns, or None when anything in it needs the Python path (the
    decoders above, ``ingest.events``): a malformed or unusual field, a value over its
    limit (``message``, ``stack``, ``attr`` bytes; ``attrs`` entries)."""
    found = _core.decode(raw, message, stack, attrs, attr)
    if found is None:
        return None
    try:
        context = Context() if found[1] is None else _context_decoder.decode(found[1])
    except (msgspec.DecodeError, RecursionError):
        return None
    (events, _, ts, ts_min, ts_max, levels, messages, urls, missing_urls, attrs_texts,
     error_types, error_messages, error_stacks) = found
    return Columns(events, context, ts, ts_min, ts_max, Strings(*levels), Strings(*messages),
                   Strings(*urls), missing_urls, Strings(*attrs_texts),
                   None if error_types is None else Strings(*error_types),
                   None if error_messages is None else Strings(*error_messages),
                   None if error_stacks is None else Strings(*error_stacks))


def decode_logs(payload: bytes, message: int, attrs: int, attr: int, max_tags: int,
                min_ts: int) -> tuple[Columns, str | None] | None:
    """A Sentry log item's container read by the core into the columns
    ``ingest.envelope``'s Python path would make of it (no URL, no error), and the first
    ``sentry.release`` attribute; None when anything needs that path."""
    found = _core.logs(payload, message, attrs, attr, max_tags, min_ts)
    if found is None:
        return None
    events, release, ts, ts_min, ts_max, levels, messages, attrs_texts = found
    no_url = Strings(bytes(4 * (events + 1)), b"", bytes((events + 7) // 8))
    return Columns(events, Context(), ts, ts_min, ts_max, Strings(*levels),
                   Strings(*messages), no_url, events, Strings(*attrs_texts), None, None,
                   None), release
