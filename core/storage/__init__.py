"""Object storage for Parquet files and artifacts: one small protocol, two backends.

- ``base``: the :class:`Storage` protocol, :class:`ObjectInfo`, the errors, and the key rules
  (relative ``/``-separated keys such as
  ``logs/project=p1/box=_/date=2026-11-29/x.parquet``).
- ``local``: files under ``<data_dir>/objects``, written as ``.part``, fsynced, renamed;
  ``recover()`` at start deletes ``.part`` files a crash left behind.
- ``s3``: a bucket and key prefix on AWS or any S3-compatible server; the app calls
  ``ensure_bucket()`` at start.

Queries read Parquet through ``arrow_filesystem()`` and ``arrow_path(key)``, so DuckDB
needs no ``httpfs``. :func:`open_storage` picks the backend from the config.
"""

from __future__ import annotations

import os

from core.config import Config
from core.storage.base import NotFound, ObjectInfo, Storage, StorageError
from core.storage.local import LocalStorage
from core.storage.s3 import S3Storage

__all__ = [
    "LocalStorage",
    "NotFound",
    "ObjectInfo",
    "S3Storage",
    "Storage",
    "StorageError",
    "open_storage",
]


def open_storage(config: Config) -> Storage:
    if config.storage == "s3":
        return S3Storage(
            endpoint=config.s3_endpoint,
            bucket=config.s3_bucket,
            prefix=config.s3_prefix,
            region=config.s3_region,
        )
    return LocalStorage(os.path.join(config.data_dir, "objects"))
