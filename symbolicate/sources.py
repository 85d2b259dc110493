"""A map's original sources (``sourcesContent``), kept beside ``symbolic`` rather than in it.

``symbolic``'s ``SourceMapCache`` finds a position in logarithmic time, but when the map
carries ``sourcesContent`` each lookup also costs time in proportion to the size of the
original file it lands in (measured on three.js in a 5.9 MB map: 2 us a lookup without
``sourcesContent``, 50 us on average and up to 0.9 ms with it, whatever ``context_lines``).
So the cache is built from the map without ``sourcesContent`` (:func:`strip`), and context
lines come from :class:`OriginalSources`: each source's JSON string is decoded and split
once, when a frame first lands in it, with the same line rules ``symbolic`` applies, so
answers are unchanged:

- the cache's lines end at ``\\n`` only (``\\r`` stays in the line);
- ``SourceMapView``'s source views end lines at ``\\r\\n``, ``\\r`` or ``\\n``.

Context lines are found by the source name the lookup returns, so a map is only stripped when
those names are plain: no ``sourceRoot`` (``symbolic`` joins it to the names) and no name
given twice (an index map's sections are flattened by name). Anything else, or a map
``msgspec`` cannot read as JSON, goes to ``symbolic`` whole, as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

import msgspec

_Object = dict[str, msgspec.Raw]
_object = msgspec.json.Decoder(_Object)
_sections = msgspec.json.Decoder(list[_Object])
_names = msgspec.json.Decoder(list[str | None])
_contents = msgspec.json.Decoder(list[msgspec.Raw])
_root = msgspec.json.Decoder(str | None)
_text = msgspec.json.Decoder(str | None)
_encode = msgspec.json.Encoder().encode
_VIEW_LINES = re.compile(r"\r\n|\r|\n")


class Lines(NamedTuple):
    lines: list[str]  # without their line ends
    blank_end: bool  # the text ends with "\n" (or is empty): the cache has no line after it


class OriginalSources:
    """Original sources by name, as JSON strings until a lookup needs their lines."""

    def __init__(self, raw: dict[str, msgspec.Raw | None]) -> None:
        self._raw = raw
        self._lines: dict[str, Lines | None] = {}
        self._view_lines: dict[str, Lines | None] = {}
        self.raw_bytes = sum(len(r) for r in raw.values() if r is not None)

    def _text(self, name: str) -> str | None:
        raw = self._raw.get(name)
        try:
            return None if raw is None else _text.decode(raw)
        except msgspec.DecodeError:  # not a string: uploads refuse such maps
            return None

    def texts(self) -> Iterator[tuple[str, str | None]]:
        """(name, content) of every source, in the map's order."""
        for name in self._raw:
            yield name, self._text(name)

    def lines(self, name: str) -> Lines | None:
        """The source's lines as ``SourceMapCache`` numbers them (lines end at ``\\n``), or
        None without content."""
        try:
            return self._lines[name]
        except KeyError:
            return self._split(name)[0]

    def view_lines(self, name: str) -> Lines | None:
        """The source's lines as ``SourceMapView.get_sourceview`` gives them (lines end at
        ``\\r\\n``, ``\\r`` or ``\\n``)."""
        try:
            return self._view_lines[name]
        except KeyError:
            return self._split(name)[1]

    def split_all(self) -> None:
        for name in self._raw:
            if name not in self._lines:
                self._split(name)

    def _split(self, name: str) -> tuple[Lines | None, Lines | None]:
        text = self._text(name)
        lines = view = None
        if text is not None:
            split = text.split("\n")  # 6x faster than a regex on a 1.6 MB source
            if "\r" in text:  # trim() drops the "\r"s before a "\n"; the view splits at "\r"
                lines = Lines([line.rstrip("\r") for line in split], text.endswith("\n"))
                view = Lines(_VIEW_LINES.split(text), False)
            else:
                lines = Lines(split, text.endswith("\n") or not text)
                view = Lines(split, False)
        # Threads may race here: both compute the same lines, dict writes are atomic.
        self._view_lines[name] = view
        self._lines[name] = lines
        return lines, view


class Stripped(NamedTuple):
    map: bytes  # the map without sourcesContent
    sources: OriginalSources


class _Ambiguous(Exception):
    """Source names that do not map one to one to contents: keep the map whole."""


def strip(source_map: bytes) -> Stripped | None:
    """``source_map`` without ``sourcesContent`` and the contents by source name; None when
    the map must go to ``symbolic`` whole (see the module's docstring)."""
    raw: dict[str, msgspec.Raw | None] = {}
    try:
        top = _strip_one(_object.decode(source_map), raw)
        if "sections" in top:
            sections = _sections.decode(top["sections"])
            for section in sections:
                if "map" in section:
                    inner = _object.decode(section["map"])
                    if "sections" in inner:
                        raise _Ambiguous  # nested index maps: invalid, let symbolic say so
                    section["map"] = msgspec.Raw(_encode(_strip_one(inner, raw)))
            top["sections"] = msgspec.Raw(_encode(sections))
    except (msgspec.DecodeError, RecursionError, _Ambiguous):
        return None
    return Stripped(_encode(top), OriginalSources(raw))


def _strip_one(obj: _Object, raw: dict[str, msgspec.Raw | None]) -> _Object:
    """``obj`` (a map, or an index map's top level) without its sourcesContent, which goes
    into ``raw`` by source name."""
    if "sourceRoot" in obj and _root.decode(obj["sourceRoot"]):
        raise _Ambiguous
    contents = _contents.decode(obj.pop("sourcesContent")) if "sourcesContent" in obj else []
    names = _names.decode(obj["sources"]) if "sources" in obj else []
    for index, name in enumerate(names):
        if not name:
            continue  # symbolic reports no file for an empty name
        if name in raw:
            raise _Ambiguous
        content = contents[index] if index < len(contents) else None
        raw[name] = None if content is None or bytes(content) == b"null" else content
    return obj
