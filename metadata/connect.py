"""The metadata database a setting names (``BOXTRAIL_CATALOG_URL``), opened."""

from __future__ import annotations

from pathlib import Path

from metadata.db import Database
from metadata.postgres import Postgres
from metadata.sqlite import Sqlite


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def open_database(catalog_url: str, data_dir: Path, *, readonly: bool = False) -> Database:
    """The metadata database a setting names: ``sqlite:`` (``<data_dir>/meta.sqlite``) or a
    PostgreSQL URL."""
    if is_postgres_url(catalog_url):
        return Postgres(catalog_url, readonly=readonly, migrate=not readonly)
    return Sqlite(data_dir / "meta.sqlite", readonly=readonly)
