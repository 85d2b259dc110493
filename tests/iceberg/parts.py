"""In-process pieces of a data directory with the tables on, for tests that drive the
catalog directly: its catalog (the tables as its mirror), the tables, local storage; and
files written as a flush leaves them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec

from core.config import load
from core.schema import RowBatch, to_table
from core.storage import LocalStorage
from iceberg.tables import Tables, open_tables
from ingest.flusher import encode_parquet, partitions
from metadata.catalog import Catalog, FileEntry
from metadata.sqlite import Sqlite

NOW_MS = int(time.time() * 1000)


@contextmanager
def opened(tmp_path: Path) -> Iterator[tuple[Catalog, Tables, LocalStorage]]:
    config = load({"BOXTRAIL_DATA_DIR": str(tmp_path), "BOXTRAIL_ICEBERG": "on"})
    db = Sqlite(tmp_path / "meta.sqlite")
    storage = LocalStorage(str(tmp_path / "objects"))
    catalog = Catalog(db, "n1")
    tables = open_tables(config, db)
    catalog.mirror = tables
    yield catalog, tables, storage
    tables.close()
    db.close()


def write(catalog: Catalog, storage: LocalStorage, first_id: int, n: int, box: str = "b1"
          ) -> FileEntry:
    """A file of ``n`` rows of project p1 and ``box``, written and pending, as a flush
    leaves it."""
    batch = RowBatch(project_id="p1", box=box, session_id=None, release=None,
                     user_agent=None, sdk=None, debug_ids=None, received=NOW_MS,
                     id_start=first_id, ts=[NOW_MS + i for i in range(n)],
                     level=["info"] * n, message=[f"m{first_id + i}" for i in range(n)],
                     url=[None] * n, attrs=[None] * n, error_type=[None] * n,
                     error_message=[None] * n, error_stack=[None] * n, truncated=[None] * n)
    [(entry, part)] = partitions("p1", to_table([batch]))
    data = encode_parquet(part)
    entry = msgspec.structs.replace(entry, bytes=len(data))
    catalog.add_pending([entry])
    storage.put(entry.key, data)
    return entry
