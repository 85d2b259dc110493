"""Metadata schema upgrades: 1 -> 2 adds the source map index, 2 -> 3 the projects' Sentry
ids and keys, 3 -> 4 the files' layout, 6 -> 7 API keys' scopes and ingest keys (on SQLite
and on PostgreSQL); nothing else changes."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

import psycopg

from metadata import ddl
from metadata.postgres import Postgres
from metadata.sqlite import open_db
from tenancy.tenants import Tenancy
from tests.support.pgserver import PgServer


def test_a_version_1_database_gets_the_artifact_index(tmp_path: Path) -> None:
    path = tmp_path / "meta.sqlite"
    con = sqlite3.connect(path, isolation_level=None)
    con.executescript("BEGIN;" + ddl._SCHEMA + "PRAGMA user_version=1; COMMIT;")
    con.execute("INSERT INTO tenants VALUES ('ten_1', 'acme', '2026-01-01T00:00:00Z')")
    con.close()
    upgraded = open_db(path)
    assert upgraded.execute("PRAGMA user_version").fetchone()[0] == ddl.SCHEMA_VERSION == 9
    assert upgraded.execute("SELECT name FROM tenants").fetchall() == [("acme",)]
    assert upgraded.execute("SELECT count(*) FROM sourcemap_artifacts").fetchone() == (0,)
    upgraded.close()
    open_db(path).close()  # opening again is a no-op


def test_a_version_2_database_gives_every_project_a_sentry_id_and_key(tmp_path: Path) -> None:
    path = tmp_path / "meta.sqlite"
    con = sqlite3.connect(path, isolation_level=None)
    con.executescript("BEGIN;" + ddl._SCHEMA + ddl._SCHEMA_2 + "PRAGMA user_version=2; COMMIT;")
    con.execute("INSERT INTO tenants VALUES ('ten_1', 'acme', '2026-01-01T00:00:00Z')")
    for n, key in enumerate(["bti_Ab-c_d", "bti_plain_0", "bti_x-y"]):
        con.execute("INSERT INTO projects VALUES (?, 'ten_1', ?, ?, '[]', '2026-01-01')",
                    (f"prj_{n}", f"p{n}", key))
    con.close()
    upgraded = open_db(path)
    rows = upgraded.execute(
        "SELECT ingest_key, sentry_id, sentry_key FROM projects ORDER BY id").fetchall()
    assert sorted(r[1] for r in rows) == [1, 2, 3]
    assert rows[1][2] == "bti_plain_0"  # a key that fits a DSN stays the Sentry key
    for ingest_key, _, sentry_key in (rows[0], rows[2]):  # '-' cannot be in a DSN
        assert re.fullmatch(r"bts_[0-9a-f]{32}", sentry_key) and ingest_key != sentry_key
    assert rows[0][2] != rows[2][2]
    upgraded.close()


def test_a_version_3_database_marks_its_files_layout_1(tmp_path: Path) -> None:
    path = tmp_path / "meta.sqlite"
    con = sqlite3.connect(path, isolation_level=None)
    con.executescript("BEGIN;" + ddl._SCHEMA + ddl._SCHEMA_2 + ddl._SCHEMA_3
                      + "PRAGMA user_version=3; COMMIT;")
    con.execute("INSERT INTO files VALUES ('logs/a.parquet', 'prj_1', '_', '2026-01-01', 1, 2, "
                "1, 2, 2, 100, 'live', 0)")
    con.close()
    upgraded = open_db(path)
    assert upgraded.execute("SELECT key, layout FROM files").fetchall() == [
        ("logs/a.parquet", 1)]
    upgraded.close()


def test_a_new_database_is_created_at_the_current_version(tmp_path: Path) -> None:
    con = open_db(tmp_path / "meta.sqlite")
    assert con.execute("PRAGMA user_version").fetchone()[0] == ddl.SCHEMA_VERSION
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"tenants", "files", "sourcemap_artifacts", "changes", "ingest_keys"} <= tables
    con.close()


_V6_ROWS = [
    "INSERT INTO tenants VALUES ('ten_1', 'acme', '2026-01-01T00:00:00Z')",
    "INSERT INTO api_keys VALUES ('{}', 'ten_1', 'btk_abcd', '2026-01-01T00:00:00Z')"
    .format("a" * 64),
    "INSERT INTO projects VALUES ('prj_1', 'ten_1', 'shop', 'bti_plain', '[]', "
    "'2026-01-01T00:00:00Z', 1, 'bti_plain')",
    "INSERT INTO projects VALUES ('prj_2', 'ten_1', 'old', 'bti_a-b', '[]', "
    "'2026-01-01T00:00:00Z', 2, 'bts_0123')",
    "INSERT INTO sessions VALUES ('{}', 'ten_1', 'csrf', '2026-01-01T00:00:00Z', 1e12)"
    .format("b" * 64),
]


def _check_version_7(execute: Callable[[str], list[tuple[object, ...]]]) -> None:
    assert execute("SELECT id, name, scopes, expires_at FROM api_keys") == [
        ("key_" + "a" * 16, "", "admin read sourcemaps:write", None)]
    assert sorted(execute("SELECT key, project_id, name, enabled, rate_limit FROM ingest_keys")
                  ) == [("bti_a-b", "prj_2", "default", 1, None),
                        ("bti_plain", "prj_1", "default", 1, None),
                        ("bts_0123", "prj_2", "sentry", 1, None)]
    assert execute("SELECT key_hash FROM sessions") == [("",)]
    assert execute("SELECT count(*) FROM changes") == [(0,)]


def test_a_version_6_database_keeps_its_keys_with_every_scope(tmp_path: Path) -> None:
    path = tmp_path / "meta.sqlite"
    con = sqlite3.connect(path, isolation_level=None)
    con.executescript("BEGIN;" + "".join(ddl._MIGRATIONS[:6]) + "PRAGMA user_version=6; "
                      + "; ".join(_V6_ROWS) + "; COMMIT;")
    con.close()
    upgraded = open_db(path)
    _check_version_7(lambda sql: [tuple(r) for r in upgraded.execute(sql).fetchall()])
    tenancy = Tenancy(upgraded)  # the old projects' keys still take events
    assert tenancy.project_by_ingest_key("bti_a-b").id == "prj_2"  # type: ignore[union-attr]
    assert tenancy.project_by_ingest_key("bts_0123").id == "prj_2"  # type: ignore[union-attr]
    [old] = [p for p in tenancy.list_projects("ten_1") if p.id == "prj_2"]
    assert (old.ingest_key, old.sentry_key) == ("bti_a-b", "bts_0123")
    upgraded.close()


def test_a_version_6_postgresql_catalog_is_upgraded_alike(pg_server: PgServer) -> None:
    url = pg_server.new_database()
    with psycopg.connect(url, autocommit=True) as con:
        con.execute(ddl._PG_SCHEMA)
        con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        con.execute("INSERT INTO schema_version VALUES (6)")
        for row in _V6_ROWS:
            con.execute(row)
    upgraded = Postgres(url)
    try:
        _check_version_7(lambda sql: [tuple(r) for r in upgraded.execute(sql).fetchall()])
        version = upgraded.execute("SELECT max(version) FROM schema_version").fetchone()[0]
        assert version == ddl.SCHEMA_VERSION
    finally:
        upgraded.close()
