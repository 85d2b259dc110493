"""The metadata database's schema: SQLite's as its chain of migrations (version n is made by
the n-th; an existing file is upgraded step by step at open), PostgreSQL's as one whole text
at the current version. The two are compared as created by ``tests/metadata/test_schema_parity.py``.
"""

from __future__ import annotations

SCHEMA_VERSION = 9

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

# Version 4: each Parquet file's layout (core.schema.LAYOUT): files written before
# it are layout 1, without ``error_frames``; readers select what a file lacks as NULL.
_SCHEMA_4 = """
ALTER TABLE files ADD COLUMN layout INTEGER NOT NULL DEFAULT 1;
"""

# Version 5: web console sessions (tenancy.sessions): the token's SHA-256, as for API keys.
_SCHEMA_5 = """
CREATE TABLE sessions (
    hash TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id),
    csrf TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at REAL NOT NULL  -- Unix time
);
"""

# Version 6: cluster mode. The WAL position a flush covers is kept per node (each node has
# its own WAL), and each file names the node that wrote it, so a node's start-up clean-up
# touches only its own unfinished writes. Rows of a database from before are the one node's
# (node_id ''); the node that opens it claims them (Catalog.claim). ``nodes`` gives each
# node id a small number of its own; ``leases`` hands a job (compacting one partition) to
# one node at a time; ``cluster_settings`` keeps what every node must read the same (the
# dev API key, which each node writes to its data directory); ``sourcemap_generations``
# counts each project's source map uploads and deletes, which symbolication caches key on,
# so an upload through one node is seen by the next read on any other.
_SCHEMA_6 = """
ALTER TABLE files ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
CREATE INDEX files_by_state ON files (state, node_id);
CREATE TABLE wal_state_6 (
    node_id TEXT PRIMARY KEY,
    flushed_lsn INTEGER NOT NULL
);
INSERT INTO wal_state_6 (node_id, flushed_lsn) SELECT '', flushed_lsn FROM wal_state;
DROP TABLE wal_state;
ALTER TABLE wal_state_6 RENAME TO wal_state;
CREATE TABLE wal_projects (
    node_id TEXT NOT NULL,
    project_id TEXT NOT NULL,
    flushed_lsn INTEGER NOT NULL,
    PRIMARY KEY (node_id, project_id)
);
CREATE TABLE nodes (
    node_id TEXT PRIMARY KEY,
    idx INTEGER NOT NULL UNIQUE,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started_at TEXT NOT NULL
);
CREATE TABLE leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL  -- Unix time
);
CREATE TABLE cluster_settings (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE sourcemap_generations (
    project_id TEXT PRIMARY KEY,
    generation INTEGER NOT NULL
);
"""

# Version 7: API keys a tenant manages (tenancy.keys): an id to name one by, a name,
# scopes, an expiry, when it was last used (written now and then, never on the request
# path). Keys made before keep every scope. A console session belongs to the key that
# opened it, and ends with it. ``changes`` is what every node reads to apply at once what
# another node changed: a key revoked, a project changed or deleted (tenancy.changes).
_SCHEMA_7 = """
ALTER TABLE api_keys ADD COLUMN id TEXT;
ALTER TABLE api_keys ADD COLUMN name TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN scopes TEXT NOT NULL DEFAULT 'admin read sourcemaps:write';
ALTER TABLE api_keys ADD COLUMN expires_at REAL;  -- Unix time; NULL: never
ALTER TABLE api_keys ADD COLUMN last_used_at REAL;  -- Unix time
UPDATE api_keys SET id = 'key_' || substr(hash, 1, 16);
CREATE UNIQUE INDEX api_keys_by_id ON api_keys (id);
ALTER TABLE sessions ADD COLUMN key_hash TEXT NOT NULL DEFAULT '';
CREATE INDEX sessions_by_key ON sessions (key_hash);
CREATE TABLE changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    ref TEXT NOT NULL,
    at REAL NOT NULL  -- Unix time
);
CREATE TABLE ingest_keys (
    key TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects(id),
    name TEXT NOT NULL,
    enabled INTEGER NOT NULL DEFAULT 1,
    rate_limit REAL,  -- events/s; NULL: BOXTRAIL_RATE_LIMIT_EVENTS
    created_at TEXT NOT NULL
);
CREATE INDEX ingest_keys_by_project ON ingest_keys (project_id);
INSERT INTO ingest_keys (key, project_id, name, enabled, created_at)
    SELECT ingest_key, id, 'default', 1, created_at FROM projects;
INSERT INTO ingest_keys (key, project_id, name, enabled, created_at)
    SELECT sentry_key, id, 'sentry', 1, created_at FROM projects
    WHERE sentry_key IS NOT NULL AND sentry_key != ingest_key;
"""

