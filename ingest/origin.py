"""Where a request comes from: the box id in its Origin, and whether the origin is allowed.

Both read the parsed Origin (``core.origins``), never its text.
"""

from __future__ import annotations

import re
from functools import lru_cache

from core.origins import ANY, Origin, parse_entry, parse_origin

BOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def box_pattern(pattern: str) -> re.Pattern[str]:
    """``{box}.box.example.com`` -> a regex whose group 1 is the box id."""
    before, _, after = pattern.lower().partition("{box}")
    return re.compile(re.escape(before) + r"([a-z0-9][a-z0-9-]{0,62})" + re.escape(after))


# Every ingest request with an Origin reads these; a page sends the same few over and over.
# The caches are bounded, so a client cycling through made-up origins only costs parses.
_origin = lru_cache(maxsize=4096)(parse_origin)
_entry = lru_cache(maxsize=4096)(parse_entry)


def box_from_origin(origin: str | None, pattern: re.Pattern[str]) -> str | None:
    parsed = _origin(origin) if origin else None
    match = pattern.fullmatch(parsed.host) if parsed else None
    return match.group(1) if match else None


def origin_allowed(origin: str | None, allowed: list[str]) -> bool:
    """An empty list allows any origin; so does a request without Origin (not a browser)."""
    if not allowed or not origin:
        return True
    if ANY in allowed:
        return True
    parsed = _origin(origin)
    return parsed is not None and any(_matches(entry, parsed) for entry in allowed)


def _matches(entry: str, origin: Origin) -> bool:
    rule = _entry(entry)  # None for an entry stored before entries were parsed at creation
    return rule is not None and rule.matches(origin)
