"""Frames as the API returns them, and the rewritten stack text.

A :class:`FrameOut` is a parsed frame, rewritten to its original location where a source
map answered (``symbolicated``), or kept as printed with a ``problem`` naming why not. The
rewritten ``stack`` reads like a V8 stack of original locations, whatever engine printed
the raw one, so a reader (or an agent) sees one format.
"""

from __future__ import annotations

from typing import Literal, get_args

import msgspec

from symbolicate.stack import Frame

# Why a frame stays minified (``symbolicated`` false), or what a rewritten one lacks (the
# last three): the one list, the ``problem`` of a frame and the label of
# ``boxtrail_symbolication_frames_total``. ``symbolicate.lookup`` says when each is given,
# docs/sdk.md what to do about it.
Problem = Literal[
    "missing_sourcemap", "url_mismatch", "malformed_sourcemap", "no_mapping",
    "release_mismatch", "no_original_source", "invalid_location", "no_location",
    "missing_column", "sourcemap_unavailable", "internal_error",
    "missing_source_name", "missing_sources_content", "missing_minified_source",
]
PROBLEMS: tuple[str, ...] = get_args(Problem)

CONTEXT_LINES = 5
MAX_CONTEXT_CHARS = 140  # a context line longer than this is cut around the column
_CUT = "\u2026"


class FrameOut(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    function: str | None
    file: str | None
    line: int | None
    column: int | None
    context_line: str | None = None
    pre_context: list[str] = []
    post_context: list[str] = []
    raw: str
    symbolicated: bool = False
    problem: Problem | None = None
    # Where ``function`` came from: "source" (the original source's enclosing function at
    # the original position; None there means an anonymous function or top-level code);
    # where the map's segment is coarse (it covers functions starting later on the line,
    # ``symbolicate.scopes.SourceScopes.name_for``), one of those, picked by the printed
    # frame: "printed_key" (the engine printed its property key) or "span" (what the print
    # says otherwise: no name, async, top-level); "minified" (the minified code's scopes:
    # the map has no original source here, or it is too large to parse), "printed" (as the
    # engine printed it); None: no name at all.
    function_source: str | None = None


def unsymbolicated(frame: Frame, problem: Problem | None) -> FrameOut:
    """``frame`` as printed; built-in frames never have a problem (there is no file)."""
    return FrameOut(function=frame.function, file=frame.url, line=frame.line,
                    column=frame.column, raw=frame.raw,
                    problem=None if frame.native else problem,
                    function_source="printed" if frame.function else None)


def trim(line: str, column: int | None) -> str:
    """``line`` without its newline, cut to :data:`MAX_CONTEXT_CHARS` around ``column``
    (1-based) so a minified-looking source line still shows the spot."""
    line = line.rstrip("\r\n")
    return line if len(line) <= MAX_CONTEXT_CHARS else cut(line, column)


def cut(line: str, column: int | None) -> str:
    """``line`` (longer than :data:`MAX_CONTEXT_CHARS`) cut to that around ``column``."""
    center = max((column or 1) - 1, 0)
    start = max(0, min(center - MAX_CONTEXT_CHARS // 2, len(line) - MAX_CONTEXT_CHARS))
    end = start + MAX_CONTEXT_CHARS
    return (_CUT if start else "") + line[start:end] + (_CUT if end < len(line) else "")


def _location(frame: Frame) -> str:
    if frame.native:
        return "native" if frame.raw.endswith("[native code]") else "<anonymous>"
    parts = [frame.url or "<anonymous>"]
    if frame.line is not None:
        parts.append(str(frame.line))
        if frame.column is not None:
            parts.append(str(frame.column))
    return ":".join(parts)


def stack_text(message: str | None, frames: list[Frame], out: list[FrameOut],
               omitted: int) -> str:
    """V8-style text: the message line, then ``    at fn (file:line:column)`` per frame."""
    lines = [message] if message else []
    for frame, rewritten in zip(frames, out, strict=True):
        if rewritten.symbolicated:
            name = rewritten.function
            # A source the map leaves unnamed (null): the position, without a file.
            location = f"{rewritten.file or '<unknown>'}:{rewritten.line}:{rewritten.column}"
        else:
            name = frame.function
            if name and frame.alias:
                name = f"{name} [as {frame.alias}]"
            location = _location(frame)
        prefix = ("async " if frame.is_async else "") + ("new " if frame.is_constructor else "")
        if frame.eval and not rewritten.symbolicated:
            location = f"eval at {location}"
        lines.append(f"    at {prefix}{name} ({location})" if name
                     else f"    at {prefix}{location}")
    if omitted:
        lines.append(f"    ... {omitted} more frames")
    return "\n".join(lines)
