"""SQLite's schema (made by its chain of migrations, ``metadata.db._MIGRATIONS``) and
PostgreSQL's (made whole, ``_PG_SCHEMA``) are two texts kept by hand: here they are
compared as the two databases created them. Every table, its columns in order (type
family, nullability, default), its primary key, unique constraints, foreign keys and
indexes (columns, uniqueness, the partial index's condition) must be the same."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import psycopg

from metadata.sqlite import open_db

Shape = dict[str, dict[str, Any]]

# SQLite's affinity of each PostgreSQL type these schemas use.
_FAMILY = {"text": "text", "integer": "integer", "bigint": "integer",
           "double precision": "real", "real": "real"}


def _default(value: str | None) -> str | None:
    """'1', "''::text" and "''" alike."""
    if value is None:
        return None
    return value.split("::")[0].strip("()")


def _condition(sql: str | None) -> str | None:
    """A partial index's WHERE, as text both databases agree on."""
    if not sql or " WHERE " not in sql.upper():
        return None
    where = re.split(r"\bWHERE\b", sql, flags=re.I)[1]
    where = re.sub(r"::\w+", "", where).replace("(", "").replace(")", "")
    return " ".join(where.lower().split())


def sqlite_shape(path: Path) -> Shape:
    con = sqlite3.connect(path)
    shape: Shape = {}
    tables = [r[0] for r in con.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
    for table in tables:
        columns = [(name, _FAMILY.get(kind.lower(), kind.lower()), bool(notnull) or bool(pk),
                    _default(default))
                   for _, name, kind, notnull, default, pk
                   in con.execute(f"PRAGMA table_info({table})")]
        primary = tuple(name for _, name, *_, pk in sorted(
            con.execute(f"PRAGMA table_info({table})"), key=lambda r: r[5]) if pk)
        foreign = sorted((r[3], r[2], r[4]) for r in con.execute(
            f"PRAGMA foreign_key_list({table})"))
        indexes: dict[str, tuple[tuple[str, ...], bool, str | None]] = {}
        unique: set[tuple[str, ...]] = set()
        for _, name, is_unique, origin, _partial in con.execute(f"PRAGMA index_list({table})"):
            cols = tuple(r[2] for r in con.execute(f"PRAGMA index_info({name})"))
            if origin == "pk":
                continue
            if origin == "u":  # a UNIQUE constraint of the table
                unique.add(cols)
                continue
            sql = con.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)
                              ).fetchone()[0]
            indexes[name] = (cols, bool(is_unique), _condition(sql))
        shape[table] = {"columns": columns, "primary": primary, "unique": unique,
                        "foreign": foreign, "indexes": indexes}
    con.close()
    return shape


def postgres_shape(url: str) -> Shape:
    shape: Shape = {}
    with psycopg.connect(url) as con:
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
            "AND table_name <> 'schema_version'")]
        for table in tables:
            columns = [(name, _FAMILY.get(kind, kind), nullable == "NO", _default(default))
                       for name, kind, nullable, default in con.execute(
                           "SELECT column_name, data_type, is_nullable, column_default "
                           "FROM information_schema.columns WHERE table_name = %s "
                           "ORDER BY ordinal_position", (table,))]
            constraints = con.execute(
                "SELECT c.contype, c.conname, "
                "array(SELECT a.attname FROM unnest(c.conkey) WITH ORDINALITY k(n, i) "
                "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n "
                "ORDER BY k.i), c.confrelid::regclass::text, "
                "array(SELECT a.attname FROM unnest(c.confkey) WITH ORDINALITY k(n, i) "
                "JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n "
                "ORDER BY k.i) "
                "FROM pg_constraint c WHERE c.conrelid = %s::regclass", (table,)).fetchall()
            primary = next((tuple(cols) for kind, _, cols, _, _ in constraints
                            if kind == "p"), ())
            unique = {tuple(cols) for kind, _, cols, _, _ in constraints if kind == "u"}
            foreign = sorted((cols[0], ref, refcols[0])
                             for kind, _, cols, ref, refcols in constraints if kind == "f")
            owned = {name for kind, name, *_ in constraints if kind in ("p", "u")}
            indexes = {}
            for name, unique_index, cols, sql in con.execute(
                    "SELECT i.relname, x.indisunique, "
                    "array(SELECT a.attname FROM unnest(x.indkey) WITH ORDINALITY k(n, o) "
                    "JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.n "
                    "ORDER BY k.o), pg_get_indexdef(x.indexrelid) "
                    "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
                    "WHERE x.indrelid = %s::regclass", (table,)):
                if name not in owned:
                    indexes[name] = (tuple(cols), bool(unique_index), _condition(sql))
            shape[table] = {"columns": columns, "primary": primary, "unique": unique,
                            "foreign": foreign, "indexes": indexes}
    return shape


def differences(a: Shape, b: Shape) -> list[str]:
    out = [f"table {t}: only in {'SQLite' if t in a else 'PostgreSQL'}"
           for t in sorted(set(a) ^ set(b))]
    for table in sorted(set(a) & set(b)):
        for part in ("columns", "primary", "unique", "foreign", "indexes"):
            if a[table][part] != b[table][part]:
                out.append(f"{table}.{part}:\n  SQLite     {a[table][part]}\n"
                           f"  PostgreSQL {b[table][part]}")
    return out


def test_sqlite_and_postgresql_make_the_same_schema(tmp_path: Path, pg_url: str) -> None:
    open_db(tmp_path / "meta.sqlite").close()
    from metadata.postgres import Postgres

    Postgres(pg_url).close()
    sqlite, postgres = sqlite_shape(tmp_path / "meta.sqlite"), postgres_shape(pg_url)
    assert len(sqlite) >= 12 and sqlite["files"]["indexes"]
    assert not differences(sqlite, postgres), "\n".join(differences(sqlite, postgres))


def test_a_difference_is_seen(tmp_path: Path) -> None:
    """What the comparison would miss if it read less: a column, a default, an index's
    condition."""
    open_db(tmp_path / "a.sqlite").close()
    base = sqlite_shape(tmp_path / "a.sqlite")
    for change in ("ALTER TABLE leases ADD COLUMN note TEXT",
                   "DROP INDEX files_by_id",
                   "DROP INDEX files_by_time; CREATE INDEX files_by_time ON files "
                   "(project_id, max_ts, min_ts) WHERE state = 'retired'"):
        path = tmp_path / f"{abs(hash(change))}.sqlite"
        open_db(path).close()
        con = sqlite3.connect(path)
        con.executescript(change)
        con.close()
        assert differences(base, sqlite_shape(path)), change
