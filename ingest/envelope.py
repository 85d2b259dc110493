"""Sentry envelopes and events -> ingest's events: the wire protocol of Sentry's SDKs.

An envelope is a JSON header line, then items: a JSON item header line, then its payload:
``length`` bytes when the header says, else up to the next newline. :func:`split` reads
that frame and refuses the whole envelope when the frame itself is broken (a header that is
not a JSON object, a payload shorter than its ``length``, a missing newline after it), as
Sentry's Relay does. What one item holds is judged alone: an ``event`` whose JSON does not
read is dropped and counted, and the other items are kept.

:func:`to_events` makes ingest's own :class:`~ingest.wire.Event` of what is stored:

- ``event`` (and the legacy store endpoint's body): one row. Level as sent (Sentry's
  default is ``error``); message from ``logentry`` or ``message``, else ``Type: value`` of
  the exception; the exception Sentry puts last in ``exception.values`` (the one thrown)
  becomes ``error``, its frames kept as sent, innermost first (Sentry lists them outermost
  first; they are read as they are, never parsed from text) and printed as V8 prints a
  stack for ``error.stack``. An exception marked ``mechanism.synthetic`` with no type is
  what ``captureMessage`` attaches: the row is a log line, not an error. ``tags``, ``user``
  (id, email, username, ip_address), ``environment``, ``dist``, ``logger``, ``transaction``,
  the event id and the scalar fields of ``contexts`` (``trace.trace_id``, ``os.name``...)
  become ``attrs``; ``request.url`` the row's url; ``release`` and
  ``debug_meta.images`` (debug ids by script URL) the batch's context.
- ``log`` (``Sentry.logger.*``): a container ``{"items": [...]}``, one row per item: level,
  ``body`` as message, ``timestamp`` (seconds), ``attributes`` (``{name: {value, type}}``)
  as attrs.
- Every other item type (sessions, transactions, client reports, attachments, replays,
  profiles, spans, unknown ones) is accepted and counted by type, not stored.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

import msgspec

from core.usage import sentry_discards
from ingest.errors import InvalidBody
from ingest.events import MIN_TS, Limits
from ingest.surrogates import repair as repair_surrogates
from ingest.wire import Columns, Context, ErrorInfo, Event, Sdk, decode_logs
from symbolicate.stack import MAX_LINE_CHARS, Frame, cut_line

STORED = frozenset(("event", "log"))
MAX_ITEMS = 1000  # an envelope's items; a log item holds up to MAX_LOGS rows
MAX_FRAMES = 250
MAX_TAGS = 64

_decode_json = msgspec.json.Decoder().decode
_encode_json = msgspec.json.Encoder().encode


class Item(NamedTuple):
    type: str
    headers: dict[str, Any]
    payload: bytes


class BrokenItem(Exception):
    """One item's payload cannot be read; the rest of the envelope stands."""


def _header(line: bytes, what: str) -> dict[str, Any]:
    try:
        value = _decode_json(line)
    except (msgspec.DecodeError, RecursionError):
        raise InvalidBody(f"the envelope's {what} is not JSON: {line[:80]!r}") from None
    if not isinstance(value, dict):
        raise InvalidBody(f"the envelope's {what} must be a JSON object")
    return value


def split(raw: bytes) -> tuple[dict[str, Any], list[Item]]:
    """The envelope's header and its items; :class:`InvalidBody` for a broken frame."""
    end = raw.find(b"\n")
    head, pos = (raw, len(raw)) if end < 0 else (raw[:end], end + 1)
    if not head.strip():
        raise InvalidBody("an envelope starts with a JSON header line")
    header = _header(head, "header")
    items: list[Item] = []
    while pos < len(raw):
        end = raw.find(b"\n", pos)
        line = raw[pos:] if end < 0 else raw[pos:end]
        pos = len(raw) if end < 0 else end + 1
        if not line.strip():
            continue  # blank lines between items (and the trailing newline)
        if len(items) == MAX_ITEMS:
            raise InvalidBody(f"more than {MAX_ITEMS} items in one envelope")
        item_header = _header(line, f"item {len(items)} header")
        kind = item_header.get("type")
        if not isinstance(kind, str) or not kind:
            raise InvalidBody(f"item {len(items)} header has no type")
        length = item_header.get("length")
        if length is None:
            end = raw.find(b"\n", pos)
            payload = raw[pos:] if end < 0 else raw[pos:end]
            pos = len(raw) if end < 0 else end + 1
        else:
            if type(length) is not int or length < 0:
                raise InvalidBody(f"item {len(items)} length must be a non-negative integer")
            if pos + length > len(raw):
                raise InvalidBody(f"item {len(items)} is {length} bytes but the envelope ends "
                                  f"after {len(raw) - pos}")
            payload = raw[pos:pos + length]
            pos += length
            if pos < len(raw):
                if raw[pos:pos + 1] != b"\n":
                    raise InvalidBody(f"item {len(items)} is longer than its length {length}")
                pos += 1
        items.append(Item(kind, item_header, payload))
    return header, items


