"""Where a request comes from: the box id in its Origin, and whether the origin is allowed."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

BOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def box_pattern(pattern: str) -> re.Pattern[str]:
    """``{box}.box.example.com`` -> a regex whose group 1 is the box id."""
    before, _, after = pattern.lower().partition("{box}")
    return re.compile(re.escape(before) + r"([a-z0-9][a-z0-9-]{0,62})" + re.escape(after))


def origin_host(origin: str) -> str | None:
    try:
        return urlsplit(origin).hostname
    except ValueError:
        return None


def box_from_origin(origin: str | None, pattern: re.Pattern[str]) -> str | None:
    if not origin:
        return None
    host = origin_host(origin)
    match = pattern.fullmatch(host) if host else None
    return match.group(1) if match else None


def origin_allowed(origin: str | None, allowed: list[str]) -> bool:
    """An empty list allows any origin; so does a request without Origin (not a browser)."""
    if not allowed or not origin:
        return True
    origin = origin.lower().rstrip("/")
    for entry in allowed:
        if entry == "*" or entry == origin:
            return True
        scheme, sep, host = entry.partition("://*.")
        if sep and origin.startswith(scheme + "://"):
            rest = origin[len(scheme) + 3 :]
            if rest.endswith("." + host) and len(rest) > len(host) + 1:
                return True
    return False
