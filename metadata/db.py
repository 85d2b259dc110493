"""The metadata database: tenancy, the file catalog, WAL state, the index of uploaded source
map artifacts, web console sessions, and (in a cluster) the nodes and their leases.

Two backends behind one :class:`Database`: a SQLite file beside the WAL (the embedded
default, ``BOXTRAIL_CATALOG_URL=sqlite:``) and PostgreSQL (``postgresql://...``), shared by
the nodes of a cluster. Callers write SQL once, with ``?`` placeholders and the syntax the
two share (``ON CONFLICT ... DO UPDATE``, partial indexes); :class:`Postgres` turns the
placeholders into psycopg's. Each backend creates and upgrades its own schema at open.

Statements are sub-millisecond index lookups or small transactions and run on the caller's
thread; one lock per connection keeps a transaction whole when another thread uses the same
connection. A commit waits for an fsync (SQLite's ``synchronous=FULL``, PostgreSQL's own),
which a busy disk can stretch to seconds, so the flusher and the compactor write from
threads (``ingest.service``). SQLite then keeps a second connection for reads outside a
transaction: in WAL mode it never waits for a writer, so the event loop's reads (the query
planner, keys, projects) do not queue behind another thread's commit. A PostgreSQL that
cannot be reached raises :class:`MetadataUnavailable` (503, ``Retry-After``) and the next
statement reconnects.

Every PostgreSQL call has a deadline on the client's side, because a server that hangs
(a cut network, a proxy or NAT box that keeps acknowledging) answers neither a statement
timeout nor TCP keepalives: :class:`_Watchdog` shuts the socket of a call past its
deadline, which fails the call with :class:`MetadataUnavailable` and leaves the
connection broken, to be made again. On the event loop's thread a call waits at most
``LOOP_DEADLINE_S`` (0.5 s) and never connects: while there is no connection it fails at
once and a thread connects (every request's and 202's latency is the loop's). A call from
another thread (a request's guard, a worker) waits ``REQUEST_DEADLINE_S`` (1 s); the
flusher's and the compactor's (:func:`patiently`) ``THREAD_DEADLINE_S`` (5 s). A read
the loop awaits from a thread (a search's plan, :func:`promptly`) is held to the loop's
terms.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import heapq
import itertools
import logging
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from core.errors import InvalidParameter, ServiceUnavailable

log = logging.getLogger("boxtrail.db")

SCHEMA_VERSION = 6

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

# Version n is made by the n-th.
_MIGRATIONS = (_SCHEMA, _SCHEMA_2, _SCHEMA_3, _SCHEMA_4, _SCHEMA_5, _SCHEMA_6)

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
# PostgreSQL versions, as SQLite's: the n-th entry makes version first + n.
_PG_MIGRATIONS = {SCHEMA_VERSION: _PG_SCHEMA}


class MetadataUnavailable(ServiceUnavailable):
    """The metadata database (PostgreSQL) cannot be reached; retry later."""

    code = "catalog_unavailable"

    def __init__(self, reason: str) -> None:
        super().__init__(f"the metadata database is not reachable; retry later ({reason})",
                         headers={"Retry-After": "5"})


class UnstorableText(InvalidParameter):
    """A value PostgreSQL's text cannot hold (a NUL character, a lone surrogate)."""

    def __init__(self) -> None:
        super().__init__("a value holds a NUL character or a lone surrogate, which cannot be "
                         "stored or looked up")


def _check(params: Sequence[object]) -> None:
    for value in params:
        if isinstance(value, str) and ("\x00" in value or not _utf8(value)):
            raise UnstorableText


def _utf8(value: str) -> bool:
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


class TooLargeForIndex(InvalidParameter):
    """A value over what PostgreSQL can index (~2.7 KB in a btree entry)."""

    def __init__(self) -> None:
        super().__init__("a value is too large to be stored in the catalog; use a shorter "
                         "name, URL or release")


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Database:
    """One connection to the metadata database (see the module docstring)."""

    dialect: str
    url: str
    # Across a network (PostgreSQL): its calls have deadlines, and what waits for one of
    # them (a search waiting for a flush's commit) waits no longer than a deadline either.
    remote = False
    # What a broken UNIQUE or foreign key raises, whichever backend.
    integrity_errors: tuple[type[Exception], ...]

    def execute(self, sql: str, params: Sequence[object] = ()) -> Cursor:
        raise NotImplementedError

    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        raise NotImplementedError

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """All statements inside commit together, or none does."""
        raise NotImplementedError
        yield

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads inside see the database as of one moment (no write may be made inside)."""
        raise NotImplementedError
        yield

    def serialize(self, name: str) -> None:
        """Inside :meth:`transaction`: wait until no other transaction (on any node) that
        called this with ``name`` is open, and hold them off until this one ends. For
        read-then-write steps such as taking the next number of a sequence."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _Rows:
    """A read's rows, fetched whole while its connection was held."""

    def __init__(self, rows: list[Any], rowcount: int = -1) -> None:
        self.rows = rows
        self.rowcount = rowcount

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return self.rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rows)