@dataclass
class Converted:
    """What an envelope's items make: rows to store, and the batch context they share."""

    events: list[Event] = field(default_factory=list)
    release: str | None = None
    debug_ids: dict[str, str] = field(default_factory=dict)
    sdk: Sdk | None = None
    user_agent: str | None = None
    box_id: str | None = None
    event_id: str | None = None
    frames: dict[int, list[Frame]] = field(default_factory=dict)  # by index in events
    stored: dict[str, int] = field(default_factory=dict)  # rows by item type
    dropped: list[str] = field(default_factory=list)  # item types not stored, or broken
    # Rows the SDK dropped before sending, by reason: its client reports (core.usage).
    discarded: dict[str, int] = field(default_factory=dict)
    # The one log item, read by the compiled core instead of into ``events``.
    columns: Columns | None = None
    log_payload: bytes = b""

    @property
    def rows(self) -> int:
        return len(self.events) if self.columns is None else self.columns.events

    def python_rows(self) -> None:
        """The core's rows made again by the Python path, into ``events`` (a timestamp the
        batch does not take as it is: that path judges it)."""
        rows = _typed_logs(self.log_payload, self)
        self.events = list(_logs(read_object(self.log_payload), self)) if rows is None else rows
        self.columns = None

    def context(self) -> Context:
        return Context(release=self.release, sdk=self.sdk, user_agent=self.user_agent,
                       box_id=self.box_id, debug_ids=self.debug_ids or None)


def to_events(header: dict[str, Any], items: list[Item], max_logs: int,
              limits: Limits | None = None) -> Converted:
    """The rows and context of an envelope's items. With ``limits``, an envelope whose one
    stored item is a log is read by the compiled core when it takes it (``Converted.columns``);
    without, always by the Python path, the reference."""
    out = Converted()
    compiled = limits is not None and [i.type for i in items if i.type in STORED] == ["log"]
    event_id = header.get("event_id")
    out.event_id = event_id if isinstance(event_id, str) else None
    out.sdk = _sdk(header.get("sdk"))
    logs = 0
    for item in items:
        if item.type not in STORED:
            out.dropped.append(item.type)
            if item.type == "client_report":
                with contextlib.suppress(BrokenItem):
                    sentry_discards(read_object(item.payload), out.discarded)
            continue
        try:
            if item.type == "event":
                add_event(out, read_object(item.payload))
            elif compiled and limits is not None and (found := decode_logs(
                    item.payload, limits.message, limits.attrs, limits.attr, MAX_TAGS,
                    MIN_TS)) is not None:
                out.columns, out.release = found
                out.log_payload = item.payload
                if out.columns.events > max_logs:
                    raise InvalidBody(f"more than {max_logs} log rows in one envelope")
                out.stored["log"] = out.columns.events
            else:
                rows = _typed_logs(item.payload, out)
                if rows is None:  # some value of an unexpected type: read it loosely
                    rows = list(_logs(read_object(item.payload), out))
                logs += len(rows)
                if logs > max_logs:
                    raise InvalidBody(f"more than {max_logs} log rows in one envelope")
                out.events += rows
                out.stored["log"] = out.stored.get("log", 0) + len(rows)
        except BrokenItem:
            out.dropped.append(f"invalid_{item.type}")
    return out


def read_object(payload: bytes) -> dict[str, Any]:
    try:
        value = _decode_json(payload)
    except RecursionError:
        raise BrokenItem from None
    except msgspec.DecodeError:
        # A lone surrogate escape ("\ud800"), as /v1/ingest reads it: U+FFFD in its place.
        if (repaired := repair_surrogates(payload)) == payload:
            raise BrokenItem from None
        return read_object(repaired)
    if not isinstance(value, dict):
        raise BrokenItem
    return value


# --- events --------------------------------------------------------------------------------