_SCHEMA_8 = """
CREATE TABLE deletions (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    project_id TEXT NOT NULL,
    project_name TEXT NOT NULL,
    selector TEXT NOT NULL,  -- JSON: erasure.selector.Selector
    state TEXT NOT NULL,  -- queued | running | done | failed
    phase TEXT NOT NULL,  -- where a running job is: nodes | files | purge | artifacts
    created_at REAL NOT NULL,  -- Unix time
    started_at REAL,
    purged_at REAL,
    result TEXT NOT NULL,  -- JSON: what was matched and removed
    error TEXT
);
CREATE INDEX deletions_by_project ON deletions (tenant_id, project_id, created_at);
CREATE INDEX deletions_by_state ON deletions (state);
CREATE TABLE deletion_acks (  -- a node applied the job: its buffer and WAL hold none
    deletion_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (deletion_id, node_id)
);
CREATE TABLE deletion_counts (  -- rows a node's flushes left out, with the flush's commit
    deletion_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    rows INTEGER NOT NULL,
    PRIMARY KEY (deletion_id, node_id)
);
"""

_SCHEMA_9 = """
CREATE TABLE usage_minutes (  -- core.usage: a quantity per tenant, project, box, minute, kind
    tenant_id TEXT NOT NULL,
    minute INTEGER NOT NULL,  -- Unix seconds of the minute's (or snapshot hour's) start
    project_id TEXT NOT NULL,
    box TEXT NOT NULL,  -- '' when none
    kind TEXT NOT NULL,
    source TEXT NOT NULL,  -- the intake, the reader; ''
    reason TEXT NOT NULL,  -- a refusal's or a discard's; ''
    quantity INTEGER NOT NULL,
    sent INTEGER NOT NULL DEFAULT 0,  -- how much of it the sink has taken into its outbox
    PRIMARY KEY (tenant_id, minute, project_id, box, kind, source, reason)
);
CREATE INDEX usage_minutes_unsent ON usage_minutes (minute) WHERE quantity > sent;
CREATE TABLE usage_outbox (  -- usage events to push, each with its id, until answered
    id TEXT PRIMARY KEY,
    body TEXT NOT NULL,
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at REAL NOT NULL
);
CREATE INDEX usage_outbox_by_due ON usage_outbox (next_at);
"""

# Version n is made by the n-th.
_MIGRATIONS = (_SCHEMA, _SCHEMA_2, _SCHEMA_3, _SCHEMA_4, _SCHEMA_5, _SCHEMA_6, _SCHEMA_7,
               _SCHEMA_8, _SCHEMA_9)

