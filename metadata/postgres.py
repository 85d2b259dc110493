"""PostgreSQL, the metadata database a cluster's nodes share (``metadata.db``).

Every call has a deadline on the client's side, because a server that hangs (a cut
network, a proxy or NAT box that keeps acknowledging) answers neither a statement timeout
nor TCP keepalives: :class:`_Watchdog` shuts the socket of a call past its deadline, which
fails the call with :class:`MetadataUnavailable` and leaves the connection broken, to be
made again. On the event loop's thread a call waits at most ``LOOP_DEADLINE_S`` (0.5 s) and
never connects: while there is no connection it fails at once and a thread connects (every
request's and 202's latency is the loop's). A call from another thread (a request's guard,
a worker) waits ``REQUEST_DEADLINE_S`` (1 s); the flusher's and the compactor's
(:func:`patiently`) ``THREAD_DEADLINE_S`` (5 s). A read the loop awaits from a thread (a
search's plan, :func:`promptly`) is held to the loop's terms.
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
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from metadata.db import (
    Cursor,
    Database,
    LockTaken,
    MetadataUnavailable,
    Rows,
    TooLargeForIndex,
    check_params,
    is_read,
)
from metadata.ddl import _PG_SCHEMA, _PG_STEPS, PG_FIRST_VERSION, SCHEMA_VERSION

log = logging.getLogger("boxtrail.db")


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
            made = version
            if made == 0:
                self.con.execute(_PG_SCHEMA)
                made = PG_FIRST_VERSION
            for step in range(made + 1, SCHEMA_VERSION + 1):
                self.con.execute(_PG_STEPS[step])
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
                not getattr(local, "writing", 0) and is_read(sql))):
            return self.reader.execute(sql, params)
        check_params(params)
        seconds = self._deadline_s()
        with self._locked(seconds):
            try:
                with self._call(seconds) as con:
                    cur = con.execute(self._translate(sql), params)
                    # Fetched under the deadline: a caller's fetch would read the socket
                    # again, with no deadline.
                    return cur if cur.description is None else Rows(cur.fetchall(),
                                                                      cur.rowcount)
            except self.psycopg.errors.ProgramLimitExceeded as exc:
                raise TooLargeForIndex from exc
            except self.psycopg.OperationalError as exc:
                raise MetadataUnavailable(_reason(exc)) from exc

    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        rows = list(rows)
        for row in rows:
            check_params(row)
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

    def lock_for_life(self, name: str) -> _AdvisoryLock:
        return _AdvisoryLock(self.url, name)

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


class _AdvisoryLock:
    """A session advisory lock on a connection of its own, held while it stays open."""

    def __init__(self, url: str, name: str) -> None:
        self.key = _lock_key(name)
        self.db = Postgres(url, migrate=False)
        if not self._take():
            self.db.close()
            raise LockTaken(name)

    def _take(self) -> bool:
        return bool(self.db.execute("SELECT pg_try_advisory_lock(?)", (self.key,)
                                    ).fetchone()[0])

    def check(self) -> bool:
        con = self.db.con
        if con is not None and not con.closed and not con.broken:
            try:
                self.db.execute("SELECT 1")
                return True
            except MetadataUnavailable:
                pass
        try:
            return self._take()  # the lock went with the connection: take it again
        except MetadataUnavailable:
            return True  # still out: nobody else can take it either

    def release(self) -> None:
        self.db.close()
