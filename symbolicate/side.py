"""What symbolication's jobs read in a worker process (``core.workers``): the storage
backend, the artifact index through a read-only connection of its own, and a symbolicator
with its caches, which live as long as the worker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.config import Config
from core.metrics import Registry
from core.storage import Storage, open_storage
from core.workers import Side
from metadata.connect import open_database
from metadata.db import Database
from symbolicate.artifacts import ArtifactStore
from symbolicate.lookup import Symbolicator, symbolication_metrics


class ArtifactView(ArtifactStore):
    """The artifact index as a worker reads it: its own read-only connection, and the
    server's upload generation of the project, given with each job (the caches key on it,
    so an upload the server committed is seen by the next job)."""

    def __init__(self, db: Database, storage: Storage) -> None:
        super().__init__(db, storage)
        self._generation: dict[str, int] = {}

    def observe(self, project_id: str, generation: int) -> None:
        self._generation[project_id] = generation

    def generation(self, project_id: str) -> int:
        return self._generation.get(project_id, 0)


class SymbolicateSide(Side):
    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.storage = open_storage(config)
        db = open_database(config.catalog_url, Path(config.data_dir).resolve(), readonly=True)
        self.store = ArtifactView(db, self.storage)
        self.symbolicator = Symbolicator(self.store, self.metrics,
                                         config.symbolicate_cache_bytes,
                                         config.symbolicate_stack_cache_bytes)
        self.loop = asyncio.new_event_loop()  # the symbolicator's coroutines run on it

    @classmethod
    def declare(cls, metrics: Registry, gauge: Callable[[str], float]) -> None:
        symbolication_metrics(metrics, lambda: gauge("boxtrail_symbolication_built_bytes"))

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)
