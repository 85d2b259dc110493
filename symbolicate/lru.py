"""A least-recently-used cache bounded by the summed cost of its entries (bytes, as
measured by the caller), safe across threads: the symbolicator's caches of built lookups,
resolutions and rewritten stacks (``symbolicate.lookup``)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

_K = TypeVar("_K")
_V = TypeVar("_V")


class ByteLRU(Generic[_K, _V]):
    """Least recently used entries go first once their summed cost passes ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[_K, tuple[_V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: _K) -> _V | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, key: _K, value: _V, cost: int) -> None:
        if cost > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._items[key] = (value, cost)
            self.bytes += cost
            while self.bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self.bytes -= dropped

    def __len__(self) -> int:
        return len(self._items)
