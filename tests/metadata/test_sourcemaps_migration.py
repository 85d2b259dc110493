"""Metadata schema upgrades: 1 -> 2 adds the source map index, 2 -> 3 the projects' Sentry
ids and keys, 3 -> 4 the files' layout; nothing else changes."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from metadata import ddl
from metadata.sqlite import open_db


def test_a_version_1_database_gets_the_artifact_index(tmp_path: Path) -> None:
    path = tmp_path / "meta.sqlite"
    con = sqlite3.connect(path, isolation_level=None)
    con.executescript("BEGIN;" + ddl._SCHEMA + "PRAGMA user_version=1; COMMIT;")
    con.execute("INSERT INTO tenants VALUES ('ten_1', 'acme', '2026-01-01T00:00:00Z')")
    con.close()
    upgraded = open_db(path)
    assert upgraded.execute("PRAGMA user_version").fetchone()[0] == ddl.SCHEMA_VERSION == 6
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


def test_a_new_database_is_created_at_version_5(tmp_path: Path) -> None:
    con = open_db(tmp_path / "meta.sqlite")
    assert con.execute("PRAGMA user_version").fetchone()[0] == 6
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"tenants", "files", "sourcemap_artifacts"} <= tables
    con.close()
