"""Row encoding details: timestamps as ISO-8601 UTC with milliseconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from query.rows import iso_ms

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@given(st.integers(946_684_800_000, 7_258_118_400_000))  # 2000 to 2200
def test_iso_ms_is_the_exact_utc_time(ms: int) -> None:
    expected = EPOCH + timedelta(milliseconds=ms)
    assert iso_ms(ms) == expected.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    assert datetime.fromisoformat(iso_ms(ms)) == expected
