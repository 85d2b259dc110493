"""Several real boxtrail nodes sharing a PostgreSQL catalog, a Redis bus and an S3 bucket,
each on its own loopback port and data directory (tests/support/server.py).

With ``proxied=True`` each node reaches each engine through its own FaultProxy
(tests/support/faultproxy.py), ``cluster.proxies[i]["pg" | "redis" | "s3"]``, so one node can lose
one engine while the others keep it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.support.faultproxy import FaultProxy
from tests.support.s3server import S3Server
from tests.support.server import Server


def _through(url: str, proxy: FaultProxy) -> str:
    """``url`` with its host and port replaced by the proxy's (user and path kept)."""
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@127.0.0.1:{proxy.port}" if user else f"127.0.0.1:{proxy.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _proxy_to(url: str) -> FaultProxy:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None, url
    return FaultProxy(parts.hostname, parts.port).start()


class Cluster:
    def __init__(self, root: Path, pg_url: str, redis_url: str, s3: S3Server, bucket: str,
                 nodes: int = 3, env: dict[str, str] | None = None,
                 proxied: bool = False) -> None:
        shared = {**s3.env(), "BOXTRAIL_S3_BUCKET": bucket, "BOXTRAIL_CATALOG_URL": pg_url,
                  "BOXTRAIL_BUS_URL": redis_url, **(env or {})}
        self.proxies: list[dict[str, FaultProxy]] = []
        per_node: list[dict[str, str]] = [{} for _ in range(nodes)]
        if proxied:
            try:
                for urls in per_node:
                    links = {"pg": _proxy_to(pg_url), "redis": _proxy_to(redis_url),
                             "s3": _proxy_to(s3.endpoint)}
                    self.proxies.append(links)
                    urls.update({"BOXTRAIL_CATALOG_URL": _through(pg_url, links["pg"]),
                                 "BOXTRAIL_BUS_URL": _through(redis_url, links["redis"]),
                                 "BOXTRAIL_S3_ENDPOINT": _through(s3.endpoint, links["s3"])})
            except BaseException:
                self._stop_proxies()
                raise
        self.nodes = [Server(root / f"node{i}",
                             {**shared, **per_node[i - 1], "BOXTRAIL_NODE_ID": f"node{i}"})
                      for i in range(1, nodes + 1)]

    def start(self) -> Cluster:
        """Every node at once (each waits at start until the others have read it). If one
        fails to start, those that did are stopped: a fixture that fails in its setup gets
        no teardown, and they would outlive the test."""
        try:
            self._each(lambda node: node.start())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            self._each(lambda node: node.stop())
        finally:
            self._stop_proxies()

    def _stop_proxies(self) -> None:
        for links in self.proxies:
            for proxy in links.values():
                proxy.stop()

    def _each(self, action: Callable[[Server], object]) -> None:
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            for future in [pool.submit(action, node) for node in self.nodes]:
                future.result()

    def __getitem__(self, i: int) -> Server:
        return self.nodes[i]

    def __len__(self) -> int:
        return len(self.nodes)
