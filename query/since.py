"""``since`` and ``until``: a duration back from now (``30s``, ``10m``, ``2h``, ``7d``, ``1w``)
or ISO-8601."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from boxtrail.errors import InvalidParameter

_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION = re.compile(r"(\d{1,9})([smhdw])")
# The times a query can name: a window reaching past either end means "from the start"
# or "nothing yet", not an error (and never a time DuckDB or datetime cannot hold).
MIN_MS = 0
MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


def parse_since(text: str, now_ms: int) -> int:
    """Epoch milliseconds of the oldest row wanted, within ``MIN_MS..MAX_MS``."""
    return parse_time(text, now_ms, "since")


def parse_until(text: str, now_ms: int, since_ms: int) -> int:
    """Epoch milliseconds the rows wanted are older than: after ``since_ms``."""
    until_ms = parse_time(text, now_ms, "until")
    if until_ms <= since_ms:
        raise InvalidParameter(
            f"until={text.strip()[:40]!r} is not after since: the window [since, until) "
            "would be empty", detail={"parameter": "until"})
    return until_ms


def parse_time(text: str, now_ms: int, parameter: str) -> int:
    """Epoch milliseconds of a time given as ``parameter``, within ``MIN_MS..MAX_MS``."""
    text = text.strip()
    if match := _DURATION.fullmatch(text):
        return clamp_ms(now_ms - int(match.group(1)) * _UNITS_MS[match.group(2)])
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidParameter(
            f"{parameter}={text[:40]!r} is neither a duration (30s, 10m, 2h, 7d, 1w) nor an "
            "ISO-8601 time (2026-11-29T10:00:00Z)", detail={"parameter": parameter}) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        return clamp_ms(int(moment.timestamp() * 1000))
    except (OverflowError, ValueError):  # year 1 or 9999 with an offset past the range
        return MIN_MS if moment.year < 1000 else MAX_MS


def clamp_ms(ms: int) -> int:
    return min(max(ms, MIN_MS), MAX_MS)
