"""Metadata schema 1 -> 2: the source map index is added, nothing else changes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from boxtrail import db


def test_a_version_1_database_gets_the_artifact_index(tmp_path: Path) -> None:
    path = tmp_path / "meta.sqlite"
    con = sqlite3.connect(path, isolation_level=None)
    con.executescript("BEGIN;" + db._SCHEMA + "PRAGMA user_version=1; COMMIT;")
    con.execute("INSERT INTO tenants VALUES ('ten_1', 'acme', '2026-01-01T00:00:00Z')")
    con.close()
    upgraded = db.open_db(path)
    assert upgraded.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION == 2
    assert upgraded.execute("SELECT name FROM tenants").fetchall() == [("acme",)]
    assert upgraded.execute("SELECT count(*) FROM sourcemap_artifacts").fetchone() == (0,)
    upgraded.close()
    db.open_db(path).close()  # opening again is a no-op


def test_a_new_database_is_created_at_version_2(tmp_path: Path) -> None:
    con = db.open_db(tmp_path / "meta.sqlite")
    assert con.execute("PRAGMA user_version").fetchone()[0] == 2
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"tenants", "files", "sourcemap_artifacts"} <= tables
    con.close()
