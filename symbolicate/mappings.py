"""A source map's ``mappings`` string checked against ECMA-426, in numpy.

``symbolic`` decodes mappings into ``u32`` fields and wraps what does not fit: a negative
original line becomes line 4294967295, a column of 2^32 becomes 0. It also refuses VLQs
longer than 13 digits that the specification calls valid (``gggg...A``: zero digits padding
a small value). So the mappings are checked here instead, at upload:

- the grammar (ECMA-426 "Mappings grammar"): base64 digits, ``,`` between segments and
  ``;`` between lines; a segment has 1, 4 or 5 fields (no empty segment between commas);
  every continuation digit is followed by another digit;
- each VLQ within 32 bits (``VLQUnsignedValue`` < 2^32, the specification's "throw");
- each running value in range: generated column, original line and original column in
  ``[0, 2^31)`` (the values a VLQ can state), source index below ``len(sources)`` and name
  index below ``len(names)``. ECMA-426 leaves these to the consumer ("optionally report an
  error"); ``symbolic`` already refuses bad source and name indexes at parse, and the others
  it would wrap, so an upload refuses them all, naming the line and segment.

:func:`check` is linear and runs in chunks of :data:`CHUNK` bytes, so its memory stays
bounded whatever the map's size; each numpy step releases the GIL on a chunk this size.
:func:`shorten` rewrites VLQs longer than 7 digits (the most a 32-bit value needs) to their
shortest form, which ``symbolic`` accepts, without changing what they mean.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

LIMIT = 1 << 31  # positions: 0-based, below what a signed 32-bit VLQ can state
CHUNK = 1 << 16  # bytes of mappings per numpy pass (small enough to stay in cache)
_MAX_SEGMENT = 5 * 7 + 1  # five fields of at most 7 digits (once shortened), and a separator
_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_TERMINAL, _CONTINUATION, _COMMA, _SEMI = ord("A"), ord("g"), ord(","), ord(";")
# Each byte as its kind: "A" a terminal digit (value < 32), "g" a continuation digit, the
# separators as themselves, anything else "?"; and each digit as its value.
_KINDS = bytearray(b"?" * 256)
_VALUES = np.zeros(256, np.int64)
for _value, _digit in enumerate(_ALPHABET):
    _KINDS[_digit] = _TERMINAL if _value < 32 else _CONTINUATION
    _VALUES[_digit] = _value & 31
_KINDS[_COMMA], _KINDS[_SEMI] = _COMMA, _SEMI
# A run of 7 or more continuation digits from its start (the look-behind keeps a failed
# match from being retried inside the run: linear), and the terminal digit after it if any.
_LONG = re.compile(rb"(?<![g-z0-9+/])[g-z0-9+/]{7,}+[A-Za-f]?")

_Ints = npt.NDArray[np.int64]
_Bytes = npt.NDArray[np.uint8]


class MappingsError(ValueError):
    """The mappings break ECMA-426; the message says where (1-based line and segment)."""


class Extent(NamedTuple):
    """What an index map needs of a section's mappings (generated positions, 0-based)."""

    end: tuple[int, int] | None  # the greatest mapped position; None: no mappings
    first_line_end: int  # the greatest column mapped on line 0 (-1: none)


def _where(text: bytes, at: int, what: str) -> MappingsError:
    line = text.count(b";", 0, at)
    start = text.rfind(b";", 0, at) + 1
    return MappingsError(f"mappings: generated line {line + 1}, segment "
                         f"{text.count(b',', start, at) + 1}: {what}")


def _decode_long(digits: bytes) -> int:
    value = 0
    for digit in reversed(digits):
        value = (value << 5) | (_ALPHABET.index(digit) & 31)
    return value


def _encode(unsigned: int) -> bytes:
    out = bytearray()
    while True:
        digit, unsigned = unsigned & 31, unsigned >> 5
        out.append(_ALPHABET[digit | 32] if unsigned else _ALPHABET[digit])
        if not unsigned:
            return bytes(out)


