"""``since`` and ``until``: a duration back from now (``30s``, ``10m``, ``2h``, ``7d``, ``1w``)
or an ISO-8601 time (``2026-11-29``, ``2026-11-29T10:00:00Z``, ``...T10:00:00.123+02:00``).

:data:`TIME_PATTERN` is the one definition of the forms: :func:`parse_time` refuses what it
does not match, and the OpenAPI schema states it (``query.routes``), so a client generated
from the schema sends no time the server refuses. It is a regular expression in the subset
Python and ECMA-262 (JSON Schema's dialect) read alike, and it admits only real calendar
dates: ``datetime.fromisoformat`` never fails on what it matches.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from core.errors import InvalidParameter

_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
# [0-9], not \d: Python's \d takes any Unicode digit ("٣m"), ECMA's only ASCII ones.
DURATION = "[0-9]{1,9}[smhdw]"
_YEAR = "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"  # 0001-9999
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = ("(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
              "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))")
_DATE = f"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_CLOCK = "T(?:[01][0-9]|2[0-3]):[0-5][0-9](?::[0-5][0-9](?:[.][0-9]{1,9})?)?"
_OFFSET = "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"  # no offset: UTC
ISO_8601 = f"{_DATE}(?:{_CLOCK}{_OFFSET}?)?"
TIME_PATTERN = f"^(?:{DURATION}|{ISO_8601})$"
_DURATION = re.compile(DURATION)
_ISO_8601 = re.compile(ISO_8601)
# The times a query can name: a window reaching past either end means "from the start"
# or "nothing yet", not an error (and never a time DuckDB or datetime cannot hold).
MIN_MS = 0
MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


def parse_since(text: str, now_ms: int) -> int:
    """Epoch milliseconds of the oldest row wanted, within ``MIN_MS..MAX_MS - 1``: a
    window ``[since, until)`` ends at ``MAX_MS`` at the latest, the last time there is."""
    return min(parse_time(text, now_ms, "since"), MAX_MS - 1)


def parse_until(text: str, now_ms: int, since_ms: int) -> int:
    """Epoch milliseconds the rows wanted are older than: after ``since_ms``."""
    until_ms = parse_time(text, now_ms, "until")
    if until_ms <= since_ms:
        raise InvalidParameter(
            f"until={text[:40]!r} is not after since: the window [since, until) "
            "would be empty", detail={"parameter": "until"})
    return until_ms


def parse_time(text: str, now_ms: int, parameter: str) -> int:
    """Epoch milliseconds of a time given as ``parameter``, within ``MIN_MS..MAX_MS``."""
    if _DURATION.fullmatch(text):
        return clamp_ms(now_ms - int(text[:-1]) * _UNITS_MS[text[-1]])
    if not _ISO_8601.fullmatch(text):
        raise InvalidParameter(
            f"{parameter}={text[:40]!r} is neither a duration (30s, 10m, 2h, 7d, 1w) nor an "
            "ISO-8601 time (2026-11-29T10:00:00Z)", detail={"parameter": parameter})
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        return clamp_ms(int(moment.timestamp() * 1000))
    except (OverflowError, ValueError):  # year 1 or 9999 with an offset past the range
        return MIN_MS if moment.year < 1000 else MAX_MS


def clamp_ms(ms: int) -> int:
    return min(max(ms, MIN_MS), MAX_MS)
