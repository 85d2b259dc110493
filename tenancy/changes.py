"""What one node changed that every node must apply at once: the change feed.

A change is a row of ``changes``: a kind and what it names. ``api_key``: a key was
revoked (its hash). ``project``: a project's name, allowed origins or keys changed, or it
was deleted (its id). It is written in the same transaction as the change itself
(:func:`record`), so a node that reads one sees the change it describes.

Every node reads the feed every :data:`POLL_S` (:meth:`Changes.run`, a loop under the
node's supervisor) and hands each new row to the listener of its kind. The node that made
the change applies it before it answers, and never waits for the feed.

A sequence number can commit out of order on PostgreSQL: two transactions take 7 and 8,
and 8 commits first. So each read also takes again the rows of the last
:data:`LOOKBACK_S`, and applies only those it has not applied yet. A change that commits
later than that after taking its number would be missed. Changes come from short
transactions of their own, so that does not happen. Rows older than :data:`KEEP_S` are
deleted.

While the catalog is out of reach, the loop logs it and tries again at its next turn. A
node cut off from the catalog cannot learn of a revocation. It refuses an expired key from
memory all the same.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from metadata.db import Database, MetadataUnavailable

if TYPE_CHECKING:
    from tenancy.tenants import Tenancy

POLL_S = 0.25
LOOKBACK_S = 10.0
KEEP_S = 86_400.0
PRUNE_EVERY_S = 600.0

log = logging.getLogger("boxtrail.tenancy")

Listener = Callable[[str], None]


def record(db: Database, kind: str, ref: str) -> None:
    """A change for every node, in the caller's transaction."""
    db.execute("INSERT INTO changes (kind, ref, at) VALUES (?, ?, ?)", (kind, ref, time.time()))


class Changes:
    def __init__(self, db: Database, tenancy: Tenancy) -> None:
        self.db = db
        self.keys = tenancy.keys
        self.listeners: dict[str, Listener] = {"api_key": tenancy.keys.forget,
                                               "project": tenancy.changed}
        self._applied: dict[int, float] = {}  # seq -> when it was applied (monotonic)
        row = db.execute("SELECT max(seq) FROM changes").fetchone()
        self._last = int(row[0] or 0)
        self._pruned_at = 0.0

    def _read(self) -> list[tuple[int, str, str]]:
        rows = self.db.execute(
            "SELECT seq, kind, ref FROM changes WHERE seq > ? OR at > ? ORDER BY seq",
            (self._last, time.time() - LOOKBACK_S)).fetchall()
        now = time.time()
        if now - self._pruned_at > PRUNE_EVERY_S:
            self._pruned_at = now
            self.db.execute("DELETE FROM changes WHERE at < ?", (now - KEEP_S,))
        return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]

    def apply(self, rows: list[tuple[int, str, str]]) -> None:
        """The rows not applied yet, to their listeners (on the event loop)."""
        now = time.monotonic()
        for seq, kind, ref in rows:
            if seq in self._applied:
                continue
            self._applied[seq] = now
            self._last = max(self._last, seq)
            if (listener := self.listeners.get(kind)) is not None:
                listener(ref)
        self._applied = {s: t for s, t in self._applied.items() if now - t < 2 * LOOKBACK_S}

    async def run(self) -> None:
        """Read and apply the feed, sweep expired keys, write their uses: for good."""
        while True:
            try:
                self.apply(await asyncio.to_thread(self._read))
                if used := self.keys.due_uses():
                    await asyncio.to_thread(self.keys.write_uses, used)
            except MetadataUnavailable as exc:
                log.warning("the change feed could not be read: %s", exc)
            self.keys.sweep()
            await asyncio.sleep(POLL_S)