def shorten(mappings: str) -> str:
    """``mappings`` with every VLQ of more than 7 digits in its shortest form; raises
    :class:`MappingsError` for one without its last digit or beyond 32 bits."""
    text = mappings.encode("ascii", "replace")
    if _LONG.search(text) is None:
        return mappings
    return _shorten(text).decode()


def _shorten(text: bytes) -> bytes:
    def replace(match: re.Match[bytes]) -> bytes:
        digits = match.group()
        if _KINDS[digits[-1]] != _TERMINAL:
            raise _where(text, match.end(), "a VLQ ends without its last digit")
        unsigned = _decode_long(digits)
        if unsigned >= 1 << 32:
            raise _where(text, match.start(), "a VLQ beyond 32 bits")
        return _encode(unsigned)

    return _LONG.sub(replace, text)


class _State:
    """Running values carried from one chunk to the next."""

    def __init__(self) -> None:
        self.line = 0
        self.column = 0  # reset by ";"
        self.fields = [0, 0, 0, 0]  # source, original line, original column, name
        self.end: tuple[int, int] | None = None
        self.first_line_end = -1


def check(mappings: str, sources: int, names: int) -> Extent:
    """Raise :class:`MappingsError` unless ``mappings`` is valid for a map with
    ``sources`` sources and ``names`` names (see the module's docstring)."""
    if not mappings.isascii():
        at = next(i for i, c in enumerate(mappings) if not c.isascii())
        raise _where(mappings[:at].encode(), at, f"{mappings[at]!r} is not a base64 digit")
    text = mappings.encode()
    kinds = text.translate(_KINDS)
    if (at := kinds.find(b"?")) >= 0:
        raise _where(text, at, f"{chr(text[at])!r} is not a base64 digit")
    if kinds.find(b"g" * 7) >= 0:
        text = _shorten(text)
        kinds = text.translate(_KINDS)
    state = _State()
    limits = (sources, LIMIT, LIMIT, names)
    start = 0
    while start < len(text):
        end = len(text)
        if end - start > CHUNK:
            cut = start + CHUNK
            window = kinds[cut: cut + _MAX_SEGMENT]
            found = [i for i in (window.find(b","), window.find(b";")) if i >= 0]
            if found:
                end = cut + min(found) + 1
            elif cut + _MAX_SEGMENT < len(text):
                raise _where(text, cut, "a segment of more than 5 fields")
        _check_chunk(text, kinds, start, end, state, limits)
        start = end
    return Extent(state.end, state.first_line_end)


def _check_chunk(text: bytes, kinds: bytes, start: int, end: int, state: _State,
                 limits: tuple[int, int, int, int]) -> None:
    """One chunk, ``text[start:end]``: it starts a segment and ends after a separator or
    at the end of ``text``."""
    kind = np.frombuffer(kinds, np.uint8, end - start, start)
    _check_separators(text, start, kind, end == len(text))
    terminals = np.flatnonzero(kind == _TERMINAL)
    semicolons = np.cumsum(kind == _SEMI, dtype=np.int32)
    final_line = state.line + (int(semicolons[-1]) if len(semicolons) else 0)
    if not len(terminals):
        if final_line != state.line:
            state.column = 0
        state.line = final_line
        return
    unsigned = _unsigned(kind, np.frombuffer(text, np.uint8, end - start, start), terminals)
    if (bad := unsigned >= 1 << 32).any():
        raise _where(text, start + int(terminals[bad.argmax()]), "a VLQ beyond 32 bits")
    magnitude = unsigned >> 1
    signed = np.where(unsigned & 1, -magnitude, magnitude)
    signed[unsigned == 1] = -LIMIT  # ECMA-426: "-0" is -2^31
    # Segments: a VLQ starts a new one where a separator came since the previous VLQ.
    segment = np.cumsum(kind < _TERMINAL, dtype=np.int32)[terminals]
    firsts = np.flatnonzero(np.diff(segment, prepend=-1))
    counts = np.diff(firsts, append=len(terminals))
    if (bad := (counts == 2) | (counts == 3) | (counts > 5)).any():
        raise _where(text, start + int(terminals[firsts[bad.argmax()]]),
                     f"a segment of {counts[bad.argmax()]} fields (1, 4 or 5 expected)")
    # Generated columns: relative within a line, reset by ";".
    line: _Ints = state.line + semicolons[terminals[firsts]].astype(np.int64)
    column = _running_column(signed[firsts], line, state)
    if (bad := (column < 0) | (column >= LIMIT)).any():
        raise _where(text, start + int(terminals[firsts[bad.argmax()]]),
                     f"generated column {column[bad.argmax()]} is out of range")
    # The other fields: relative to their previous occurrence, over the whole map.
    mapped = firsts[counts >= 4]
    named = firsts[counts == 5] + 4
    what = ("source index", "original line", "original column", "name index")
    for index, at in enumerate((mapped + 1, mapped + 2, mapped + 3, named)):
        if not len(at):
            continue
        running = state.fields[index] + np.cumsum(signed[at])
        if (bad := (running < 0) | (running >= limits[index])).any():
            value = int(running[bad.argmax()])
            bound = f"below {limits[index]}" if index in (0, 3) else "in range"
            raise _where(text, start + int(terminals[at[bad.argmax()]]),
                         f"{what[index]} {value} is not {bound}")
        state.fields[index] = int(running[-1])
    _advance(state, line, column, final_line)


