"""Per-project token buckets, counted in events (not requests), and one per ingest key
that has a limit of its own (``ingest-key:<key>``, at that key's rate).

In a cluster every node keeps the buckets of the whole cluster's rate: each reports what
it admitted (:meth:`TokenBuckets.report`, on the bus every 100 ms) and takes what the
others admitted out of its own buckets (:meth:`TokenBuckets.spend`). A node learns of the
others' events up to ~0.1-0.2 s late, so the cluster admits at most the rate plus what
the other nodes took in that window (and, at a spike on every node at once, up to the
burst on each); ``docs/cluster.md`` has the measurement.
"""

from __future__ import annotations

import time


class TokenBuckets:
    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = max(burst, rate)
        self._buckets: dict[str, tuple[float, float]] = {}  # project -> (tokens, at)
        self._admitted: dict[str, float] = {}  # events admitted here since the last report
        # Buckets with a rate of their own (an ingest key's limit): key -> (rate, burst).
        self._limits: dict[str, tuple[float, float]] = {}

    def _limit(self, key: str) -> tuple[float, float]:
        return self._limits.get(key, (self.rate, self.burst))

    def take(self, key: str, n: int, now: float | None = None,
             rate: float | None = None) -> float | None:
        """Take ``n`` tokens; None if allowed, else seconds until they will be there.
        ``rate``: the bucket's own rate (events/s, a burst of one second's worth) instead
        of the node's."""
        if rate is not None:
            self._limits[key] = (rate, max(rate, 1.0))
        rate, burst = self._limit(key)
        if rate <= 0:
            return None
        now = time.monotonic() if now is None else now
        tokens, at = self._buckets.get(key, (burst, now))
        tokens = min(burst, tokens + (now - at) * rate)
        # A batch larger than the burst is let through from a full bucket (into debt),
        # otherwise it could never pass.
        if tokens >= n or tokens >= burst:
            self._buckets[key] = (tokens - n, now)
            self._admitted[key] = self._admitted.get(key, 0) + n
            return None
        self._buckets[key] = (tokens, now)
        # A batch over the burst passes once the bucket is full again.
        return (min(n, burst) - tokens) / rate

    def give_back(self, key: str, n: int) -> None:
        """Return ``n`` tokens taken for a batch that was not stored after all."""
        rate, burst = self._limit(key)
        if rate <= 0 or key not in self._buckets:
            return
        tokens, at = self._buckets[key]
        self._buckets[key] = (min(burst, tokens + n), at)
        self._admitted[key] = self._admitted.get(key, 0) - n

    def report(self) -> dict[str, float] | None:
        """What this node admitted since the last report (None: nothing)."""
        admitted, self._admitted = self._admitted, {}
        admitted = {k: v for k, v in admitted.items() if v}
        return admitted or None

    def spend_all(self, used: dict[str, float]) -> None:
        """:meth:`spend` for each project of another node's report."""
        for key, n in used.items():
            self.spend(key, n)

    def spend(self, key: str, n: float, now: float | None = None) -> None:
        """Take ``n`` tokens that another node of the cluster spent (into debt if need be)."""
        rate, burst = self._limit(key)
        if rate <= 0:
            return
        now = time.monotonic() if now is None else now
        tokens, at = self._buckets.get(key, (burst, now))
        tokens = min(burst, tokens + (now - at) * rate)
        # At most one burst of debt: after a bus outage every node reports what it let
        # through meanwhile, which must not lock the project out for as long again.
        self._buckets[key] = (max(tokens - n, -burst), now)
