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


def test_the_row_is_defined_once() -> None:
    """``core.schema.ROW`` is the row: the API row's fields, the batch's shared and per-event
    fields and the read's columns are the table's, nothing more."""
    import msgspec

    from core.schema import ROW, SHARED, RowBatch
    from query.rows import COLUMNS, ErrorOut, Row

    api = {c.api for c in ROW if c.api}
    top = {f.encode_name for f in msgspec.structs.fields(Row)} - {"error", "problem", "rawAttrs"}
    nested = {f"error.{f.encode_name}" for f in msgspec.structs.fields(ErrorOut)}
    assert api == top | nested
    assert tuple(c.name for c in ROW if c.api) == COLUMNS
    fields = {f.name: f.type for f in msgspec.structs.fields(RowBatch)}
    for column in ROW:
        if column.name == "id":
            continue  # the batch's ids: id_start, id_step
        if column.name == "received":
            assert fields[column.name] is int and column.shared
        elif column.shared:
            assert "list" not in str(fields[column.name]), column.name
        else:
            assert str(fields[column.name]).startswith("list"), column.name
    assert set(SHARED) | {c.name for c in ROW if not c.shared} - {"id"} <= set(fields)
