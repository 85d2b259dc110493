"""From a decoded body to a :class:`RowBatch`: per-event validation, defaults and limits.

A bad event is rejected alone with a reason; long strings are cut to their limit
and the event's ``truncated`` column names what was cut.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

import msgspec

from core.attrs import AttrsError
from core.attrs import decode as decode_attrs
from core.config import Config
from core.schema import Packed, RowBatch
from ingest.errors import EventReason
from ingest.wire import Columns, Context, Event, Scalar, event_decoder
from symbolicate.stack import Frame

LEVELS = {"debug": "debug", "info": "info", "warn": "warn", "error": "error",
          "warning": "warn", "log": "info", "trace": "debug", "fatal": "error",
          "critical": "error"}
CANONICAL_LEVELS = frozenset(("debug", "info", "warn", "error"))
MIN_TS = 946_684_800_000  # 2000-01-01: smaller values are most likely seconds, not ms
MAX_FUTURE_MS = 10 * 60_000
_attrs_encoder = msgspec.json.Encoder()
_frames_encoder = msgspec.json.Encoder()
# Numbers that could be out of float range: an exponent of 100 or more (after a digit or
# '.', before what ends a number), or 200 digits in a row (below both, a number is under
# 10^(199+99), in range; 300 let 1<249 zeros>e60 through, found by an attack). Looked
# for in the bytes with digits and '.' folded to '0' and number ends to 't', where the
# regex has a literal prefix to skip to (the same regex on the raw blob cost ~200 us a
# request). A string holding such a shape only sends its batch down the slower, decoding
# path.
_NUMBER_SHAPES = bytes.maketrans(b"0123456789.E,}] \t\r\n", b"00000000000ettttttt")
_BIG_EXPONENT = re.compile(rb"0e\+?000+t")
_LONG_DIGITS = b"0" * 200


class Rejection(msgspec.Struct, frozen=True):
    index: int
    code: EventReason
    error: str


class InvalidEvent(Exception):
    def __init__(self, code: EventReason, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Limits:
    message: int
    stack: int
    attrs: int
    attr: int

    @classmethod
    def from_config(cls, config: Config) -> Limits:
        return cls(config.max_message_bytes, config.max_stack_bytes, config.max_attrs,
                   config.max_attr_bytes)


def clip(text: str, limit: int) -> str | None:
    """``text`` cut to ``limit`` UTF-8 bytes, or None when it fits."""
    if len(text) * 4 <= limit:
        return None
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return None
    return raw[:limit].decode("utf-8", "ignore")


def parse_ts(value: int | float | str | None, received: int) -> int:
    if value is None:
        return received
    if isinstance(value, str):
        try:
            text = value[:-1] + "+00:00" if value[-1:] in ("Z", "z") else value
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidEvent("invalid_timestamp",
                               f"ts {value[:40]!r} is neither epoch milliseconds nor ISO-8601"
                               ) from None
        if parsed.tzinfo is None:
            raise InvalidEvent("invalid_timestamp", "an ISO-8601 ts needs a UTC offset or Z")
        ms = int(parsed.timestamp() * 1000)
    else:
        ms = int(value)
    if ms < MIN_TS:
        raise InvalidEvent("invalid_timestamp",
                           f"ts {value} is before 2000-01-01; send epoch milliseconds, not seconds")
    return ms


def mark_attr(key: str) -> str:
    """The ``truncated`` name of attribute ``key``: names are joined with commas, so a
    comma (and the escape character) in a key is percent-escaped."""
    return "attrs." + key[:64].replace("%", "%25").replace(",", "%2C")


def metric_field(name: str) -> str:
    """A ``truncated`` name as the metric's label: attribute keys are the client's
    words, and must not become label values (one time series each)."""
    return "attrs.value" if name.startswith("attrs.") else name


class BatchBuilder:
    """Collects one request's events column by column."""

    def __init__(self, project_id: str, box: str | None, context: Context, received: int,
                 limits: Limits) -> None:
        self.limits = limits
        self.received = received
        # Context strings are cut like event fields and every row of the batch says so.
        self.context_cut: list[str] = []
        self.default_url = self._clip_context("context.url", context.url, limits.message)
        sdk = context.sdk
        self.batch = RowBatch(
            project_id=project_id,
            box=box,
            session_id=self._clip_context("context.sessionId", context.session_id,
                                          limits.attr),
            release=self._clip_context("context.release", context.release, limits.attr),
            user_agent=self._clip_context("context.userAgent", context.user_agent,
                                          limits.attr),
            sdk=self._clip_context("context.sdk", f"{sdk.name or '?'}/{sdk.version or '?'}",
                                   limits.attr) if sdk else None,
            debug_ids=self._debug_ids(context.debug_ids, limits),
            received=received,
            id_start=0,
            ts=[], level=[], message=[], url=[], attrs=[], error_type=[],
            error_message=[], error_stack=[], truncated=[],
        )
        self.rejected: list[Rejection] = []
        self.truncations: dict[str, int] = {}

    def _debug_ids(self, ids: dict[str, str] | None, limits: Limits) -> str | None:
        """The page's debug ids (script URL -> id) as JSON, kept within what one event may
        carry, for every row of the batch holds a copy: ``limits.attrs`` entries, each URL
        and id within ``limits.attr`` bytes, ``limits.message`` bytes in all. An entry past
        a limit is dropped whole (a cut URL or id names nothing) and the rows marked
        ``context.debugIds``. Unbounded, 1 MB of ids sent once took 300 MB in memory, and
        3 MB overflowed the seal, leaving acked rows unreadable."""
        if not ids:
            return None
        kept: list[bytes] = []
        size = 1  # "{" and "}", less the last entry's comma
        for url, debug_id in ids.items():
            key, value = _attrs_encoder.encode(url), _attrs_encoder.encode(debug_id)
            cost = len(key) + len(value) + 2  # ':' and ','
            if (len(kept) == limits.attrs or len(key) - 2 > limits.attr
                    or len(value) - 2 > limits.attr or size + cost > limits.message):
                continue
            kept.append(key + b":" + value)
            size += cost
        if len(kept) < len(ids):
            self.context_cut.append("context.debugIds")
        return (b"{" + b",".join(kept) + b"}").decode() if kept else None

    def _clip_context(self, name: str, value: str | None, limit: int) -> str | None:
        if value is None or (short := clip(value, limit)) is None:
            return value
        self.context_cut.append(name)
        return short

    def add_all(self, events: list[Event]) -> None:
        """All events of a typed body: the column-wise fast path, else one by one."""
        if not self._add_fast(events):
            for index, event in enumerate(events):
                self.add(index, event)

    def _add_fast(self, events: list[Event]) -> bool:
        """Append the batch column by column if every event is valid as sent and within
        every limit (the common case); return False, having appended nothing, otherwise."""
        if not events:
            return True
        limits = self.limits
        levels = [e.level for e in events]
        if not CANONICAL_LEVELS.issuperset(levels):
            return False
        messages = [e.message for e in events]
        if None in messages or max(map(len, messages)) * 4 > limits.message:  # type: ignore[arg-type]
            return False
        newest = self.received + MAX_FUTURE_MS
        ts = [e.ts for e in events]
        for t in ts:
            if type(t) is not int or not MIN_TS <= t <= newest:
                return False
        attrs = self._raw_attrs([e.attrs for e in events], limits)
        if attrs is None:
            return False
        urls = [e.url for e in events]
        present_urls = [u for u in urls if u]
        if present_urls and max(map(len, present_urls)) * 4 > limits.message:
            return False
        errors = [e.error for e in events]
        has_errors = any(errors)
        if has_errors:
            for error in errors:
                if error is not None and (
                        len(error.message or "") * 4 > limits.message
                        or len(error.stack or "") * 4 > limits.stack
                        or len(error.type or "") * 4 > limits.attr):
                    return False
        default_url = self.default_url
        self._set(ts, levels, messages, [u or default_url for u in urls],  # type: ignore[arg-type]
                  attrs,
                  [e.type if e else None for e in errors] if has_errors else None,
                  [e.message if e else None for e in errors] if has_errors else None,
                  [e.stack if e else None for e in errors] if has_errors else None)
        return True

    def add_columns(self, columns: Columns) -> bool:
        """A body the compiled core read (``ingest.wire.decode_columns``), its columns as
        the core made them, if its timestamps are in range; return False, having appended
        nothing, otherwise."""
        if columns.events and (columns.ts_min < MIN_TS
                               or columns.ts_max > self.received + MAX_FUTURE_MS):
            return False
        self.batch.packed = Packed(
            columns.ts, columns.level, columns.message, columns.url, columns.attrs,
            columns.error_type, columns.error_message, columns.error_stack,
            self.default_url if columns.missing_urls else None,
            ",".join(self.context_cut) if self.context_cut else None)
        if self.context_cut:
            self._count(self.context_cut * columns.events)
        return True

    def _set(self, ts: list[int], levels: list[str], messages: list[str],
             urls: list[str | None], attrs: list[str | None], error_type: list[str | None] | None,
             error_message: list[str | None] | None, error_stack: list[str | None] | None
             ) -> None:
        """The columns of a batch whose events all passed as sent (None: no errors)."""
        n = len(ts)
        b = self.batch
        b.ts, b.level, b.message, b.url, b.attrs = ts, levels, messages, urls, attrs
        if error_type is None or error_message is None or error_stack is None:
            b.error_type = b.error_message = b.error_stack = [None] * n
        else:
            b.error_type, b.error_message, b.error_stack = error_type, error_message, error_stack
        b.truncated = [",".join(self.context_cut) if self.context_cut else None] * n
        if self.context_cut:
            self._count(self.context_cut * n)

    @staticmethod
    def _raw_attrs(raws: list[msgspec.Raw], limits: Limits) -> list[str | None] | None:
        """The attrs column from raw JSON, or None if any object needs a closer look.

        Checked over all events at once: every present value must be an object (it
        starts with ``{``) holding no nested ``{`` or ``[`` (``{`` once per value; a
        string holding one just takes the slow path), short enough that no value can
        be over its limit and that it cannot hold more than ``limits.attrs`` entries
        (each takes at least 5 bytes: ``"":0,``). JSON strings cannot hold a raw
        U+001E, so it separates the values unambiguously.
        """
        present = [r for r in raws if r]
        if not present:
            return [None] * len(raws)
        blob = b"\x1e".join(present)
        n = len(present)
        longest = max(map(len, present))
        if (blob.count(b"{") != n or b"[" in blob or longest > limits.attr
                or longest > 5 * limits.attrs):
            return None
        try:
            texts = blob.decode().split("\x1e")
        except UnicodeDecodeError:  # a raw value is not UTF-8 (the decoder skipped it whole)
            return None
        # First characters from the split strings: a third of counting b"\x1e{" in the blob.
        if [t[:1] for t in texts].count("{") != n:
            return None
        # Stored as sent, this text must read back the same in every reader. Duplicate keys
        # do (core.attrs: the first value, as DuckDB's json_extract), but a number out
        # of float range does not read at all: any number with an exponent of 100 or more,
        # or a run of 200 digits, sends the batch to the per-event path that decodes it.
        shapes = blob.translate(_NUMBER_SHAPES)
        if _LONG_DIGITS in shapes or _BIG_EXPONENT.search(shapes):
            return None
        if n == len(raws):
            return texts  # type: ignore[return-value]
        it = iter(texts)
        return [next(it) if r else None for r in raws]

    def add(self, index: int, event: Event | msgspec.Raw, frames: list[Frame] | None = None
            ) -> None:
        """One event (``frames``: its error's frames as a client sent them structured,
        innermost first; see ``ingest.envelope``)."""
        try:
            if isinstance(event, msgspec.Raw):
                try:
                    event = event_decoder.decode(event)
                except msgspec.DecodeError as exc:
                    raise InvalidEvent("invalid_event", str(exc)) from None
                except RecursionError:
                    raise InvalidEvent("invalid_event", "event is nested too deeply") from None
            self._add(event, frames)
        except InvalidEvent as exc:
            self.rejected.append(Rejection(index, exc.code, str(exc)))

    def _add(self, event: Event, frames: list[Frame] | None = None) -> None:
        level = LEVELS.get(event.level.lower())
        if level is None:
            raise InvalidEvent("invalid_level",
                               f"level {event.level[:20]!r} is not one of debug, info, warn, error")
        error = event.error
        message = event.message
        if message is None:
            if error is None:
                raise InvalidEvent("invalid_event", "an event needs a message or an error")
            message = error.message or error.type or ""
        ts = parse_ts(event.ts, self.received)
        cut: list[str] = list(self.context_cut)
        if ts > self.received + MAX_FUTURE_MS:
            # A box with a clock far ahead would put its rows out of every "last N minutes"
            # query: the row takes the time it was received, and says so.
            ts = self.received
            cut.append("ts")
        limits = self.limits
        if (short := clip(message, limits.message)) is not None:
            message = short
            cut.append("message")
        url = event.url or self.default_url
        if event.url and (short := clip(event.url, limits.message)) is not None:
            url = short
            cut.append("url")
        err_type = err_message = stack = None
        if error is not None:
            err_type, err_message, stack = error.type, error.message, error.stack
            if err_type is not None and (short := clip(err_type, limits.attr)) is not None:
                err_type = short
                cut.append("error.type")
            if err_message is not None and (short := clip(err_message, limits.message)):
                err_message = short
                cut.append("error.message")
            if stack is not None and (short := clip(stack, limits.stack)) is not None:
                stack = short
                cut.append("error.stack")
        attrs = None
        if event.attrs:
            try:
                decoded = None if bytes(event.attrs) == b"null" else decode_attrs(event.attrs)
            except (msgspec.DecodeError, AttrsError) as exc:  # not scalars; out of range
                raise InvalidEvent("invalid_event", f"attrs: {exc}") from None
            except RecursionError:
                raise InvalidEvent("invalid_event", "attrs: nested too deeply") from None
            if decoded:
                attrs = self._attrs(decoded, cut)
        b = self.batch
        b.ts.append(ts)
        b.level.append(level)
        b.message.append(message)
        b.url.append(url)
        b.attrs.append(attrs)
        b.error_type.append(err_type)
        b.error_message.append(err_message)
        b.error_stack.append(stack)
        if frames and error is not None:
            encoded = _frames_encoder.encode(frames)
            if len(encoded) > limits.stack:  # readers parse the (cut) stack text instead
                cut.append("error.frames")
                b.error_frames.append(None)
            else:
                b.error_frames.append(encoded.decode())
        else:
            b.error_frames.append(None)
        if cut:
            self._count(cut)
            b.truncated.append(",".join(cut))
        else:
            b.truncated.append(None)

    def _count(self, names: list[str]) -> None:
        for name in names:
            field = metric_field(name)
            self.truncations[field] = self.truncations.get(field, 0) + 1

    def _attrs(self, attrs: dict[str, Scalar], cut: list[str]) -> str:
        limits = self.limits
        if len(attrs) > limits.attrs:
            attrs = dict(list(attrs.items())[: limits.attrs])
            cut.append("attrs")
        if any(len(key) * 4 > limits.attr for key in attrs):
            # A key, like a value, is cut to the attribute limit, and marked by its cut form.
            kept: dict[str, Scalar] = {}
            for key, value in attrs.items():
                if (short_key := clip(key, limits.attr)) is not None:
                    cut.append(mark_attr(short_key))
                    key = short_key
                kept[key] = value
            attrs = kept
        for key, value in attrs.items():
            if isinstance(value, str) and (short := clip(value, limits.attr)) is not None:
                attrs[key] = short
                cut.append(mark_attr(key))
        return _attrs_encoder.encode(attrs).decode()