def _is_read(sql: str) -> bool:
    return sql.lstrip()[:6].upper() == "SELECT"


class Sqlite(Database):
    dialect = "sqlite"
    integrity_errors = (sqlite3.IntegrityError,)

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.url = f"sqlite:{path}"
        self.lock = threading.RLock()
        self._local = threading.local()  # .writing: inside transaction(); .reading: snapshot()
        if readonly:
            from urllib.parse import quote

            self.con = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True,
                                       isolation_level=None, check_same_thread=False)
            self.reader, self.read_lock = self.con, self.lock
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        con = self.con = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        con.execute("PRAGMA journal_mode=WAL")
        # FULL: a committed catalog row (and the WAL position it retires) survives power loss.
        con.execute("PRAGMA synchronous=FULL")
        con.execute("PRAGMA foreign_keys=ON")
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise RuntimeError(f"{path}: metadata schema {version}, this build knows "
                               f"{SCHEMA_VERSION}")
        if version < SCHEMA_VERSION:  # one transaction: all of the upgrade or none of it
            con.executescript("BEGIN;" + "".join(_MIGRATIONS[version:])
                              + f"PRAGMA user_version={SCHEMA_VERSION}; COMMIT;")
        # Opened after the schema: it reads what the migration committed.
        self.reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.read_lock = threading.RLock()

    def execute(self, sql: str, params: Sequence[object] = ()) -> Cursor:
        local = self._local
        if getattr(local, "reading", False) or (
                not getattr(local, "writing", 0) and _is_read(sql)):
            # What was last committed, whatever another thread is committing now.
            with self.read_lock:
                return _Rows(self.reader.execute(sql, params).fetchall())
        with self.lock:
            return self.con.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        with self.lock:
            self.con.executemany(sql, rows)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        local = self._local
        with self.lock:
            # IMMEDIATE: the write lock at the start, so a read-then-write inside cannot be
            # overtaken by another connection's write (the artifact worker's, a CLI's).
            self.con.execute("BEGIN IMMEDIATE")
            local.writing = getattr(local, "writing", 0) + 1  # its reads see its writes
            try:
                yield
            except BaseException:
                self.con.execute("ROLLBACK")
                raise
            finally:
                local.writing -= 1
            self.con.execute("COMMIT")

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        local = self._local
        with self.read_lock:
            self.reader.execute("BEGIN")  # deferred: the first read fixes what it sees
            local.reading = True
            try:
                yield
            finally:
                local.reading = False
                self.reader.execute("COMMIT")

    def serialize(self, name: str) -> None:
        pass  # BEGIN IMMEDIATE holds the one write lock already

    def close(self) -> None:
        if self.reader is not self.con:
            self.reader.close()
        self.con.close()


def _lock_key(name: str) -> int:
    """A 64-bit advisory lock key for ``name`` (PostgreSQL's advisory locks take a bigint)."""
    return int.from_bytes(hashlib.sha256(b"boxtrail:" + name.encode()).digest()[:8], "big",
                          signed=True)


def _pg_sql(sql: str) -> str:
    """``?`` placeholders as psycopg's ``%s`` (and a literal ``%`` doubled), outside quotes."""
    out = []
    quote = ""
    for ch in sql:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "?":
            out.append("%s")
            continue
        elif ch == "%":
            out.append("%%")
            continue
        out.append(ch)
    return "".join(out)