def add_event(out: Converted, event: dict[str, Any]) -> None:
    """Add a Sentry event (an ``event`` item, or the store endpoint's body) to ``out``."""
    if out.event_id is None and isinstance(event.get("event_id"), str):
        out.event_id = event["event_id"]
    out.release = out.release or _text(event.get("release"))
    out.sdk = out.sdk or _sdk(event.get("sdk"))
    request = _dict(event.get("request"))
    headers = _pairs(request.get("headers"))
    out.user_agent = out.user_agent or _text(headers.get("User-Agent"))
    for image in _list(_dict(event.get("debug_meta")).get("images")):
        image = _dict(image)
        code_file, debug_id = _text(image.get("code_file")), _text(image.get("debug_id"))
        if code_file and debug_id and len(out.debug_ids) < MAX_TAGS:
            out.debug_ids[code_file] = debug_id
    tags = _pairs(event.get("tags"))
    box = tags.get("boxId") or tags.get("box_id")
    out.box_id = out.box_id or (box if isinstance(box, str) else None)
    error, frames = error_of(event)
    message = _message(event)
    if message is None and error is not None:
        message = ": ".join(p for p in (error.type, error.message) if p) or None
    attrs: dict[str, Any] = {}
    for key, value in list(tags.items())[:MAX_TAGS]:
        if isinstance(key, str):
            attrs[key] = _scalar(value)
    user = _dict(event.get("user"))
    for key in ("id", "email", "username", "ip_address"):
        if user.get(key) is not None:
            attrs[f"user.{key}"] = _scalar(user[key])
    for key in ("environment", "dist", "logger", "transaction"):
        if (value := _text(event.get(key))) is not None:
            attrs[key] = value
    # Contexts' scalar fields, one level deep: trace.trace_id, browser.name, os.version...
    for name, context in list(_dict(event.get("contexts")).items())[:MAX_TAGS]:
        for key, value in list(_dict(context).items())[:MAX_TAGS]:
            if isinstance(value, str | int | float | bool) and len(attrs) < MAX_TAGS:
                attrs.setdefault(f"{name}.{key}", _scalar(value))
    event_id = event.get("event_id")
    if (event_id := event_id if isinstance(event_id, str) else out.event_id) is not None:
        attrs["sentry.event_id"] = event_id
    out.stored["event"] = out.stored.get("event", 0) + 1
    if frames:
        out.frames[len(out.events)] = frames
    out.events.append(Event(
        ts=_timestamp(event.get("timestamp")), level=_level(event.get("level"), "error"),
        message=message if message is not None else "", url=_text(request.get("url")),
        attrs=msgspec.Raw(_encode_json(attrs)) if attrs else msgspec.Raw(), error=error))


def _message(event: dict[str, Any]) -> str | None:
    for source in (event.get("logentry"), event.get("message")):
        if isinstance(source, str):
            return source
        if isinstance(source, dict):
            text = _text(source.get("formatted")) or _text(source.get("message"))
            if text is not None:
                return text
    return None


def error_of(event: dict[str, Any]) -> tuple[ErrorInfo | None, list[Frame]]:
    """The event's error (the exception thrown) and its frames, innermost first."""
    exception = event.get("exception")
    values = _list(exception.get("values") if isinstance(exception, dict) else exception)
    values = [v for v in values if isinstance(v, dict)]
    if not values:
        return None, []
    thrown = values[-1]  # Sentry lists a chain cause first, the exception thrown last
    mechanism = _dict(thrown.get("mechanism"))
    kind, value = _text(thrown.get("type")), _text(thrown.get("value"))
    if mechanism.get("synthetic") is True and not kind:
        return None, []  # captureMessage's stack: the row is a log line
    sent = _list(_dict(thrown.get("stacktrace")).get("frames"))
    frames = [_frame(f) for f in reversed(sent[-MAX_FRAMES:])]
    stack = None
    if frames:
        head = f"{kind or 'Error'}: {value}" if value else (kind or "Error")
        stack = "\n".join([head, *(f"    {f.raw}" for f in frames)])
    return ErrorInfo(type=kind, message=value, stack=stack), frames


def _frame(sent: Any) -> Frame:
    """A Sentry frame as ingest keeps it (``symbolicate.stack.Frame``), and printed as V8
    prints one: the stack text rows show (``error.stack``) is these lines."""
    sent = _dict(sent)
    url = _cut(_text(sent.get("abs_path")) or _text(sent.get("filename")))
    line, column = _position(sent.get("lineno")), _position(sent.get("colno"))
    function = _cut(_text(sent.get("function")))
    if function == "?":  # Sentry's name for an anonymous function: V8 prints none
        function = None
    native = url is None or url in ("<anonymous>", "native", "[native code]")
    where = url or "<anonymous>"
    if line is not None:
        where += f":{line}" + (f":{column}" if column is not None else "")
    raw = cut_line(f"at {function} ({where})" if function else f"at {where}")
    return Frame(raw=raw, function=function, url=None if native else url,
                 line=None if native else line, column=None if native else column,
                 native=native)


