"""``GET /v1/projects/{project}/histogram``: matching rows counted per time bucket and level.

The width is the narrowest of a ladder of round durations that fits the window in the
buckets asked for; buckets start at multiples of it since the epoch (UTC), so the same
minute is the same bucket in every answer. DuckDB counts (``QueryEngine.histogram``, the
same plan and filters as a search); here the few hundred counts become the answer, every
bucket present, oldest first.
"""

from __future__ import annotations

import msgspec

from core.errors import InvalidParameter
from query.rows import iso_ms

MAX_BUCKETS = 500
_DAY_S = 86_400
_YEAR_S = 365 * _DAY_S
# Bucket widths in seconds. Past a week: months, quarters, years, then 1-2-5 steps of
# years up to one bucket for every time a query can name (1970 to 9999).
LADDER_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10_800, 21_600,
            43_200, _DAY_S, 7 * _DAY_S, 30 * _DAY_S, 90 * _DAY_S,
            *(years * _YEAR_S for years in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000,
                                            5000, 10_000)))


class HistogramBucket(msgspec.Struct, frozen=True, kw_only=True):
    ts: str  # the bucket's start
    counts: dict[str, int]  # rows per level, the levels with rows only


class Histogram(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    from_: str  # the window asked for, [from, to)
    to: str
    bucket_seconds: int
    total: int
    # Every bucket from the one holding ``from`` to the one holding the window's last ms.
    buckets: list[HistogramBucket]


def check_buckets(value: int) -> int:
    if not 1 <= value <= MAX_BUCKETS:
        raise InvalidParameter(f"buckets must be 1..{MAX_BUCKETS}, got {value}",
                               detail={"parameter": "buckets"})
    return value


def bucket_width_ms(since_ms: int, until_ms: int, buckets: int) -> int:
    """The narrowest width of the ladder giving at most ``buckets`` aligned buckets over
    ``[since_ms, until_ms)``."""
    for seconds in LADDER_S:
        width = seconds * 1000
        if (until_ms - 1) // width - since_ms // width < buckets:
            return width
    return LADDER_S[-1] * 1000  # a window within 1970..9999 fits the last rung in one


def histogram(since_ms: int, until_ms: int, width_ms: int,
              counts: list[tuple[object, ...]]) -> Histogram:
    """The answer from DuckDB's ``(bucket number, level, count)`` rows."""
    first = since_ms // width_ms
    by_bucket: list[dict[str, int]] = [{} for _ in range((until_ms - 1) // width_ms - first + 1)]
    total = 0
    for number, level, count in counts:
        by_bucket[int(number) - first][str(level)] = int(count)  # type: ignore[call-overload]
        total += int(count)  # type: ignore[call-overload]
    return Histogram(from_=iso_ms(since_ms), to=iso_ms(until_ms),
                     bucket_seconds=width_ms // 1000, total=total,
                     buckets=[HistogramBucket(ts=iso_ms((first + i) * width_ms), counts=c)
                              for i, c in enumerate(by_bucket)])