def _on_loop() -> bool:
    """Whether the caller runs on an asyncio event loop's thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _Deadline:
    """One armed call: :attr:`cut` tells the call it failed because its time was up."""

    __slots__ = ("at", "con", "cut")

    def __init__(self, at: float, con: Any) -> None:
        self.at = at
        self.con = con
        self.cut = False


class _Watchdog:
    """One thread for every connection of the process: it shuts down the socket of a call
    still running at its deadline. libpq's wait for an answer then ends at once (the socket
    reads end-of-file), psycopg raises and marks the connection broken; nothing else can
    end a wait on a peer that never answers and never closes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, con: Any, seconds: float) -> _Deadline:
        deadline = _Deadline(time.monotonic() + seconds, con)
        with self._cond:
            heapq.heappush(self._heap, (deadline.at, next(self._order), deadline))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="catalog-deadlines",
                                                daemon=True)
                self._thread.start()
            if self._heap[0][2] is deadline:
                self._cond.notify()
        return deadline

    def disarm(self, deadline: _Deadline) -> None:
        # Under the lock: once this returns, the watchdog cannot shut the socket (whose
        # descriptor a closed connection could give to another). Left in the heap,
        # popped unused when it reaches the top (no search, no re-heapify).
        with self._cond:
            deadline.con = None

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                while self._heap and (self._heap[0][0] <= now or self._heap[0][2].con is None):
                    _, _, due = heapq.heappop(self._heap)
                    if due.con is not None:
                        due.cut = True
                        _shut(due.con)
                self._cond.wait(self._heap[0][0] - now if self._heap else None)


def _shut(con: Any) -> None:
    try:
        fd = con.pgconn.socket
    except Exception:  # closed already
        return
    try:
        # A duplicate of the descriptor: shutting it down shuts the one socket both name.
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


_WATCHDOG = _Watchdog()
# How long the calls of a context may wait: "patient" (the background writers), "prompt"
# (a read the event loop awaits from a thread), or "" (by the thread the call runs on).
_TERMS: contextvars.ContextVar[str] = contextvars.ContextVar("catalog_terms", default="")


@contextmanager
def _terms(terms: str) -> Iterator[None]:
    token = _TERMS.set(terms)
    try:
        yield
    finally:
        _TERMS.reset(token)


def patiently() -> contextlib.AbstractContextManager[None]:
    """Catalog calls inside (and in the threads ``asyncio.to_thread`` starts from inside,
    which copy the context) get ``THREAD_DEADLINE_S``: for the background writers, and
    for the start, before the loop serves anything."""
    return _terms("patient")


def promptly() -> contextlib.AbstractContextManager[None]:
    """Catalog calls inside, on any thread, are held to the event loop's terms: the loop's
    deadline, no connect, no wait behind a call that hangs. For a read a request awaits
    in a thread (a search's plan): it costs the request no more than on the loop, and
    never holds the loop."""
    return _terms("prompt")


def _hurried() -> bool:
    """Whether a call is held to the loop's terms (see :func:`promptly`)."""
    terms = _TERMS.get()
    return terms == "prompt" or (not terms and _on_loop())


