"""``error.stack`` text as JavaScript engines print it -> frames, innermost first.

One entry point, :func:`parse_stack`, for the three engines browsers run:

- V8 (Chromium, Node): a message line (``TypeError: x is undefined``, possibly several lines),
  then ``    at fn (url:line:col)``, ``at url:line:col``, ``at async fn (...)``,
  ``at new Foo (...)``, ``at Object.i [as name] (...)``, ``at Array.map (<anonymous>)``,
  ``at async Promise.all (index 0)`` and eval frames
  ``at fn (eval at f (url:line:col), <anonymous>:line:col)``.
- SpiderMonkey (Firefox): no message line; ``fn@url:line:col``, ``@url:line:col``,
  ``async*fn@...`` (any ``cause*`` prefix marks an async boundary) and eval code as
  ``fn@url line 9 > eval:1:25`` or ``anonymous@url line 10 > Function:1:8``.
- JavaScriptCore (Safari): ``fn@url:line:col``, ``global code@...``, ``module code@...``,
  ``[native code]``, ``fn@[native code]``, anonymous functions as a bare ``url:line:col``,
  and eval / ``new Function`` code without any location (``eval code``, ``anonymous@``).

Eval frames: what is printed for code run by ``eval`` or ``new Function`` is a position in
a string that no uploaded file contains, so a :class:`Frame` with ``eval=True`` carries the
*outer* location instead: the line of the script that called eval, which a source map can
map. V8 gives that line's column too; SpiderMonkey gives only the line (``column=None``);
JavaScriptCore gives nothing (``url=None``). Code named by ``//# sourceURL=`` (webpack's
``eval`` devtool) is printed by V8 as an ordinary location and parsed as one.

Numbers are kept as printed (1-based). ``function`` is the name as printed, minus V8's
``async ``/``new `` prefixes and ``[as alias]`` suffix, which become fields. The engine is a
guess from the shapes seen: ``fn@url`` frames with no JavaScriptCore-only marker are
called SpiderMonkey.

Safety: stacks come from the internet. Parsing uses only string searches that move in one
direction (``rfind`` steps that never rescan, no backtracking regex), so its time is linear
in the input. Each line is cut to :data:`MAX_LINE_CHARS` before it is read (the start and
the end are kept: the name is at one end and the line:column at the other), long ``data:``
URLs are abbreviated, and at most :data:`MAX_FRAMES` frames are kept - the innermost, where
the error happened - with the rest counted in ``omitted_frames``. Nothing raises: a line
that is not a frame is part of the message (before the first frame) or skipped (after it).
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

Engine = Literal["v8", "spidermonkey", "jsc", "unknown"]

MAX_LINE_CHARS = 4096
MAX_FRAMES = 250
MAX_MESSAGE_CHARS = 4096
MAX_DATA_URL_CHARS = 128  # a data: URL is the whole script: its start says enough

CUT = "\u2026"  # marks where a line, URL or message was shortened
_HEAD_CHARS = 1024  # of a cut line, kept from its start (the rest is kept from its end)
_MAX_EVAL_DEPTH = 8  # "eval at f (eval at g (...))" levels followed to the outer script
_MAX_DIGITS = 9  # longer "numbers" are not positions (and int() of 5000 digits raises)
_JSC_LABELS = frozenset(("global code", "module code", "eval code"))
_V8_NATIVE = frozenset(("<anonymous>", "native", "native code"))
# A URL scheme (RFC 3986) and its colon. Anchored (used with match at a position) and
# bounded to 32 characters, so a failed attempt costs O(32) whatever follows.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]{0,30}:")


class Frame(msgspec.Struct, frozen=True, kw_only=True, gc=False):  # no cycles: str/int/bool
    raw: str  # the line as printed, stripped, cut to MAX_LINE_CHARS
    function: str | None = None
    alias: str | None = None  # V8 "Object.i [as name]" -> function "Object.i", alias "name"
    url: str | None = None
    line: int | None = None
    column: int | None = None
    is_async: bool = False  # V8 "at async fn", SpiderMonkey "async*fn" / "cause*fn"
    is_constructor: bool = False  # V8 "at new Foo"
    native: bool = False  # built-in code: no file to map
    eval: bool = False  # eval / new Function code; url/line/column are the caller's


class ParsedStack(msgspec.Struct, frozen=True, kw_only=True):
    engine: Engine
    message: str | None  # lines before the first frame (V8's "Type: message"), else None
    frames: list[Frame]  # innermost first, in the order the engine printed them
    omitted_frames: int = 0  # frames after the first MAX_FRAMES, dropped


def parse_stack(text: str) -> ParsedStack:
    v8: list[Frame] = []
    other: list[Frame] = []  # SpiderMonkey / JavaScriptCore "fn@url" frames
    v8_total = other_total = jsc_votes = sm_votes = 0
    v8_start = other_start = -1  # character offset of the first frame of each kind
    offset = 0
    for original in text.split("\n"):
        start, offset = offset, offset + len(original) + 1
        line = cut_line(original.strip())
        if not line:
            continue
        frame = _v8_frame(line) if line.startswith("at ") else None
        if frame is not None:
            v8_total += 1
            v8_start = start if v8_start < 0 else v8_start
            if len(v8) < MAX_FRAMES:
                v8.append(frame)
            continue
        parsed = _at_frame(line)
        if parsed is not None:
            frame, vote = parsed
            jsc_votes += vote == "jsc"
            sm_votes += vote == "spidermonkey"
            other_total += 1
            other_start = start if other_start < 0 else other_start
            if len(other) < MAX_FRAMES:
                other.append(frame)
    # A V8 stack wins over "fn@url"-looking lines: in one, those are message text or noise.
    engine: Engine
    if v8_total:
        engine, frames, total, first = "v8", v8, v8_total, v8_start
    elif other_total:
        engine = "jsc" if jsc_votes > sm_votes else "spidermonkey"
        frames, total, first = other, other_total, other_start
    else:
        engine, frames, total, first = "unknown", [], 0, len(text)
    return ParsedStack(engine=engine, message=_message(text[:first]), frames=frames,
                       omitted_frames=total - len(frames))


# --- shared pieces -------------------------------------------------------------------------


def cut_line(line: str) -> str:
    """``line`` cut to MAX_LINE_CHARS, its start and end kept (the name is at one end and
    the line:column at the other)."""
    if len(line) <= MAX_LINE_CHARS:
        return line
    return line[:_HEAD_CHARS] + CUT + line[len(line) - (MAX_LINE_CHARS - _HEAD_CHARS - 1):]


def _message(text: str) -> str | None:
    text = text.strip().replace("\r\n", "\n")
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 1] + CUT
    return text or None


def _number(text: str) -> int | None:
    # isdigit() alone accepts "²" and other non-ASCII digits.
    if 0 < len(text) <= _MAX_DIGITS and text.isascii() and text.isdigit():
        return int(text)
    return None


def _position(location: str) -> tuple[str, int | None, int | None]:
    """``url:line:col`` or ``url:line`` -> its parts, from the right, so that colons in
    the URL (scheme, port, ``page@2.0:chunk.js``) stay in it. Else all of it is the URL."""
    head, sep, last = location.rpartition(":")
    last_number = _number(last) if sep else None
    if last_number is None:
        return location, None, None
    url, sep, middle = head.rpartition(":")
    line = _number(middle) if sep else None
    if line is None:  # "url:line" (old engines print no column)
        return head, last_number, None
    return url, line, last_number


def _url(text: str) -> str | None:
    if not text or text == "<anonymous>":
        return None
    if text.startswith("data:") and len(text) > MAX_DATA_URL_CHARS:
        return text[: MAX_DATA_URL_CHARS - 1] + CUT
    return text


def _matching_open(text: str) -> int:
    """Index of the ``(`` that closes with ``text``'s final ``)``, or -1.

    Walks leftwards from paren to paren. The nearest ``(`` and ``)`` to the left are both
    remembered and only the one consumed is searched again, so no character is scanned
    twice (searching both each step would be quadratic on ``(`` + ``)`` * n)."""
    depth = 0
    opening = text.rfind("(")
    closing = text.rfind(")")
    while True:
        if closing > opening:
            depth += 1
            closing = text.rfind(")", 0, closing)
        elif opening >= 0:
            depth -= 1
            if depth == 0:
                return opening
            opening = text.rfind("(", 0, opening)
        else:
            return -1


# --- V8 ----------------------------------------------------------------------------------


def _v8_frame(line: str) -> Frame | None:
    """``at NAME (LOCATION)`` or ``at LOCATION``; None if the line is not a frame."""
    body = line[3:].strip()
    name: str | None = None
    location = body
    if body.endswith(")"):
        # From the right: URLs hold "(group)", names hold "fn.(anonymous function)".
        opening = _matching_open(body)
        if opening < 0:  # unbalanced, e.g. a ")" in the URL: V8 writes " (" before it
            opening = body.find(" (") + 1
        if opening > 0:
            name, location = body[:opening].rstrip(), body[opening + 1 : -1]
    is_async = is_constructor = False
    alias = None
    if name is None:
        if body.startswith("async "):
            is_async, location = True, body[len("async ") :]
    else:
        if name.startswith("async "):
            is_async, name = True, name[len("async ") :]
        if name.startswith("new "):
            is_constructor, name = True, name[len("new ") :]
        if name.endswith("]") and (cut := name.rfind(" [as ")) >= 0:
            name, alias = name[:cut], name[cut + len(" [as ") : -1]
    url: str = ""
    line_no = column = None
    native = is_eval = False
    if location.startswith("eval at "):
        is_eval = True
        url, line_no, column = _v8_eval_origin(location)
    # "(<anonymous>)" / "(native)": built-ins; "(index 0)": Promise.all's element
    elif location in _V8_NATIVE or location.startswith("index "):
        native = True
    else:
        url, line_no, column = _position(location)
        # A bare "at something" must look like a place, or it is prose in a message.
        if name is None and line_no is None and "://" not in location:
            return None
    return Frame(raw=line, function=name or None, alias=alias, url=_url(url), line=line_no,
                 column=column, is_async=is_async, is_constructor=is_constructor,
                 native=native, eval=is_eval)


def _v8_eval_origin(location: str) -> tuple[str, int | None, int | None]:
    """``eval at f (ORIGIN), <anonymous>:l:c`` -> the position in ORIGIN, where ORIGIN is
    ``url:line:col`` or, for eval inside eval, ``eval at g (ORIGIN)`` again."""
    text = location
    for _ in range(_MAX_EVAL_DEPTH):
        if not text.startswith("eval at "):
            url, line, column = _position(text)
            return (url, line, column) if line is not None else ("", None, None)
        tail = text.rfind("), ")  # ", <anonymous>:l:c" (or a //# sourceURL name) ends it
        if tail >= 0:
            text = text[: tail + 1]
        opening = _matching_open(text) if text.endswith(")") else -1
        if opening < 0:
            break
        text = text[opening + 1 : -1]
    return "", None, None


# --- SpiderMonkey and JavaScriptCore -------------------------------------------------------

_Vote = Literal["spidermonkey", "jsc"] | None


def _at_frame(line: str) -> tuple[Frame, _Vote] | None:
    """``NAME@LOCATION`` (or JavaScriptCore's bare forms) -> a frame and which engine it
    suggests; None if the line is not a frame."""
    if line == "[native code]":
        return Frame(raw=line, native=True), "jsc"
    if line == "eval code":
        return Frame(raw=line, function=line, eval=True), "jsc"
    at = _name_end(line)
    if at < 0 or "://" in line[:at]:  # JavaScriptCore's anonymous function: bare url:l:c
        url, line_no, column = _position(line)
        if line_no is None or " " in line or "\t" in line:
            return None
        return Frame(raw=line, url=_url(url), line=line_no, column=column), "jsc"
    name, location = line[:at], line[at + 1 :]
    vote: _Vote = None
    is_async = False
    star = name.find("*")
    if star >= 0:  # "async*", "promise callback*", "setTimeout handler*": SpiderMonkey
        is_async, name, vote = True, name[star + 1 :], "spidermonkey"
    if name in _JSC_LABELS:
        vote = "jsc"
    elif ": " in name or name.count(" ") > 1:
        return None  # prose such as "Error: cannot reach user@host:8080"
    elif name.endswith("<"):  # "outer/<", "refreshTimeout<": SpiderMonkey's inner functions
        vote = "spidermonkey"
    function = name or None
    if location == "":  # JavaScriptCore's eval code and new Function code: no location
        if not function:
            return None  # a lone "@" says nothing
        return Frame(raw=line, function=function, is_async=is_async,
                     eval=name in ("eval code", "anonymous")), "jsc"
    if location == "[native code]":
        return Frame(raw=line, function=function, is_async=is_async, native=True), "jsc"
    mark = location.find(" line ")
    if mark > 0 and " > " in location[mark:]:
        # "url line 9 > eval:1:25", "url line 3 > eval line 1 > eval:1:1": the outermost
        # "url line N" is the script line that ran the code.
        number = location[mark + len(" line ") :].partition(" ")[0]
        return Frame(raw=line, function=function, is_async=is_async, url=_url(location[:mark]),
                     line=_number(number), eval=True), "spidermonkey"
    url, line_no, column = _position(location)
    if line_no is None:
        return None
    return Frame(raw=line, function=function, is_async=is_async, url=_url(url), line=line_no,
                 column=column), vote


def _name_end(line: str) -> int:
    """Index of the ``@`` between name and location, or -1.

    Both sides may hold ``@``: URLs (``lodash@4.17.21``, ``webpack://@scope``) and names
    (Firefox names webpack modules ``./node_modules/@babel/...``). The separator is the
    first ``@`` followed by something that starts a location: a scheme, a path, JSC's
    ``[native code]``, or nothing; failing that, the first ``@`` (``@filename.js:1:2``)."""
    first = at = line.find("@")
    while at >= 0:
        if _starts_location(line, at + 1):
            return at
        at = line.find("@", at + 1)
    return first


def _starts_location(line: str, start: int) -> bool:
    return (start == len(line) or line.startswith(("/", "[native code]"), start)
            or _SCHEME.match(line, start) is not None)