def _check_separators(text: bytes, start: int, kind: _Bytes, last: bool) -> None:
    """No VLQ cut short by a separator or the end, no empty segment next to a comma. The
    chunk starts a segment (after a separator, or at the start of the text)."""
    separator = kind < _TERMINAL
    comma = kind == _COMMA
    cut = (kind[:-1] == _CONTINUATION) & separator[1:]
    if cut.any() or (last and kind[-1] == _CONTINUATION):
        at = int(cut.argmax()) + 1 if cut.any() else len(kind)
        raise _where(text, start + at, "a VLQ ends without its last digit")
    empty = (comma[1:] & separator[:-1]) | (comma[:-1] & separator[1:])
    # The chunk's first byte follows a separator: a comma there is an empty segment, and
    # so is a separator after a comma.
    first = comma[0] or (start > 0 and separator[0] and text[start - 1] == _COMMA)
    if first or empty.any() or (last and comma[-1]):
        at = 0 if first else int(empty.argmax()) + 1 if empty.any() else len(kind)
        raise _where(text, start + at, "an empty segment")


def _unsigned(kind: _Bytes, text: _Bytes, terminals: _Ints) -> _Ints:
    """Each VLQ's unsigned value, from its terminal digit back to its first (the most
    significant first): once shortened a VLQ has at most 7 digits, and most have one."""
    unsigned = _VALUES[text[terminals]]
    which = np.flatnonzero(kind[terminals - 1] == _CONTINUATION)  # [-1]: never "g" (the end)
    at = terminals[which]
    value = unsigned[which]
    for back in range(1, 7):
        if not len(which):
            break
        value = (value << 5) | _VALUES[text[at - back]]
        unsigned[which] = value
        more = np.flatnonzero(kind[at - back - 1] == _CONTINUATION)
        which, at, value = which[more], at[more], value[more]
    return unsigned


def _running_column(deltas: _Ints, lines: _Ints, state: _State) -> _Ints:
    """Absolute generated columns from their deltas, each line starting from 0 (the first
    line from ``state.column`` if it continues the previous chunk's line)."""
    sums = np.cumsum(deltas)
    starts = np.flatnonzero(np.diff(lines, prepend=-1))
    base = np.concatenate(([0], sums))[starts]
    if lines[0] == state.line:
        base[0] -= state.column
    columns: _Ints = sums - np.repeat(base, np.diff(starts, append=len(deltas)))
    return columns


def _advance(state: _State, line: _Ints, column: _Ints, final_line: int) -> None:
    """Carry what the next chunk and the caller need (lines of mappings never decrease)."""
    last_line = int(line[-1])
    end_column = int(column[line == last_line].max())
    if state.end is not None and state.end[0] == last_line:
        end_column = max(end_column, state.end[1])
    state.end = (last_line, end_column)
    if state.line == 0 and (first := column[line == 0]).size:
        state.first_line_end = max(state.first_line_end, int(first.max()))
    state.column = int(column[-1]) if final_line == last_line else 0
    state.line = final_line