# PostgreSQL's schema: the same tables as SQLite's at SCHEMA_VERSION, in PostgreSQL's types
# (BIGINT where SQLite's INTEGER holds 64 bits). A later version appends its step to both.
_PG_SCHEMA = """
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
    sentry_id BIGINT,
    sentry_key TEXT,
    UNIQUE (tenant_id, name)
);
CREATE UNIQUE INDEX projects_by_sentry_id ON projects (sentry_id);
CREATE UNIQUE INDEX projects_by_sentry_key ON projects (sentry_key);
CREATE TABLE files (
    key TEXT PRIMARY KEY,
    project_id TEXT NOT NULL,
    box TEXT NOT NULL,
    date TEXT NOT NULL,
    min_ts BIGINT NOT NULL,
    max_ts BIGINT NOT NULL,
    min_id BIGINT NOT NULL,
    max_id BIGINT NOT NULL,
    rows BIGINT NOT NULL,
    bytes BIGINT NOT NULL,
    state TEXT NOT NULL,
    changed_at DOUBLE PRECISION NOT NULL,
    layout INTEGER NOT NULL DEFAULT 1,
    node_id TEXT NOT NULL DEFAULT ''
);
CREATE INDEX files_by_time ON files (project_id, max_ts, min_ts) WHERE state = 'live';
CREATE INDEX files_by_partition ON files (project_id, box, date) WHERE state = 'live';
CREATE INDEX files_by_id ON files (project_id, max_id) WHERE state = 'live';
CREATE INDEX files_by_state ON files (state, node_id);
CREATE TABLE wal_state (
    node_id TEXT PRIMARY KEY,
    flushed_lsn BIGINT NOT NULL
);
CREATE TABLE sourcemap_artifacts (
    project_id TEXT NOT NULL,
    release TEXT NOT NULL,
    url TEXT NOT NULL,
    name TEXT NOT NULL,
    map_name TEXT NOT NULL,
    js_sha256 TEXT,
    js_bytes BIGINT NOT NULL,
    map_sha256 TEXT NOT NULL,
    map_bytes BIGINT NOT NULL,
    debug_id TEXT,
    sources_content INTEGER NOT NULL,
    uploaded_at TEXT NOT NULL,
    seq BIGINT NOT NULL,
    PRIMARY KEY (project_id, release, url)
);
CREATE INDEX sourcemap_artifacts_by_url ON sourcemap_artifacts (project_id, url, seq);
CREATE INDEX sourcemap_artifacts_by_debug_id ON sourcemap_artifacts (project_id, debug_id, seq)
    WHERE debug_id IS NOT NULL;
CREATE TABLE sessions (
    hash TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id),
    csrf TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE wal_projects (
    node_id TEXT NOT NULL,
    project_id TEXT NOT NULL,
    flushed_lsn BIGINT NOT NULL,
    PRIMARY KEY (node_id, project_id)
);
CREATE TABLE nodes (
    node_id TEXT PRIMARY KEY,
    idx INTEGER NOT NULL UNIQUE,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started_at TEXT NOT NULL
);
CREATE TABLE leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE cluster_settings (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE sourcemap_generations (
    project_id TEXT PRIMARY KEY,
    generation BIGINT NOT NULL
);
"""
# PostgreSQL's schema began at version 6 (_PG_SCHEMA); each later version is a step.
PG_FIRST_VERSION = 6
_PG_STEPS = {
    7: """
ALTER TABLE api_keys ADD COLUMN id TEXT;
ALTER TABLE api_keys ADD COLUMN name TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN scopes TEXT NOT NULL DEFAULT 'admin read sourcemaps:write';
ALTER TABLE api_keys ADD COLUMN expires_at DOUBLE PRECISION;
ALTER TABLE api_keys ADD COLUMN last_used_at DOUBLE PRECISION;
UPDATE api_keys SET id = 'key_' || substr(hash, 1, 16);
CREATE UNIQUE INDEX api_keys_by_id ON api_keys (id);
ALTER TABLE sessions ADD COLUMN key_hash TEXT NOT NULL DEFAULT '';
CREATE INDEX sessions_by_key ON sessions (key_hash);
CREATE TABLE changes (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind TEXT NOT NULL,
    ref TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL
);
CREATE TABLE ingest_keys (
    key TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects(id),
    name TEXT NOT NULL,
    enabled INTEGER NOT NULL DEFAULT 1,
    rate_limit DOUBLE PRECISION,
    created_at TEXT NOT NULL
);
CREATE INDEX ingest_keys_by_project ON ingest_keys (project_id);
INSERT INTO ingest_keys (key, project_id, name, enabled, created_at)
    SELECT ingest_key, id, 'default', 1, created_at FROM projects;
INSERT INTO ingest_keys (key, project_id, name, enabled, created_at)
    SELECT sentry_key, id, 'sentry', 1, created_at FROM projects
    WHERE sentry_key IS NOT NULL AND sentry_key != ingest_key;
""",
    8: """
CREATE TABLE deletions (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    project_id TEXT NOT NULL,
    project_name TEXT NOT NULL,
    selector TEXT NOT NULL,
    state TEXT NOT NULL,
    phase TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    started_at DOUBLE PRECISION,
    purged_at DOUBLE PRECISION,
    result TEXT NOT NULL,
    error TEXT
);
CREATE INDEX deletions_by_project ON deletions (tenant_id, project_id, created_at);
CREATE INDEX deletions_by_state ON deletions (state);
CREATE TABLE deletion_acks (
    deletion_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (deletion_id, node_id)
);
CREATE TABLE deletion_counts (
    deletion_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    rows BIGINT NOT NULL,
    PRIMARY KEY (deletion_id, node_id)
);
""",
    9: """
CREATE TABLE usage_minutes (
    tenant_id TEXT NOT NULL,
    minute BIGINT NOT NULL,
    project_id TEXT NOT NULL,
    box TEXT NOT NULL,
    kind TEXT NOT NULL,
    source TEXT NOT NULL,
    reason TEXT NOT NULL,
    quantity BIGINT NOT NULL,
    sent BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, minute, project_id, box, kind, source, reason)
);
CREATE INDEX usage_minutes_unsent ON usage_minutes (minute) WHERE quantity > sent;
CREATE TABLE usage_outbox (
    id TEXT PRIMARY KEY,
    body TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX usage_outbox_by_due ON usage_outbox (next_at);
""",
}