"""The metadata database: one SQLite file beside the WAL (tenancy, file catalog, WAL state).

It is used from the event loop's thread only; every statement is a sub-millisecond
index lookup or a small transaction, so no thread pool is needed.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE tenants (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL
);
CREATE TABLE api_keys (
    hash TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id),
    prefix TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE projects (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id),
    name TEXT NOT NULL,
    ingest_key TEXT NOT NULL UNIQUE,
    allowed_origins TEXT NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE TABLE files (
    key TEXT PRIMARY KEY,
    project_id TEXT NOT NULL,
    box TEXT NOT NULL,
    date TEXT NOT NULL,
    min_ts INTEGER NOT NULL,
    max_ts INTEGER NOT NULL,
    min_id INTEGER NOT NULL,
    max_id INTEGER NOT NULL,
    rows INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    -- 'pending': being written (removed at start if the write never finished);
    -- 'live': visible to queries; 'retired': replaced by compaction, deleted later.
    state TEXT NOT NULL,
    changed_at REAL NOT NULL
);
CREATE INDEX files_by_time ON files (project_id, max_ts, min_ts) WHERE state = 'live';
CREATE INDEX files_by_partition ON files (project_id, box, date) WHERE state = 'live';
CREATE INDEX files_by_id ON files (project_id, max_id) WHERE state = 'live';
CREATE TABLE wal_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    flushed_lsn INTEGER NOT NULL
);
INSERT INTO wal_state (id, flushed_lsn) VALUES (1, 0);
"""


def open_db(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    con.execute("PRAGMA journal_mode=WAL")
    # FULL: a committed catalog row (and the WAL position it retires) survives power loss.
    con.execute("PRAGMA synchronous=FULL")
    con.execute("PRAGMA foreign_keys=ON")
    version = con.execute("PRAGMA user_version").fetchone()[0]
    if version == 0:
        con.executescript("BEGIN;" + _SCHEMA + f"PRAGMA user_version={SCHEMA_VERSION}; COMMIT;")
    elif version != SCHEMA_VERSION:
        raise RuntimeError(f"{path}: metadata schema {version}, this build knows {SCHEMA_VERSION}")
    return con
