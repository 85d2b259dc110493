"""Several real boxtrail nodes sharing a PostgreSQL catalog, a Redis bus and an S3 bucket,
each on its own loopback port and data directory (tests/server.py)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.s3server import S3Server
from tests.server import Server


class Cluster:
    def __init__(self, root: Path, pg_url: str, redis_url: str, s3: S3Server, bucket: str,
                 nodes: int = 3, env: dict[str, str] | None = None) -> None:
        shared = {**s3.env(), "BOXTRAIL_S3_BUCKET": bucket, "BOXTRAIL_CATALOG_URL": pg_url,
                  "BOXTRAIL_BUS_URL": redis_url, **(env or {})}
        self.nodes = [Server(root / f"node{i}", {**shared, "BOXTRAIL_NODE_ID": f"node{i}"})
                      for i in range(1, nodes + 1)]

    def start(self) -> Cluster:
        """Every node at once (each waits at start until the others have read it)."""
        self._each(lambda node: node.start())
        return self

    def stop(self) -> None:
        self._each(lambda node: node.stop())

    def _each(self, action: Callable[[Server], object]) -> None:
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            for future in [pool.submit(action, node) for node in self.nodes]:
                future.result()

    def __getitem__(self, i: int) -> Server:
        return self.nodes[i]

    def __len__(self) -> int:
        return len(self.nodes)
