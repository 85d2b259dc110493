"""Per-project token buckets, counted in events (not requests)."""

from __future__ import annotations

import time


class TokenBuckets:
    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = max(burst, rate)
        self._buckets: dict[str, tuple[float, float]] = {}  # project -> (tokens, at)

    def take(self, key: str, n: int, now: float | None = None) -> float | None:
        """Take ``n`` tokens; None if allowed, else seconds until they will be there."""
        if self.rate <= 0:
            return None
        now = time.monotonic() if now is None else now
        tokens, at = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        # A batch larger than the burst is let through from a full bucket (into debt),
        # otherwise it could never pass.
        if tokens >= n or tokens >= self.burst:
            self._buckets[key] = (tokens - n, now)
            return None
        self._buckets[key] = (tokens, now)
        # A batch over the burst passes once the bucket is full again.
        return (min(n, self.burst) - tokens) / self.rate

    def give_back(self, key: str, n: int) -> None:
        """Return ``n`` tokens taken for a batch that was not stored after all."""
        if self.rate <= 0 or key not in self._buckets:
            return
        tokens, at = self._buckets[key]
        self._buckets[key] = (min(self.burst, tokens + n), at)