class Postgres(Database):
    dialect = "postgresql"
    remote = True
    CONNECT_TIMEOUT_S = 2
    RETRY_AFTER_S = 2.0
    STATEMENT_TIMEOUT_MS = 10_000
    # A call on the event loop: sub-millisecond on a reachable server (~0.1-0.3 ms on
    # loopback), so 0.5 s only ever cuts a server that hangs, and holds every request of
    # the node at most this long, once per connection, before calls fail fast.
    LOOP_DEADLINE_S = 0.5
    # A call from any other thread (a request's guard runs in one, as do sync handlers and
    # workers): a request that needs the catalog answers a 503 within ~2 s.
    REQUEST_DEADLINE_S = 1.0
    # A call of the flusher or the compactor (inside :func:`patiently`): a commit waits for
    # the server's fsync, which a busy disk stretched to 1.8 s here; nobody waits for these
    # but the WAL, and past 5 s the flush retries.
    THREAD_DEADLINE_S = 5.0

    def __init__(self, url: str, *, readonly: bool = False, migrate: bool = True) -> None:
        import psycopg

        self.psycopg = psycopg
        self.url = url
        self.readonly = readonly
        self.integrity_errors = (psycopg.errors.IntegrityError,)
        self.lock = threading.RLock()
        self._local = threading.local()  # .writing: inside transaction(); .reading: snapshot()
        self.reader: Postgres = self
        self._sql: dict[str, str] = {}
        self.con: Any = None
        self._quiet_until = 0.0
        self._last_failure = ""
        self._connecting: threading.Thread | None = None
        self._call_started: float | None = None  # when the lock's holder took it
        # Opening happens at start, before anything waits on this node: a writer's deadline
        # (a migration waits its turn behind the other nodes' under an advisory lock).
        with patiently():
            self._connect()
            if migrate:
                self._migrate()
        # Reads outside a transaction: a connection of their own, so the event loop's do
        # not queue behind a commit another thread is waiting for.
        if not readonly:
            self.reader = Postgres(url, readonly=True, migrate=False)

    def _connect(self) -> None:
        self.con = None
        self.con = self._open()

    def _open(self) -> Any:
        """A new connection (the caller holds it as ``con``), or MetadataUnavailable."""
        psycopg = self.psycopg
        options = f"-c statement_timeout={self.STATEMENT_TIMEOUT_MS}"
        if self.readonly:
            options += " -c default_transaction_read_only=on"
        if time.monotonic() < self._quiet_until:  # failed just now: fail fast, not wait
            raise MetadataUnavailable(self._last_failure)
        try:
            return psycopg.connect(
                self.url, autocommit=True, connect_timeout=self.CONNECT_TIMEOUT_S,
                options=options, application_name="boxtrail",
                # A peer that vanished (a cut network) is noticed in seconds, not hours:
                # idle (keepalives) and with data unacknowledged (tcp_user_timeout).
                keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
                tcp_user_timeout=10_000)
        except psycopg.OperationalError as exc:
            # While the server is out of reach, calls fail at once for a while instead of
            # each waiting out a connect timeout.
            self._last_failure = _reason(exc)
            self._quiet_until = time.monotonic() + self.RETRY_AFTER_S
            raise MetadataUnavailable(self._last_failure) from exc

    def _migrate(self) -> None:
        """Create or upgrade the schema. Nodes starting together take turns: the first
        does the work under an advisory lock, the others then find it done."""
        with self.transaction():
            self.con.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key("migrate"),))
            self.con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = self.con.execute("SELECT max(version) FROM schema_version").fetchone()
            version = row[0] or 0
            if version > SCHEMA_VERSION:
                raise RuntimeError(f"{_safe_url(self.url)}: metadata schema {version}, this "
                                   f"build knows {SCHEMA_VERSION}")
            if version == 0:
                self.con.execute(_PG_MIGRATIONS[SCHEMA_VERSION])
            else:
                for step in range(version + 1, SCHEMA_VERSION + 1):
                    self.con.execute(_PG_MIGRATIONS[step])
            if version < SCHEMA_VERSION:
                self.con.execute("INSERT INTO schema_version (version) VALUES (%s)",
                                 (SCHEMA_VERSION,))

    def _ready(self) -> Any:
        if self.con is None or self.con.closed or self.con.broken:
            if _hurried():
                # A connect can wait its whole timeout for a server that hangs: never on
                # the loop. A thread connects; calls fail at once meanwhile.
                self._connect_in_background()
                raise MetadataUnavailable(self._last_failure or "reconnecting")
            self._connect()
        return self.con

    def _connect_in_background(self) -> None:
        if self._connecting is not None and self._connecting.is_alive():
            return

        def connect() -> None:
            # Not under the lock: the loop's calls must not wait behind a connect.
            try:
                con = self._open()
            except MetadataUnavailable:
                return  # the loop's next call starts another attempt
            with self.lock:
                if self.con is None or self.con.closed or self.con.broken:
                    self.con = con
                    return
            con.close()

        self._connecting = threading.Thread(target=connect, name="catalog-connect",
                                            daemon=True)
        self._connecting.start()

    @staticmethod
    def _deadline_s() -> float:
        if _TERMS.get() == "patient":
            return Postgres.THREAD_DEADLINE_S
        return Postgres.LOOP_DEADLINE_S if _hurried() else Postgres.REQUEST_DEADLINE_S

    @contextmanager
    def _locked(self, seconds: float) -> Iterator[None]:
        """The connection's lock, waited for no longer than the call's deadline. A thread
        whose call hangs holds it until its own deadline cuts it; the loop does not wait
        behind a call that has run past the loop's deadline already (the server hangs)."""
        if not self.lock.acquire(blocking=False):
            started = self._call_started
            if _hurried() and started is not None:
                # Behind a call (or connect) that has run the loop's deadline already, the
                # server hangs: fail now. Else wait until it has, at most.
                seconds = min(seconds, started + self.LOOP_DEADLINE_S - time.monotonic())
                if seconds <= 0:
                    raise MetadataUnavailable("the catalog has not answered the call before")
            if not self.lock.acquire(timeout=seconds):
                raise MetadataUnavailable(
                    f"the catalog connection is busy for over {seconds:g} s")
        outermost = self._call_started is None  # only the lock's holder changes it
        if outermost:
            self._call_started = time.monotonic()
        try:
            yield
        finally:
            if outermost:
                self._call_started = None
            self.lock.release()

    @contextmanager
    def _call(self, seconds: float) -> Iterator[Any]:
        """The connection, under a deadline of ``seconds`` (unless an enclosing call of this
        thread has one already: a transaction's covers its statements)."""
        local = self._local
        con = self._ready()
        if getattr(local, "armed", False):
            yield con
            return
        deadline = _WATCHDOG.arm(con, seconds)
        local.armed = True
        try:
            yield con
        except self.psycopg.OperationalError as exc:
            if deadline.cut:
                log.warning("catalog: no answer within %g s; the connection is dropped and "
                            "made again", seconds)
                with contextlib.suppress(Exception):
                    con.close()
                raise MetadataUnavailable(f"no answer within {seconds:g} s") from exc
            raise
        finally:
            local.armed = False
            _WATCHDOG.disarm(deadline)
            if deadline.cut and not con.closed:
                # Cut as it finished: its answer may be whole, the socket is not.
                with contextlib.suppress(Exception):
                    con.close()

    def _translate(self, sql: str) -> str:
        found = self._sql.get(sql)
        if found is None:
            found = self._sql[sql] = _pg_sql(sql)
        return found

    def execute(self, sql: str, params: Sequence[object] = ()) -> Cursor:
        local = self._local
        if self.reader is not self and (getattr(local, "reading", False) or (
                not getattr(local, "writing", 0) and _is_read(sql))):
            return self.reader.execute(sql, params)
        _check(params)
        seconds = self._deadline_s()
        with self._locked(seconds):
            try:
                with self._call(seconds) as con:
                    cur = con.execute(self._translate(sql), params)
                    # Fetched under the deadline: a caller's fetch would read the socket
                    # again, with no deadline.
                    return cur if cur.description is None else _Rows(cur.fetchall(),
                                                                      cur.rowcount)
            except self.psycopg.errors.ProgramLimitExceeded as exc:
                raise TooLargeForIndex from exc
            except self.psycopg.OperationalError as exc:
                raise MetadataUnavailable(_reason(exc)) from exc

    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        rows = list(rows)
        for row in rows:
            _check(row)
        seconds = self._deadline_s()
        with self._locked(seconds):
            try:
                with self._call(seconds) as con, con.cursor() as cur:
                    cur.executemany(self._translate(sql), rows)
            except self.psycopg.errors.ProgramLimitExceeded as exc:
                raise TooLargeForIndex from exc
            except self.psycopg.OperationalError as exc:
                raise MetadataUnavailable(_reason(exc)) from exc

    @contextmanager
    def transaction(self) -> Iterator[None]:
        local = self._local
        seconds = self._deadline_s()
        with self._locked(seconds):
            local.writing = getattr(local, "writing", 0) + 1  # its reads see its writes
            try:
                # The deadline covers the whole transaction, its COMMIT included: a COMMIT
                # cut short is one whose answer was lost (the flusher settles those).
                with self._call(seconds) as con, con.transaction():
                    yield
            except self.psycopg.OperationalError as exc:
                raise MetadataUnavailable(_reason(exc)) from exc
            finally:
                local.writing -= 1

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        if self.reader is not self:
            local = self._local
            with self.reader.snapshot():
                local.reading = True
                try:
                    yield
                finally:
                    local.reading = False
            return
        with self.transaction():
            self.con.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield

    def serialize(self, name: str) -> None:
        self.execute("SELECT pg_advisory_xact_lock(?)", (_lock_key(name),))

    def close(self) -> None:
        if self.reader is not self:
            self.reader.close()
        if self.con is not None:
            self.con.close()


def _reason(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=netloc[0].split(":")[0] + ":***@" + netloc[2]))


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def open_database(catalog_url: str, data_dir: Path, *, readonly: bool = False) -> Database:
    """The metadata database a setting names: ``sqlite:`` (``<data_dir>/meta.sqlite``) or a
    PostgreSQL URL."""
    if is_postgres_url(catalog_url):
        return Postgres(catalog_url, readonly=readonly, migrate=not readonly)
    return Sqlite(data_dir / "meta.sqlite", readonly=readonly)


def open_db(path: Path) -> Sqlite:
    """The SQLite metadata database at ``path`` (created or upgraded)."""
    return Sqlite(path)
