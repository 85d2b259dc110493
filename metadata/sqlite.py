"""The embedded metadata database: one SQLite file beside the WAL (``metadata.db``)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from metadata.db import Cursor, Database, Rows, is_read
from metadata.ddl import _MIGRATIONS, SCHEMA_VERSION


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
                not getattr(local, "writing", 0) and is_read(sql)):
            # What was last committed, whatever another thread is committing now.
            with self.read_lock:
                return Rows(self.reader.execute(sql, params).fetchall())
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


def open_db(path: Path) -> Sqlite:
    """The SQLite metadata database at ``path`` (created or upgraded)."""
    return Sqlite(path)
