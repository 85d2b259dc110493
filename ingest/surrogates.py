"""Lone UTF-16 surrogate escapes in JSON, repaired instead of costing the whole body.

``JSON.stringify`` writes half an emoji (a string cut by page code) as ``"\\ud83d"``;
msgspec, rightly, refuses such a document. Since one bad string must not cost every
event of a batch, a body refused for that reason has each lone surrogate escape
replaced by ``\\ufffd`` (the replacement character, as a UTF-8 decoder would do) and
is decoded again.
"""

from __future__ import annotations

import re

# A run of backslashes then u + a D-block code unit. An odd run is an escape; an even
# run is escaped backslashes followed by the letter u.
_ESCAPE = re.compile(rb"(\\+)u([dD][0-9a-fA-F]{3})")


def _unit(match: re.Match[bytes] | None) -> int:
    if match is None or len(match.group(1)) % 2 == 0:
        return -1
    return int(match.group(2), 16)


def repair(raw: bytes) -> bytes:
    matches = list(_ESCAPE.finditer(raw))
    out: list[bytes] = []
    last = 0
    for i, match in enumerate(matches):
        unit = _unit(match)
        if unit < 0xD800:
            continue
        prev = matches[i - 1] if i and matches[i - 1].end() == match.start() else None
        nxt = matches[i + 1] if i + 1 < len(matches) and matches[i + 1].start() == match.end() \
            else None
        if unit <= 0xDBFF and 0xDC00 <= _unit(nxt) <= 0xDFFF:
            continue  # a high surrogate with its low one
        if unit >= 0xDC00 and 0xD800 <= _unit(prev) <= 0xDBFF:
            continue  # the low half of a pair
        start = match.start(2) - 1  # the 'u'
        out += [raw[last:start], b"ufffd"]
        last = match.end()
    if not out:
        return raw
    out.append(raw[last:])
    return b"".join(out)
