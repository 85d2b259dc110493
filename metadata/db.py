"""The metadata database: tenancy, the file catalog, WAL state, the index of uploaded source
map artifacts, web console sessions, and (in a cluster) the nodes and their leases.

Two backends behind one :class:`Database`: a SQLite file beside the WAL (the embedded
default, ``BOXTRAIL_CATALOG_URL=sqlite:``) and PostgreSQL (``postgresql://...``), shared by
the nodes of a cluster (``metadata.sqlite``, ``metadata.postgres``; ``metadata.connect``
opens the one a setting names). Callers write SQL once, with ``?`` placeholders and the
syntax the two share (``ON CONFLICT ... DO UPDATE``, partial indexes); PostgreSQL's backend
turns the placeholders into psycopg's. Each backend creates and upgrades its own schema at
open (``metadata.ddl``).

Statements are sub-millisecond index lookups or small transactions and run on the caller's
thread; one lock per connection keeps a transaction whole when another thread uses the same
connection. A commit waits for an fsync (SQLite's ``synchronous=FULL``, PostgreSQL's own),
which a busy disk can stretch to seconds, so the flusher and the compactor write from
threads (``ingest.service``). SQLite then keeps a second connection for reads outside a
transaction: in WAL mode it never waits for a writer, so the event loop's reads (the query
planner, keys, projects) do not queue behind another thread's commit. A PostgreSQL that
cannot be reached raises :class:`MetadataUnavailable` (503, ``Retry-After``) and the next
statement reconnects.

Every PostgreSQL call has a deadline on the client's side (``metadata.postgres``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from core.errors import InvalidParameter, ServiceUnavailable


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


def check_params(params: Sequence[object]) -> None:
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

    def lock_for_life(self, name: str) -> LifeLock | None:
        """A lock on ``name`` this process holds while it lives (raising
        :class:`LockTaken` if another process holds it), or None where no other process
        can share this database (SQLite: the WAL's file lock keeps one per data directory)."""
        return None


class LockTaken(Exception):
    """Another process holds the lock."""


class LifeLock(Protocol):
    def check(self) -> bool:
        """Whether this process still holds it; after a connection loss, take it again."""
        ...

    def release(self) -> None: ...


class Rows:
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


def is_read(sql: str) -> bool:
    return sql.lstrip()[:6].upper() == "SELECT"
