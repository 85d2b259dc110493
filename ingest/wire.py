"""The ingest body as it arrives: ``{"context": {...}, "events": [...]}``.

Decoders are built once. A body is first decoded whole into typed Structs (the
fast path); if any event is malformed, it is decoded again with events kept raw,
and each event is decoded alone so one bad event is rejected without its neighbours.
"""

from __future__ import annotations

import msgspec

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
