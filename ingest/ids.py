"""The ids this node gives its rows, and its *floor*: an id at or below which every row it
made is visible here (and, in a cluster, published), so a reader that has every row up to
the floor has missed none below it. A batch holds its ids from :meth:`NodeIds.take` until
it is settled: made durable and handed on, or refused."""

from __future__ import annotations

from core.schema import IdGenerator


class NodeIds:
    def __init__(self, node: int = 1) -> None:
        self.generator = IdGenerator(node)  # node: this node's number (cluster.nodes)
        self._held: dict[int, None] = {}  # first ids of batches not yet settled, in order

    def take(self, n: int) -> int:
        """The first of ``n`` ids for a batch, held until :meth:`settle`."""
        start = self.generator.take(n)
        self._held[start] = None
        return start

    def settle(self, id_start: int) -> None:
        self._held.pop(id_start, None)

    def advance_past(self, used: int) -> None:
        self.generator.advance_past(used)

    def floor(self) -> int:
        """Below the oldest batch not yet settled, else where the clock is now."""
        if self._held:
            return next(iter(self._held)) - 1
        return self.generator.floor()
