"""The metadata database: one SQLite file beside the WAL (tenancy, file catalog, WAL state,
the index of uploaded source map artifacts, web console sessions).

It is used from the event loop's thread only; every statement is a sub-millisecond
index lookup or a small transaction, so no thread pool is needed.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

SCHEMA_VERSION = 5

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

# Version 2: uploaded source map artifacts (symbolicate.artifacts). One row per built JS file
# (or per map whose JS was not uploaded); the bytes live on the storage backend under
# sourcemaps/<project>/<sha256>.
_SCHEMA_2 = """
CREATE TABLE sourcemap_artifacts (
    project_id TEXT NOT NULL,
    release TEXT NOT NULL,  -- '' when uploaded without a release
    url TEXT NOT NULL,  -- where the JS is served: '~/assets/app.js' or 'https://cdn/app.js'
    name TEXT NOT NULL,  -- the JS file's path in the upload
    map_name TEXT NOT NULL,
    js_sha256 TEXT,  -- NULL: the map came without its JS
    js_bytes INTEGER NOT NULL,
    map_sha256 TEXT NOT NULL,
    map_bytes INTEGER NOT NULL,
    debug_id TEXT,
    sources_content INTEGER NOT NULL,  -- 1: every source has its content
    uploaded_at TEXT NOT NULL,
    seq INTEGER NOT NULL,  -- upload order: the newest wins among equal matches
    PRIMARY KEY (project_id, release, url)
);
CREATE INDEX sourcemap_artifacts_by_url ON sourcemap_artifacts (project_id, url, seq);
CREATE INDEX sourcemap_artifacts_by_debug_id ON sourcemap_artifacts (project_id, debug_id, seq)
    WHERE debug_id IS NOT NULL;
"""

# Version 3: what a Sentry SDK needs to send here (ingest.sentry): a numeric project id and a
# public key of letters, digits and '_' (the SDK refuses a DSN with anything else). A project
# whose ingest key fits is given it as its Sentry key; older keys (with '-') get a new one.
_SCHEMA_3 = """
ALTER TABLE projects ADD COLUMN sentry_id INTEGER;
ALTER TABLE projects ADD COLUMN sentry_key TEXT;
UPDATE projects SET sentry_id = rowid, sentry_key = CASE
    WHEN ingest_key GLOB '*[^A-Za-z0-9_]*' THEN 'bts_' || lower(hex(randomblob(16)))
    ELSE ingest_key END;
CREATE UNIQUE INDEX projects_by_sentry_id ON projects (sentry_id);
CREATE UNIQUE INDEX projects_by_sentry_key ON projects (sentry_key);
"""

# Version 4: each Parquet file's layout (boxtrail.schema.LAYOUT): files written before
# it are layout 1, without ``error_frames``; readers select what a file lacks as NULL.
_SCHEMA_4 = """
ALTER TABLE files ADD COLUMN layout INTEGER NOT NULL DEFAULT 1;
"""

# Version 5: web console sessions (boxtrail.session): the token's SHA-256, as for API keys.
_SCHEMA_5 = """
CREATE TABLE sessions (
    hash TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id),
    csrf TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at REAL NOT NULL  -- Unix time
);
"""

# Version n is made by the n-th.
_MIGRATIONS = (_SCHEMA, _SCHEMA_2, _SCHEMA_3, _SCHEMA_4, _SCHEMA_5)


def open_db(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    con.execute("PRAGMA journal_mode=WAL")
    # FULL: a committed catalog row (and the WAL position it retires) survives power loss.
    con.execute("PRAGMA synchronous=FULL")
    con.execute("PRAGMA foreign_keys=ON")
    version = con.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise RuntimeError(f"{path}: metadata schema {version}, this build knows {SCHEMA_VERSION}")
    if version < SCHEMA_VERSION:  # one transaction: all of the upgrade or none of it
        con.executescript("BEGIN;" + "".join(_MIGRATIONS[version:])
                          + f"PRAGMA user_version={SCHEMA_VERSION}; COMMIT;")
    return con