def _cut(text: str | None) -> str | None:
    """At most MAX_LINE_CHARS, as ``symbolicate.stack`` cuts a printed line."""
    return text if text is None or len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS]


def _position(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value < 1 << 31 else None


# --- logs ----------------------------------------------------------------------------------


class _Typed(msgspec.Struct, gc=False):
    value: str | int | float | bool | None = None


class _LogEntry(msgspec.Struct, gc=False):
    timestamp: float | None = None
    level: str | None = None
    body: str = ""
    attributes: dict[str, _Typed] = {}


class _LogContainer(msgspec.Struct, gc=False):
    items: list[_LogEntry] = []


_log_decoder = msgspec.json.Decoder(_LogContainer)


def _typed_logs(payload: bytes, out: Converted) -> list[Event] | None:
    """A log container whose values all have the types Sentry's SDKs send: decoded into
    structs in one pass (a third of the loose path's time); None when any is not."""
    try:
        container = _log_decoder.decode(payload)
    except (msgspec.DecodeError, RecursionError):
        return None
    events = []
    levels = _LEVELS
    for entry in container.items:
        attributes = entry.attributes
        if len(attributes) > MAX_TAGS:
            return None
        attrs = {key: typed.value for key, typed in attributes.items()}
        if out.release is None and isinstance(release := attrs.get("sentry.release"), str):
            out.release = release
        for value in attrs.values():
            if type(value) is int and not -(1 << 63) <= value < 1 << 63:
                return None
        seconds = entry.timestamp
        level = entry.level
        events.append(Event(
            ts=int(seconds * 1000) if seconds and MIN_TS / 1000 <= seconds < 1e13 else None,
            level=levels.get(level) or _level(level, "info") if level else "info",
            message=entry.body,
            attrs=msgspec.Raw(_encode_json(attrs)) if attrs else msgspec.Raw()))
    return events


def _logs(container: dict[str, Any], out: Converted) -> Iterator[Event]:
    for entry in _list(container.get("items")):
        entry = _dict(entry)
        attrs: dict[str, Any] = {}
        for key, typed in list(_dict(entry.get("attributes")).items())[:MAX_TAGS]:
            value = typed.get("value") if isinstance(typed, dict) else typed
            attrs[key] = _scalar(value)
        out.release = out.release or _text(attrs.get("sentry.release"))
        body = entry.get("body")
        yield Event(ts=_timestamp(entry.get("timestamp")), level=_level(entry.get("level"),
                                                                         "info"),
                    message=body if isinstance(body, str) else _encode_json(body).decode(),
                    attrs=msgspec.Raw(_encode_json(attrs)) if attrs else msgspec.Raw())


# --- values as Sentry sends them -----------------------------------------------------------

_LEVELS = {"fatal": "error", "error": "error", "warning": "warn", "warn": "warn",
           "info": "info", "log": "info", "debug": "debug", "trace": "debug"}


def _level(value: Any, default: str) -> str:
    return _LEVELS.get(value.lower(), default) if isinstance(value, str) else default


def _timestamp(value: Any) -> int | None:
    """Sentry's seconds (a number) or RFC 3339 text (UTC when it names no offset) as what
    ingest reads: epoch milliseconds or ISO-8601 with an offset."""
    if isinstance(value, bool):
        return None
    ms = None
    if isinstance(value, int | float) and math.isfinite(value) and 0 < value < 1e13:
        ms = int(value * 1000)
    elif isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value[:-1] + "+00:00" if value[-1] in "Zz" else value)
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=UTC)
            ms = int(parsed.timestamp() * 1000)
        except (ValueError, OverflowError, OSError):
            return None
    # Sentry keeps an event whose time it cannot read at the time it arrived; so does this.
    return ms if ms is not None and ms >= MIN_TS else None


def _scalar(value: Any) -> str | int | float | bool | None:
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, int):
        return value if -(1 << 63) <= value < 1 << 63 else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return _encode_json(value).decode()


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _pairs(value: Any) -> dict[str, Any]:
    """Sentry's tags and headers: an object, or a list of ``[name, value]`` pairs."""
    if isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for pair in _list(value):
        if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str):
            out.setdefault(pair[0], pair[1])
    return out


def _sdk(value: Any) -> Sdk | None:
    sdk = _dict(value)
    name, version = _text(sdk.get("name")), _text(sdk.get("version"))
    return Sdk(name=name, version=version) if name or version else None
