"""``symbolicate.mappings`` against a literal reading of ECMA-426's DecodeMappings.

The oracle below follows the specification step by step in plain Python (slow, obviously
right), reporting every "optionally report an error" as an error, as uploads do. Hypothesis
feeds both the same strings, cut into chunks of every small size so that chunk edges fall
everywhere.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from symbolicate import mappings
from tests.fixtures.sourcemaps.handmade import B64, vlq

LIMIT = 2**31


class Invalid(Exception):
    pass


def _vlq_value(digits: str) -> int:
    """VLQSignedValue: the unsigned value below 2^32, its lowest bit the sign; "-0" is
    -2^31."""
    unsigned = sum((B64.index(d) & 31) << (5 * k) for k, d in enumerate(digits))
    if unsigned >= 2**32:
        raise Invalid("beyond 32 bits")
    value = unsigned >> 1
    if unsigned & 1:
        return -LIMIT if value == 0 else -value
    return value


def _fields(segment: str) -> list[int]:
    out, digits = [], ""
    for char in segment:
        if char not in B64:
            raise Invalid("not base64")
        digits += char
        if B64.index(char) < 32:  # a terminal digit ends the VLQ
            out.append(_vlq_value(digits))
            digits = ""
    if digits or len(out) not in (1, 4, 5):
        raise Invalid("grammar")
    return out


def oracle(text: str, sources: int, names: int) -> tuple[tuple[int, int] | None, int]:
    """(the greatest generated position, the greatest column on line 0) or Invalid."""
    state = [0, 0, 0, 0]  # source, original line, original column, name
    end: tuple[int, int] | None = None
    first_line_end = -1
    for line, group in enumerate(text.split(";")):
        column = 0
        for segment in group.split(",") if group else []:
            if not segment:
                raise Invalid("empty segment")
            fields = _fields(segment)
            column += fields[0]
            if not 0 <= column < LIMIT:
                raise Invalid("generated column")
            for index, delta in enumerate(fields[1:]):
                state[index] += delta
            if len(fields) > 1 and not (0 <= state[0] < sources and 0 <= state[1] < LIMIT
                                        and 0 <= state[2] < LIMIT):
                raise Invalid("original position")
            if len(fields) == 5 and not 0 <= state[3] < names:
                raise Invalid("name")
            end = max(end or (line, column), (line, column))
            if line == 0:
                first_line_end = max(first_line_end, column)
    return end, first_line_end


def checked(text: str, sources: int, names: int) -> tuple[tuple[int, int] | None, int] | str:
    try:
        extent = mappings.check(text, sources, names)
    except mappings.MappingsError:
        return "invalid"
    return extent.end, extent.first_line_end


def expected(text: str, sources: int, names: int) -> tuple[tuple[int, int] | None, int] | str:
    try:
        return oracle(text, sources, names)
    except Invalid:
        return "invalid"


VALUES = st.one_of(st.integers(-3, 3), st.integers(-(2**33), 2**33),
                   st.sampled_from([LIMIT - 1, -LIMIT, LIMIT, 2**32 - 1, 2**32]))
VLQS = st.builds(vlq, VALUES, st.sampled_from([0, 0, 0, 1, 6, 7, 12]))
SEGMENTS = st.lists(VLQS, min_size=1, max_size=6).map("".join)
WELL_FORMED = st.lists(st.lists(SEGMENTS, max_size=4).map(",".join), max_size=5).map(";".join)
ANY_TEXT = st.text(alphabet="AAAABCDEFgggghiZz/+9,,;;!", max_size=60)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(WELL_FORMED, ANY_TEXT), st.integers(0, 3), st.integers(0, 3))
def test_check_agrees_with_the_specification(text: str, sources: int, names: int) -> None:
    want = expected(text, sources, names)
    with pytest.MonkeyPatch.context() as patch:
        for chunk in (*range(1, 9), mappings.CHUNK):
            patch.setattr(mappings, "CHUNK", chunk)
            assert checked(text, sources, names) == want, (text, chunk)


@pytest.mark.parametrize(("text", "where"), [
    ("AAAA;AAAA,AAAg", "generated line 2, segment 2: a VLQ ends without its last digit"),
    ("AAAA;;AA", "generated line 3, segment 1: a segment of 2 fields (1, 4 or 5 expected)"
     ),
    ("AAAA,C\u00e9AC", "generated line 1, segment 2: '\u00e9' is not a base64 digit"),
    (";;AAAA,DAAA", "generated line 3, segment 2: generated column -1 is out of range"),
])
def test_errors_say_where(text: str, where: str) -> None:
    with pytest.raises(mappings.MappingsError) as raised:
        mappings.check(text, 1, 0)
    assert str(raised.value) == f"mappings: {where}"


@settings(max_examples=100, deadline=None, derandomize=True)
@given(WELL_FORMED)
def test_shorten_keeps_the_meaning(text: str) -> None:
    try:
        short = mappings.shorten(text)
    except mappings.MappingsError:
        assert expected(text, 4, 4) == "invalid"
        return
    assert max((len(run) for run in short.replace(";", ",").split(",")), default=0) <= 35
    for sources, names in ((1, 1), (4, 4)):
        assert expected(short, sources, names) == expected(text, sources, names)


def test_long_runs_are_linear() -> None:
    """Continuation digits with no end, and padding, in runs of every length."""
    for unit in ("g" * 1000 + ",", "A" + "g" * 5000 + "A" + "AA;", "gA" * 5000, "g"):
        small, large = unit * 100, unit * 800
        costs = []
        for text in (small, large):
            start = time.process_time()
            checked(text, 1, 0)
            costs.append(time.process_time() - start)
        assert costs[1] < 30 * max(costs[0], 1e-3), (unit[:10], costs)
