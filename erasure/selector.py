"""What a deletion selects: a project's rows, narrowed by box, time range and query.

A :class:`Selector` is stored with its job (JSON) and applied wherever a row can be: to
a Parquet file's rows, to the live buffer's chunks, to another node's rows held here. It
selects only rows that existed when the job was made: their ids were given at or before
``upto_id`` (ids begin with the millisecond they were given in, ``core.schema``), so a
box that keeps sending after an erasure request keeps its new rows.

:meth:`Selector.mask` decides row by row, in DuckDB over the Arrow table, with the same
SQL as a search (``query.language``), so ``attr.userId:42`` deletes exactly what a search
for it returns.
"""

from __future__ import annotations

import functools

import duckdb
import msgspec
import numpy as np
import pyarrow as pa

from core.schema import ID_EPOCH_MS, ID_STEP, NODE_BITS, SEQ_BITS
from query.language import compile_query


def id_upto(ms: int) -> int:
    """The highest id any node can have given at or before Unix time ``ms``."""
    counter = ((ms - ID_EPOCH_MS + 1) << SEQ_BITS) - 1
    return (counter << NODE_BITS) | (ID_STEP - 1)


class Selector(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``project``: every row of the project (and what else it owns: a project deletion).
    Else the rows of ``box`` (if set) with ``since_ms <= ts < until_ms`` (each if set)
    matching ``query`` (if set); always only those with ``id <= upto_id``."""

    upto_id: int
    project: bool = False
    box: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    query: str | None = None

    def where(self) -> tuple[str, list[object]]:
        """A DuckDB condition over a row: true for a selected row."""
        terms: list[str] = ["id <= ?"]
        params: list[object] = [self.upto_id]
        if self.project:
            return " AND ".join(terms), params
        if self.box is not None:
            terms.append("box = ?")
            params.append(self.box)
        if self.since_ms is not None:
            terms.append("epoch_ms(ts) >= ?")
            params.append(self.since_ms)
        if self.until_ms is not None:
            terms.append("epoch_ms(ts) < ?")
            params.append(self.until_ms)
        if self.query is not None:
            sql, more = compile_query(self.query)
            terms.append(f"({sql})")
            params.extend(more)
        return " AND ".join(terms), params

    def whole_file(self, box: str, min_ts: int, max_ts: int, max_id: int) -> bool:
        """Whether every row of a file with these bounds is selected (no need to read it)."""
        if max_id > self.upto_id:
            return False
        if self.project:
            return True
        if self.query is not None and compile_query(self.query)[0] != "TRUE":
            return False
        if self.box is not None and box != self.box:
            return False
        return ((self.since_ms is None or min_ts >= self.since_ms)
                and (self.until_ms is None or max_ts < self.until_ms))

    def may_touch(self, box: str, min_ts: int, max_ts: int, min_id: int) -> bool:
        """Whether a file with these bounds may hold a selected row."""
        if min_id > self.upto_id:
            return False
        if self.project:
            return True
        if self.box is not None and box != self.box:
            return False
        return ((self.since_ms is None or max_ts >= self.since_ms)
                and (self.until_ms is None or min_ts < self.until_ms))

    def mask(self, table: pa.Table) -> np.ndarray:
        """One bool per row of ``table`` (SCHEMA's columns): True where selected."""
        if table.num_rows == 0:
            return np.zeros(0, dtype=bool)
        where, params = self.where()
        con = _database().cursor()  # its own, over one in-memory database: any thread
        try:
            con.register("t", table)
            got = con.sql(f"SELECT coalesce(({where}), FALSE) AS s FROM t",
                          params=params).fetchnumpy()["s"]
        finally:
            con.close()
        out = np.asarray(got, dtype=bool)
        if len(out) != table.num_rows:
            raise RuntimeError(f"a selection of {table.num_rows} rows gave {len(out)} answers")
        return out


@functools.cache
def _database() -> duckdb.DuckDBPyConnection:
    return duckdb.connect(config={"autoinstall_known_extensions": False,
                                  "autoload_known_extensions": False})


def keep(table: pa.Table, selectors: list[Selector]) -> tuple[pa.Table, int]:
    """``table`` without the rows any of ``selectors`` selects, and how many those were."""
    if not selectors or table.num_rows == 0:
        return table, 0
    selected = np.zeros(table.num_rows, dtype=bool)
    for selector in selectors:
        selected |= selector.mask(table)
    removed = int(selected.sum())
    if not removed:
        return table, 0
    return table.filter(pa.array(~selected)), removed
