"""The kinds of usage are one list (``core.usage.KINDS``), each with its unit, and
docs/usage.md's table is that list: a kind added without a row fails here."""

from __future__ import annotations

import re
from pathlib import Path

from core.usage import KINDS, UNITS

DOC = Path(__file__).resolve().parents[2] / "docs" / "usage.md"


def test_every_kind_is_documented_with_its_unit() -> None:
    table = DOC.read_text().split("| kind | unit | what |")[1].split("\n\n")[0]
    rows = dict(re.findall(r"^\| `([a-z_.]+)` \| ([a-z_]+) \|", table, re.M))
    assert rows == {kind: UNITS[kind] for kind in KINDS}
